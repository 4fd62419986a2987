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

import functools
import itertools
import math
import multiprocessing
import pickle
import warnings
import weakref
from collections.abc import Generator, Iterator, Mapping
from contextlib import nullcontext
from typing import Any, Optional, TypeVar, Union, cast

import torch

from framework.data._batching import BatchPlan, derive_seed, round_robin
from framework.data._checks import as_device, config_checks, no_instances, validate
from framework.data._distributed import agree, even
from framework.data._passes import eager_pass, lazy_pass_in_process
from framework.data._pool import LoaderCode, UserCode, WorkerPool, closed_error, main_thread
from framework.data._position import Position
from framework.data._protocol import Batch, Instances
from framework.data._rng import PrivateRandom, scoped, unseeded_seed
from framework.data._shards import Consumed, ShardPlan
from framework.data._state import resumed_position, whole_state
from framework.data._worker import WorkerSpec
from framework.data.collate import DataCollator, DefaultDataCollator
from framework.data.loader import DataLoader, TensorDict, move_to_device, pin_memory
from framework.data.reader import (
    DatasetReader,
    DatasetReaderInput,
    DistributedInfo,
    Instance,
    current_distributed_info,
)
from framework.data.sampler import BatchSampler

__all__ = ["MultiProcessDataLoader"]

_P = TypeVar("_P")

class MultiProcessDataLoader(DataLoader):
    """Reads with `reader` from `data_path` in `num_workers` processes and yields batches.

    Args:
        reader: the `DatasetReader`; it is copied into each worker.
        data_path: passed to `reader.read()`.
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
        num_workers: worker processes; 0 reads in this process.
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
    ) -> None:
        validate(
            batch_size=batch_size, drop_last=drop_last, shuffle=shuffle,
            batch_sampler=batch_sampler, batches_per_epoch=batches_per_epoch,
            num_workers=num_workers, max_instances_in_memory=max_instances_in_memory,
            start_method=start_method, persistent_workers=persistent_workers,
            transfer=transfer, timeout=timeout, cuda_device=cuda_device,
        )
        self.reader = reader
        self.data_path = data_path
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.shuffle = shuffle
        self.batch_sampler = batch_sampler
        self.batches_per_epoch = batches_per_epoch
        self.num_workers = num_workers
        self.max_instances_in_memory = max_instances_in_memory
        self.start_method = start_method
        self.quiet = quiet
        self.collate_fn = collate_fn
        self.seed = seed
        # Unseeded: a seed from `random`'s state, which is not drawn from (reproducible
        # if the caller seeds `random` before building the loader).
        self._seed_or_unseeded = unseeded_seed() if seed is None else seed
        self.persistent_workers = persistent_workers
        self.pin_memory = pin_memory
        self.even_batches = even_batches
        self.transfer = transfer
        self.timeout = timeout
        self.cuda_device: Optional[torch.device] = None
        if cuda_device is not None:
            self.set_target_device(cuda_device)
        # CUDA can only be initialised in workers that were not forked.
        self._worker_cuda_safe = start_method in ("spawn", "forkserver")
        self._plan = BatchPlan(batch_size, drop_last, shuffle, batch_sampler, max_instances_in_memory)
        self._hook_overridden = (
            type(reader).apply_token_indexers is not DatasetReader.apply_token_indexers
        )
        if pin_memory and not torch.cuda.is_available():
            warnings.warn(
                "pin_memory=True but CUDA is not available: batches are not pinned",
                stacklevel=2,
            )
        self._instances: Optional[list[Instance]] = None
        self._indexes: Optional[list[int]] = None  # each cached instance's record index
        # the batches of the last eager pass asked for (`eager_lists`), and what made them
        self._eager_lists: Optional[tuple[Any, list[list[int]]]] = None
        self._pool: Optional[WorkerPool] = None
        self._closes = 0  # close() calls: one while workers start (another thread) ends that pass
        self._epoch = 0
        self._pending: Optional[Position] = None  # where the next pass starts
        self._current: Optional[Position] = None  # the pass in progress
        self._last: Optional[Position] = None  # the pass that ended last
        self._batch_generator: Optional[Generator[TensorDict, None, None]] = None
        # batches_per_epoch: batches the current iter() has yielded (0 between epochs);
        # after load_state_dict, the saved count, so the first iter() yields the rest.
        self._epoch_batches = 0
        # batches_per_epoch: the iter() epochs that have ended (their last batch taken):
        # the training loop's epoch, which the pass epoch (`_epoch`) is not.
        self._loop_epoch = 0
        self._batches = 0  # batches yielded since built or loaded: ranks compare it in state_dict()
        if max_instances_in_memory is None:
            self._load_instances()  # eager mode reads everything up front, as AllenNLP does

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
            yield from self._new_pass()
            return
        # As AllenNLP's: the pass that is not used up carries over into the next epoch.
        generator: Optional[Generator[TensorDict, None, None]] = (
            self._batch_generator or self._new_pass()
        )
        self._batch_generator = None
        # Lazy ranks have no collective of their own here: each batch's failure is shared.
        shared = self._evened() and self.max_instances_in_memory is not None
        # > 0: resumed mid-epoch. Kept until a batch is yielded: a pass cut short before
        # its first batch (an exception in next()) still owes the same rest of the epoch.
        start = self._epoch_batches if self._epoch_batches < self.batches_per_epoch else 0
        self._epoch_batches = start
        try:
            for index in range(start, self.batches_per_epoch):
                assert generator is not None
                try:
                    generator, batch = self._next_batch(generator)
                except Exception as error:
                    if not shared:
                        raise
                    agree(0, error)  # raises on every rank
                    raise
                if shared:
                    agree(1, None)
                if index == self.batches_per_epoch - 1:
                    # Hand the pass over before the last yield: a consumer that takes
                    # exactly len(loader) batches (islice, zip) never resumes us.
                    self._batch_generator, generator = generator, None
                self._epoch_batches = (index + 1) % self.batches_per_epoch
                if self._epoch_batches == 0:
                    self._loop_epoch += 1  # its last batch: the state describes the next
                yield batch
        finally:
            if generator is not None:
                # Cut short: the pass stays pending and `_epoch_batches` counts what this
                # epoch yielded, so the next iter() yields the rest of the epoch.
                generator.close()

    def _next_batch(
        self, generator: Generator[TensorDict, None, None]
    ) -> tuple[Generator[TensorDict, None, None], TensorDict]:
        """The next batch of `generator`, or of a fresh pass when the data ran out."""
        try:
            return generator, next(generator)
        except StopIteration:
            pass
        generator = self._new_pass()
        try:
            return generator, next(generator)
        except StopIteration:
            raise ValueError(
                f"a full pass over {self.data_path!r} yields no batches, so "
                f"batches_per_epoch={self.batches_per_epoch} can never be met; "
                "check the data, or drop_last with fewer instances than batch_size"
            ) from None

    def iter_instances(self) -> Iterator[Instance]:
        """Yield every instance after `apply_token_indexers` (cached in eager mode)."""
        if self._instances is not None:
            yield from self._instances
            return
        if self.max_instances_in_memory is None:
            yield from self._load_instances()
            return
        # One swap of the loader's random streams per chunk (memory stays bounded).
        for instance, _ in self._read_instances(step=self.max_instances_in_memory):
            yield instance

    def set_target_device(self, device: Union[int, str, torch.device]) -> None:
        new = as_device(device)  # ConfigError for a device torch would not take
        # getattr: __init__ calls this before the pool attribute exists
        if new != self.cuda_device and getattr(self, "_pool", None) is not None:
            self._close_pool()  # persistent workers hold the old device
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
        return whole_state(self)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a `state_dict()`, saved with any num_workers or world size.

        The same num_workers and world size resume batch for batch; others deal out
        the records the epoch has not yielded yet over this loader's ranks and workers.
        Settings that would change which instances exist or how they batch (reader,
        data_path, batch settings, sampler) must be the same: `ResumeError` (a
        ValueError) naming them.
        """
        position = resumed_position(self, state)
        epoch_batches = state.get("epoch_batches", 0)  # absent: a state from before the count
        # absent: a state from before the count (right without batches_per_epoch)
        loop_epoch = state.get("loop_epoch", position.epoch)
        for key, value in (("epoch_batches", epoch_batches), ("loop_epoch", loop_epoch)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(
                    f"the state's {key!r} must be an int >= 0, got {value!r}; "
                    "pass the loader's own state_dict()"
                )
        if self._batch_generator is not None:
            self._batch_generator.close()
            self._batch_generator = None
        self._close_pool()
        self._pending = position
        self._current = None
        self._last = None
        self._epoch = position.epoch
        self._epoch_batches = epoch_batches
        self._loop_epoch = loop_epoch
        self._batches = 0

    def close(self) -> None:
        """Stop any workers now (they are also stopped when the loader is collected)."""
        self._closes += 1
        if self._batch_generator is not None:
            self._batch_generator.close()
            self._batch_generator = None
        self._close_pool()

    # -- passes over the data -------------------------------------------------------------

    def _next_position(self) -> Position:
        if self._pending is None:
            self._pending = Position(epoch=self._epoch, seed=self._epoch_seed(self._epoch))
        return self._pending

    def _epoch_seed(self, epoch: int) -> int:
        info = current_distributed_info()
        rank = info.global_rank if info else 0
        return derive_seed(self._seed_or_unseeded, "epoch", epoch, "rank", rank)

    def _new_pass(self) -> Generator[TensorDict, None, None]:
        """A pass whose generators hold this loader weakly.

        A carried-over pass is kept on the loader (`_batch_generator`); were its frames
        to hold the loader, `del loader` would leave a reference cycle, and the workers
        running until the next `gc.collect()`. `__del__` closes the pass first.
        """
        loader = cast(MultiProcessDataLoader, weakref.proxy(self))
        return MultiProcessDataLoader._pass(loader)

    def _pass(self) -> Generator[TensorDict, None, None]:
        # `self` is a weak proxy (see _new_pass): call the stream generators through
        # the class so that their frames hold the proxy too, not the loader.
        cls = MultiProcessDataLoader
        position = self._next_position()
        self._pending = None
        self._current = position
        self._epoch = position.epoch + 1
        info = current_distributed_info()
        if self.max_instances_in_memory is None:
            stream = eager_pass(self, position)
        elif self.num_workers == 0:
            stream = lazy_pass_in_process(self, position)
        else:
            stream = cls._lazy_pass_in_workers(self, position, info)
        if self._evened() and self.max_instances_in_memory is not None:
            if self.batches_per_epoch is None:
                stream = even(stream)
        finished = False
        try:
            for batch in stream:  # each on its device already (`_finish`), then counted
                self._batches += 1
                yield batch
            finished = True
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()  # stops the workers at once when the consumer stops early
            try:
                if finished:
                    self._last = position  # for state_dict() while other ranks are still in it
                elif self._current is position and self._pending is None:
                    # Cut short (`break`, an exception, Ctrl-C): the pass is not over. The
                    # next iter() yields its rest, as a loader restored from state_dict() does.
                    # (Not a stale pass closed late, after load_state_dict() or another pass.)
                    self._pending = Position.from_dict(position.to_dict())
                if self._current is position:
                    self._current = None
            except ReferenceError:
                pass  # the loader is gone (collected, or the interpreter is exiting)

    def _evened(self) -> bool:
        """Whether ranks agree on batch counts (and so must fail together, never alone)."""
        info = current_distributed_info()
        return info is not None and info.world_size > 1 and self.even_batches

    def _lazy_pass_in_workers(
        self, position: Position, info: Optional[DistributedInfo]
    ) -> Iterator[Any]:
        pool = self._get_pool(info)
        persistent = self.persistent_workers
        finished = False
        resumed = position.consumed > 0 or bool(position.base.below or position.base.bits)
        world, rank = (info.world_size, info.global_rank) if info else (1, 0)
        try:
            with UserCode():  # the pool's own errors are WorkerErrors already
                # The pool counts a batch once `prepared` made it: one whose hook or
                # collator raised is not counted, and a resume makes it again.
                # (through the class: `self` is a weak proxy, and `self._prepared` would be
                # bound to the loader itself, holding it from the pass's frames)
                prepared = functools.partial(MultiProcessDataLoader._prepared, self)
                yield from pool.run(position, "batches", self.timeout, rank, world, prepared)
            finished = True
        finally:
            try:
                owned = pool is self._pool
            except ReferenceError:
                owned = False  # the loader is gone: nothing will reuse these workers
            if not finished or not persistent or not owned:
                pool.shutdown()
                if owned:
                    self._pool = None
        if position.instances == 0 and not resumed:
            raise no_instances(self.reader, self.data_path)

    def _prepared(self, message: Union[Batch, Instances]) -> Any:
        """A worker's message made a batch: its tensors, or its instances hooked and
        collated; pinned and moved to the device (`_finish`)."""
        if isinstance(message, Batch):
            return self._finish(message.payload)
        with scoped(message.seed) if message.seed is not None else nullcontext():
            for instance in message.instances:  # in the batch's own streams
                self.reader.apply_token_indexers(instance)
            batch = self.collate_fn(message.instances)
        return self._finish(batch)

    def _finish(self, batch: Any) -> Any:
        """`batch` pinned and on `cuda_device`. Every pass calls it before it counts the
        batch as consumed: an error or Ctrl-C in the copy leaves the batch to the resume.
        Its errors (CUDA out of memory) are the loader's own, never wrapped as WorkerError."""
        with LoaderCode():
            if self.pin_memory and torch.cuda.is_available():
                batch = pin_memory(batch)
            if self.cuda_device is not None:
                batch = move_to_device(batch, self.cuda_device, non_blocking=self.pin_memory)
            return batch

    # -- reading instances --------------------------------------------------------------

    def _load_instances(self) -> list[Instance]:
        if self._instances is None:
            error: Optional[Exception] = None
            pairs: list[tuple[Instance, Optional[int]]] = []
            try:
                pairs = list(self._read_instances(step=None))
                if not pairs:
                    error = no_instances(self.reader, self.data_path)
            except Exception as raised:
                pairs, error = [], raised
            if self._evened():
                agree(len(pairs), error)  # a rank that failed fails every rank, at once
            elif error is not None:
                raise error
            indexes = [index for _, index in pairs]
            # Record indexes let another split resume; a reader that hides them cannot.
            self._indexes = None if None in indexes else cast(list[int], indexes)
            if self._indexes is not None and self.num_workers > 1:
                # Workers' chunks interleave in record order only while every record
                # gives an instance; a reader that skips records ("at most one instance
                # per record") would cache another order per num_workers, and a resume
                # with another num_workers (the exact path) would repeat and skip.
                pairs.sort(key=lambda pair: cast(int, pair[1]))
                self._indexes.sort()
            self._instances = [instance for instance, _ in pairs]
        return self._instances

    def _read_instances(self, step: Optional[int]) -> Iterator[tuple[Instance, Optional[int]]]:
        """(instance, record index) of this rank's share; in this process `step` are read
        per swap of the loader's random streams (None: all in one, when no caller code
        runs between)."""
        info = current_distributed_info()
        world, rank = (info.world_size, info.global_rank) if info else (1, 0)
        if self.num_workers == 0:
            shards = ShardPlan(rank, world, Consumed())  # it defers the hook to _hooked
            self.reader._set_shard_plan(shards)
            try:
                pairs = self._progress((x, shards.take()) for x in self.reader.read(self.data_path))
                # Seeded as worker 0 would be (the same data with 0 or 1 workers).
                private = PrivateRandom(derive_seed(self._epoch_seed(0), "worker", 0))
                with UserCode():
                    yield from self._hooked(private.wrap(pairs, step), step)
            finally:
                self.reader._set_shard_plan(None)
            return
        pool = self._start_pool(info)
        position = Position(epoch=0, seed=self._epoch_seed(0))
        try:
            messages = pool.run(position, "instances", self.timeout, rank, world)
            with UserCode():  # apply_token_indexers runs here
                yield from self._hooked(self._progress(self._interleave(messages)), step)  # type: ignore[arg-type]
        finally:
            pool.shutdown()

    def _interleave(self, messages: Iterator[Instances]) -> Iterator[tuple[Instance, Optional[int]]]:
        # Worker w holds items w, w + n, ...: taking one instance from each worker's
        # chunk in turn restores the reader's order.
        chunks: list[list[tuple[Instance, Optional[int]]]] = []
        for message in messages:
            chunks.append(list(zip(message.instances, message.indexes)))
            if len(chunks) == self.num_workers:
                yield from round_robin(chunks)
                chunks = []
        yield from round_robin(chunks)

    def _hooked(
        self, pairs: Iterator[tuple[Instance, Optional[int]]], step: Optional[int]
    ) -> Iterator[tuple[Instance, Optional[int]]]:
        """`pairs`, after `apply_token_indexers` (in the main process, whatever
        num_workers), `step` at a time (None: all) in streams of the hook's own."""
        if not self._hook_overridden:
            yield from pairs
            return
        private = PrivateRandom(derive_seed(self._epoch_seed(0), "hook"))
        while True:
            items = list(itertools.islice(pairs, step))
            with private.active():
                for instance, _ in items:
                    self.reader.apply_token_indexers(instance)
            yield from items
            if step is None or len(items) < step:
                return

    def _progress(self, iterable: Iterator[_P]) -> Iterator[_P]:
        if self.quiet:
            return iterable
        from tqdm import tqdm

        return iter(tqdm(iterable, desc="loading instances", unit="instance", position=0))

    # -- workers ------------------------------------------------------------------------

    def _spec(self, info: Optional[DistributedInfo]) -> WorkerSpec:
        # Only CUDA IPC (shared_memory) carries CUDA tensors between processes; a
        # pickle-5 frame carries bytes, so then the batch moves in this process.
        device = None
        if self._worker_cuda_safe and self.transfer == "shared_memory":
            device = self.cuda_device
        return WorkerSpec(
            reader=self.reader,
            data_path=self.data_path,
            plan=self._plan,
            collate_fn=self.collate_fn,
            collate_in_worker=not self._hook_overridden,
            num_workers=self.num_workers,
            distributed=info,
            device=device,
            transfer=self.transfer,  # type: ignore[arg-type]
            set_death_signal=main_thread(),
            start_method=self.start_method,
            prefetch=self._prefetch(),
            # Progress messages a few times per timeout, so it measures silence only.
            heartbeat=None if self.timeout is None else self.timeout / 4,
        )

    def _prefetch(self) -> int:
        # As AllenNLP sizes its queues: about two chunks' worth of batches per worker.
        size = self.batch_size or (self.batch_sampler and self.batch_sampler.get_batch_size())
        chunk = self.max_instances_in_memory or 1024
        return max(2, 2 * chunk // (size or 1))

    def _get_pool(self, info: Optional[DistributedInfo]) -> WorkerPool:
        if self._pool is not None and self._pool.closed:
            self._pool = None
        if self._pool is not None and self._pool.busy:
            # Another iteration of this loader is still open: give this one its own
            # workers rather than pull the others' out from under it.
            return self._start_pool(info)
        if self._pool is None:
            self._pool = self._start_pool(info)
        return self._pool

    def _start_pool(self, info: Optional[DistributedInfo]) -> WorkerPool:
        context = multiprocessing.get_context(self.start_method)
        closes = self._closes
        try:
            pool = WorkerPool(self._spec(info), self.num_workers, context, self.quiet)
        except (TypeError, AttributeError, ValueError, pickle.PicklingError) as error:
            if self.start_method == "fork":
                raise
            raise TypeError(
                f"start_method={self.start_method!r} pickles the reader, sampler and "
                f"collate_fn to start each worker, and that failed: {error}. Define them "
                "at module level (importable), or use start_method='fork'"
            ) from error
        if self._closes != closes:  # close() from another thread while the workers started
            pool.shutdown()
            raise closed_error()
        return pool

    def _close_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __del__(self) -> None:
        # Close a carried-over pass while the weak proxies its frames hold still work.
        generator = getattr(self, "_batch_generator", None)
        pool = getattr(self, "_pool", None)
        try:
            if generator is not None:
                generator.close()
            if pool is not None:
                pool.shutdown()
        except Exception:  # interpreter shutdown: the pool's finalizer reaps instead
            pass
