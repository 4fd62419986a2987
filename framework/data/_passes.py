"""The two passes over an epoch that run in the loader's own process: an eager one
(batches of the cached instances) and a lazy one with no workers (this process reads
its shard and batches it as worker 0 would). The worker pool's pass stays with the
loader, which owns the pool."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Optional

from framework.data._batching import batch_seed, derive_seed, slot_batches
from framework.data._checks import no_instances
from framework.data._distributed import agree
from framework.data._pool import UserCode, in_process
from framework.data._position import Position
from framework.data._rng import PrivateRandom, draws_nothing, scoped, seed_everything
from framework.data._shards import Point, ShardPlan
from framework.data.reader import DatasetReader, Instance, current_distributed_info

if TYPE_CHECKING:
    from framework.data.multiprocess import MultiProcessDataLoader

__all__ = ["eager_lists", "eager_pass", "lazy_pass_in_process"]


def eager_pass(loader: MultiProcessDataLoader, position: Position) -> Iterator[Any]:
    """An eager epoch: batches of the cached instances, sampled and collated here."""
    instances = loader._load_instances()
    error: Optional[Exception] = None
    lists: list[list[int]] = []
    try:
        lists = eager_lists(loader, position)
    except Exception as raised:
        error = in_process(raised)  # wrapped before agree: one type on every rank
    if loader._evened():
        lists = lists[: agree(len(lists), error)]
    elif error is not None:
        raise error
    plain = draws_nothing(loader.collate_fn)
    with UserCode():
        for index in range(position.consumed, len(lists)):
            chosen = [instances[i] for i in lists[index]]
            if plain:
                batch = loader.collate_fn(chosen)
            else:
                # A random collator (masking) draws from the loader's streams, seeded per
                # batch: the caller's are untouched, and a resumed epoch collates the same.
                with scoped(derive_seed(position.seed, "collate", index)):
                    batch = loader.collate_fn(chosen)
            batch = loader._finish(batch)  # on the device before it counts (Ctrl-C in the copy)
            position.consumed = index + 1
            yield batch


def eager_lists(loader: MultiProcessDataLoader, position: Position) -> list[list[int]]:
    """The batches (cache indexes) of the eager pass at `position`, whole (before any
    evening out over ranks), as its seed and base make them.

    `state_dict()` needs them for a pass not yet begun (loaded, cut short) too: they
    are kept for the last position asked, keyed by what makes them."""
    key = (position.epoch, position.seed, position.base.below, position.base.bits)
    cached = loader._eager_lists
    if cached is not None and cached[0] == key:
        return cached[1]
    instances = loader._load_instances()
    # Resumed in another split: only what the epoch has not yielded yet.
    keep = list(range(len(instances)))
    if position.base.below or position.base.bits:
        assert loader._indexes is not None  # a state without indexes is refused on load
        keep = [i for i, record in enumerate(loader._indexes) if record not in position.base]
    kept = [instances[i] for i in keep]
    lists = loader._plan.batch_lists(kept, derive_seed(position.seed, "eager"))
    lists = [[keep[i] for i in indices] for indices in lists]
    loader._eager_lists = (key, lists)
    return lists


def lazy_pass_in_process(loader: MultiProcessDataLoader, position: Position) -> Iterator[Any]:
    """A lazy epoch with no workers: this process reads its shard and batches as worker 0 would."""
    info = current_distributed_info()
    world, rank = (info.world_size, info.global_rank) if info else (1, 0)
    position.begin(1)
    resumed = position.consumed > 0 or bool(position.base.below or position.base.bits)
    worker_seed = derive_seed(position.seed, "worker", 0)
    start = position.points[0] or Point(record=position.base.below, token=position.base.token)
    shards = ShardPlan(rank, world, position.base, max(start.record, 0), start.token)
    reader = loader.reader  # the reader itself (`loader` may be a weak proxy), to unset the plan
    reader._set_shard_plan(shards)
    counter = itertools.count()
    counting = _CountingReader(reader, counter)
    # Chunks reseed the streams: the loader's own ones (swapped in below), never the caller's.
    def reseed(seed: int) -> None:
        seed_everything(seed, cuda=False)

    hook = loader._hook_overridden
    plain = draws_nothing(loader.collate_fn) and not hook

    def collated() -> Iterator[tuple[list[Optional[int]], Any, Any]]:
        stream = slot_batches(counting, loader.data_path, loader._plan, worker_seed, shards, start, reseed)
        for instances, indexes, point in stream:
            if plain:
                yield indexes, point, loader.collate_fn(instances)
                continue
            # The hook (deferred by the shard plan, as in a worker) and the collator draw
            # from the batch's own streams, as a worker's batch does.
            with scoped(batch_seed(worker_seed, point)):
                if hook:
                    for instance in instances:
                        reader.apply_token_indexers(instance)
                batch = loader.collate_fn(instances)
            yield indexes, point, batch

    # Seeded as worker 0 would be, in streams of its own: the caller's draws between
    # batches change nothing, and the caller's streams stay untouched. A swap costs
    # ~0.1-0.3 ms, so make a chunk's worth of batches per swap (memory stays about
    # max_instances_in_memory, as in a worker's prefetch).
    batches = PrivateRandom(worker_seed).wrap(collated(), _batches_per_chunk(loader))
    try:
        with UserCode():
            for indexes, point, batch in batches:
                batch = loader._finish(batch)  # on the device before it counts (Ctrl-C in the copy)
                position.consumed += 1
                position.record(0, indexes, point)
                yield batch
        position.finish(0, next(counter), shards.where()[0])
    finally:
        reader._set_shard_plan(None)  # the reader reads whole again outside the loader
    if position.instances == 0 and not resumed:
        raise no_instances(loader.reader, loader.data_path)


def _batches_per_chunk(loader: MultiProcessDataLoader) -> int:
    size = loader.batch_size or (loader.batch_sampler and loader.batch_sampler.get_batch_size())
    return max(1, (loader.max_instances_in_memory or 1) // (size or 1))


class _CountingReader:
    """`reader.read`, counting the instances it yields into `counter`."""

    def __init__(self, reader: DatasetReader, counter: Iterator[int]) -> None:
        self.reader = reader
        self.counter = counter

    def read(self, data_path: Any) -> Iterator[Instance]:
        return (x for x, _ in zip(self.reader.read(data_path), self.counter))

