"""Readers and rank entry points for the loader's distributed and sharding tests.

Importable by module name, so "spawn" children (ranks, workers) can unpickle them.
"""

from __future__ import annotations

import faulthandler
import json
import os
import socket
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

from framework.data.reader import DatasetReader
from tests.support.loader import CountingReader, make_instance


class RankFailingReader(CountingReader):
    """Raises on rank `victim` only, after `after` instances of its shard."""

    def __init__(self, n: int = 40, victim: int = 1, after: int = 0, **kwargs: Any) -> None:
        super().__init__(n, **kwargs)
        self.victim = victim
        self.after = after

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        info = self.get_distributed_info()
        for i, instance in enumerate(super()._read(file_path)):
            if info is not None and info.global_rank == self.victim and i >= self.after * info.world_size:
                raise FileNotFoundError(f"cannot open {file_path!r}")
            yield instance


class ListReader(DatasetReader):
    """Shards by itself, but `_read` returns a list (runs before `read()` iterates)."""

    def __init__(self, n: int = 12, **kwargs: Any) -> None:
        super().__init__(manual_distributed_sharding=True, manual_multiprocess_sharding=True, **kwargs)
        self.n = n

    def _read(self, file_path: Any) -> list[dict[str, Any]]:
        return [make_instance(i) for i in self.shard_iterable(range(self.n))]


class ForgetfulListReader(DatasetReader):
    """Sets manual_multiprocess_sharding but never shards: every worker reads everything."""

    def __init__(self, n: int = 8) -> None:
        super().__init__(manual_multiprocess_sharding=True)
        self.n = n

    def _read(self, file_path: Any) -> list[dict[str, Any]]:
        return [make_instance(i) for i in range(self.n)]


CASES: dict[str, dict[str, Any]] = {
    # Fewer instances (2) than ranks (3): rank 2's shard is empty.
    "eager_0": {"reader": ("counting", 2), "num_workers": 0},
    "eager_2": {"reader": ("counting", 2), "num_workers": 2},
    "lazy_0": {"reader": ("counting", 2), "num_workers": 0, "max_instances_in_memory": 4},
    "lazy_2": {"reader": ("counting", 2), "num_workers": 2, "max_instances_in_memory": 4},
    "lazy_bpe_2": {
        "reader": ("counting", 2),
        "num_workers": 2,
        "max_instances_in_memory": 4,
        "batches_per_epoch": 3,
    },
    "eager_bpe_0": {"reader": ("counting", 2), "num_workers": 0, "batches_per_epoch": 3},
    # Rank 1's reader raises (at once in eager mode, mid-shard in lazy mode).
    "fail_eager_0": {"reader": ("failing", 0), "num_workers": 0},
    "fail_eager_2": {"reader": ("failing", 0), "num_workers": 2},
    "fail_lazy_0": {"reader": ("failing", 3), "num_workers": 0, "max_instances_in_memory": 4},
    "fail_lazy_2": {"reader": ("failing", 3), "num_workers": 2, "max_instances_in_memory": 4},
    "fail_lazy_bpe_0": {
        "reader": ("failing", 3),
        "num_workers": 0,
        "max_instances_in_memory": 4,
        "batches_per_epoch": 5,
    },
}


# What a rank forked from the test forkserver has imported already: a spawned rank pays
# seconds of CPU to import torch, and a suite starts dozens of them.
FORKSERVER_PRELOAD = ["__main__", "torch", "torch.distributed", "framework.data.multiprocess"]


def start_ranks(target: Callable[..., None], args: tuple[Any, ...], nprocs: int) -> None:
    """Run `target(rank, *args)` in `nprocs` fresh processes and wait for them all, as
    `torch.multiprocessing.spawn` does, but forked from a forkserver (see
    `FORKSERVER_PRELOAD`). Each rank gets the environment the test has now, not the one
    the forkserver started with."""
    import torch.multiprocessing as mp

    environ = dict(os.environ)
    mp.start_processes(
        _in_environ, args=(target, environ, *args), nprocs=nprocs, join=True, start_method="forkserver"
    )


def _in_environ(rank: int, target: Callable[..., None], environ: dict[str, str], *args: Any) -> None:
    os.environ.clear()
    os.environ.update(environ)
    target(rank, *args)


def free_port() -> int:
    """A port free now on 127.0.0.1, for one process group's rendezvous (each group its
    own: a neighbour of another group's port may be taken by then)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def join_gloo(rank: int, world: int, port: int, *, collective_s: float, stuck_s: float) -> None:
    """Join a gloo group on 127.0.0.1:`port`. A rank left waiting in a collective fails
    after `collective_s` instead of 30 minutes; one stuck anywhere prints every thread's
    stack and ends after `stuck_s` (the test then fails saying where), before the test's
    own timeout kills it silently."""
    import torch.distributed as dist

    faulthandler.dump_traceback_later(stuck_s, exit=True)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        world_size=world,
        rank=rank,
        timeout=timedelta(seconds=collective_s),
    )


def empty_or_failing_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    """One rank of a gloo group: what each case yields or raises (the group times out fast)."""
    import torch.distributed as dist

    from framework.data import _pool
    from framework.data.multiprocess import MultiProcessDataLoader

    # A worker forked while a gloo thread held one of CPython's locks can hang before its
    # first line (gh-112275, Python before 3.11.10); it is forked again after START_S,
    # which must stay under the 20 s collective timeout below for the other ranks to wait.
    _pool.START_S = 5.0
    join_gloo(rank, world, port, collective_s=20, stuck_s=90)
    results: dict[str, Any] = {}
    try:
        for name, options in CASES.items():
            options = dict(options)
            kind, number = options.pop("reader")
            reader = CountingReader(number) if kind == "counting" else RankFailingReader(after=number)
            print(f"rank {rank}: case {name}", file=sys.stderr, flush=True)
            try:
                loader = MultiProcessDataLoader(reader, "x", batch_size=2, quiet=True, seed=0, **options)
                results[name] = {"batches": [len(batch["id"]) for batch in loader]}
            except Exception as error:  # recorded: the test compares every rank's outcome
                results[name] = {"error": type(error).__name__, "message": str(error)}
            with open(f"{out_dir}/rank{rank}.json", "w") as handle:
                json.dump(results, handle)  # written as we go: a timeout still shows the rest
    finally:
        dist.destroy_process_group()
