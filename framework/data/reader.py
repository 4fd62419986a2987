"""`DatasetReader`: turns a data path into instances, sharded across workers and ranks.

A reader implements `_read(file_path)`; `read(file_path)` wraps it so that, in a
multi-process loader or under torch.distributed, every worker of every rank sees a
disjoint share of the data. Readers that can shard faster themselves (by file, by
byte offset) set `manual_multiprocess_sharding` / `manual_distributed_sharding` and
use `shard_iterable` or `get_worker_info()` / `get_distributed_info()`.

This module must not import torch at import time: plugin listing imports it.
"""

from __future__ import annotations

import itertools
import os
import sys
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Optional, TypeVar, Union

from framework.config import ConfigChecks
from framework.data._shards import Seekable, ShardPlan
from framework.registry import Registrable

__all__ = [
    "DatasetReader",
    "DatasetReaderInput",
    "DistributedInfo",
    "Instance",
    "Seekable",
    "UnshardedReadWarning",
    "WorkerInfo",
]

_T = TypeVar("_T")

Instance = Any
"""An instance is any picklable object; dicts of tensors, numbers and strings batch by default."""

PathOrStr = Union[str, os.PathLike]  # type: ignore[type-arg]
DatasetReaderInput = Union[str, os.PathLike, List[Any], Dict[str, Any]]  # type: ignore[type-arg]
"""What `read()` accepts: a path, or a list or dict of them when a reader supports it."""


class UnshardedReadWarning(UserWarning):
    """Every loader worker parses every record: the reader does not shard by worker."""


@dataclass(frozen=True)
class WorkerInfo:
    """Where a reader runs inside a multi-process loader: `id` of `num_workers` workers."""

    num_workers: int
    id: int


@dataclass(frozen=True)
class DistributedInfo:
    """Where a reader runs under torch.distributed: `global_rank` of `world_size` ranks."""

    world_size: int
    global_rank: int


def _reader_problems(arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    """`DatasetReader`'s own rules on its arguments (see `DatasetReader.config_checks`)."""
    max_instances = arguments.get("max_instances")
    if isinstance(max_instances, (int, float)) and max_instances < 0:
        return [("max_instances", f"max_instances must be None or >= 0, got {max_instances}")]
    return []


_OWN_CHECKS = ConfigChecks(_reader_problems, {"properties": {"max_instances": {"minimum": 0}}})


def shard_quota(total: int, num_shards: int, shard: int) -> int:
    """How many of the first `total` items fall to `shard` when dealt round-robin."""
    return total // num_shards + (1 if shard < total % num_shards else 0)


class DatasetReader(Registrable):
    """Reads instances from a data path; subclasses implement `_read(file_path)`.

    Args:
        max_instances: stop after this many instances in total, across every worker
            and rank (each shard reads its exact share of the first `max_instances`).
        manual_distributed_sharding: `_read` shards by rank itself (with
            `shard_iterable` or `get_distributed_info()`), so `read` does not.
        manual_multiprocess_sharding: `_read` shards by loader worker itself (with
            `shard_iterable` or `get_worker_info()`), so `read` does not.
        serialization_dir: where a run keeps its outputs, for readers that need it.

    `apply_token_indexers(instance)` is a hook that runs in the main process on every
    instance, after it has crossed from a worker: attach unpicklable or heavy
    objects (vocabularies, tokenizer handles) there, not in `_read`.
    """

    deterministic: bool = True
    """Whether `_read` yields the same instances in the same order every run (given the
    loader's seeded streams). A reader that cannot promise it (a directory listing, a
    database query without ORDER BY, a draw from its own unseeded generator) sets it to
    False: `load_state_dict()` then refuses to resume it rather than resume it wrong."""

    deals_with_shard_iterable: bool = False
    """For a reader with both manual sharding flags: whether `_read` deals its records
    only through `shard_iterable()` (the built-in readers do). Then, as for a reader
    without the flags, the loader may hand each worker only its own whole shards of a
    streamed dataset (`data_path` naming remote shards) instead of every shard."""

    # Class-level defaults keep a subclass that forgets super().__init__() working.
    max_instances: Optional[int] = None
    manual_distributed_sharding: bool = False
    manual_multiprocess_sharding: bool = False
    serialization_dir: Optional[str] = None
    _worker_info: Optional[WorkerInfo] = None
    _distributed_info: Optional[DistributedInfo] = None
    _distributed_info_set: bool = False
    _shard_helper_used: bool = False
    _info_queried: bool = False
    _shard_plan: Optional[ShardPlan] = None  # set by the loader for its next read()
    _reading: Optional[ShardPlan] = None  # the plan of the read() now making an instance
    # The rules on the arguments that annotations cannot state, as (key, what to change)
    # pairs: each constructor raises its own, and `framework.config.validate` reports
    # them all from a config before anything is built. A subclass with rules of its
    # own sets `config_checks = Parent.config_checks.extended(its_problems)` and
    # calls `ConfigChecks(its_problems).enforce(...)` in its `__init__`.
    config_checks: ClassVar[ConfigChecks] = _OWN_CHECKS

    def __init__(
        self,
        max_instances: Optional[int] = None,
        manual_distributed_sharding: bool = False,
        manual_multiprocess_sharding: bool = False,
        serialization_dir: Optional[str] = None,
    ) -> None:
        _OWN_CHECKS.enforce({"max_instances": max_instances})
        self.max_instances = max_instances
        self.manual_distributed_sharding = manual_distributed_sharding
        self.manual_multiprocess_sharding = manual_multiprocess_sharding
        self.serialization_dir = serialization_dir
        self._worker_info = None
        self._distributed_info = None

    def read(self, file_path: DatasetReaderInput) -> Iterator[Instance]:
        """Yield this worker's and rank's share of the instances in `file_path`.

        Called directly, `apply_token_indexers` runs on each instance here; when a
        loader reads (in a worker or in this process), the loader runs it, in the main
        process, after the sampler and in random streams of its own.
        """
        # Reset before _read runs: a _read that returns a list has done its work (and
        # its sharding) by the time the instances are iterated.
        self._shard_helper_used = False
        self._info_queried = False
        # The loader's plan is for this read only: the reader's other reads (the
        # caller's own, between batches) read as if there were none.
        plan, self._shard_plan = self._shard_plan, None
        previous, self._reading = self._reading, plan
        try:
            instances = self._multi_worker_islice(self._read(file_path), plan)
        finally:
            self._reading = previous
        if plan is not None:
            instances = self._under(plan, instances)
        overridden = type(self).apply_token_indexers is not DatasetReader.apply_token_indexers
        if self._worker_info is not None or plan is not None or not overridden:
            # The hook is a no-op, or the loader runs it (after crossing from a worker,
            # after the sampler, in streams of its own; it set the plan).
            yield from instances
            return
        for instance in instances:
            self.apply_token_indexers(instance)
            yield instance

    def _under(self, plan: ShardPlan, instances: Iterator[Instance]) -> Iterator[Instance]:
        """`instances`, with `plan` the one `shard_iterable` deals by while each is made."""
        while True:
            previous, self._reading = self._reading, plan
            try:
                instance = next(instances)
            except StopIteration:
                return
            finally:
                self._reading = previous
            yield instance

    def _read(self, file_path: DatasetReaderInput) -> Iterable[Instance]:
        """Yield instances from `file_path`; a generator keeps lazy loading lazy."""
        raise NotImplementedError(f"{type(self).__name__} must implement _read(file_path)")

    def text_to_instance(self, *inputs: Any) -> Instance:
        """Build one instance from raw inputs (for prediction); optional."""
        raise NotImplementedError(f"{type(self).__name__} does not implement text_to_instance")

    def apply_token_indexers(self, instance: Instance) -> None:
        """Main-process hook run on each instance before batching; may change it in place.

        Readers that override it get their instances batched in the main process
        (after this hook) rather than in the workers.
        """
        return None

    def get_worker_info(self) -> Optional[WorkerInfo]:
        """The loader worker this reader runs in, or None in the main process."""
        self._info_queried = True  # a manual-sharding reader that asks shards by itself
        return self._worker_info

    def get_distributed_info(self) -> Optional[DistributedInfo]:
        """This process's rank and the world size under torch.distributed, else None."""
        self._info_queried = True
        return self._dist_info()

    def _dist_info(self) -> Optional[DistributedInfo]:
        if self._distributed_info_set:
            return self._distributed_info
        return current_distributed_info()

    def _set_worker_info(self, info: Optional[WorkerInfo]) -> None:
        """Set by the loader inside a worker; not for users."""
        self._worker_info = info

    def _set_distributed_info(self, info: Optional[DistributedInfo]) -> None:
        """Set by the loader (workers may not see the process group); not for users."""
        self._distributed_info = info
        self._distributed_info_set = True

    def _set_shard_plan(self, plan: Optional[ShardPlan]) -> None:
        """Set by the loader: deal records by `plan` (resumable), not by worker and rank."""
        self._shard_plan = plan

    def shard_iterable(self, iterable: Iterable[_T]) -> Iterator[_T]:
        """This worker's and rank's share of `iterable`, dealt round-robin.

        For readers with both manual sharding flags set: call it inside `_read` on
        something cheap (lines, file names) before the expensive work. The share
        respects `max_instances` exactly.

        Resuming (the reader hook): `iterable` is the reader's stream of records, one
        instance each (or none), yielded by a generator that takes the next record
        only when it needs it; the loader counts records to know which ones a resumed
        epoch still owes. If `iterable` opts into `Seekable` (`tell()`, `seek(token)`
        and the class attribute `__framework_seekable__ = True`; the built-in readers'
        records do; an open file does not), a
        resumed epoch seeks there instead of reading the records it skips.
        """
        if not (self.manual_distributed_sharding and self.manual_multiprocess_sharding):
            raise ValueError(
                f"{type(self).__name__}.shard_iterable() was called but "
                "manual_distributed_sharding and manual_multiprocess_sharding are not both "
                "True. Pass manual_distributed_sharding=True, manual_multiprocess_sharding=True "
                "to super().__init__() in the reader's constructor."
            )
        self._shard_helper_used = True
        if self._reading is not None:
            return self._reading.filter(iterable, self.max_instances)
        iterator: Iterator[_T] = iter(iterable)
        if self.max_instances is not None:
            iterator = itertools.islice(iterator, self.max_instances)
        return self._deal(iterator, distributed=True, multiprocess=True)

    def _deal(self, iterator: Iterator[_T], *, distributed: bool, multiprocess: bool) -> Iterator[_T]:
        dist_info = self._dist_info()
        worker_info = self._worker_info
        if distributed and dist_info is not None and dist_info.world_size > 1:
            iterator = itertools.islice(iterator, dist_info.global_rank, None, dist_info.world_size)
        if multiprocess and worker_info is not None and worker_info.num_workers > 1:
            iterator = itertools.islice(iterator, worker_info.id, None, worker_info.num_workers)
        return iterator

    def _shard_position(self) -> tuple[int, int]:
        """(this shard's index, number of shards), ranks outer and workers inner."""
        dist_info = self._dist_info()
        worker_info = self._worker_info
        world, rank = (dist_info.world_size, dist_info.global_rank) if dist_info else (1, 0)
        workers, wid = (worker_info.num_workers, worker_info.id) if worker_info else (1, 0)
        # Item i of the full stream goes to rank i % world, then worker (i // world) % workers,
        # so shard p = rank + world * worker owns the items with i % (world * workers) == p.
        return rank + world * wid, world * workers

    def _multi_worker_islice(self, iterable: Iterable[_T], plan: Optional[ShardPlan] = None) -> Iterator[_T]:
        """Apply automatic sharding and the `max_instances` limit to `_read`'s output."""
        auto_dist = not self.manual_distributed_sharding
        auto_workers = not self.manual_multiprocess_sharding
        iterator: Iterator[_T] = iter(iterable)
        if auto_dist and auto_workers and plan is not None:
            yield from plan.filter(iterable, self.max_instances)
            return
        if auto_dist and auto_workers:
            # Fully automatic: taking the first max_instances before dealing makes the
            # shards together hold exactly the first max_instances items.
            if self.max_instances is not None:
                iterator = itertools.islice(iterator, self.max_instances)
            yield from self._deal(iterator, distributed=True, multiprocess=True)
            return
        iterator = self._deal(iterator, distributed=auto_dist, multiprocess=auto_workers)
        if self.max_instances is not None:
            shard, num_shards = self._shard_position()
            iterator = itertools.islice(iterator, shard_quota(self.max_instances, num_shards, shard))
        count = 0
        for count, item in enumerate(iterator, 1):  # noqa: B007 (count is used below)
            yield item
        if count:  # a shard whose quota is 0 never started _read, so cannot tell
            self._warn_if_unsharded()

    def _warn_if_unsharded(self) -> None:
        if self._shard_helper_used or self._info_queried:
            return
        dist_info = self._dist_info()
        worker_info = self._worker_info
        if worker_info is not None and worker_info.id != 0:
            return  # every worker reads the same way: one of them says so, not all
        unsharded = []
        if self.manual_multiprocess_sharding and worker_info and worker_info.num_workers > 1:
            unsharded.append("manual_multiprocess_sharding")
        if self.manual_distributed_sharding and dist_info and dist_info.world_size > 1:
            unsharded.append("manual_distributed_sharding")
        if not unsharded:
            return
        # Point at the reader's _read (not at this module), and record it in that
        # module's registry so the default filter shows it once, not once per epoch.
        code = getattr(type(self)._read, "__code__", None)
        module = sys.modules.get(type(self).__module__)
        warnings.warn_explicit(
            f"{type(self).__name__} sets {' and '.join(unsharded)}=True but its _read() "
            "never called shard_iterable(), get_worker_info() or get_distributed_info(), so "
            "every shard may have read the same instances (duplicates). Call "
            "self.shard_iterable(...) inside _read(), or leave the flag False to let read() "
            "shard for you.",
            UserWarning,
            code.co_filename if code else __file__,
            code.co_firstlineno if code else 0,
            registry=vars(module).setdefault("__warningregistry__", {}) if module else None,
        )


def current_distributed_info() -> Optional[DistributedInfo]:
    """Rank and world size from torch.distributed, without importing torch."""
    if "torch.distributed" not in sys.modules:
        return None  # torch.distributed was never imported, so no group is initialized
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    return DistributedInfo(world_size=dist.get_world_size(), global_rank=dist.get_rank())
