"""The three streams of batches a pass runs: an eager one (batches of the cached
instances), a lazy one with no workers (this process reads its shard and batches it
as worker 0 would) and a lazy one in a leased worker pool. Each takes the settings
and the state it works on explicitly; none refers to the loader."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, Optional

from framework.data._batching import batch_seed, derive_seed, slot_batches
from framework.data._cache import InstanceCache
from framework.data._checks import no_instances
from framework.data._distributed import agree
from framework.data._lease import WorkerPools
from framework.data._pool import UserCode, in_process
from framework.data._position import Position
from framework.data._rng import PrivateRandom, draws_nothing, scoped, seed_everything
from framework.data._settings import LoaderSettings
from framework.data._shards import slot_reading
from framework.data.reader import DatasetReader, DistributedInfo, Instance, current_distributed_info
from framework.data.shard_files import let_go, read_since

__all__ = ["eager_pass", "lazy_pass_in_process", "lazy_pass_in_workers"]


def eager_pass(settings: LoaderSettings, cache: InstanceCache, position: Position) -> Iterator[Any]:
    """An eager epoch: batches of the cached instances, sampled and collated here."""
    instances = cache.load()
    error: Optional[Exception] = None
    lists: list[list[int]] = []
    try:
        lists = cache.batch_lists(position)
    except Exception as raised:
        error = in_process(raised)  # wrapped before agree: one type on every rank
    if settings.evened():
        lists = lists[: agree(len(lists), error)]
    elif error is not None:
        raise error
    collate_fn = settings.collate_fn
    plain = draws_nothing(collate_fn)
    with UserCode():
        for index in range(position.consumed, len(lists)):
            chosen = [instances[i] for i in lists[index]]
            if plain:
                batch = collate_fn(chosen)
            else:
                # A random collator (masking) draws from the loader's streams, seeded per
                # batch: the caller's are untouched, and a resumed epoch collates the same.
                with scoped(derive_seed(position.seed, "collate", index)):
                    batch = collate_fn(chosen)
            batch = settings.finish(batch)  # on the device before it counts (Ctrl-C in the copy)
            position.consumed = index + 1
            yield batch


def lazy_pass_in_workers(
    settings: LoaderSettings, pools: WorkerPools, position: Position, info: Optional[DistributedInfo]
) -> Iterator[Any]:
    """A lazy epoch in a pool leased from `pools` (handed back when the pass ends)."""
    world, rank = (info.world_size, info.global_rank) if info else (1, 0)
    settings.decide_dealing(position, world)
    pool = pools.lease(info, bool(position.deal))
    finished = False
    resumed = position.consumed > 0 or bool(position.base.below or position.base.bits)
    try:
        with UserCode():  # the pool's own errors are WorkerErrors already
            # The pool counts a batch once `prepared` made it: one whose hook or
            # collator raised is not counted, and a resume makes it again.
            source = settings.source_for(position.epoch)
            yield from pool.run(position, "batches", settings.timeout, rank, world, settings.prepared, source)
        finished = True
    finally:
        pools.release(pool, finished)
    if position.instances == 0 and not resumed and (not position.deal or (position.split or 1) > 1):
        # (With whole shards dealt to ranks, a rank's shards may all be empty: the others'
        # are not. Ranks that split the streams read them all, as records dealt one by one.)
        raise no_instances(settings.reader, settings.data_path)


def lazy_pass_in_process(settings: LoaderSettings, position: Position) -> Iterator[Any]:
    """A lazy epoch with no workers: this process reads its shard and batches as worker 0 would."""
    info = current_distributed_info()
    world, rank = (info.world_size, info.global_rank) if info else (1, 0)
    position.begin(1)
    resumed = position.consumed > 0 or bool(position.base.below or position.base.bits)
    worker_seed = derive_seed(position.seed, "worker", 0)
    settings.decide_dealing(position, world)
    shards, source, start = slot_reading(
        rank,
        world,
        position.base,
        position.points[0],
        settings.source_for(position.epoch),
        position.deal or 0,
        position.split or 1,
    )
    reader = settings.reader
    reader._set_shard_plan(shards)
    counter = itertools.count()
    counting = _CountingReader(reader, counter)

    # Chunks reseed the streams: the loader's own ones (swapped in below), never the caller's.
    def reseed(seed: int) -> None:
        seed_everything(seed, cuda=False)

    hook = settings.hook_overridden
    plain = draws_nothing(settings.collate_fn) and not hook

    def collated() -> Iterator[tuple[list[Optional[int]], Any, Any]]:
        stream = slot_batches(counting, source, settings.plan, worker_seed, shards, start, reseed)
        for instances, indexes, point in stream:
            if plain:
                yield indexes, point, settings.collate_fn(instances)
                continue
            # The hook (deferred by the shard plan, as in a worker) and the collator draw
            # from the batch's own streams, as a worker's batch does.
            with scoped(batch_seed(worker_seed, point)):
                if hook:
                    for instance in instances:
                        reader.apply_token_indexers(instance)
                batch = settings.collate_fn(instances)
            yield indexes, point, batch

    # Seeded as worker 0 would be, in streams of its own: the caller's draws between
    # batches change nothing, and the caller's streams stay untouched. A swap costs
    # ~0.1-0.3 ms, so make a chunk's worth of batches per swap (memory stays about
    # max_instances_in_memory, as in a worker's prefetch).
    batches = PrivateRandom(worker_seed).wrap(collated(), settings.batches_per_chunk())
    try:
        with UserCode():
            for indexes, point, batch in batches:
                batch = settings.finish(batch)  # on the device before it counts (Ctrl-C in the copy)
                position.consumed += 1
                position.record(0, indexes, point, read_since(source))
                yield batch
        position.finish(0, next(counter), shards.where()[0])
    finally:
        reader._set_shard_plan(None)  # the reader reads whole again outside the loader
        let_go(source)
    if position.instances == 0 and not resumed and (not position.deal or (position.split or 1) > 1):
        # (With whole shards dealt to ranks, a rank's shards may all be empty: the others'
        # are not. Ranks that split the streams read them all, as records dealt one by one.)
        raise no_instances(settings.reader, settings.data_path)


class _CountingReader:
    """`reader.read`, counting the instances it yields into `counter`."""

    def __init__(self, reader: DatasetReader, counter: Iterator[int]) -> None:
        self.reader = reader
        self.counter = counter

    def read(self, data_path: Any) -> Iterator[Instance]:
        return (x for x, _ in zip(self.reader.read(data_path), self.counter))
