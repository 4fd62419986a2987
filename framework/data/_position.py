"""`Position`: where one rank's pass over the data stands, enough to resume it exactly.

The pool is its only writer (see `_pool`); `state_dict()` reads it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Optional, cast

from framework.data._shards import READ, Consumed, Point, dealt_streams, reading_order, split_share

__all__ = ["Position"]


@dataclass
class Position:
    """Where a pass over the data stands (one rank's): enough to resume it exactly.

    Per worker (slot `rank + world_size * worker`): batches taken, whether it is done,
    the `Point` to restart it after its last batch, the record indexes it yielded at or
    after that point's record (`taken`), and when done, the record below which it read
    everything (`ends`). `base`: the records the epoch yielded before this pass began.

    `deal`: over how many slots the epoch deals whole shards (`ShardPlan`), 0 when it
    deals records one by one, None until its first pass begins. `high`: per worker,
    one past the highest record index it yielded. `shards_read`: the sha256 of each streamed
    shard the epoch opened (by URL), which a saved state pins.
    """

    epoch: int
    seed: int
    consumed: int = 0
    per_worker: list[int] = field(default_factory=list)
    done: list[bool] = field(default_factory=list)
    next_worker: int = 0
    instances: int = 0
    base: Consumed = field(default_factory=Consumed)
    points: list[Optional[Point]] = field(default_factory=list)
    taken: list[list[int]] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    tracked: bool = True
    deal: Optional[int] = None
    split: Optional[int] = None
    high: list[int] = field(default_factory=list)
    shards_read: dict[str, str] = field(default_factory=dict)

    def begin(self, workers: int) -> None:
        """Size the per-worker lists for a pass with `workers` slots (once)."""
        if not self.per_worker:
            self.per_worker = [0] * workers
            self.done = [False] * workers
        if not self.points:
            self.points = [None] * workers
            self.taken = [[] for _ in range(workers)]
            self.ends = [-1] * workers
        if not self.high:
            self.high = [0] * workers

    def record(
        self,
        worker: int,
        indexes: list[Optional[int]],
        point: Optional[Point],
        shards_read: Optional[dict[str, str]] = None,
    ) -> None:
        """Worker `worker` yielded a batch of `indexes`; after it the worker restarts at
        `point`; it opened the shards of `shards_read` since its last batch."""
        if shards_read:
            self.shards_read.update(shards_read)
        previous = self.points[worker]
        self.points[worker] = point
        if point is None or point.record < 0 or any(i is None for i in indexes):
            self.tracked = False
        if not self.tracked or point is None:
            return
        taken = self.taken[worker]
        taken.extend(cast(list[int], indexes))
        if indexes:
            self.high[worker] = max(self.high[worker], 1 + max(cast(list[int], indexes)))
        if previous is None or previous.record != point.record:
            deal = self.deal or 0
            here = reading_order(point.record, deal)
            self.taken[worker] = [i for i in taken if reading_order(i, deal) >= here]

    def finish(self, worker: int, instances: int, end: int) -> None:
        self.done[worker] = True
        self.instances += instances
        self.ends[worker] = end

    def limits(self, rank: int, world: int) -> dict[int, int]:
        """Per share of this rank's slots (a slot's, or with whole shards dealt, a
        stream's: the indexes `i % stride == share`): every record of it below this one
        was yielded."""
        out = {}
        slots = world * len(self.points)
        for worker, point in enumerate(self.points):
            slot = rank + world * worker
            if not self.deal:
                if self.done[worker] and self.ends[worker] >= 0:
                    out[slot] = self.ends[worker]
                elif point is not None:
                    out[slot] = point.record
                else:
                    out[slot] = self.base.below  # nothing yielded yet
                continue
            # A slot reads its streams one after another: those before the current one
            # are read to their end (past every index the slot yielded).
            finished = max(self.high[worker], self.ends[worker], self.base.below)
            current = point.record % self.deal if point is not None else -1
            streams, part = dealt_streams(slot, slots, self.deal, self.split or 1)
            for stream in streams:
                share = split_share(stream, part, self.deal, self.split or 1)
                if self.done[worker] or stream < current:
                    out[share] = finished
                elif stream == current and point is not None:
                    out[share] = point.record
                else:
                    out[share] = self.base.below  # nothing yielded yet
        return out

    def marks(self, rank: int, world: int) -> dict[int, list[int]]:
        """Per stream of this rank's slots (whole shards dealt): where reading it again
        may start (`Consumed.marks`): the base's, unless a worker is past it. The job's
        mark of a stream several ranks read (`split`) is the earliest of theirs."""
        out: dict[int, list[int]] = {}
        if not self.deal:
            return out
        slots = world * len(self.points)
        for worker, point in enumerate(self.points):
            current = point.record % self.deal if point is not None else -1
            streams, _ = dealt_streams(rank + world * worker, slots, self.deal, self.split or 1)
            for stream in streams:
                if self.done[worker] or stream < current:
                    out[stream] = [READ, 0]
                elif stream == current and point is not None and point.shard is not None:
                    out[stream] = list(point.shard)
                else:
                    out[stream] = list(self.base.marks.get(stream, [0, 0]))
        return out

    def stride(self, slots: int) -> int:
        """The share of record `i` is `i % stride` (`limits`), for a pass of `slots` slots."""
        return self.deal * (self.split or 1) if self.deal else slots

    def tokens(self) -> dict[int, Any]:
        """Seek tokens by record index, where the workers' points know them (with whole
        shards dealt, none: a token is a place in one slot's shards)."""
        if self.deal:
            return {}
        return {p.record: p.token for p in self.points if p is not None and p.token is not None}

    def to_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "seed": self.seed,
            "consumed": self.consumed,
            "per_worker": list(self.per_worker),
            "done": list(self.done),
            "next_worker": self.next_worker,
            "instances": self.instances,
            "base": self.base.to_dict(),
            "points": [None if p is None else p.to_dict() for p in self.points],
            "taken": [list(t) for t in self.taken],
            "ends": list(self.ends),
            "tracked": self.tracked,
            "deal": self.deal,
            "split": self.split,
            "high": list(self.high),
            "shards_read": dict(self.shards_read),
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> Position:
        # Copies: the caller's state must stay as saved (it may be loaded again).
        # "deal", "high" and "shards_read": absent from a state of format version 3 (records dealt one by one)
        older: dict[str, Any] = {"deal": 0, "split": 1, "high": [], "shards_read": {}}
        fields: dict[str, Any] = {
            key: copy.deepcopy(state.get(key, older.get(key))) for key in cls.__dataclass_fields__
        }
        missing = [key for key in cls.__dataclass_fields__ if key not in state and key not in older]
        if missing:
            raise KeyError(missing[0])
        fields["base"] = Consumed.from_dict(state["base"])
        fields["points"] = [None if p is None else Point.from_dict(p) for p in state["points"]]
        fields["taken"] = [list(t) for t in state["taken"]]
        return cls(**fields)
