"""`Position`: where one rank's pass over the data stands, enough to resume it exactly.

The pool is its only writer (see `_pool`); `state_dict()` reads it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Optional, cast

from framework.data._shards import Consumed, Point

__all__ = ["Position"]


@dataclass
class Position:
    """Where a pass over the data stands (one rank's): enough to resume it exactly.

    Per worker (slot `rank + world_size * worker`): batches taken, whether it is done,
    the `Point` to restart it after its last batch, the record indexes it yielded at or
    after that point's record (`taken`), and when done, the record below which it read
    everything (`ends`). `base`: the records the epoch yielded before this pass began.
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

    def begin(self, workers: int) -> None:
        """Size the per-worker lists for a pass with `workers` slots (once)."""
        if not self.per_worker:
            self.per_worker = [0] * workers
            self.done = [False] * workers
        if not self.points:
            self.points = [None] * workers
            self.taken = [[] for _ in range(workers)]
            self.ends = [-1] * workers

    def record(self, worker: int, indexes: list[Optional[int]], point: Optional[Point]) -> None:
        """Worker `worker` yielded a batch of `indexes`; after it the worker restarts at `point`."""
        previous = self.points[worker]
        self.points[worker] = point
        if point is None or point.record < 0 or any(i is None for i in indexes):
            self.tracked = False
        if not self.tracked or point is None:
            return
        taken = self.taken[worker]
        taken.extend(cast(list[int], indexes))
        if previous is None or previous.record != point.record:
            self.taken[worker] = [i for i in taken if i >= point.record]

    def finish(self, worker: int, instances: int, end: int) -> None:
        self.done[worker] = True
        self.instances += instances
        self.ends[worker] = end

    def limits(self, rank: int, world: int) -> dict[int, int]:
        """Per slot of this rank: every record of its share below this one was yielded."""
        out = {}
        for worker, point in enumerate(self.points):
            slot = rank + world * worker
            if self.done[worker] and self.ends[worker] >= 0:
                out[slot] = self.ends[worker]
            elif point is not None:
                out[slot] = point.record
            else:
                out[slot] = self.base.below  # nothing yielded yet
        return out

    def tokens(self) -> dict[int, Any]:
        """Seek tokens by record index, where the workers' points know them."""
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
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> Position:
        # Copies: the caller's state must stay as saved (it may be loaded again).
        fields = {key: copy.deepcopy(state[key]) for key in cls.__dataclass_fields__}
        fields["base"] = Consumed.from_dict(state["base"])
        fields["points"] = [None if p is None else Point.from_dict(p) for p in state["points"]]
        fields["taken"] = [list(t) for t in state["taken"]]
        return cls(**fields)
