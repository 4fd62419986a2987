"""Loader benchmark: MultiProcessDataLoader against torch.utils.data.DataLoader, in one run.

Same reader logic, same collate (`DefaultDataCollator`), batch size 32. The torch
side is an `IterableDataset` sharded by `get_worker_info()`; ours is a lazy
`MultiProcessDataLoader` whose reader shards with `shard_iterable`.

    python benchmarks/bench_loader.py            # full run, writes benchmarks/results/loader.json
    python benchmarks/bench_loader.py --quick    # smaller data, for a smoke test

Figures are medians over `--repeats` runs; ratios are of medians.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import IterableDataset, get_worker_info

from framework.data.collate import DefaultDataCollator
from framework.data.multiprocess import MultiProcessDataLoader
from framework.data.reader import DatasetReader

BATCH = 32
RESULTS = Path(__file__).resolve().parent / "results" / "loader.json"
WORDS = [f"w{i}" for i in range(5000)]
VOCAB = {word: index for index, word in enumerate(WORDS)}


def write_corpus(path: Path, lines: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with path.open("w") as handle:
        for _ in range(lines):
            handle.write(" ".join(rng.choices(WORDS, k=rng.randint(5, 30))) + "\n")


def tokenize_and_index(line: str) -> dict[str, Any]:
    ids = [VOCAB.get(token, 0) for token in line.split()]
    return {"tokens": torch.tensor(ids), "length": len(ids)}


def spin(iterations: int) -> int:
    x = 0
    for _ in range(iterations):
        x += sum(range(50))
    return x


def calibrate(millis: float = 1.0) -> int:
    """Iterations of `spin` that take `millis` ms of CPU (thread time, not wall time,
    so that other load on the machine does not change the amount of work)."""
    started = time.thread_time()
    spin(20_000)
    per_ms = 20_000 / ((time.thread_time() - started) * 1000)
    return max(1, int(per_ms * millis))


def busy(line: str, iterations: int) -> dict[str, Any]:
    """A fixed amount of pure-Python work, then the same instance as the cheap reader."""
    spin(iterations)
    return tokenize_and_index(line)


def read_lines(path: str) -> Iterator[str]:
    with open(path) as handle:
        yield from handle


class BenchReader(DatasetReader):
    """Our side: shards the lines (cheap), then does the work on its own share."""

    def __init__(self, work: int = 0, **kwargs: Any) -> None:
        super().__init__(manual_distributed_sharding=True, manual_multiprocess_sharding=True,
                         **kwargs)
        self.work = work

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        for line in self.shard_iterable(read_lines(file_path)):
            yield busy(line, self.work) if self.work else tokenize_and_index(line)


class BenchDataset(IterableDataset):  # type: ignore[type-arg]
    """torch's side: the same work, sharded by torch's get_worker_info()."""

    def __init__(self, path: str, work: int = 0) -> None:
        self.path = path
        self.work = work

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        for index, line in enumerate(read_lines(self.path)):
            if info is None or index % info.num_workers == info.id:
                yield busy(line, self.work) if self.work else tokenize_and_index(line)


def ours(path: Path, workers: int, work: int = 0, **kwargs: Any) -> MultiProcessDataLoader:
    return MultiProcessDataLoader(
        BenchReader(work), str(path), batch_size=BATCH, num_workers=workers,
        max_instances_in_memory=BATCH * 32, quiet=True, **kwargs,
    )


def theirs(path: Path, workers: int, work: int = 0) -> TorchDataLoader:  # type: ignore[type-arg]
    return TorchDataLoader(
        BenchDataset(str(path), work), batch_size=BATCH, num_workers=workers,
        collate_fn=DefaultDataCollator(),
    )


def rate(make: Callable[[], Any]) -> tuple[float, float]:
    """(batches per second over one full pass, seconds to the first batch)."""
    started = time.perf_counter()
    loader = make()
    iterator = iter(loader)
    next(iterator)
    first = time.perf_counter() - started
    count = 1
    for _ in iterator:
        count += 1
    return count / (time.perf_counter() - started), first


def median_rates(makers: dict[str, Callable[[], Any]], repeats: int) -> dict[str, Any]:
    """Each loader `repeats` times, interleaved (so that load from other processes on
    the machine hits every loader alike); medians per loader."""
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in makers}
    for _ in range(repeats):
        for name, make in makers.items():
            runs[name].append(rate(make))
    return {
        name: {
            "batches_per_s": statistics.median(r[0] for r in results),
            "first_batch_s": statistics.median(r[1] for r in results),
            "all_batches_per_s": [round(r[0], 1) for r in results],
        }
        for name, results in runs.items()
    }


# -- memory: each measurement in a fresh process, so earlier runs cannot inflate it ------


def pss_kib(pid: int) -> Optional[int]:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_kib(pid: int) -> Optional[int]:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def memory_run(path: str) -> dict[str, float]:
    """Iterate one lazy epoch with 2 workers; peak PSS and RSS of main plus workers."""
    me = os.getpid()
    peak = {"pss": 0, "rss": 0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            pids = [me, *children(me)]
            pss = sum(pss_kib(p) or 0 for p in pids)
            rss = sum(rss_kib(p) or 0 for p in pids)
            peak["pss"], peak["rss"] = max(peak["pss"], pss), max(peak["rss"], rss)
            time.sleep(0.02)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    batches = sum(1 for _ in ours(Path(path), 2))
    stop.set()
    thread.join()
    return {"peak_pss_mib": peak["pss"] / 1024, "peak_rss_mib": peak["rss"] / 1024,
            "batches": batches}


def measure_memory(path: Path, repeats: int) -> dict[str, float]:
    runs = []
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, __file__, "--memory-run", str(path)],
            capture_output=True, text=True, check=True,
        )
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small data, one repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory-run", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_run:
        print(json.dumps(memory_run(args.memory_run)))
        return
    lines = 20_000 if args.quick else 200_000
    heavy_lines = 400 if args.quick else 3_000
    repeats = 1 if args.quick else args.repeats
    torch.set_num_threads(1)  # both loaders' main processes alike; workers use 1 too

    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__, "platform": platform.platform()},
        "batch_size": BATCH, "repeats": repeats,
        "load_average_before": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        write_corpus(corpus, lines)
        heavy = Path(tmp) / "heavy.txt"
        write_corpus(heavy, heavy_lines, seed=1)
        small = Path(tmp) / "small.txt"
        write_corpus(small, lines // 10, seed=2)

        cheap = median_rates({
            "torch_0": lambda: theirs(corpus, 0),
            "torch_2": lambda: theirs(corpus, 2),
            "ours_0": lambda: ours(corpus, 0),
            "ours_2": lambda: ours(corpus, 2),
            "ours_2_shared_memory": lambda: ours(corpus, 2, transfer="shared_memory"),
        }, repeats)
        cheap["ratios"] = {
            "ours_2_vs_torch_2": cheap["ours_2"]["batches_per_s"] / cheap["torch_2"]["batches_per_s"],
            "ours_2_vs_ours_0": cheap["ours_2"]["batches_per_s"] / cheap["ours_0"]["batches_per_s"],
            "torch_2_vs_torch_0": cheap["torch_2"]["batches_per_s"] / cheap["torch_0"]["batches_per_s"],
            "pickle5_vs_shared_memory": cheap["ours_2"]["batches_per_s"]
            / cheap["ours_2_shared_memory"]["batches_per_s"],
            "first_batch_ours_2_over_torch_2": cheap["ours_2"]["first_batch_s"]
            / cheap["torch_2"]["first_batch_s"],
        }
        results["cheap_reader"] = {"lines": lines, **cheap}

        work = calibrate(1.0)
        heavy_results = median_rates({
            "ours_0": lambda: ours(heavy, 0, work),
            "ours_2": lambda: ours(heavy, 2, work),
            "torch_0": lambda: theirs(heavy, 0, work),
            "torch_2": lambda: theirs(heavy, 2, work),
        }, repeats)
        heavy_results["ratios"] = {
            "ours_2_vs_ours_0": heavy_results["ours_2"]["batches_per_s"]
            / heavy_results["ours_0"]["batches_per_s"],
            "ours_2_vs_torch_2": heavy_results["ours_2"]["batches_per_s"]
            / heavy_results["torch_2"]["batches_per_s"],
        }
        results["cpu_heavy_reader"] = {"lines": heavy_lines, "work_cpu_ms": 1.0,
                                       "spin_iterations": work, **heavy_results}

        small_memory = measure_memory(small, repeats)
        large_memory = measure_memory(corpus, repeats)
        results["lazy_memory"] = {
            "small_lines": lines // 10, "large_lines": lines,
            "small": small_memory, "large": large_memory,
            "pss_growth": large_memory["peak_pss_mib"] / small_memory["peak_pss_mib"] - 1,
            "rss_growth": large_memory["peak_rss_mib"] / small_memory["peak_rss_mib"] - 1,
        }

    results["load_average_after"] = os.getloadavg()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)


def print_table(results: dict[str, Any]) -> None:
    cheap, heavy, memory = (results["cheap_reader"], results["cpu_heavy_reader"],
                            results["lazy_memory"])
    print(f"\nbatch size {results['batch_size']}, medians of {results['repeats']} runs, "
          f"{results['machine']['cpus']} CPUs, load average before/after "
          f"{results['load_average_before'][0]:.1f}/{results['load_average_after'][0]:.1f}\n")
    print(f"cheap reader ({cheap['lines']} lines)   batches/s   first batch (s)")
    for name in ("torch_0", "torch_2", "ours_0", "ours_2", "ours_2_shared_memory"):
        row = cheap[name]
        print(f"  {name:<26} {row['batches_per_s']:>9.1f}   {row['first_batch_s']:>8.3f}")
    for name, value in cheap["ratios"].items():
        print(f"  {name:<36} {value:>6.2f}x")
    print(f"\nCPU-heavy reader ({heavy['lines']} lines, {heavy['work_cpu_ms']} ms CPU each)")
    for name in ("ours_0", "ours_2", "torch_0", "torch_2"):
        print(f"  {name:<26} {heavy[name]['batches_per_s']:>9.1f}")
    for name, value in heavy["ratios"].items():
        print(f"  {name:<36} {value:>6.2f}x")
    print("\nlazy mode peak memory, main + 2 workers (MiB)")
    for size in ("small", "large"):
        row = memory[size]
        print(f"  {size:<6} {memory[size + '_lines']:>7} lines   PSS {row['peak_pss_mib']:>7.1f}"
              f"   RSS {row['peak_rss_mib']:>7.1f}")
    print(f"  growth at 10x data: PSS {memory['pss_growth']:+.1%}, RSS {memory['rss_growth']:+.1%}")
    print(f"\nwritten to {RESULTS}")


if __name__ == "__main__":
    main()
