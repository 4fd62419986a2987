"""First-batch benchmark: seconds to the first batch, and batches per second over the
pass, for a lazy `MultiProcessDataLoader` and torch's `DataLoader`, in one run.

The reader takes 1 ms per instance (a sleep: a reader waiting on its storage, so other
load on the 2 cores does not change its cost); `max_instances_in_memory=3200`, batch
size 32, 6,400 instances. torch's side is an `IterableDataset` sharded with
`get_worker_info()`; it cannot shuffle one, so its rows are the plain order. Ours
runs plain, shuffled, and with the bucket sampler, each of which needs a chunk.

    python benchmarks/bench_first_batch.py           # writes benchmarks/results/first_batch.json
    python benchmarks/bench_first_batch.py --quick   # a smoke test, writes nothing
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import IterableDataset, get_worker_info

from framework.data.collate import DefaultDataCollator
from framework.data.multiprocess import MultiProcessDataLoader
from framework.data.reader import DatasetReader
from framework.data.sampler import BatchSampler

BATCH = 32
CHUNK = 3200
RESULTS = Path(__file__).resolve().parent / "results" / "first_batch.json"


def instance(index: int) -> dict[str, Any]:
    time.sleep(0.001)
    return {"tokens": torch.arange(index % 7 + 1), "index": index}


class SlowReader(DatasetReader):
    def __init__(self, count: int) -> None:
        super().__init__(manual_distributed_sharding=True, manual_multiprocess_sharding=True)
        self.count = count

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        for index in self.shard_iterable(range(self.count)):
            yield instance(index)


class SlowDataset(IterableDataset):  # type: ignore[type-arg]
    def __init__(self, count: int) -> None:
        self.count = count

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for index in range(worker, self.count, workers):
            yield instance(index)


def timed(make: Callable[[], Any]) -> tuple[float, float]:
    """(seconds to the first batch, batches per second over the whole pass)."""
    started = time.perf_counter()
    batches = iter(make())
    next(batches)
    first = time.perf_counter() - started
    count = 1 + sum(1 for _ in batches)
    return first, count / (time.perf_counter() - started)


def makers(count: int, workers: int) -> dict[str, Callable[[], Any]]:
    def ours(**options: Any) -> Callable[[], Any]:
        return lambda: MultiProcessDataLoader(
            SlowReader(count), "-", num_workers=workers, max_instances_in_memory=CHUNK, quiet=True, **options
        )

    bucket = BatchSampler.by_name("bucket")(batch_size=BATCH, sorting_keys=["tokens"])
    return {
        f"torch_{workers}": lambda: TorchDataLoader(
            SlowDataset(count), batch_size=BATCH, num_workers=workers, collate_fn=DefaultDataCollator()
        ),
        f"ours_{workers}": ours(batch_size=BATCH),
        f"ours_{workers}_shuffle": ours(batch_size=BATCH, shuffle=True),
        f"ours_{workers}_bucket": ours(batch_sampler=bucket),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer instances, one repeat, writes nothing")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    count, repeats = (640, 1) if args.quick else (2 * CHUNK, args.repeats)
    torch.set_num_threads(1)
    rows: dict[str, list[tuple[float, float]]] = {}
    for _ in range(repeats):  # rows take turns, so load from elsewhere hits each alike
        for workers in (0, 2):
            for name, make in makers(count, workers).items():
                rows.setdefault(name, []).append(timed(make))
    results: dict[str, Any] = {
        "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}, torch {torch.__version__}",
        "instances": count, "batch_size": BATCH, "max_instances_in_memory": CHUNK, "repeats": repeats,
        "rows": {
            name: {
                "first_batch_s": statistics.median(r[0] for r in runs),
                "batches_per_s": statistics.median(r[1] for r in runs),
            }
            for name, runs in rows.items()
        },
    }  # fmt: skip
    for name, row in results["rows"].items():
        torch_row = results["rows"][f"torch_{name.split('_')[1]}"]
        row["first_batch_vs_torch"] = row["first_batch_s"] / torch_row["first_batch_s"]
        row["throughput_vs_torch"] = row["batches_per_s"] / torch_row["batches_per_s"]
        print(
            f"{name:<16} first batch {row['first_batch_s']:.3f} s ({row['first_batch_vs_torch']:.2f}x torch)"
            f"   {row['batches_per_s']:7.1f} batches/s ({row['throughput_vs_torch']:.2f}x torch)"
        )
    if not args.quick:
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")
        print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
