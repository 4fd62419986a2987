"""Turning a stream of instances into lists of instances, one list per batch.

The same code runs in the main process (`num_workers=0`, eager mode) and in each
worker (lazy mode), so a shard batches identically wherever it runs. All randomness
comes from seeds passed in: the same seed gives the same batches.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import operator
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Optional

from framework.data._shards import Point, ShardPlan, digest_of
from framework.data.sampler import BatchSampler
from framework.errors import ResumeError

__all__ = [
    "BatchPlan",
    "batch_seed",
    "derive_seed",
    "not_deterministic",
    "seeded_global_random",
    "slot_batches",
]


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed mixed from `parts` (stable across runs and processes)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def batch_seed(slot_seed: int, point: Point) -> int:
    """The seed of the streams a lazy batch is collated in (and its hook run in): from
    the slot's seed and where the batch ends (chunk, taken), which a resumed slot
    reaches again with the same values, whatever it skipped."""
    return derive_seed(slot_seed, "collate", point.chunk, point.within)


@contextmanager
def seeded_global_random(seed: int) -> Iterator[None]:
    """Seed the `random` module inside the block, restoring its state afterwards.

    Samplers use `random` (as AllenNLP's do); scoping keeps the caller's state intact.
    """
    state = random.getstate()
    random.seed(seed)
    try:
        yield
    finally:
        random.setstate(state)


def round_robin(chunks: list[list[Any]]) -> Iterator[Any]:
    """The first item of each chunk, then the second of each, and so on (chunks may be short)."""
    missing = object()
    for row in itertools.zip_longest(*chunks, fillvalue=missing):
        for item in row:
            if item is not missing:
                yield item


def groups_of(iterable: Iterable[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(iterable)
    while True:
        group = list(itertools.islice(iterator, size))
        if not group:
            return
        yield group


@dataclass(frozen=True)
class _Slot:
    """One slot's stream for `BatchPlan.resumable`: its (instance, record index) pairs,
    its seed, where to start, where a chunk starts (`where()`) and how to reseed the
    reader's random streams."""

    items: Iterator[tuple[Any, Optional[int]]]
    seed: int
    start: Point
    where: Callable[[], tuple[int, Any]]
    held: Callable[[], Optional[list[int]]]  # `Point.shard` of where a chunk starts
    reseed: Callable[[int], None]


@dataclass(frozen=True)
class BatchPlan:
    """How instances become batches: a sampler, or batch_size/shuffle/drop_last."""

    batch_size: Optional[int]
    drop_last: bool
    shuffle: bool
    batch_sampler: Optional[BatchSampler]
    max_instances_in_memory: Optional[int]

    def batch_lists(self, instances: Sequence[Any], seed: int) -> list[list[int]]:
        """Index lists over an in-memory sequence (eager mode, or one lazy chunk)."""
        if self.batch_sampler is not None:
            if not instances:
                return []  # nothing left (a rank's share of a resumed epoch): no batches
            # A copy per call: what a sampler keeps across calls (a bucket sampler's
            # guessed sorting keys) would make a chunk batch differently after the
            # chunks before it than in a worker resumed at it, which never saw them.
            sampler = copy.copy(self.batch_sampler)
            with seeded_global_random(seed):
                lists = [list(b) for b in sampler.get_batch_indices(instances)]
            return check_indices(lists, len(instances), self.batch_sampler)
        assert self.batch_size is not None
        order = list(range(len(instances)))
        if self.shuffle:
            random.Random(seed).shuffle(order)
        lists = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        if self.drop_last and lists and len(lists[-1]) < self.batch_size:
            lists.pop()
        return lists

    def chunk_size(self, number: int) -> int:
        """How many instances lazy chunk `number` of a slot holds: one batch first, then
        twice as many as the chunk before, up to `max_instances_in_memory`. A shuffle or
        a sampler needs a whole chunk before its first batch: the first batch of a pass
        then waits for one batch's reading, not for `max_instances_in_memory`'s (the
        first chunks shuffle within smaller windows, as a shuffle buffer that fills).
        A function of the chunk's number alone, so a resumed slot cuts the same chunks."""
        most = self.max_instances_in_memory
        assert most is not None
        batch = self.batch_size or (self.batch_sampler.get_batch_size() if self.batch_sampler else None)
        if not batch or number >= 32:
            return most
        return min(most, batch << number)

    def resumable(self, slot: _Slot) -> Iterator[tuple[list[Any], list[Optional[int]], Point]]:
        """Lazy mode: (instances, their record indexes, where to restart after them).

        The slot's `items` are (instance, record index) pairs; they are batched one
        chunk (`chunk_size`) at a time, from `start` (a chunk and how much
        of it was taken). Each chunk starts from seeds of its own (`reseed` seeds the
        reader's random streams), so a chunk read again after a seek is the same
        chunk; `where()` gives the (record, seek token) a chunk starts at.
        """
        if self.batch_sampler is not None:
            yield from self._sampled(slot)
            return
        assert self.batch_size is not None
        size = self.batch_size
        batch: list[tuple[Any, Optional[int]]] = []
        point, taken = slot.start, slot.start.within
        # Batches span chunk boundaries, as with a shuffle buffer: only the last is short.
        for item, point, taken in self._flat(slot):
            batch.append(item)
            if len(batch) == size:
                yield [x for x, _ in batch], [i for _, i in batch], replace(point, within=taken)
                batch = []
        if batch and not self.drop_last:
            yield [x for x, _ in batch], [i for _, i in batch], replace(point, within=taken)

    def _chunks(self, slot: _Slot) -> Iterator[tuple[Point, Iterator[tuple[Any, Optional[int]]]]]:
        """(where chunk n starts, its items), lazily: the next chunk starts after the last."""
        number, pulled = slot.start.chunk, slot.start.skip
        while True:
            size = self.chunk_size(number)
            record, token = slot.where()
            shard = slot.held()
            slot.reseed(derive_seed(slot.seed, "chunk", number))
            counter = itertools.count()
            # map/zip: counted in C, not per item in Python
            items = map(operator.itemgetter(0), zip(itertools.islice(slot.items, size), counter))
            # The chunk's first instance, digested: a resumed slot checks it is the same.
            first = next(items, None)
            digest = None if first is None else digest_of(first[0])
            if number == slot.start.chunk and slot.start.digest not in (None, digest):
                raise not_deterministic(slot.start, digest)
            chunk = items if first is None else itertools.chain([first], items)
            yield Point(number, record, token, pulled, digest=digest, shard=shard), chunk
            for _ in chunk:  # the consumer may have stopped early: finish the chunk
                pass
            count = next(counter)
            if count < size:
                return
            pulled += count
            number += 1

    def _flat(self, slot: _Slot) -> Iterator[tuple[tuple[Any, Optional[int]], Point, int]]:
        """Each item (shuffled within its chunk), its chunk's start and how many of the
        chunk it completes (restarting after it: that chunk, that many taken)."""
        drop = slot.start.within
        for point, chunk in self._chunks(slot):
            ordered: Iterator[tuple[Any, Optional[int]]] = chunk
            if self.shuffle:
                listed = list(chunk)
                random.Random(derive_seed(slot.seed, "shuffle", point.chunk)).shuffle(listed)
                ordered = iter(listed)
            for taken, item in enumerate(ordered, 1):
                if taken > drop:
                    yield item, point, taken
            drop = 0

    def _sampled(self, slot: _Slot) -> Iterator[tuple[list[Any], list[Optional[int]], Point]]:
        drop = slot.start.within
        for point, chunk in self._chunks(slot):
            pairs = list(chunk)
            instances = [x for x, _ in pairs]
            lists = self.batch_lists(instances, derive_seed(slot.seed, point.chunk)) if pairs else []
            for taken, indices in enumerate(lists, 1):
                if taken > drop:
                    yield (
                        [instances[i] for i in indices],
                        [pairs[i][1] for i in indices],
                        replace(point, within=taken),
                    )
            drop = 0


def slot_batches(
    reader: Any,
    data_path: Any,
    plan: BatchPlan,
    seed: int,
    shards: ShardPlan,
    start: Point,
    reseed: Callable[[int], None],
) -> Iterator[tuple[list[Any], list[Optional[int]], Point]]:
    """One slot's batches of a lazy pass, from `start` (`shards` already set on `reader`).

    A start without a known record (a reader that does not say which record an
    instance came from) reads and drops the `start.skip` instances before it.
    """
    seed = derive_seed(seed, "batches")
    first = derive_seed(seed, "chunk", start.chunk)
    instances = iter(reader.read(data_path))
    if start.record > 0:
        # The reader reaches the start record inside its first read: seed the chunk there,
        # after the records it reads past, as an uninterrupted pass does.
        shards.at_start = lambda: reseed(first)
        reseed = _once_skipped(reseed)
    elif start.record < 0:
        for _ in itertools.islice(instances, start.skip):
            shards.take()
    items = ((instance, shards.take()) for instance in instances)
    return plan.resumable(_Slot(items, seed, start, shards.where, shards.held, reseed))


def _once_skipped(reseed: Callable[[int], None]) -> Callable[[int], None]:
    """`reseed`, except for its first call (the shard plan seeds the first chunk)."""
    calls = itertools.count()

    def skip_first(seed: int) -> None:
        if next(calls):
            reseed(seed)

    return skip_first


def not_deterministic(start: Point, found: Optional[str]) -> ResumeError:
    """The error for a resumed slot whose chunk begins with another instance than saved."""
    where = f"record {start.record}" if start.record >= 0 else f"instance {start.skip}"
    now = "nothing" if found is None else f"another instance (digest {found})"
    return ResumeError(
        f"cannot resume exactly: the chunk this worker resumes in (chunk {start.chunk}, at "
        f"{where}) began with an instance of digest {start.digest} when the state was "
        f"saved, and the reader now yields {now} there. The reader is not deterministic "
        "(its order or its instances change from run to run: a set or a directory listing "
        "iterated, a draw outside the loader's seeded streams) or the data changed, so "
        "the saved position would repeat and skip instances. Make the reader yield the "
        "same instances in the same order every run, or start the epoch afresh without "
        "load_state_dict()",
        "not_deterministic",
    )


def check_indices(lists: list[list[int]], size: int, sampler: BatchSampler) -> list[list[int]]:
    """`lists` without empty batches; ValueError naming the sampler for a bad index."""
    for indices in lists:
        for index in indices:
            if not isinstance(index, int) or not 0 <= index < size:
                raise ValueError(
                    f"{type(sampler).__name__}.get_batch_indices() returned index {index!r} "
                    f"for {size} instances; indices must be ints in [0, {size}). Under a lazy "
                    "loader the sampler sees max_instances_in_memory instances at a time."
                )
    return [indices for indices in lists if indices]
