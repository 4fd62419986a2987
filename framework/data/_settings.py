"""`LoaderSettings`: what a `MultiProcessDataLoader` was built with, in the shape its
passes, its instance cache and its saved state need. It never refers to the loader,
so a pass kept between epochs holds no reference to the loader.

`Setting` and `PlanSetting` make the loader's public attributes views of it, so a
setting assigned after construction is the one every part reads."""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Generic, Optional, Protocol, TypeVar, Union, cast, overload

import torch

from framework.data._batching import BatchPlan, derive_seed
from framework.data._checks import stream_problems
from framework.data._pool import LoaderCode, main_thread
from framework.data._position import Position
from framework.data._protocol import Batch, Instances
from framework.data._rng import scoped
from framework.data._worker import WorkerSpec
from framework.data.collate import DataCollator
from framework.data.loader import move_to_device, pin_memory
from framework.data.reader import (
    DatasetReader,
    DatasetReaderInput,
    DistributedInfo,
    current_distributed_info,
)
from framework.data.shard_files import ShardFiles, resolve_source
from framework.errors import ConfigError

__all__ = ["LoaderSettings", "PlanSetting", "Setting"]

_T = TypeVar("_T")


@dataclass
class LoaderSettings:
    """A loader's settings, checked already (`framework.data._checks.validate`).

    `seed` is the loader's seed, or the one it took from `random` when given none.
    The loader's attributes write through to it (`Setting`): a value assigned after
    construction is what the next pass and `state_dict()` read.
    """

    reader: DatasetReader
    data_path: DatasetReaderInput
    plan: BatchPlan
    batches_per_epoch: Optional[int]
    num_workers: int
    start_method: str
    quiet: bool
    collate_fn: DataCollator
    seed: int
    persistent_workers: bool
    pin_memory: bool
    even_batches: bool
    transfer: str
    timeout: Optional[float]
    cuda_device: Optional[torch.device] = None
    cache_dir: Optional[str] = None
    cache_limit: Optional[Union[int, str]] = None
    prefetch: int = 2  # shards fetched ahead of the one being read
    # What `reader.read()` gets: `data_path`, or the shards it names (`resolve`).
    source: Any = None
    shard_seed: int = 0  # the seed given (0 without one): every rank orders shards alike
    # (epoch, {url: sha256}): a loaded state's shards, read with those bytes in that epoch
    pins: Optional[tuple[int, dict[str, str]]] = None

    def resolve(self) -> None:
        """Resolve `data_path` into `source` (see `framework.data.shard_files`):
        listings and a manifest are read here, once, and a `cache_limit` too small for
        `prefetch` is a `ConfigError` here, before any worker starts."""
        problems = stream_problems(self.cache_limit, self.prefetch)
        if problems:
            raise ConfigError(*problems[0])
        self.source = resolve_source(self.data_path, self.cache_dir, self.cache_limit, self.prefetch)

    def source_for(self, epoch: int) -> Any:
        """What the reader reads in lazy epoch `epoch`: streamed shards in an order
        shuffled per epoch when the loader (or its sampler) shuffles, so each epoch's
        chunks mix other shards. Every rank and worker derives the same order."""
        source = self.source
        sampler = self.plan.batch_sampler
        shuffles = self.plan.shuffle or bool(getattr(sampler, "shuffle", False))
        if not isinstance(source, ShardFiles):
            return source
        if shuffles:
            source = source.in_epoch_order(self.shard_seed, epoch)
        if self.pins is not None and self.pins[0] == epoch:
            source = source.pinned(self.pins[1])
        return source

    def decide_dealing(self, position: Position, world: int) -> None:
        """At a pass's start: how it deals streamed shards (`Position.deal` and `split`),
        unless a pass of its epoch decided already (an epoch keeps its dealing)."""
        if position.deal is None:
            position.deal = self.deal(world)
        if position.split is None:
            position.split = self.split(world) if position.deal else 1

    def split(self, world: int) -> int:
        """Ranks splitting each dealt stream's records: all of them when they even their
        batch counts (`even_batches`), else 1 (whole shards to ranks too). Shards differ
        in size: ranks dealt whole ones end far apart, and evening would drop the rest."""
        return world if world > 1 and self.even_batches else 1

    def deal(self, world: int) -> int:
        """As how many streams a lazy epoch starting now deals streamed shards: one per
        reading process (each reads only its own whole shards), or one per worker of a
        rank when the ranks split each stream's records (`split`); 0 to deal records one
        by one: with fewer shards than streams, a reader that shards by itself, or
        `max_instances` (the first records of the whole stream, which no stream alone
        holds)."""
        reader = self.reader
        streams = self.slots_per_rank() * (1 if self.split(world) > 1 else world)
        flags = (reader.manual_distributed_sharding, reader.manual_multiprocess_sharding)
        plans = not any(flags) or (all(flags) and reader.deals_with_shard_iterable)
        source = self.source
        if not (self.lazy and isinstance(source, ShardFiles) and plans and reader.max_instances is None):
            return 0
        return streams if 1 < streams <= len(source) else 0

    def eager_source(self) -> Any:
        """What an eager cache is read from: the source, with a loaded state's pins (the
        cache holds every epoch's instances: they are the bytes the state was saved on)."""
        source = self.source
        if isinstance(source, ShardFiles) and self.pins is not None:
            return source.pinned(self.pins[1])
        return source

    @property
    def hook_overridden(self) -> bool:
        """Whether the reader has its own apply_token_indexers, which the main process runs."""
        return type(self.reader).apply_token_indexers is not DatasetReader.apply_token_indexers

    @property
    def max_instances_in_memory(self) -> Optional[int]:
        return self.plan.max_instances_in_memory

    @property
    def lazy(self) -> bool:
        return self.plan.max_instances_in_memory is not None

    def evened(self) -> bool:
        """Whether ranks agree on batch counts (and so must fail together, never alone)."""
        info = current_distributed_info()
        return info is not None and info.world_size > 1 and self.even_batches

    def epoch_seed(self, epoch: int) -> int:
        info = current_distributed_info()
        rank = info.global_rank if info else 0
        return derive_seed(self.seed, "epoch", epoch, "rank", rank)

    def slots_per_rank(self) -> int:
        """Positions a rank tracks: one per worker in lazy mode, one in eager mode."""
        return max(1, self.num_workers) if self.lazy else 1

    def batch_size_hint(self) -> Optional[int]:
        sampler = self.plan.batch_sampler
        return self.plan.batch_size or (sampler.get_batch_size() if sampler is not None else None)

    def batches_ahead(self) -> int:
        # As AllenNLP sizes its queues: about two chunks' worth of batches per worker.
        chunk = self.max_instances_in_memory or 1024
        return max(2, 2 * chunk // (self.batch_size_hint() or 1))

    def batches_per_chunk(self) -> int:
        return max(1, (self.max_instances_in_memory or 1) // (self.batch_size_hint() or 1))

    def spec(self, info: Optional[DistributedInfo]) -> WorkerSpec:
        """What each worker is started with."""
        # Only CUDA IPC (shared_memory) carries CUDA tensors between processes; a
        # pickle-5 frame carries bytes, so then the batch moves in this process. CUDA
        # can only be initialised in workers that were not forked.
        device = None
        if self.start_method in ("spawn", "forkserver") and self.transfer == "shared_memory":
            device = self.cuda_device
        return WorkerSpec(
            reader=self.reader,
            data_path=self.source,
            plan=self.plan,
            collate_fn=self.collate_fn,
            collate_in_worker=not self.hook_overridden,
            num_workers=self.num_workers,
            distributed=info,
            device=device,
            transfer=self.transfer,  # type: ignore[arg-type]
            set_death_signal=main_thread(),
            start_method=self.start_method,
            prefetch=self.batches_ahead(),
            # Progress messages a few times per timeout, so it measures silence only.
            heartbeat=None if self.timeout is None else self.timeout / 4,
        )

    def finish(self, batch: Any) -> Any:
        """`batch` pinned and on `cuda_device`. Every pass calls it before it counts the
        batch as consumed: an error or Ctrl-C in the copy leaves the batch to the resume.
        Its errors (CUDA out of memory) are the loader's own, never wrapped as WorkerError."""
        with LoaderCode():
            if self.pin_memory and torch.cuda.is_available():
                batch = pin_memory(batch)
            if self.cuda_device is not None:
                batch = move_to_device(batch, self.cuda_device, non_blocking=self.pin_memory)
            return batch

    def prepared(self, message: Union[Batch, Instances]) -> Any:
        """A worker's message made a batch: its tensors, or its instances hooked and
        collated; pinned and moved to the device (`finish`)."""
        if isinstance(message, Batch):
            return self.finish(message.payload)
        with scoped(message.seed) if message.seed is not None else nullcontext():
            for instance in message.instances:  # in the batch's own streams
                self.reader.apply_token_indexers(instance)
            batch = self.collate_fn(message.instances)
        return self.finish(batch)


class _Epochs(Protocol):
    def mid_epoch(self) -> bool: ...


class _Configured(Protocol):
    _settings: LoaderSettings

    @property
    def _progress(self) -> _Epochs: ...

    def _setting_changed(self, reads_data: bool) -> None: ...


class Setting(Generic[_T]):
    """A loader attribute that lives in the loader's `LoaderSettings` (its `_settings`):
    reading and assigning it read and assign the settings the passes, the instance
    cache and the saved state use, so the attribute is their one source of truth.

    A setting that decides which instances an epoch holds or how they batch
    (`shapes_epoch`) cannot change while an epoch is under way: the epoch was read and
    batched with the old value, and a state saved then would pair the old position
    with the new value. A new value reaches the workers too: persistent workers,
    started with the old one, are not kept; and a setting that decides what is read
    (`reads_data`) drops the instances the eager cache read with the old one."""

    def __init__(self, *, shapes_epoch: bool = False, reads_data: bool = False) -> None:
        self.shapes_epoch = shapes_epoch or reads_data
        self.reads_data = reads_data

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, loader: None, owner: type) -> Setting[_T]: ...

    @overload
    def __get__(self, loader: _Configured, owner: type) -> _T: ...

    def __get__(self, loader: Optional[_Configured], owner: type) -> Union[Setting[_T], _T]:
        if loader is None:
            return self
        return cast(_T, self.read(loader._settings))

    def __set__(self, loader: _Configured, value: _T) -> None:
        if self.shapes_epoch and loader._progress.mid_epoch():
            raise ValueError(
                f"{self.name} cannot change in the middle of an epoch: the epoch under way was "
                f"read and batched with the old value. Assign it between epochs (after a pass "
                f"has run to its end), or build a new loader"
            )
        old = self.read(loader._settings)
        self.write(loader._settings, value)
        if not _same(old, value):
            try:
                loader._setting_changed(self.reads_data)
            except BaseException:  # refused (a ConfigError): the loader keeps what it had
                self.write(loader._settings, old)
                raise

    def read(self, settings: LoaderSettings) -> Any:
        return getattr(settings, self.name)

    def write(self, settings: LoaderSettings, value: _T) -> None:
        setattr(settings, self.name, value)


def _same(old: Any, new: Any) -> bool:
    """Whether an assignment keeps the value (the same object, or an equal plain one)."""
    if old is new:
        return True
    try:
        return bool(isinstance(new, (bool, int, float, str)) and old == new)
    except Exception:
        return False


class PlanSetting(Setting[_T]):
    """A `Setting` of the batch plan (batch size, sampler, ...): the plan is immutable,
    so an assignment replaces it."""

    def __init__(self) -> None:
        super().__init__(shapes_epoch=True)

    def read(self, settings: LoaderSettings) -> Any:
        return getattr(settings.plan, self.name)

    def write(self, settings: LoaderSettings, value: _T) -> None:
        changed: dict[str, Any] = {self.name: value}
        settings.plan = dataclasses.replace(settings.plan, **changed)
