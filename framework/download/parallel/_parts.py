"""The part plan of a parallel fetch and its on-disk record of complete parts.

A plan cuts an object of a known size and version into byte ranges of one part
size. Which parts are complete, and how far the others got, is recorded next to the
partial file (`<final>.P<tag>.<host>.<pid>.<random>.parts`, JSON written
atomically), only after those bytes are fsynced; `adopt_parts` takes over an orphaned parallel
partial file together with its record (the same rules as a single-stream partial:
regular files of this user whose writer is gone). Parallel partial files carry a
`P` tag, so the single-stream path never takes their holes for bytes.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Final, Optional

import attrs

from framework.download._cache import parse_json, write_json_atomic
from framework.download._partial import (
    ACTIVE,
    NEW_PARTIAL_FLAGS,
    PARALLEL_TAG,
    Partial,
    PartialName,
    discard,
    foreign,
    orphaned,
    ours,
    remove_quietly,
    work_leftovers,
)
from framework.download._validators import Validators
from framework.download.backend import ByteStream

__all__ = [
    "MOST_PARTS",
    "PARALLEL_TAG",
    "Resumed",
    "VersionChanged",
    "adopt_parts",
    "discard_record",
]

logger = logging.getLogger("framework.download")

_RECORD_SUFFIX: Final = ".parts"
_COPY_CHUNK: Final = 1 << 20
_ADOPT_FLAGS: Final = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_LARGEST_RECORD: Final = 16 << 20  # read no more of a record (a planted one may be huge)
MOST_PARTS: Final = 1 << 20  # a plan has at most this many parts (larger ones for huge objects)


@attrs.frozen
class _Plan:
    size: int
    part_size: int
    validators: Validators

    @property
    def count(self) -> int:
        return -(-self.size // self.part_size)

    def bounds(self, index: int) -> tuple[int, int]:
        start = index * self.part_size
        return start, min(self.size, start + self.part_size)

    def check(self, stream: ByteStream, position: int) -> None:
        """A `VersionChanged` unless `stream` is a part of this plan's version from `position`."""
        got = Validators.of(stream)
        if (
            stream.status != 206
            or stream.start != position
            or stream.encoding is not None
            or stream.size != self.size
            or got.tag != self.validators.tag
        ):
            raise VersionChanged(
                f"a part came as status {stream.status}, from byte {stream.start} of {stream.size}, "
                f"version {got.version!r}; the plan was for {self.validators.version!r}"
            )


class VersionChanged(Exception):
    """A part did not come from the version the plan was made for."""


def _record_path(name: PartialName) -> Path:
    return name.path.with_name(name.path.name[: -len(".part")] + _RECORD_SUFFIX)


def _save_record(name: PartialName, plan: _Plan, done: set[int], reached: dict[int, int]) -> None:
    """Record the complete parts, and how far the others got (the first byte not yet
    written of each); the caller fsynced those bytes first."""
    data = {
        "size": plan.size,
        "part_size": plan.part_size,
        "etag": plan.validators.etag,
        "last_modified": plan.validators.last_modified,
        "date": plan.validators.date,
        "done": _runs(done),
        "reached": {str(index): position for index, position in sorted(reached.items())},
    }
    write_json_atomic(_record_path(name), data, durable=True)


def _runs(indices: set[int]) -> list[list[int]]:
    """`indices` as runs `[first, last]`: parts complete lowest first, so a record stays
    small whatever the object's size."""
    runs: list[list[int]] = []
    for index in sorted(indices):
        if runs and runs[-1][1] == index - 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return runs


def _load_record(path: Path) -> Optional[tuple[_Plan, set[int], dict[int, int]]]:
    """A record of ours, readable and consistent, else None (a miss: start over). A
    `reached` entry that makes no sense is dropped (its part is fetched whole)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not ours(os.fstat(fd)):
            return None
        with os.fdopen(os.dup(fd), "rb") as file:
            data = parse_json(file.read(_LARGEST_RECORD))
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        size, part_size = data["size"], data["part_size"]
        fields = [data.get(key) for key in ("etag", "last_modified", "date")]
    except (KeyError, TypeError):
        return None
    if not (_whole(size) and _whole(part_size) and size > 0 and part_size > 0):
        return None
    if not all(value is None or isinstance(value, str) for value in fields):
        return None
    plan = _Plan(size, part_size, Validators(*fields))
    if plan.count > MOST_PARTS:  # no plan of ours has more; a planted one must not cost memory
        return None
    # Progress is vouched for entry by entry: one that makes no sense is dropped alone
    # (its parts are fetched again), the others still count.
    done, entries = data.get("done"), data.get("reached", {})
    if not (isinstance(done, list) and isinstance(entries, dict)):
        return None  # not a record of ours
    runs: list[tuple[int, int]] = []
    for run in done:
        if isinstance(run, list) and len(run) == 2 and all(map(_whole, run)):
            if 0 <= run[0] <= run[1] < plan.count:
                runs.append((run[0], run[1]))
    complete: set[int] = set()
    covered = -1  # runs are expanded once each part: overlapping planted runs cost no more
    for first, last in sorted(runs):
        complete.update(range(max(first, covered + 1), last + 1))
        covered = max(covered, last)
    reached: dict[int, int] = {}
    for key, position in entries.items():
        # A part number has at most 7 digits (`MOST_PARTS`); int() of thousands raises.
        readable = isinstance(key, str) and key.isdigit() and key.isascii() and len(key) <= 20
        index = int(key) if readable else -1
        if _whole(position) and 0 <= index < plan.count and index not in complete:
            start, end = plan.bounds(index)
            if start < position < end:
                reached[index] = position
    return plan, complete, reached


def _whole(value: object) -> bool:
    """An int that is no bool (JSON's true is not a number of bytes)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _recorded_bytes(plan: _Plan, done: set[int], reached: dict[int, int]) -> int:
    return sum(end - start for start, end in map(plan.bounds, done)) + sum(
        position - plan.bounds(index)[0] for index, position in reached.items()
    )


@attrs.define
class Resumed:
    """A parallel partial file taken over from a writer that is gone, with its record."""

    partial: Partial
    plan: _Plan
    done: set[int]
    reached: dict[int, int]  # parts begun: the first byte not yet written


def adopt_parts(final: Path) -> Optional[Resumed]:
    """Take over an orphaned parallel partial file and its record (renamed to ours).

    Only regular files of this user whose writer is gone, with a readable record for
    their version and size, are candidates: the same rules as `Partial.adopt`.
    The one with the most recorded progress is taken. Records whose partial file is
    gone, dead writers' temporary files and, once one is taken, the other dead writers'
    parallel partial files are removed (otherwise `Partial.adopt` sweeps them)."""
    for leftover in work_leftovers(final, (_RECORD_SUFFIX, ".tmp")):
        partial = leftover.with_name(leftover.name[: -len(_RECORD_SUFFIX)] + ".part")
        if leftover.name.endswith(".tmp") or not os.path.lexists(partial):
            remove_quietly(leftover)
    now = time.time()
    candidates = []
    for name in PartialName.all(final):
        if not name.tag.startswith(PARALLEL_TAG):
            continue
        try:
            info = os.lstat(name.path)
        except OSError:
            continue
        if ours(info) and orphaned(name, info, now):
            loaded = _load_record(_record_path(name))
            if loaded is not None and PARALLEL_TAG + loaded[0].validators.tag != name.tag:
                loaded = None
            candidates.append((_recorded_bytes(*loaded) if loaded is not None else -1, name, loaded))
    candidates.sort(key=lambda candidate: candidate[0], reverse=True)  # the most progress first
    adopted: Optional[Resumed] = None
    for _recorded, name, loaded in candidates:
        if adopted is None and loaded is not None:
            adopted = _take(name, *loaded)
            if adopted is not None:
                continue
        if adopted is not None:  # another dead writer's: nothing will resume it now
            remove_quietly(name.path)
            remove_quietly(_record_path(name))
    return adopted


def _take(name: PartialName, plan: _Plan, done: set[int], reached: dict[int, int]) -> Optional[Resumed]:
    mine = name.claimed() if foreign(name) else name.renamed()
    ACTIVE.add(str(mine.path))
    try:
        os.rename(name.path, mine.path)  # atomic: at most one adopter wins
    except OSError:
        ACTIVE.discard(str(mine.path))
        return None
    try:
        os.rename(_record_path(name), _record_path(mine))
        fd = os.open(mine.path, _ADOPT_FLAGS)
    except OSError:
        remove_quietly(_record_path(mine))
        ACTIVE.discard(str(mine.path))
        return None  # the file stays, a later single-stream adoption starts it over
    info = os.fstat(fd)
    if not ours(info) or info.st_size != plan.size:  # swapped since the lstat, or not ours
        os.close(fd)
        remove_quietly(_record_path(mine))
        ACTIVE.discard(str(mine.path))
        return None
    if foreign(name):  # its writer may wake: its parts go to a file it never had open
        copied = _copy(mine, fd, plan, done, reached)
        if copied is None:
            return None
        mine, fd = copied
    partial = Partial(mine, fd)
    partial.validators = plan.validators
    partial.offset = _recorded_bytes(plan, done, reached)
    return Resumed(partial, plan, done, reached)


def _copy(
    taken: PartialName, fd: int, plan: _Plan, done: set[int], reached: dict[int, int]
) -> Optional[tuple[PartialName, int]]:
    """Copy the recorded bytes of a stale parallel partial file (`fd`, renamed to
    `taken`) into a new sparse file of ours with its own record, and remove it (see
    `Partial._copy`). A part that comes short (its writer woke and truncated it) is
    dropped from `done` and `reached`: it is fetched again. None (both files gone) if
    the copy fails."""
    copy = PartialName(taken.final, taken.tag, folder=taken.folder)
    ACTIVE.add(str(copy.path))
    out: Optional[int] = None
    try:
        out = os.open(copy.path, NEW_PARTIAL_FLAGS, 0o644)
        os.ftruncate(out, plan.size)
        for index in sorted(done | set(reached)):
            start, end = plan.bounds(index)
            end = reached.get(index, end)
            if _copy_range(fd, out, start, end) < end:
                done.discard(index)
                reached.pop(index, None)
        os.fsync(out)
        _save_record(copy, plan, done, reached)  # only after the bytes it vouches for are durable
    except OSError as error:
        if out is not None:
            os.close(out)
        discard(copy.path)
        remove_quietly(_record_path(copy))
        logger.info("cannot copy the stale partial file %s (%s); starting over", taken.path, error)
        return None
    except BaseException:
        if out is not None:
            os.close(out)
        discard(copy.path)
        remove_quietly(_record_path(copy))
        raise
    finally:
        os.close(fd)
        discard(taken.path)
        remove_quietly(_record_path(taken))
    return copy, out


def _copy_range(source: int, target: int, start: int, end: int) -> int:
    """Copy bytes `start` to `end` of `source` to the same place in `target`; where the
    copy stopped (short of `end` if `source` ends first)."""
    position = start
    while position < end:
        chunk = os.pread(source, min(_COPY_CHUNK, end - position), position)
        if not chunk:
            break
        view = memoryview(chunk)
        while view:
            written = os.pwrite(target, view, position)
            view, position = view[written:], position + written
    return position


def discard_record(partial: Partial) -> None:
    remove_quietly(_record_path(partial.name))
