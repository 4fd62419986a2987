"""Resume benchmark: time to the first batch after `load_state_dict()` at 90% of an epoch,
against a fresh loader's first batch, in one run.

300k lines, the built-in ``"text"`` reader (hashed token ids), 2 workers, lazy mode,
batch size 32, shuffled. Each side is built from scratch per measurement (workers
started, file opened): the resumed one seeks to where the epoch stood; it does not
replay it. For comparison, torchdata's `StatefulDataLoader` over an equivalent
`IterableDataset` (sharded by `get_worker_info()`), if torchdata is installed: without
a state of the dataset's own, it fast-forwards by skipping.

    python benchmarks/bench_resume.py            # writes benchmarks/results/resume.json
    python benchmarks/bench_resume.py --quick    # 30k lines, for a smoke test

Figures are medians over `--repeats` runs (interleaved); the ratio is of medians.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

from bench_loader import write_corpus

from framework.data.collate import DefaultDataCollator
from framework.data.multiprocess import MultiProcessDataLoader
from framework.data.reader import DatasetReader

BATCH = 32
WORKERS = 2
RESULTS = Path(__file__).resolve().parent / "results" / "resume.json"


def ours(path: Path) -> MultiProcessDataLoader:
    reader = DatasetReader.by_name("text")(num_buckets=5000, keep_text=False)
    return MultiProcessDataLoader(
        reader, str(path), batch_size=BATCH, shuffle=True, num_workers=WORKERS,
        max_instances_in_memory=BATCH * 32, quiet=True, seed=0,
    )


def first_batch(make: Callable[[], Any], state: Any = None) -> float:
    """Seconds from building the loader (and loading `state`) to its first batch."""
    started = time.perf_counter()
    loader = make()
    if state is not None:
        loader.load_state_dict(state)
    iterator = iter(loader)
    next(iterator)
    elapsed = time.perf_counter() - started
    del iterator
    close = getattr(loader, "close", None)
    if close is not None:
        close()
    return elapsed


def at_90_percent(make: Callable[[], Any], lines: int) -> Any:
    """The loader's state after 90% of an epoch's batches (plain data, via JSON for ours)."""
    loader = make()
    iterator = iter(loader)
    for _ in itertools.islice(iterator, int(0.9 * lines / BATCH)):
        pass
    state = loader.state_dict()
    del iterator
    return state


def measure(make: Callable[[], Any], state: Any, repeats: int) -> dict[str, float]:
    fresh, resumed = [], []
    for _ in range(repeats):  # interleaved: other load on the machine hits both alike
        fresh.append(first_batch(make))
        resumed.append(first_batch(make, state))
    result = {"fresh_s": statistics.median(fresh), "resumed_s": statistics.median(resumed)}
    result["ratio"] = result["resumed_s"] / result["fresh_s"]
    return result


def torchdata_side(path: Path, lines: int, repeats: int) -> dict[str, Any]:
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError as error:
        return {"skipped": f"torchdata is not installed ({error})"}
    from torch.utils.data import IterableDataset, get_worker_info

    reader = DatasetReader.by_name("text")(num_buckets=5000, keep_text=False)

    class Lines(IterableDataset):  # type: ignore[type-arg]
        def __iter__(self) -> Iterator[dict[str, Any]]:
            info = get_worker_info()
            with open(path) as handle:
                for index, line in enumerate(handle):
                    if info is None or index % info.num_workers == info.id:
                        yield reader.text_to_instance(line.rstrip("\n"))

    def make() -> Any:
        return StatefulDataLoader(Lines(), batch_size=BATCH, num_workers=WORKERS,
                                  collate_fn=DefaultDataCollator())

    return measure(make, at_90_percent(make, lines), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--lines", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    lines = args.lines or (30_000 if args.quick else 300_000)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "corpus.txt"
        write_corpus(path, lines)

        def make() -> MultiProcessDataLoader:
            return ours(path)

        state = json.loads(json.dumps(at_90_percent(make, lines)))
        results: dict[str, Any] = {
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}",
            "lines": lines,
            "batch_size": BATCH,
            "num_workers": WORKERS,
            "state_bytes": len(json.dumps(state)),
            "framework": measure(make, state, args.repeats),
            "torchdata": torchdata_side(path, lines, args.repeats),
        }
    print(json.dumps(results, indent=2))
    if not args.quick:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
