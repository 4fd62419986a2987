"""Turning a stream of instances into lists of instances, one list per batch.

The same code runs in the main process (``num_workers=0``, eager mode) and in each
worker (lazy mode), so a shard batches identically wherever it runs. All randomness
comes from seeds passed in: the same seed gives the same batches.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Optional

from framework.data.sampler import BatchSampler

__all__ = ["BatchPlan", "derive_seed", "seeded_global_random"]


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed mixed from `parts` (stable across runs and processes)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


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


def groups_of(iterable: Iterable[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(iterable)
    while True:
        group = list(itertools.islice(iterator, size))
        if not group:
            return
        yield group


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
            with seeded_global_random(seed):
                lists = [list(b) for b in self.batch_sampler.get_batch_indices(instances)]
            return check_indices(lists, len(instances), self.batch_sampler)
        assert self.batch_size is not None
        order = list(range(len(instances)))
        if self.shuffle:
            random.Random(seed).shuffle(order)
        lists = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        if self.drop_last and lists and len(lists[-1]) < self.batch_size:
            lists.pop()
        return lists

    def stream(self, instances: Iterable[Any], seed: int) -> Iterator[list[Any]]:
        """Lazy mode: batches from a stream, sampling or shuffling one chunk at a time."""
        chunk_size = self.max_instances_in_memory
        assert chunk_size is not None
        if self.batch_sampler is not None:
            for index, chunk in enumerate(groups_of(instances, chunk_size)):
                for indices in self.batch_lists(chunk, derive_seed(seed, index)):
                    yield [chunk[i] for i in indices]
            return
        assert self.batch_size is not None
        if not self.shuffle:
            # Nothing to do per chunk: stream straight into batches (first batch sooner).
            for group in groups_of(instances, self.batch_size):
                if self.drop_last and len(group) < self.batch_size:
                    return
                yield group
            return
        rng = random.Random(seed)

        def shuffled() -> Iterator[Any]:
            for chunk in groups_of(instances, chunk_size):
                rng.shuffle(chunk)
                yield from chunk

        # Batches span chunk boundaries, as with a shuffle buffer: only the last is short.
        for group in groups_of(shuffled(), self.batch_size):
            if self.drop_last and len(group) < self.batch_size:
                return
            yield group


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
