"""The messages between the main process and a loader worker, one frozen class each.

Main process -> worker, on the worker's control pipe:

- `Start`: serve one pass (batches or instances) from a seed: the worker's slot of
  the records (`slot` of `slots`, without those in `base`), restarting at `point`;
- `Stop`: finish the current batch and exit (also checked between batches, so a
  busy worker stops cooperatively and cleans up).

Worker -> main process, as frames on the worker's data pipe:

- `Ready` (forked workers only, their first frame): the worker got through its
  start-up, where a lock another thread held at the fork could stop it for good;
- `Batch` (a collated batch), `Instances` (a list of instances), each with the
  record indexes of its instances and (lazy mode) the `Point` to restart after it;
- `Progress`: the reader is still producing (sent only when a `timeout` is set, so
  the timeout measures silence, not the time to fill a frame);
- `Done`: the pass ended, after reading `instances` instances and every record of
  the slot below `end` (-1: unknown);
- `Failed`: the pass raised; the worker keeps serving commands.

A worker only counts what it sends; the pool is the only writer of the iteration
position (`Position`), so what `state_dict()` reports is what the consumer received.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

from framework.data._shards import Consumed, Point

__all__ = [
    "Batch",
    "Done",
    "Failed",
    "Instances",
    "PassKind",
    "Progress",
    "Ready",
    "Start",
    "Stop",
    "ToMain",
    "ToWorker",
]

PassKind = Literal["batches", "instances"]


@dataclass(frozen=True, slots=True)
class Start:
    kind: PassKind
    seed: int
    slot: int  # this worker's share: records i with i % slots == slot, not in base (or see deal)
    slots: int
    base: Consumed  # records the epoch yielded before this pass (an elastic resume)
    point: Optional[Point]  # where to restart (resuming); None: from the start
    source: Any = None  # what the reader reads this pass, when not the spec's (shards in epoch order)
    deal: int = 0  # the shards of `source` dealt as this many streams (0: records one by one)
    split: int = 1  # ranks splitting each stream's records (`framework.data._shards.dealt_streams`)


@dataclass(frozen=True, slots=True)
class Stop:
    pass


@dataclass(frozen=True, slots=True)
class Batch:
    payload: Any
    indexes: list[Optional[int]]  # the record each instance came from (None: unknown)
    point: Optional[Point] = None  # where this slot restarts after this batch
    shards_read: dict[str, str] = field(
        default_factory=dict
    )  # shards opened since the last message: URL -> sha256


@dataclass(frozen=True, slots=True)
class Instances:
    instances: list[Any]
    indexes: list[Optional[int]]
    point: Optional[Point] = None  # as Batch's (lazy mode, collated in the main process)
    seed: Optional[int] = None  # the batch's own streams, for the hook and collator (lazy)
    shards_read: dict[str, str] = field(default_factory=dict)  # as Batch's


@dataclass(frozen=True, slots=True)
class Progress:
    pass


@dataclass(frozen=True, slots=True)
class Ready:
    pass


@dataclass(frozen=True, slots=True)
class Done:
    instances: int
    end: int = -1


@dataclass(frozen=True, slots=True)
class Failed:
    summary: str  # "TypeName: message", safe even when the exception's __str__ raises
    traceback: str
    original: Optional[BaseException]  # None when it cannot be rebuilt in the main process


ToWorker = Union[Start, Stop]
ToMain = Union[Batch, Instances, Progress, Ready, Done, Failed]
