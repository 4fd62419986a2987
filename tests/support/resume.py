"""Rank entry points for the resume tests (importable by spawned ranks)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from framework.data.reader import DatasetReader
from tests.support.loader import CountingReader, make_instance

MODES: dict[str, dict[str, Any]] = {
    "lazy": {"max_instances_in_memory": 6, "num_workers": 2, "shuffle": True},
    "eager": {"num_workers": 1, "shuffle": True},
}


def elastic_rank(rank: int, world: int, port: int, out_dir: str, phase: str) -> None:
    """Phase "save": take 2 batches per mode, save the whole-job state; "resume": load it, yield the rest."""
    import torch.distributed as dist

    from framework.data.multiprocess import MultiProcessDataLoader

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=world, rank=rank,
        timeout=timedelta(seconds=60),
    )
    try:
        results: dict[str, Any] = {}
        for name, options in MODES.items():
            loader = MultiProcessDataLoader(
                CountingReader(50), "x", batch_size=3, quiet=True, seed=0, even_batches=False, **options
            )
            if phase == "save":
                iterator = iter(loader)
                head = [next(iterator)["id"].tolist() for _ in range(2)]
                state = loader.state_dict()  # a collective: every rank the same
                rest = [batch["id"].tolist() for batch in iterator]  # uninterrupted
                results[name] = {"head": head, "state": json.loads(json.dumps(state)), "rest": rest}
            else:
                with open(f"{out_dir}/state_{name}.json") as handle:
                    loader.load_state_dict(json.load(handle))
                tail = [batch["id"].tolist() for batch in loader]
                following = [batch["id"].tolist() for batch in loader]
                results[name] = {"tail": tail, "next": following}
            dist.barrier()
        with open(f"{out_dir}/{phase}{rank}.json", "w") as handle:
            json.dump(results, handle)
    finally:
        dist.destroy_process_group()


class PerFileReader(DatasetReader):
    """Calls shard_iterable once per "file" (two halves of range(n)), as per-file readers do."""

    def __init__(self, n: int = 50, **kwargs: Any) -> None:
        super().__init__(manual_distributed_sharding=True, manual_multiprocess_sharding=True, **kwargs)
        self.n = n

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        half = self.n // 2
        for part in (range(half), range(half, self.n)):
            for i in self.shard_iterable(part):
                yield make_instance(i)


class SelfShardingReader(DatasetReader):
    """Shards by itself with get_worker_info(): blocks of 5 ids ("files") per worker."""

    def __init__(self, n: int = 20, **kwargs: Any) -> None:
        super().__init__(manual_distributed_sharding=True, manual_multiprocess_sharding=True, **kwargs)
        self.n = n

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        info = self.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        for i in range(self.n):
            if (i // 5) % workers == worker:
                yield make_instance(i)


def uneven_rank(rank: int, world: int, port: int, out_dir: str, phase: str) -> None:
    """49 instances over 2 ranks (25 and 24, even_batches=False): rank 1 ends its epoch
    while rank 0 still has a batch to go when the state is saved; then 3 ranks resume."""
    import torch.distributed as dist

    from framework.data.multiprocess import MultiProcessDataLoader

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=world, rank=rank,
        timeout=timedelta(seconds=60),
    )
    try:
        results: dict[str, Any] = {}
        for name, options in MODES.items():
            loader = MultiProcessDataLoader(
                CountingReader(49), "x", batch_size=3, quiet=True, seed=0, even_batches=False, **options
            )
            if phase == "save":
                iterator = iter(loader)
                head = [batch["id"].tolist() for batch in itertools.islice(iterator, 8)]
                if rank == 1:
                    head += [batch["id"].tolist() for batch in iterator]  # its epoch ends
                state = loader.state_dict()
                results[name] = {"head": head, "state": json.loads(json.dumps(state))}
            else:
                with open(f"{out_dir}/state_{name}.json") as handle:
                    loader.load_state_dict(json.load(handle))
                results[name] = {"tail": [batch["id"].tolist() for batch in loader]}
            dist.barrier()
        with open(f"{out_dir}/{phase}{rank}.json", "w") as handle:
            json.dump(results, handle)
    finally:
        dist.destroy_process_group()


def guessing_bucket_loader(n: int, **options: Any) -> Any:
    """An eager loader whose bucket sampler guesses its sorting keys (none given)."""
    from framework.data.multiprocess import MultiProcessDataLoader
    from framework.data.sampler import BatchSampler

    sampler = BatchSampler.by_name("bucket")(batch_size=3, shuffle=False)  # sizes 3, 3, ..., the rest
    return MultiProcessDataLoader(
        CountingReader(n), "x", batch_sampler=sampler, quiet=True, seed=0, **options
    )


AHEAD_MODES: dict[str, dict[str, Any]] = {
    "lazy": {"max_instances_in_memory": 6, "shuffle": True},
    "eager": {"shuffle": True},
}


def ahead_loader(name: str) -> Any:
    from framework.data.multiprocess import MultiProcessDataLoader

    return MultiProcessDataLoader(
        CountingReader(49), "x", batch_size=3, quiet=True, seed=0, even_batches=False, **AHEAD_MODES[name]
    )


def two_rank_cases(rank: int, world: int, port: int, out_dir: str) -> None:
    """Three cases of tests/data/test_resume_exact.py in one gloo group (one spawn):

    - "ahead": as `uneven_rank`, but rank 1 is already 2 batches into its next epoch
      when the state is saved (rank 0 still has a batch of the first to go);
    - "empty": resume `out_dir/state.json` (one instance left) on the ranks: one gets
      nothing;
    - "step": rank r calls state_dict() after 2 + r batches (even_batches): what each
      rank raises.
    """
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=world, rank=rank,
        timeout=timedelta(seconds=300),  # above the test's own bound: a hang fails the test
    )
    try:
        results: dict[str, Any] = {"ahead": {}, "step": {}}
        for name in AHEAD_MODES:
            loader = ahead_loader(name)
            iterator = iter(loader)
            head = [batch["id"].tolist() for batch in itertools.islice(iterator, 8)]
            if rank == 1:
                head += [batch["id"].tolist() for batch in iterator]  # its epoch ends
                iterator = iter(loader)
                list(itertools.islice(iterator, 2))  # and the next one begins
            state = loader.state_dict()
            results["ahead"][name] = {"head": head, "state": json.loads(json.dumps(state))}
            dist.barrier()
        loader = guessing_bucket_loader(7, even_batches=False)
        with open(f"{out_dir}/state.json") as handle:
            loader.load_state_dict(json.load(handle))
        try:
            results["empty"] = [batch["id"].tolist() for batch in loader]
        except Exception as error:  # for the test to show (the other cases still run)
            results["empty"] = [type(error).__name__, str(error)]
        dist.barrier()
        for name, options in {"lazy": {"max_instances_in_memory": 6}, "eager": {}}.items():
            loader = guessing_bucket_loader(40, **options)
            iterator = iter(loader)
            try:
                list(itertools.islice(iterator, 2 + rank))
                loader.state_dict()
                results["step"][name] = None
            except Exception as error:
                results["step"][name] = [type(error).__name__, str(error)]
            iterator.close()
            dist.barrier()
        with open(f"{out_dir}/rank{rank}.json", "w") as handle:
            json.dump(results, handle)
    finally:
        dist.destroy_process_group()
