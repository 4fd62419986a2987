"""Resume anywhere: which records a pass has yielded, in terms no topology enters.

Every record of the data (a line, a row, an item of `_read`'s output) has an index
`i` in the reader's full stream. A pass deals the records it has to yield over
`slots = world_size * num_workers` slots, record `i` to slot `i % slots`
(slot `rank + world_size * worker`, as the reader shards today), and each slot
batches its share one chunk (`max_instances_in_memory` instances) at a time.

- `Consumed` is the set of record indexes already yielded in an epoch: every index
  below `below`, plus a bitmap of those above. It says nothing of workers or
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
import hashlib
import itertools
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any, Optional, Protocol, TypeVar, cast, runtime_checkable

__all__ = [
    "EAGER_STATE_VERSIONS",
    "LAZY_STATE_VERSIONS",
    "READ",
    "STATE_VERSION",
    "Consumed",
    "Point",
    "Seekable",
    "ShardPlan",
    "consumed_by",
    "dealt_streams",
    "digest_of",
    "is_seekable",
    "reading_order",
    "slot_reading",
    "split_share",
]

# 1: the per-topology states of issue 9 (no "version" key); 2: lazy chunks all of
# max_instances_in_memory (an eager state of version 2 still resumes: nothing it names
# changed); 3: lazy chunks that grow from one batch (`BatchPlan.chunk_size`); 4: whole
# streamed shards dealt to slots (a position's "deal"; a state of version 3 still
# resumes: its records were dealt one by one, which is deal 0).
STATE_VERSION = 4
EAGER_STATE_VERSIONS = (2, 3, 4)
LAZY_STATE_VERSIONS = (3, 4)

_T = TypeVar("_T")
_T_co = TypeVar("_T_co", covariant=True)


@runtime_checkable
class Seekable(Protocol[_T_co]):
    """Records a reader can resume in the middle of (the reader hook, see `shard_iterable`).

    Iterating yields records in order; `tell()` is a token (plain JSON data) for where
    the record after the last one yielded starts, and `seek(token)` makes the next
    iteration start there. Built-in: the `"text"`, `"jsonl"` and `"csv"` readers'.

    Opt-in: the class also sets `__framework_seekable__ = True` (`is_seekable`). A
    file object has `__iter__`, `tell` and `seek` too, but cannot tell while it is
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
    digest: Optional[str] = None  # `digest_of` the chunk's first instance (None: unknown)
    # With whole shards dealt: [place in its stream of the shard that holds `record`,
    # index in the stream of that shard's first record] (None: unknown).
    shard: Optional[list[int]] = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> Point:
        later = ("digest", "shard")  # absent from a state from before them
        known = {key: state[key] for key in cls.__dataclass_fields__ if key not in later}
        return cls(**known, digest=state.get("digest"), shard=state.get("shard"))


LOOK = 4096  # a container with more items than this enters a digest by its size only


def digest_of(instance: Any) -> str:
    """A digest of an instance's content, the same in every process (a set's order, which
    follows the hash seed, does not enter it): resuming checks that a reader yields the
    same instances at the saved positions. Containers, strings, numbers, tensors, arrays
    and dataclasses count by content; other objects by type only."""
    digest = hashlib.sha256()
    _feed(digest, instance, 0)
    return digest.hexdigest()[:24]


def _feed(digest: Any, value: Any, depth: int) -> None:
    kind = type(value)
    digest.update(f"<{kind.__module__}.{kind.__qualname__}>".encode())
    if depth > 20:
        return
    if value is None or isinstance(value, (bool, int, float, complex)):
        digest.update(repr(value).encode())
    elif isinstance(value, str):
        digest.update(value.encode("utf-8", "surrogatepass"))
    elif isinstance(value, (bytes, bytearray, memoryview)):
        digest.update(bytes(value))
    elif isinstance(value, (Mapping, set, frozenset, list, tuple)) and len(value) > LOOK:
        digest.update(f"{len(value)} items".encode())  # a vocabulary attached, say: by size
    elif isinstance(value, Mapping):
        parts = sorted((_sub(key, depth), _sub(item, depth)) for key, item in value.items())
        digest.update(repr(parts).encode())
    elif isinstance(value, (set, frozenset)):
        digest.update(repr(sorted(_sub(item, depth) for item in value)).encode())
    elif isinstance(value, (list, tuple)):
        for item in value:
            _feed(digest, item, depth + 1)
    elif _is_array(value):
        digest.update(f"{value.dtype}{tuple(value.shape)}".encode())
        digest.update(_array_bytes(value)[: 1 << 20])
    elif is_dataclass(value) and not isinstance(value, type):
        _feed(digest, {field.name: getattr(value, field.name) for field in fields(value)}, depth + 1)
    # Other objects (a vocabulary or tokenizer handle the hook attached, say) count by
    # type only: their state may hold caches or ids that differ from run to run.


def _sub(value: Any, depth: int) -> str:
    digest = hashlib.sha256()
    _feed(digest, value, depth + 1)
    return digest.hexdigest()


def _is_array(value: Any) -> bool:
    torch = sys.modules.get("torch")
    numpy = sys.modules.get("numpy")
    return bool(
        (torch is not None and isinstance(value, torch.Tensor))
        or (numpy is not None and isinstance(value, numpy.ndarray))
    )


def _array_bytes(value: Any) -> bytes:
    try:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(value, torch.Tensor):
            flat = value.detach().cpu().contiguous().reshape(-1)
            return bytes(flat.view(torch.uint8).numpy().tobytes()) if flat.numel() else b""
        return bytes(value.tobytes())
    except (RuntimeError, TypeError, ValueError):  # sparse, quantized, object arrays: by shape
        return b""


@dataclass
class Consumed:
    """Record indexes yielded so far: all of `[0, below)` and the bits of `bits` above.

    Bit k of `bits` (little-endian within each byte) is record `below + k`.
    `token` is the reader's seek token for record `below` (None when unknown).
    `marks` (whole shards dealt): per stream, where reading it again may start,
    `[place of a shard in the stream, index in the stream of its first record]`,
    every record before it consumed; place `READ` for a stream read to its end.
    """

    below: int = 0
    bits: bytes = b""
    token: Any = None
    marks: dict[int, list[int]] = field(default_factory=dict)

    def __contains__(self, index: int) -> bool:
        if index < self.below:
            return True
        offset = index - self.below
        byte = offset >> 3
        return byte < len(self.bits) and bool(self.bits[byte] >> (offset & 7) & 1)

    def to_dict(self) -> dict[str, Any]:
        # zlib + base64 keeps an eager epoch's random subset small, and plain text.
        packed = base64.b64encode(zlib.compress(self.bits)).decode("ascii")
        marks = [[stream, *mark] for stream, mark in sorted(self.marks.items())]
        return {"below": self.below, "bits": packed, "token": self.token, "marks": marks}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> Consumed:
        below = state["below"]
        if not isinstance(below, int) or below < 0:
            raise ValueError(f"consumed.below must be an int >= 0, got {below!r}")
        bits = zlib.decompress(base64.b64decode(state["bits"]))
        marks = {}
        for mark in state.get("marks") or []:
            if not (isinstance(mark, list) and len(mark) == 3 and all(type(x) is int for x in mark)):
                raise ValueError(f"a consumed mark is [stream, place, index], got {mark!r}")
            marks[mark[0]] = mark[1:]
        return cls(below, bits, state.get("token"), marks)

    @property
    def top(self) -> int:
        """An index above every consumed one past `below`."""
        return self.below + 8 * len(self.bits)

    @classmethod
    def build(
        cls, low: int, value: int, tokens: Mapping[int, Any], marks: Optional[dict[int, list[int]]] = None
    ) -> Consumed:
        """All of `[0, low)` and bit k of `value` for record `low + k`.

        `below` stays at `low` when `tokens` can seek there (resuming seeks, then skips
        what is marked); else leading marked records join `below`.
        """
        below = low
        if tokens.get(low) is None:
            ones = (~value & (value + 1)).bit_length() - 1
            below, value = low + ones, value >> ones
        packed = value.to_bytes((value.bit_length() + 7) // 8, "little")
        return cls(below, packed, tokens.get(below), dict(marks or {}))


def consumed_by(
    base: Consumed,
    slots: int,
    limits: Mapping[int, int],
    taken: Iterable[int],
    tokens: Mapping[int, Any],
    marks: Optional[Mapping[int, list[int]]] = None,
) -> Consumed:
    """`base` plus what the slots of a pass yielded (and where they stand in their
    streams, `marks`, which supersede the base's).

    Slot `p` (of `slots`) yielded every record of its share (`i % slots == p`, not in
    `base`) below `limits[p]`, and the records in `taken`. `tokens` gives seek tokens
    by record index, for the new `below`. Every share below `base.below` is consumed,
    so everything below the lowest limit (`base.below` at least) is consumed.
    """
    # A share's limit may lie below `base.below` (with whole shards dealt, a stream's
    # index grows by the stride per record): all of it down there is in `base`.
    limits = {p: max(limit, base.below) for p, limit in limits.items()}
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
    return Consumed.build(low, value, tokens, {**base.marks, **(marks or {})})


READ = -1  # a stream's mark place: read to its end (`Consumed.marks`)


def dealt_streams(slot: int, slots: int, deal: int, split: int = 1) -> tuple[list[int], int]:
    """What slot `slot` (`rank + world * worker`) of `slots` reads when an epoch deals
    its shards as `deal` streams: the streams, and its part of their records.

    `split` 1: the slots read whole streams, each its own under the topology that
    dealt them, else (an epoch resumed over another) the streams p with
    p % slots == slot, one after another; part 0, all the records. `split` R (ranks
    that even their batch counts): the workers of each rank read whole streams as
    above, and rank r keeps record k of stream p when (k + p) % R == r, so the ranks
    end a few records apart at most (the rotation by p spreads the streams' odd
    records over the ranks)."""
    reader, readers = slot // split, slots // split
    streams = [reader] if readers == deal else list(range(reader, deal, readers))
    return streams, slot % split


def split_share(stream: int, part: int, deal: int, split: int) -> int:
    """The class modulo `deal * split` of the indexes part `part` keeps of stream
    `stream`: record k (index k * deal + stream) is kept when (k + stream) % split == part."""
    return stream + deal * ((part - stream) % split)


def reading_order(index: int, deal: int) -> tuple[int, int]:
    """Where record `index` comes in a slot's reading when whole shards are dealt over
    `deal` slots (its stream, then its place in it): a slot reads its streams in
    increasing order, so this orders the records of any slot as it reads them."""
    return (index % deal, index // deal) if deal else (0, index)


class ShardPlan:
    """A slot's share of the record stream, from `start` on, without the `base` records.

    Set on the reader (`DatasetReader._set_shard_plan`) in the process that reads.
    `last` is the index of the last record handed on, `fresh` whether one was handed
    on since the reader's last instance was taken (`take`).

    With `deal` (the epoch's shards dealt as `deal` streams, `dealt_streams`,
    `framework.data.ShardFiles.dealt`) the reader reads only the slot's `streams` of
    shards: record k of stream p has index `k * deal + p`, and the slot keeps the
    records with `(k + p) % split == part` (`split_share`), so its share of stream p is
    still one class of indexes modulo `deal * split`. The shards tell the plan as
    each one opens which stream it belongs to (`opened`).
    """

    def __init__(
        self,
        slot: int,
        slots: int,
        base: Consumed,
        start: int = 0,
        token: Any = None,
        *,
        deal: int = 0,
        streams: Sequence[int] = (),
        split: int = 1,
        part: int = 0,
        firsts: Optional[Mapping[int, int]] = None,
        shard: Optional[list[int]] = None,
    ) -> None:
        self.slot = slot
        self.slots = slots
        self.base = base
        self.start = start
        self.token = token
        self.deal = deal
        self.streams = list(streams)
        self.split, self.part = split, part
        self.stride = deal * split or 1  # between one record of the slot's share and the next
        self.stream = 0  # dealt: the place in `streams` of the stream being read
        self.next = 0  # dealt: the place in that stream of the next record
        self.firsts = dict(firsts or {})  # dealt: a stream's first record read (its mark)
        if self.streams:
            self.next = self.firsts.get(self.streams[0], 0)
        # dealt: [place in its stream of the shard being read, its first record's place]
        self.shard = shard
        self.source: Any = None
        self.last = start - self.stride
        self.after = start  # dealt: the index of the record read after the last one handed on
        self.fresh = False
        self.tracked = True
        self.at_start: Optional[Callable[[], None]] = None  # run once the reader is at `start`
        self.calls = 0  # filter() calls so far in this read
        self.seeked = False  # dealt: the reader seeked, and has opened no shard since
        self.numbered = 0  # records the finished calls numbered

    def filter(self, records: Iterable[_T], limit: Optional[int] = None) -> Iterator[_T]:
        """This slot's records of `records` (the first `limit` only, when given).

        A reader may call it more than once in a read (once per file, say): the records
        are numbered on across calls, and only the first call's records seek.
        """
        if self.deal:
            yield from self._dealt(records)
            return
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

    def opened(self, stream: int, place: int) -> None:
        """The reader opened the shard at `place` of `stream` (dealt): another stream
        numbers on from its first record read (`firsts`)."""
        if stream != self.streams[self.stream]:
            self.stream, self.next = self.streams.index(stream), self.firsts.get(stream, 0)
        elif self.seeked:
            # The first shard opened after a seek: its first record's place is the saved
            # point's, when it is the shard the point was in; else unknown here.
            self.seeked = False
            if self.shard is None or self.shard[0] != place:
                self.shard = None
            return
        self.shard = [place, self.next]

    def held(self) -> Optional[list[int]]:
        """`Point.shard` for the record after the last one handed on (dealt)."""
        return None if self.shard is None else list(self.shard)

    def _dealt(self, records: Iterable[_T]) -> Iterator[_T]:
        """`filter` when whole shards are dealt: every record read is this slot's."""
        first = self.calls == 0
        self.calls += 1
        goal = self._place(self.start)
        seekable = first and is_seekable(records)
        if seekable and self.token is not None:
            cast(Seekable[_T], records).seek(self.token)
            self.stream, self.next = goal
            self.seeked = True
        self.source = records if seekable else None
        at_start = self.at_start if first else None
        base = self.base
        skip_base = bool(base.below or base.bits)
        iterator = iter(records)
        while True:
            if at_start is not None and (self.stream, self.next) >= goal:
                at_start()  # the records from `start` on draw from the chunk's seeds
                at_start = None
            try:
                record = next(iterator)  # may open a shard of the next stream (`opened`)
            except StopIteration:
                return
            place = (self.stream, self.next)
            self.next += 1
            stream = self.streams[place[0]]
            index = place[1] * self.deal + stream
            if (place[1] + stream) % self.split != self.part or place < goal or (skip_base and index in base):
                continue  # read past: another rank's, before the start, or yielded before
            self.last = index
            self.after = index + self.deal
            self.fresh = True
            yield record

    def _place(self, index: int) -> tuple[int, int]:
        """(place in `streams`, place in the stream) of record `index` (dealt)."""
        stream, place = reading_order(index, self.deal)
        if stream not in self.streams:  # a slot with no streams: nothing to read
            return (len(self.streams), 0)
        return (self.streams.index(stream), place)

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
        # Dealt: the record after the last one handed on, which the seek token is for
        # (another rank's when ranks split the streams: it is read past).
        return (self.after if self.deal else self.last + 1), token


def slot_reading(
    slot: int, slots: int, base: Consumed, point: Optional[Point], source: Any, deal: int, split: int = 1
) -> tuple[ShardPlan, Any, Point]:
    """What slot `slot` of `slots` reads in a lazy pass: its shard plan, what its reader
    reads (with the shards dealt as `deal` streams, `dealt_streams`: its streams of
    `source`, a `ShardFiles`) and where it starts (`point`, or the start of its share)."""
    if not deal:
        start = point or Point(record=base.below, token=base.token)
        return ShardPlan(slot, slots, base, max(start.record, 0), start.token), source, start
    streams, part = dealt_streams(slot, slots, deal, split)
    # Each stream from its mark: the shards before it are read already. From the base's
    # marks only, which stay the same for the whole pass: a seek token is a place in
    # what the pass read, so a pass resumed at its point reads the same shards again.
    firsts = {stream: base.marks[stream][1] for stream in streams if stream in base.marks}
    first = firsts.get(streams[0], 0) * deal + streams[0] if streams else 0
    start = point or Point(record=first)
    plan = ShardPlan(
        slot,
        slots,
        base,
        start.record if start.record >= 0 else first,  # untracked: from the start, skipping
        start.token,
        deal=deal,
        streams=streams,
        split=split,
        part=part,
        firsts=firsts,
        shard=start.shard,
    )
    mine = source.dealt(streams, deal, base.marks)
    mine.on_open = plan.opened
    return plan, mine, start
