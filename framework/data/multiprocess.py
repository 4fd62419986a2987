"""`MultiProcessDataLoader`: AllenNLP's loader, crash-proof, deterministic and resumable.

Two modes, as in AllenNLP:

- **eager** (`max_instances_in_memory=None`): every instance is read once (in
  `num_workers` workers, or in this process) and cached; each epoch samples and
  collates from the cache in the main process.
- **lazy** (`max_instances_in_memory=N`): each epoch streams the data again. Each
  worker reads its shard, applies the sampler (or shuffle) to N instances at a
  time, collates the batch *in the worker* and ships the tensors out of band
  (pickle protocol 5 over a pipe), so the main process only receives batches.

Where `apply_token_indexers` runs: it is a main-process hook, as in AllenNLP. If
the reader overrides it, workers ship each batch's instances (not tensors) and the
main process applies the hook and then collates; if it does not, workers collate.
Either way the batch sampler sees instances before the hook.

Batches come out round-robin across workers (batch i from worker i % n while all
are running), so a `seed` gives the same batches run after run, and `state_dict()`
can say exactly where an epoch stands.
"""

from __future__ import annotations

import copy
import math
import os
import warnings
from collections.abc import Iterator, Mapping
from typing import Any, Optional, Union

import torch

from framework.data._batching import BatchPlan
from framework.data._cache import InstanceCache
from framework.data._checks import as_device, config_checks, validate
from framework.data._distributed import agree
from framework.data._lease import WorkerPools
from framework.data._pass import LoaderPass, Progress
from framework.data._pool import WorkerPool
from framework.data._position import Position
from framework.data._rng import unseeded_seed
from framework.data._settings import LoaderSettings, PlanSetting, Setting
from framework.data._state import resumed_position, whole_state
from framework.data._worker import WorkerSpec
from framework.data.collate import DataCollator, DefaultDataCollator
from framework.data.loader import DataLoader, TensorDict
from framework.data.reader import DatasetReader, DatasetReaderInput, DistributedInfo, Instance
from framework.data.sampler import BatchSampler
from framework.data.shard_files import ShardFiles
from framework.errors import ResumeError

__all__ = ["MultiProcessDataLoader"]


class MultiProcessDataLoader(DataLoader):
    """Reads with `reader` from `data_path` in `num_workers` processes and yields batches.

    Args:
        reader: the `DatasetReader`; it is copied into each worker.
        data_path: passed to `reader.read()`; or shards, local or remote: a list of
            paths and URLs, a glob on a backend that lists (`"s3://b/train/*.jsonl.gz"`,
            `"/data/train-*.csv"`), a brace range (`"https://h/t-{000..255}.gz"`) or
            `"manifest:URL"`. They reach the reader as a `ShardFiles` (a sequence of
            local paths; a remote shard is fetched through the download manager when the
            reader comes to it). A plain list of local files is passed as it is. See
            `docs/howto/streaming.md`.
        batch_size: instances per batch (without a `batch_sampler`).
        drop_last: drop a final short batch (without a `batch_sampler`). In lazy mode
            each worker's last batch may be short.
        shuffle: shuffle instances each epoch (without a `batch_sampler`); in lazy mode
            within chunks of `max_instances_in_memory`.
        batch_sampler: a `BatchSampler`, instead of batch_size/drop_last/shuffle.
        batches_per_epoch: yield exactly this many batches per `iter()`; a pass left
            half-used carries over into the next epoch (once the epoch's last batch is
            taken; an epoch cut short before it, by `break` or an exception, is yielded
            to its end by the next `iter()`), and a new pass starts when data runs out.
        num_workers: worker processes; 0 reads in this process. Each worker parses
            every record and keeps its share unless the reader shards by worker
            (`shard_iterable`); with more than one worker the loader says so
            (`UnshardedReadWarning`, once per reader class under the default filter).
        max_instances_in_memory: turns on lazy mode, holding about this many instances
            per worker at a time.
        start_method: "fork", "spawn" or "forkserver".
        cuda_device: put batches on this device (in the worker under spawn/forkserver,
            in the main process under fork, where CUDA cannot be used in workers): a CUDA
            index (0 is `cuda:0`), a device string (`"cuda:1"`, `"cpu"`) or a
            `torch.device`; anything else (-1, `"gpu0"`, `"1"`) is a `ConfigError`.
        quiet: no tqdm progress bars.
        collate_fn: turns a list of instances into a batch.
        seed: seeds shuffling, samplers and the workers' random/numpy/torch (from
            seed, epoch, rank and worker id); the same seed gives the same batches. Every
            draw of the reader, collator and hook comes from streams of the loader's own,
            and the caller's random/numpy/torch streams are left untouched. None: a seed
            from the state of `random`, taken without drawing from it.
        persistent_workers: keep lazy-mode workers alive between epochs.
        pin_memory: copy batches into pinned memory (when CUDA is available).
        even_batches: under torch.distributed, every rank yields the same number of
            batches (the shortest rank's), so collective ops never wait forever.
        transfer: "pickle5" (tensors as out-of-band bytes over a pipe) or
            "shared_memory" (torch's shared-memory tensors).
        timeout: raise `WorkerError` if a worker sends nothing for this many seconds
            (fractions work). A reader that is slow but still producing instances
            sends progress messages, so only silence counts, not a slow batch.
        cache_dir: the cache folder remote shards are fetched into (None: the download
            manager's, `$FRAMEWORK_CACHE` or `~/.cache/framework`).
        cache_limit: the most bytes (an int, or `"50GB"`) the dataset's fetched shards
            may take there, beyond the shards being read or fetched; None: no bound.
            The shard whose next use is farthest goes first; a shard any process is
            reading is never removed. Too small for `prefetch` + 1 shards: `ConfigError`.
        prefetch: remote shards each reading process fetches ahead of the one it reads
            (without `cache_limit`, up to 4 times as many while its reader still waits).

    Failures never hang: reader, sampler, collator or `apply_token_indexers` code that
    raises while the data is read (in eager mode, at construction) ends iteration with
    `WorkerError`, whatever `num_workers`: its traceback in `str()`, the original
    exception as `__cause__` (`worker_id` None when it ran in this process). A worker
    killed by a signal gives `WorkerError` naming the worker and the signal; an early
    `break`, Ctrl-C or garbage collection stops every worker. Bad input:

    - a reader that yields nothing: `ValueError` (in eager mode, at construction);
    - a `data_path` that does not exist: `WorkerError`, the reader's error
      (`FileNotFoundError`) as its `__cause__`;
    - instances the collator cannot batch: `WorkerError`, `CollateError` naming the
      field as its `__cause__`;
    - a sampler returning indices out of range: `WorkerError`, a `ValueError` naming
      the sampler as its `__cause__`;
    - more workers than instances: the extra workers find their shards empty.

    Under torch.distributed (set up before the loader is built) each rank reads a
    disjoint shard. With `even_batches`, eager mode trims every rank's epoch to the
    shortest rank's (one `all_reduce` per epoch; `len()` stays the local count) and
    lazy mode stops all ranks when any runs out (one tiny `all_reduce` per batch; with
    `batches_per_epoch`, where every rank yields that many, it carries only the error
    flag). Those collectives carry an error flag: a rank that fails before them, or
    whose shard is empty, makes every rank raise (a copy of its error, naming it), never
    wait. (An eager rank that fails mid-epoch, after the once-per-epoch agreement, fails
    alone.)

    `state_dict()` is plain data (and a collective under torch.distributed: every rank
    calls it after the same batch, else `RanksOutOfStepError`, and gets the same
    whole-job state). It describes what the loader yields next: a pass cut short by
    `break` or an exception (Ctrl-C included) is not over, so the state holds its rest
    and the next `iter()` yields that rest. `load_state_dict` resumes a state saved
    with any num_workers or world size: the same ones batch for batch, others with every
    instance the epoch has not yielded yet, exactly once. It refuses (ValueError naming
    the setting) a state from a loader that reads or batches differently: batch settings
    or sampler, data_path, reader type, or another state format version.
    """

    # the rules __init__ checks its settings by, for `framework.config.validate` to run on a config
    config_checks = staticmethod(config_checks)

    # The settings, as attributes: an assignment after construction takes effect (the
    # next pass, `len()` and `state_dict()` read it), as for a plain attribute.
    reader: Setting[DatasetReader] = Setting(reads_data=True)
    data_path: Setting[DatasetReaderInput] = Setting(reads_data=True)
    batch_size: PlanSetting[Optional[int]] = PlanSetting()
    drop_last: PlanSetting[bool] = PlanSetting()
    shuffle: PlanSetting[bool] = PlanSetting()
    batch_sampler: PlanSetting[Optional[BatchSampler]] = PlanSetting()
    max_instances_in_memory: PlanSetting[Optional[int]] = PlanSetting()
    batches_per_epoch: Setting[Optional[int]] = Setting()
    num_workers: Setting[int] = Setting()
    start_method: Setting[str] = Setting()
    quiet: Setting[bool] = Setting()
    collate_fn: Setting[DataCollator] = Setting()
    persistent_workers: Setting[bool] = Setting()
    pin_memory: Setting[bool] = Setting()
    even_batches: Setting[bool] = Setting()
    transfer: Setting[str] = Setting()
    timeout: Setting[Optional[float]] = Setting()
    cache_dir: Setting[Optional[str]] = Setting(reads_data=True)
    cache_limit: Setting[Optional[Union[int, str]]] = Setting(reads_data=True)
    prefetch: Setting[int] = Setting(reads_data=True)

    def __init__(
        self,
        reader: DatasetReader,
        data_path: DatasetReaderInput,
        *,
        batch_size: Optional[int] = None,
        drop_last: bool = False,
        shuffle: bool = False,
        batch_sampler: Optional[BatchSampler] = None,
        batches_per_epoch: Optional[int] = None,
        num_workers: int = 0,
        max_instances_in_memory: Optional[int] = None,
        start_method: str = "fork",
        cuda_device: Optional[Union[int, str, torch.device]] = None,
        quiet: bool = False,
        collate_fn: DataCollator = DefaultDataCollator(),  # noqa: B008 (stateless)
        seed: Optional[int] = None,
        persistent_workers: bool = False,
        pin_memory: bool = False,
        even_batches: bool = True,
        transfer: str = "pickle5",
        timeout: Optional[float] = None,
        cache_dir: Optional[str] = None,
        cache_limit: Optional[Union[int, str]] = None,
        prefetch: int = 2,
    ) -> None:
        validate(
            batch_size=batch_size,
            drop_last=drop_last,
            shuffle=shuffle,
            batch_sampler=batch_sampler,
            batches_per_epoch=batches_per_epoch,
            num_workers=num_workers,
            max_instances_in_memory=max_instances_in_memory,
            start_method=start_method,
            persistent_workers=persistent_workers,
            transfer=transfer,
            timeout=timeout,
            cuda_device=cuda_device,
            cache_limit=cache_limit,
            prefetch=prefetch,
        )
        self._seed = seed
        self._settings = LoaderSettings(
            reader=reader,
            data_path=data_path,
            plan=BatchPlan(batch_size, drop_last, shuffle, batch_sampler, max_instances_in_memory),
            batches_per_epoch=batches_per_epoch,
            num_workers=num_workers,
            start_method=start_method,
            quiet=quiet,
            collate_fn=collate_fn,
            # Unseeded: a seed from `random`'s state, which is not drawn from (reproducible
            # if the caller seeds `random` before building the loader).
            seed=unseeded_seed() if seed is None else seed,
            persistent_workers=persistent_workers,
            pin_memory=pin_memory,
            even_batches=even_batches,
            transfer=transfer,
            timeout=timeout,
            cache_dir=None if cache_dir is None else os.fspath(cache_dir),
            cache_limit=cache_limit,
            prefetch=prefetch,
            shard_seed=0 if seed is None else seed,
        )
        self._settings.resolve()  # shards listed, budget checked: before any worker starts
        if cuda_device is not None:
            self.set_target_device(cuda_device)
        if pin_memory and not torch.cuda.is_available():
            warnings.warn(
                "pin_memory=True but CUDA is not available: batches are not pinned",
                stacklevel=2,
            )
        self._pools = WorkerPools(self._settings)  # the loader owns its workers
        self._cache = InstanceCache(self._settings, self._pools)
        self._progress = Progress()
        # batches_per_epoch: the pass an epoch left half-used, for the next epoch
        self._carried: Optional[LoaderPass] = None
        if max_instances_in_memory is None:
            self._load_instances()  # eager mode reads everything up front, as AllenNLP does

    @property
    def seed(self) -> Optional[int]:
        """The seed given (None: unseeded, a seed taken from `random`'s state)."""
        return self._seed

    @seed.setter
    def seed(self, seed: Optional[int]) -> None:
        if isinstance(self._settings.source, ShardFiles) and self._progress.mid_epoch():
            raise ValueError(
                "seed cannot change in the middle of an epoch of streamed shards: it orders "
                "the shards the epoch under way reads. Assign it between epochs"
            )
        self._seed = seed
        self._settings.seed = unseeded_seed() if seed is None else seed
        self._settings.shard_seed = 0 if seed is None else seed

    @property
    def cuda_device(self) -> Optional[torch.device]:
        """Where batches go (`set_target_device`); None: where the collator made them."""
        return self._settings.cuda_device

    @cuda_device.setter
    def cuda_device(self, device: Optional[torch.device]) -> None:
        self._settings.cuda_device = device

    # -- the DataLoader interface -------------------------------------------------------

    def __len__(self) -> int:
        if self.batches_per_epoch is not None:
            return self.batches_per_epoch
        if self.max_instances_in_memory is not None:
            raise TypeError(
                "a lazy MultiProcessDataLoader (max_instances_in_memory set) cannot know its "
                "number of batches; set batches_per_epoch, or use eager mode"
            )
        instances = self._load_instances()
        if self.batch_sampler is not None:
            return self.batch_sampler.get_num_batches(instances)
        assert self.batch_size is not None
        count = len(instances) / self.batch_size
        return math.floor(count) if self.drop_last else math.ceil(count)

    def __iter__(self) -> Iterator[TensorDict]:
        if self.batches_per_epoch is None:
            current = self._new_pass()
            try:
                yield from current
            finally:
                current.close()  # at once, also when an exception is thrown in here
            return
        yield from self._epoch(self.batches_per_epoch)

    def _epoch(self, batches_per_epoch: int) -> Iterator[TensorDict]:
        """One epoch of `batches_per_epoch` batches: as AllenNLP's, the pass that is not
        used up carries over into the next epoch."""
        progress = self._progress
        current: Optional[LoaderPass] = self._carried or self._new_pass()
        self._carried = None
        # Lazy ranks have no collective of their own here: each batch's failure is shared.
        shared = self._settings.evened() and self.max_instances_in_memory is not None
        # > 0: resumed mid-epoch. Kept until a batch is yielded: a pass cut short before
        # its first batch (an exception in next()) still owes the same rest of the epoch.
        # Not while another iter() is still counting its epoch: this one is a whole epoch.
        start = progress.epoch_batches if progress.epoch_batches < batches_per_epoch else 0
        if progress.counting is not None:
            start = 0
        counting = progress.counting = object()  # the newest iter() is the one the state counts
        progress.epoch_batches = start
        try:
            for index in range(start, batches_per_epoch):
                assert current is not None
                try:
                    current, batch = self._next_batch(current)
                except Exception as error:
                    if not shared:
                        raise
                    agree(0, error)  # raises on every rank
                    raise
                if shared:
                    agree(1, None)
                if index == batches_per_epoch - 1:
                    # Hand the pass over before the last yield: a consumer that takes
                    # exactly len(loader) batches (islice, zip) never resumes us.
                    self._carried, current = current, None
                if progress.counting is counting:
                    progress.epoch_batches = (index + 1) % batches_per_epoch
                    if progress.epoch_batches == 0:
                        progress.loop_epoch += 1  # its last batch: the state describes the next
                yield batch
        finally:
            if progress.counting is counting:
                progress.counting = None
            if current is not None:
                # Cut short: the pass stays pending and `epoch_batches` counts what this
                # epoch yielded, so the next iter() yields the rest of the epoch.
                current.close()

    def _next_batch(self, current: LoaderPass) -> tuple[LoaderPass, TensorDict]:
        """The next batch of `current`, or of a fresh pass when the data ran out."""
        try:
            return current, next(current)
        except StopIteration:
            pass
        current = self._new_pass()
        try:
            return current, next(current)
        except StopIteration:
            raise ValueError(
                f"a full pass over {self.data_path!r} yields no batches, so "
                f"batches_per_epoch={self.batches_per_epoch} can never be met; "
                "check the data, or drop_last with fewer instances than batch_size"
            ) from None

    def iter_instances(self) -> Iterator[Instance]:
        """Yield every instance after `apply_token_indexers` (cached in eager mode)."""
        if self._cache.instances is not None:
            yield from self._cache.instances
            return
        if self.max_instances_in_memory is None:
            yield from self._load_instances()
            return
        # One swap of the loader's random streams per chunk (memory stays bounded).
        for instance, _ in self._cache.read(step=self.max_instances_in_memory):
            yield instance

    def _setting_changed(self, reads_data: bool) -> None:
        """A setting was assigned a new value (see `Setting`): persistent workers started
        with the old one are not kept (a pass reading from them keeps them to its end),
        and instances read with an old reader or data_path are read again."""
        if reads_data:
            self._settings.resolve()  # first: a refused value changes nothing
        self._pools.retire()
        if reads_data:
            self._cache.forget()

    def set_target_device(self, device: Union[int, str, torch.device]) -> None:
        new = as_device(device)  # ConfigError for a device torch would not take
        # getattr: __init__ calls this before the pools exist
        if new != self.cuda_device and getattr(self, "_pools", None) is not None:
            # Persistent workers hold the old device; a pass reading from them keeps them
            # to its end (its batches move to the new device in this process).
            self._pools.retire()
        self.cuda_device = new

    def state_dict(self) -> dict[str, Any]:
        """Where iteration stands, as plain data; `load_state_dict` resumes there.

        Call it inside the training loop or after it: a pass cut short (`break`, an
        exception, Ctrl-C) is not over, and the state describes its rest (which the
        next `iter()` yields too); after a pass that ran to its end, the next epoch.
        Under torch.distributed this is a collective (every rank calls it after the
        same batch; one small `all_reduce` and one `all_gather_object`) and every
        rank returns the same whole-job state; ranks out of step raise
        `RanksOutOfStepError` at once. Its `"loop_epoch"` is the training loop's epoch
        to restart at (the next `iter()` yields it, or its rest); `"epoch"` counts
        passes over the data, which differ with `batches_per_epoch`.
        """
        return whole_state(self._settings, self._progress, self._cache)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a `state_dict()`, saved with any num_workers or world size.

        The same num_workers and world size resume batch for batch; others deal out
        the records the epoch has not yielded yet over this loader's ranks and workers.
        Settings that would change which instances exist or how they batch (reader,
        data_path, batch settings, sampler) must be the same: `ResumeError` (a
        ValueError) naming them.
        """
        shards = state.get("shards") if isinstance(state, Mapping) else None  # by URL: their sha256
        if shards is not None and not (
            isinstance(shards, Mapping)
            and all(
                isinstance(url, str) and isinstance(sha, str) and len(sha) == 64
                for url, sha in shards.items()
            )
        ):
            raise ResumeError(
                f"the state's 'shards' must map shard URLs to sha256 digests, got {shards!r}; "
                "pass the loader's own state_dict()",
                "malformed",
            )
        # The pins first: an eager cache read to check the state reads the pinned bytes.
        pins, self._settings.pins = self._settings.pins, None
        if shards is not None:
            self._settings.pins = (state.get("epoch", 0), dict(shards))
        try:
            position = resumed_position(self._settings, self._cache, state)
            epoch_batches = state.get("epoch_batches", 0)  # absent: a state from before the count
            # absent: a state from before the count (right without batches_per_epoch)
            loop_epoch = state.get("loop_epoch", position.epoch)
            for key, value in (("epoch_batches", epoch_batches), ("loop_epoch", loop_epoch)):
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise ValueError(
                        f"the state's {key!r} must be an int >= 0, got {value!r}; "
                        "pass the loader's own state_dict()"
                    )
        except BaseException:
            self._settings.pins = pins  # refused: the loader is as it was
            raise
        self._close_carried()
        self._pools.shutdown()
        self._settings.pins = None if shards is None else (position.epoch, dict(shards))
        self._progress.resume_at(position, epoch_batches, loop_epoch)

    def close(self) -> None:
        """Stop any workers now (they are also stopped when the loader is collected)."""
        self._pools.closes += 1  # ends a pass whose workers are starting (another thread)
        self._close_carried()
        self._pools.shutdown()

    def __copy__(self) -> MultiProcessDataLoader:
        """The same settings at the same point, but its own: assigning a setting or
        `set_target_device` on one leaves the other alone, and each starts its own
        workers. It shares the instances an eager loader has read."""
        other = type(self).__new__(type(self))
        other.__dict__.update(self.__dict__)
        other._settings = copy.copy(self._settings)
        other._settings.source = copy.copy(self._settings.source)  # shards held: each loader its own
        other._pools = WorkerPools(other._settings)
        other._cache = self._cache.shared(other._settings, other._pools)
        other._progress = copy.deepcopy(self._progress)
        other._carried = None
        current = other._progress.current
        if self._carried is not None and current is not None:
            # The carried pass reads the original's workers: the copy yields its rest
            # from a pass of its own, as a loader resumed from state_dict() would.
            other._progress.pending = Position.from_dict(current.to_dict())
            other._progress.current = None
        return other

    # -- passes over the data -------------------------------------------------------------

    def _new_pass(self) -> LoaderPass:
        return LoaderPass(self._settings, self._progress, self._cache, self._pools)

    def _close_carried(self) -> None:
        if self._carried is not None:
            self._carried.close()
            self._carried = None

    def _load_instances(self) -> list[Instance]:
        return self._cache.load()

    # Views of the parts, for tests and debugging.

    @property
    def _instances(self) -> Optional[list[Instance]]:
        return self._cache.instances

    @property
    def _pool(self) -> Optional[WorkerPool]:
        return self._pools.pool

    @_pool.setter
    def _pool(self, pool: Optional[WorkerPool]) -> None:
        self._pools.pool = pool

    def _spec(self, info: Optional[DistributedInfo]) -> WorkerSpec:
        return self._settings.spec(info)

    def __del__(self) -> None:
        # A carried-over pass and persistent workers stop with the loader.
        carried = getattr(self, "_carried", None)
        pools = getattr(self, "_pools", None)
        try:
            if carried is not None:
                carried.close()
            if pools is not None:
                pools.shutdown()
        except Exception:  # interpreter shutdown: the pool's finalizer reaps instead
            pass
