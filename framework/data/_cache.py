"""`InstanceCache`: the instances an eager loader reads once (in its workers or in this
process) and batches every epoch, with the record each came from and the batches of
the last eager pass asked for."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, Optional, TypeVar, cast

from framework.data._batching import derive_seed, round_robin
from framework.data._checks import no_instances
from framework.data._distributed import agree
from framework.data._lease import WorkerPools
from framework.data._pool import UserCode
from framework.data._position import Position
from framework.data._protocol import Instances
from framework.data._rng import PrivateRandom
from framework.data._settings import LoaderSettings
from framework.data._shards import Consumed, ShardPlan
from framework.data.reader import Instance, current_distributed_info
from framework.data.shard_files import let_go, read_since

__all__ = ["InstanceCache"]

_P = TypeVar("_P")


class InstanceCache:
    """The eager cache (`instances`, and `indexes`: each one's record index, or None
    when the reader hides them) and `read`, the stream it is filled from."""

    def __init__(self, settings: LoaderSettings, pools: WorkerPools) -> None:
        self.settings = settings
        self.pools = pools
        self.instances: Optional[list[Instance]] = None
        self.indexes: Optional[list[int]] = None
        self.shards_read: dict[str, str] = {}  # streamed shards read into it: URL -> sha256
        # the batches of the last eager pass asked for (`batch_lists`), and what made them
        self._lists: Optional[tuple[Any, list[list[int]]]] = None

    def shared(self, settings: LoaderSettings, pools: WorkerPools) -> InstanceCache:
        """A cache for a copy of the loader: the instances read already (never changed
        once read), the copy's own settings and pools."""
        other = InstanceCache(settings, pools)
        other.instances, other.indexes, other.shards_read = self.instances, self.indexes, self.shards_read
        return other

    def forget(self) -> None:
        """Drop what was read: the reader or data_path changed, the next `load` reads."""
        self.instances = self.indexes = self._lists = None

    def load(self) -> list[Instance]:
        """Every instance of this rank's share, read on the first call."""
        if self.instances is None:
            pairs = self._read_all()
            indexes = [index for _, index in pairs]
            # Record indexes let another split resume; a reader that hides them cannot.
            self.indexes = None if None in indexes else cast(list[int], indexes)
            if self.indexes is not None and self.settings.num_workers > 1:
                # Workers' chunks interleave in record order only while every record
                # gives an instance; a reader that skips records ("at most one instance
                # per record") would cache another order per num_workers, and a resume
                # with another num_workers (the exact path) would repeat and skip.
                pairs.sort(key=lambda pair: cast(int, pair[1]))
                self.indexes.sort()
            self.instances = [instance for instance, _ in pairs]
        return self.instances

    def _read_all(self) -> list[tuple[Instance, Optional[int]]]:
        settings = self.settings
        error: Optional[Exception] = None
        pairs: list[tuple[Instance, Optional[int]]] = []
        try:
            pairs = list(self.read(step=None))
            if not pairs:
                error = no_instances(settings.reader, settings.data_path)
        except Exception as raised:
            pairs, error = [], raised
        if settings.evened():
            agree(len(pairs), error)  # a rank that failed fails every rank, at once
        elif error is not None:
            raise error
        return pairs

    def batch_lists(self, position: Position) -> list[list[int]]:
        """The batches (cache indexes) of the eager pass at `position`, whole (before any
        evening out over ranks), as its seed and base make them.

        The saved state needs them for a pass not yet begun (loaded, cut short) too: they
        are kept for the last position asked, keyed by what makes them."""
        plan = self.settings.plan  # in the key: a batch setting assigned since changes them
        key = (plan, position.epoch, position.seed, position.base.below, position.base.bits)
        if self._lists is not None and self._lists[0] == key:
            return self._lists[1]
        instances = self.load()
        # Resumed in another split: only what the epoch has not yielded yet.
        keep = list(range(len(instances)))
        if position.base.below or position.base.bits:
            assert self.indexes is not None  # a state without indexes is refused on load
            keep = [i for i, record in enumerate(self.indexes) if record not in position.base]
        kept = [instances[i] for i in keep]
        lists = plan.batch_lists(kept, derive_seed(position.seed, "eager"))
        lists = [[keep[i] for i in indices] for indices in lists]
        self._lists = (key, lists)
        return lists

    def read(self, step: Optional[int]) -> Iterator[tuple[Instance, Optional[int]]]:
        """(instance, record index) of this rank's share; in this process `step` are read
        per swap of the loader's random streams (None: all in one, when no caller code
        runs between)."""
        settings = self.settings
        info = current_distributed_info()
        world, rank = (info.world_size, info.global_rank) if info else (1, 0)
        if settings.num_workers == 0:
            shards = ShardPlan(rank, world, Consumed())  # it defers the hook to _hooked
            settings.reader._set_shard_plan(shards)
            source = settings.eager_source()
            try:
                read = settings.reader.read(source)
                pairs = self._progress((x, shards.take()) for x in read)
                # Seeded as worker 0 would be (the same data with 0 or 1 workers).
                private = PrivateRandom(derive_seed(settings.epoch_seed(0), "worker", 0))
                with UserCode():
                    yield from self._hooked(private.wrap(pairs, step), step)
            finally:
                settings.reader._set_shard_plan(None)
                self.shards_read.update(read_since(source))
                let_go(source)
            return
        pool = self.pools.start(info)
        position = Position(epoch=0, seed=settings.epoch_seed(0))
        try:
            source = settings.eager_source()
            messages = pool.run(position, "instances", settings.timeout, rank, world, source=source)
            with UserCode():  # apply_token_indexers runs here
                yield from self._hooked(self._progress(self._interleave(messages)), step)  # type: ignore[arg-type]
        finally:
            pool.shutdown()

    def _interleave(self, messages: Iterator[Instances]) -> Iterator[tuple[Instance, Optional[int]]]:
        # Worker w holds items w, w + n, ...: taking one instance from each worker's
        # chunk in turn restores the reader's order.
        chunks: list[list[tuple[Instance, Optional[int]]]] = []
        for message in messages:
            self.shards_read.update(message.shards_read)
            chunks.append(list(zip(message.instances, message.indexes)))
            if len(chunks) == self.settings.num_workers:
                yield from round_robin(chunks)
                chunks = []
        yield from round_robin(chunks)

    def _hooked(
        self, pairs: Iterator[tuple[Instance, Optional[int]]], step: Optional[int]
    ) -> Iterator[tuple[Instance, Optional[int]]]:
        """`pairs`, after `apply_token_indexers` (in the main process, whatever
        num_workers), `step` at a time (None: all) in streams of the hook's own."""
        settings = self.settings
        if not settings.hook_overridden:
            yield from pairs
            return
        private = PrivateRandom(derive_seed(settings.epoch_seed(0), "hook"))
        while True:
            items = list(itertools.islice(pairs, step))
            with private.active():
                for instance, _ in items:
                    settings.reader.apply_token_indexers(instance)
            yield from items
            if step is None or len(items) < step:
                return

    def _progress(self, iterable: Iterator[_P]) -> Iterator[_P]:
        if self.settings.quiet:
            return iterable
        from tqdm import tqdm

        return iter(tqdm(iterable, desc="loading instances", unit="instance", position=0))
