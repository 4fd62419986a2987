"""Resume anywhere: which records a pass has yielded, in terms no topology enters.

Every record of the data (a line, a row, an item of ``_read``'s output) has an index
``i`` in the reader's full stream. A pass deals the records it has to yield over
``slots = world_size * num_workers`` slots, record ``i`` to slot ``i % slots``
(slot ``rank + world_size * worker``, as the reader shards today), and each slot
batches its share one chunk (``max_instances_in_memory`` instances) at a time.

- `Consumed` is the set of record indexes already yielded in an epoch: every index
  below ``below``, plus a bitmap of those above. It says nothing of workers or
  ranks, so any other topology can deal out what is left (`ShardPlan`).
- `Point` is where one slot's stream restarts exactly: the chunk, the record (and
  the reader's seek token) it starts at, and how much of it was taken. The same
  topology resumes batch for batch from these.
- `ShardPlan` is set on the reader in the process that reads: it filters the record
  stream to the slot's share, seeks a seekable record source (`Seekable`) to the
  start, and tells which record each instance came from.
"""

from __future__ import annotations

import base64
import itertools
import os
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Optional, Protocol, TypeVar, cast, runtime_checkable

__all__ = [
    "STATE_VERSION",
    "Consumed",
    "Point",
    "Seekable",
    "ShardPlan",
    "check_files",
    "check_settings",
    "consumed_by",
    "file_stamps",
    "is_seekable",
]

STATE_VERSION = 2  # 1: the per-topology states of issue 9 (no "version" key)

_T = TypeVar("_T")
_T_co = TypeVar("_T_co", covariant=True)


@runtime_checkable
class Seekable(Protocol[_T_co]):
    """Records a reader can resume in the middle of (the reader hook, see `shard_iterable`).

    Iterating yields records in order; `tell()` is a token (plain JSON data) for where
    the record after the last one yielded starts, and `seek(token)` makes the next
    iteration start there. Built-in: the ``"text"``, ``"jsonl"`` and ``"csv"`` readers'.

    Opt-in: the class also sets ``__framework_seekable__ = True`` (`is_seekable`). A
    file object has ``__iter__``, ``tell`` and ``seek`` too, but cannot tell while it is
    iterated, so having the methods is not enough.
    """

    __framework_seekable__: bool

    def __iter__(self) -> Iterator[_T_co]: ...

    def tell(self) -> Any: ...

    def seek(self, token: Any) -> None: ...


def is_seekable(records: object) -> bool:
    """Whether `records` opted into the resume hook (`Seekable`)."""
    return getattr(type(records), "__framework_seekable__", False) is True


@dataclass
class Point:
    """Where a slot's stream restarts exactly: chunk `chunk`, `within` of it already taken.

    `within` counts instances of the (shuffled) chunk, or batches with a sampler.
    `record` is the index of the chunk's first record (-1 when the reader does not
    say which record an instance came from: then `skip` instances are read and
    dropped instead), `token` the reader's seek token for it (None: no seeking).
    """

    chunk: int = 0
    record: int = 0
    token: Any = None
    skip: int = 0
    within: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> Point:
        return cls(**{key: state[key] for key in cls.__dataclass_fields__})


@dataclass
class Consumed:
    """Record indexes yielded so far: all of ``[0, below)`` and the bits of `bits` above.

    Bit k of `bits` (little-endian within each byte) is record ``below + k``.
    `token` is the reader's seek token for record `below` (None when unknown).
    """

    below: int = 0
    bits: bytes = b""
    token: Any = None

    def __contains__(self, index: int) -> bool:
        if index < self.below:
            return True
        offset = index - self.below
        byte = offset >> 3
        return byte < len(self.bits) and bool(self.bits[byte] >> (offset & 7) & 1)

    def to_dict(self) -> dict[str, Any]:
        # zlib + base64 keeps an eager epoch's random subset small, and plain text.
        packed = base64.b64encode(zlib.compress(self.bits)).decode("ascii")
        return {"below": self.below, "bits": packed, "token": self.token}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> Consumed:
        below = state["below"]
        if not isinstance(below, int) or below < 0:
            raise ValueError(f"consumed.below must be an int >= 0, got {below!r}")
        bits = zlib.decompress(base64.b64decode(state["bits"]))
        return cls(below, bits, state.get("token"))

    @property
    def top(self) -> int:
        """An index above every consumed one past `below`."""
        return self.below + 8 * len(self.bits)

    @classmethod
    def build(cls, low: int, value: int, tokens: Mapping[int, Any]) -> Consumed:
        """All of ``[0, low)`` and bit k of `value` for record ``low + k``.

        `below` stays at `low` when `tokens` can seek there (resuming seeks, then skips
        what is marked); else leading marked records join `below`.
        """
        below = low
        if tokens.get(low) is None:
            ones = (~value & (value + 1)).bit_length() - 1
            below, value = low + ones, value >> ones
        return cls(below, value.to_bytes((value.bit_length() + 7) // 8, "little"), tokens.get(below))


def consumed_by(
    base: Consumed,
    slots: int,
    limits: Mapping[int, int],
    taken: Iterable[int],
    tokens: Mapping[int, Any],
) -> Consumed:
    """`base` plus what the slots of a pass yielded.

    Slot `p` (of `slots`) yielded every record of its share (``i % slots == p``, not in
    `base`) below ``limits[p]``, and the records in `taken`. `tokens` gives seek tokens
    by record index, for the new `below`. Every slot starts at ``base.below`` or later,
    so everything below the lowest limit is consumed.
    """
    low = min(limits.values())
    taken = [index for index in taken if index >= low]
    top = max([base.top, *limits.values(), *(index + 1 for index in taken)])
    bits = bytearray((top - low + 7) // 8)  # marked in place: an int would copy per bit
    for p, limit in limits.items():
        for index in range(low + (p - low) % slots, limit, slots):
            bits[(index - low) >> 3] |= 1 << ((index - low) & 7)
    for index in taken:
        bits[(index - low) >> 3] |= 1 << ((index - low) & 7)
    value = int.from_bytes(bits, "little") | int.from_bytes(base.bits, "little") >> (low - base.below)
    return Consumed.build(low, value, tokens)


class ShardPlan:
    """A slot's share of the record stream, from `start` on, without the `base` records.

    Set on the reader (`DatasetReader._set_shard_plan`) in the process that reads.
    `last` is the index of the last record handed on, `fresh` whether one was handed
    on since the reader's last instance was taken (`take`).
    """

    def __init__(
        self,
        slot: int,
        slots: int,
        base: Consumed,
        start: int = 0,
        token: Any = None,
    ) -> None:
        self.slot = slot
        self.slots = slots
        self.base = base
        self.start = start
        self.token = token
        self.source: Any = None
        self.last = start - 1
        self.fresh = False
        self.tracked = True
        self.at_start: Optional[Callable[[], None]] = None  # run once the reader is at `start`
        self.calls = 0  # filter() calls so far in this read
        self.numbered = 0  # records the finished calls numbered

    def filter(self, records: Iterable[_T], limit: Optional[int] = None) -> Iterator[_T]:
        """This slot's records of `records` (the first `limit` only, when given).

        A reader may call it more than once in a read (once per file, say): the records
        are numbered on across calls, and only the first call's records seek.
        """
        first = self.calls == 0
        self.calls += 1
        index = self.numbered
        seekable = first and is_seekable(records)
        if seekable and self.token is not None:
            cast(Seekable[_T], records).seek(self.token)
            index = self.start
        self.source = records if seekable else None
        iterator = iter(records)
        for _ in itertools.islice(iterator, max(0, self.start - index)):  # no seek: read past
            index += 1
        if first and self.at_start is not None:
            self.at_start()  # the records from `start` on draw from the chunk's seeds
        if limit is not None:
            iterator = itertools.islice(iterator, max(0, limit - index))
        slot, slots, base = self.slot, self.slots, self.base
        skip_base = bool(base.below or base.bits)  # a fresh pass has nothing to skip
        for record in iterator:
            if index % slots == slot and not (skip_base and index in base):
                self.last = index
                self.fresh = True
                yield record
            index += 1
        self.numbered = index

    def take(self) -> Optional[int]:
        """The record index of the instance the reader just yielded (None: unknown)."""
        if not self.fresh:
            # No record was handed on for it: the reader yields several instances per
            # record, builds a list first, or shards by itself. Indexes are unknown.
            self.tracked = False
        self.fresh = False
        return self.last if self.tracked else None

    def where(self) -> tuple[int, Any]:
        """(index, seek token) of the record after the last one handed on."""
        if not self.tracked:
            return -1, None
        if self.calls == 0:
            # Nothing read yet (a chunk of a resumed slot starts here): the token this
            # plan seeks to is the start record's. Without it, a state saved before the
            # slot's next chunk had no seek position, and its resume read from the start.
            return self.start, self.token
        # Only the first call's records seek; a later call's position has no token.
        token = None
        if self.source is not None and self.calls == 1:
            try:
                token = self.source.tell()
            except (OSError, ValueError):  # cannot tell now (closed, say): resuming skips instead
                token = None
        return self.last + 1, token


def check_settings(saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """ValueError unless a state saved under `saved` settings is valid under `current`.

    These say which instances exist and how they batch: resuming across another of
    them would silently repeat, skip or re-batch instances. (num_workers and world size
    are not among them: another split resumes.)
    """
    if bool(saved.get("lazy")) != current["lazy"]:
        raise ValueError(
            "the state was saved by a loader in the other mode (eager/lazy); build the "
            "loader with the same max_instances_in_memory to resume it"
        )
    for key, value in current.items():
        if key not in saved:
            raise ValueError(f"the state's settings lack {key!r}; pass the loader's own state_dict()")
        if not _same_setting(saved[key], value):
            raise ValueError(
                f"the state was saved by a loader with {key}={saved[key]!r}, but this loader "
                f"has {key}={value!r}: resuming would repeat or skip instances. Build the "
                f"loader with {key}={saved[key]!r} to resume this state, or start without it"
            )


def file_stamps(data_path: Any) -> dict[str, list[int]]:
    """``{path: [size, mtime_ns]}`` of the local files `data_path` names (a path or a
    list of paths; anything else names none): a state's positions (record indexes,
    byte offsets) hold only for the same data."""
    paths = data_path if isinstance(data_path, list) else [data_path]
    stamps: dict[str, list[int]] = {}
    for path in paths:
        if isinstance(path, (str, os.PathLike)) and os.path.isfile(path):
            stat = os.stat(path)
            stamps[os.fspath(path)] = [stat.st_size, stat.st_mtime_ns]
    return stamps


def check_files(saved: Any) -> None:
    """ValueError unless the files stamped in `saved` (`file_stamps`) are unchanged."""
    if saved is None:  # a state from before the stamps
        return
    if not (isinstance(saved, Mapping) and all(
        isinstance(stamp, list) and len(stamp) == 2 and all(isinstance(x, int) for x in stamp)
        for stamp in saved.values()
    )):
        raise ValueError(
            f"the state's 'files' must map each data file to [size, mtime_ns], got {saved!r}; "
            "pass the loader's own state_dict()"
        )
    for path, (size, mtime) in saved.items():
        now = file_stamps(path).get(path)
        if now != [size, mtime]:
            found = "it is gone" if now is None else f"size {size} -> {now[0]}, mtime_ns {mtime} -> {now[1]}"
            raise ValueError(
                f"data file {path} changed since the state was saved ({found}): the saved "
                "positions would land on other records (mid-line, past the end). Resume with "
                "the unchanged file, or start the epoch afresh without load_state_dict()"
            )


def _same_setting(saved: Any, current: Any) -> bool:
    """Equal; inside a component's settings (`describe`) a None on either side matches
    anything: it may be filled in on first use (a sampler's guessed sorting keys)."""
    if isinstance(saved, Mapping) and isinstance(current, Mapping):
        return saved.keys() == current.keys() and all(
            saved[key] is None or current[key] is None or saved[key] == current[key]
            for key in saved
        )
    return bool(saved == current)
