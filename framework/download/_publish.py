"""Streaming a remote object into a partial file, and publishing it atomically.

Bytes go to a partial file that only this process writes (`PartialName`: named
with the version's tag, its host, pid and a random token), are hashed in the same
pass, checked against the expected size and sha256, fsynced, and only then renamed
to the final path. An interrupted download leaves its partial file behind; a later
call adopts it by renaming it to its own name first, so two processes never append
to one file.

The cache folder may be shared with people we do not trust: only a regular file
owned by this user is adopted, it is opened with `O_NOFOLLOW` and checked with
`fstat` on the descriptor that is then written, so a planted symlink, FIFO or
folder is never followed, written through or waited on.

Range answers are decided here, once, for every backend (`_place`): a body is
appended to a partial file only when it starts at the partial's offset and carries
the same version tag (ETag, else Last-Modified); without a validator a partial is
never resumed, since two versions' bytes must never mix.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Final, Optional

import attrs

from framework.download._cache import (
    HOST,
    NEW_FILE_FLAGS,
    RELEASED_PID,
    Entry,
    dead_leftovers,
    is_alive_local,
    parse_owner,
    unique_token,
)
from framework.download._pipeline import Pipeline
from framework.download._validators import NO_VALIDATOR, Validators
from framework.download.backend import UNPLACED, ByteStream, DownloadBackend, RemoteInfo
from framework.errors import ChecksumError, DownloadError, HTTPStatusError, NetworkError

__all__ = [
    "RESUMABLE",
    "TRANSIENT_STATUSES",
    "Fetched",
    "PartialName",
    "discard",
    "fetch",
    "partial_bytes",
    "publish_fetched",
    "publish_file",
    "remove_quietly",
    "resumable",
]

logger = logging.getLogger("framework.download")

_READ_CHUNK: Final = 1 << 20
# A partial file of another host's process, untouched this long, is taken to be orphaned;
# longer than any read timeout, so a stalled but live writer is not robbed.
STALE_AFTER_S: Final = 300.0
PARALLEL_TAG: Final = "P"  # prefixes the tag of a parallel partial file (never resumed as contiguous)


def _new_hasher() -> Any:
    return hashlib.sha256()  # looked up at each call, so a test can inject a failing hash


# Partial files this process is writing right now; any other partial of this process
# is left over from an interrupted call (Ctrl-C) and may be adopted like a dead one's.
_ACTIVE: set[str] = set()
# What may interrupt a fetch that a later call resumes: the partial file (and a parallel
# fetch's record of its parts) is kept. A status the server may answer otherwise later
# (an outage: 5xx after retries, 408, 429) is one too (see `resumable`).
RESUMABLE: Final = (NetworkError, KeyboardInterrupt)
# 501 (not implemented) is final: asking again cannot help.
TRANSIENT_STATUSES: Final = frozenset({408, 429, *range(500, 600)} - {501})


def resumable(error: BaseException) -> bool:
    """Whether a later call may resume after `error`: the partial file and its record stay.
    A broken connection, Ctrl-C, or a status of an outage (a 503 at 90% of 10 GiB must
    not cost 10 GiB)."""
    if isinstance(error, HTTPStatusError):
        return error.status in TRANSIENT_STATUSES
    return isinstance(error, RESUMABLE)


@attrs.frozen
class PartialName:
    """The one place that knows a partial file's name:
    `<final>.<tag>.<host>.<pid>.<random>.part` (see `unique_token`)."""

    final: Path
    tag: str
    token: str = attrs.field(factory=unique_token)

    @property
    def path(self) -> Path:
        return self.final.with_name(f"{self.final.name}.{self.tag}.{self.token}.part")

    @property
    def owner(self) -> Optional[tuple[str, int]]:
        return parse_owner(self.path.name)

    def renamed(self, tag: Optional[str] = None) -> PartialName:
        """This process's own name for the same file (a fresh token), optionally retagged."""
        return PartialName(self.final, self.tag if tag is None else tag)

    def claimed(self) -> PartialName:
        """A fresh name that keeps the writer's host and pid: what an adopter renames a
        foreign writer's file to before copying it. Killed before the copy is done, it
        leaves a file that is still foreign (copied again, never renamed into use)."""
        host, pid, _random = self.token.split(".")
        return PartialName(self.final, self.tag, f"{host}.{pid}.{secrets.token_hex(4)}")

    @classmethod
    def parse(cls, folder: Path, name: str) -> Optional[PartialName]:
        """The partial file called `name` in `folder`; None for any other name.
        (`FINAL.TAG.HOST.PID.RANDOM.part`: neither a tag nor a host holds a dot.)"""
        fields = name[: -len(".part")].rsplit(".", 4) if name.endswith(".part") else []
        if len(fields) != 5 or not fields[0]:
            return None
        return cls(folder / fields[0], fields[1], ".".join(fields[2:]))

    @classmethod
    def all(cls, final: Path) -> list[PartialName]:
        """Every partial file of `final`, whoever wrote it."""
        try:
            names = os.listdir(final.parent)
        except OSError:
            return []
        found = (cls.parse(final.parent, name) for name in names if name.startswith(final.name + "."))
        return [name for name in found if name is not None and name.final == final]


@attrs.frozen
class Fetched:
    """A verified partial file, ready for `publish_file`; `info` is its `fstat`."""

    temp: Path
    size: int
    sha256: str
    validators: Validators
    info: os.stat_result
    fetched: Optional[float] = None  # when its version was fetched (a copy of another cache's), else now


def partial_bytes(final: Path) -> int:
    """Bytes in every partial file of `final`: a waiter's view of the holder's progress."""
    total = 0
    for name in PartialName.all(final):
        try:
            info = os.lstat(name.path)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode):
            # Blocks, not length: a parallel fetch's file is sparse, as long as the object
            # from the start; it fills as parts arrive.
            total += min(info.st_size, info.st_blocks * 512)
    return total


def remove_quietly(path: Path) -> None:
    try:
        os.unlink(path)  # a symlink is removed itself, never its target
    except OSError:
        pass


def discard(temp: Path) -> None:
    """Remove a fetched file that will not be published."""
    _ACTIVE.discard(str(temp))
    remove_quietly(temp)


def _ours(info: os.stat_result) -> bool:
    """A plain file of this user, with no other name (a hard link to elsewhere)."""
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and info.st_nlink == 1


def _orphaned(name: PartialName, info: os.stat_result, now: float) -> bool:
    """Whether nobody writes `name` any more. A pid is only checked on this host and in
    this PID namespace; elsewhere, a file untouched for `STALE_AFTER_S` is orphaned."""
    owner = name.owner
    if owner is None:
        return False
    if owner == (HOST, os.getpid()):
        return str(name.path) not in _ACTIVE
    if owner[0] == HOST:
        return not is_alive_local(*owner)
    return now - info.st_mtime >= STALE_AFTER_S


def _foreign(name: PartialName) -> bool:
    """Whether `name`'s writer is on another host or in another PID namespace: one we
    cannot tell is dead, only silent (`STALE_AFTER_S`), and may wake."""
    owner = name.owner
    return owner is not None and owner[0] != HOST


# A new partial file: read back too (a parallel fetch hashes it as its prefix grows).
_NEW_PARTIAL_FLAGS: Final = (NEW_FILE_FLAGS & ~os.O_WRONLY) | os.O_RDWR


class _Partial:
    """The partial file this process writes: its name, checked descriptor, hash and length."""

    def __init__(self, name: PartialName, fd: int) -> None:
        self.name = name
        self.fd = fd
        self.hasher = _new_hasher()
        self.offset = 0
        self._verified = False  # a verified file stays active until it is published
        # The version the bytes belong to, once a response said so (unknown for an
        # adopted file until the server confirms its tag).
        self.validators: Optional[Validators] = None
        # That version's size, once an answer said it: what a later answer that does not
        # say it (`bytes 1000-1999/*`) is counted against, and one that says another
        # size is not resumed after.
        self.size: Optional[int] = None
        # Where a range of that version and of unknown total ended, in this process: a 416
        # there that names the version says the object ends there, even without its size.
        self.open_end: Optional[int] = None

    @classmethod
    def create(cls, final: Path) -> _Partial:
        name = PartialName(final, NO_VALIDATOR)
        _ACTIVE.add(str(name.path))
        try:
            return cls(name, os.open(name.path, NEW_FILE_FLAGS, 0o644))
        except BaseException:
            _ACTIVE.discard(str(name.path))
            raise

    @classmethod
    def adopt(cls, final: Path) -> Optional[_Partial]:
        """Take over the largest orphaned partial file by renaming it to our own name.

        Only regular files of this user, written for a version a validator names,
        are candidates; this does not trust the lock, which may silently not work on
        a shared filesystem: a live writer's file is never taken. Our other orphans
        are removed; what another user left, or planted, is never touched.
        """
        now = time.time()
        orphans = []
        for name in PartialName.all(final):
            try:
                info = os.lstat(name.path)
            except OSError:
                continue
            if _ours(info) and _orphaned(name, info, now):
                orphans.append((info.st_size, name))
        for leftover in dead_leftovers(final, (".tmp", ".parts")):  # a parallel partial's record too
            remove_quietly(leftover)
        orphans.sort(key=lambda pair: pair[0], reverse=True)
        adopted: Optional[_Partial] = None
        for _size, name in orphans:
            # A parallel partial file has holes: only `_parts.adopt_parts`, with its record, takes it.
            if adopted is None and name.tag != NO_VALIDATOR and not name.tag.startswith(PARALLEL_TAG):
                adopted = cls._take(name)
                if adopted is not None:
                    continue
            remove_quietly(name.path)
        return adopted

    @classmethod
    def _take(cls, name: PartialName) -> Optional[_Partial]:
        mine = name.claimed() if _foreign(name) else name.renamed()
        _ACTIVE.add(str(mine.path))
        try:
            os.rename(name.path, mine.path)  # atomic: at most one adopter wins
            fd = os.open(mine.path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            _ACTIVE.discard(str(mine.path))
            return None
        if not _ours(os.fstat(fd)):  # swapped between the lstat and the open
            os.close(fd)
            _ACTIVE.discard(str(mine.path))
            return None
        if _foreign(name):  # its writer may wake: its bytes go to a file it never had open
            return cls._copy(mine, fd)
        try:
            partial = cls(mine, fd)
            while chunk := os.read(fd, _READ_CHUNK):
                partial.hasher.update(chunk)
                partial.offset += len(chunk)
        except BaseException:  # Ctrl-C while hashing: a later call (of ours too) adopts it
            os.close(fd)
            _ACTIVE.discard(str(mine.path))
            raise
        return partial

    @classmethod
    def _copy(cls, taken: PartialName, fd: int) -> Optional[_Partial]:
        """Copy the bytes of a stale partial file (`fd`, renamed to `taken`) into a new
        file of ours, hashing them, and remove it: its writer, silent but maybe alive
        (another host or PID namespace), still holds its inode and may write through it
        when it wakes (its own renames fail now: it stops at the next). The file we
        publish is never that inode. On failure both go; killed, the taken file keeps its
        writer's host and pid (`PartialName.claimed`), so it is copied again, never
        renamed into use."""
        copy = PartialName(taken.final, taken.tag)  # ours
        _ACTIVE.add(str(copy.path))
        partial: Optional[_Partial] = None
        try:
            partial = cls(copy, os.open(copy.path, _NEW_PARTIAL_FLAGS, 0o644))
            while chunk := os.read(fd, _READ_CHUNK):
                partial.hasher.update(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(partial.fd, view) :]
                partial.offset += len(chunk)
        except BaseException as error:
            if partial is not None:
                os.close(partial.fd)
            discard(copy.path)
            if isinstance(error, OSError):
                logger.info("cannot copy the stale partial file %s (%s); starting over", taken.path, error)
                return None
            raise
        finally:
            os.close(fd)
            discard(taken.path)
        return partial

    def restart(self, validators: Validators) -> None:
        """Start the file over, empty, for the version `validators` name."""
        if self.offset:
            os.ftruncate(self.fd, 0)
            self.offset, self.hasher = 0, _new_hasher()
        self.validators, self.size, self.open_end = validators, None, None
        if validators.tag != self.name.tag:
            renamed = self.name.renamed(validators.tag)
            _ACTIVE.add(str(renamed.path))
            os.rename(self.name.path, renamed.path)
            _ACTIVE.discard(str(self.name.path))
            self.name = renamed

    def close(self, keep: bool) -> None:
        """Close the descriptor; remove the file unless `keep` (a resumable failure, or
        a verified file that is about to be published)."""
        os.close(self.fd)
        if not self._verified and (self.offset == 0 or self.name.tag == NO_VALIDATOR):
            keep = False  # nothing a later call could resume
        if not keep:
            discard(self.name.path)
        elif not self._verified:  # left for a later call, of this process or another
            self._release()

    def _release(self) -> None:
        """Rename the kept file (and a parallel one's record, first) to a name no live
        process owns (`RELEASED_PID`), so that any process resumes it, not only this
        one while it lives. This process writes it no more (a parallel fetch's
        workers stopped). A failed rename leaves it ours: this process resumes it."""
        token = f"{HOST}.{RELEASED_PID}.{secrets.token_hex(4)}"
        released = PartialName(self.name.final, self.name.tag, token)
        try:
            if self.name.tag.startswith(PARALLEL_TAG):
                os.rename(_record_of(self.name.path), _record_of(released.path))
            os.rename(self.name.path, released.path)
        except OSError:
            pass
        _ACTIVE.discard(str(self.name.path))

    def verified(self, url: str, sha256: Optional[str]) -> Fetched:
        info = os.fstat(self.fd)
        digest = self.hasher.hexdigest()
        if sha256 is not None and digest != sha256:
            raise ChecksumError(url, sha256, digest)
        self._verified = True
        return Fetched(self.name.path, self.offset, digest, self.validators or Validators(), info)


def _record_of(path: Path) -> Path:
    """A parallel partial file's record of parts (as `_parts._record_path`)."""
    return path.with_name(path.name[: -len(".part")] + ".parts")


def _place(backend: DownloadBackend, url: str, stream: ByteStream, partial: _Partial) -> bool:
    """Make `partial` ready for `stream`'s body: True if the body goes on at the
    partial's offset, False to ask again from byte 0.

    The one place where range answers are decided for every backend: 416, a 200
    for a Range request (or If-Range finding another version), and a body of
    another version are all told apart here. Asking again from 0 sends no Range,
    so it happens at most once per attempt.
    """
    offset = partial.offset
    if stream.status == 416:
        if offset == 0:  # no Range was sent: a final status, as any other 4xx
            raise HTTPStatusError(
                url, 416, "HTTP 416 (range not satisfiable) answered to a request without a Range"
            )
        got, size = Validators.of(stream), stream.size
        # A 416 naming this version at the byte where a range of it of unknown total ended
        # says the object ends there: what a server that never says its size can tell.
        ended_here = offset == partial.open_end and got.if_range is not None and got.tag == partial.name.tag
        if got.if_range is None or size is None:  # a 416 need not name the version: ask
            try:
                info = backend.stat(url)
            except DownloadError as error:  # no HEAD (405), a presigned GET-only URL (403)
                if resumable(error):  # a broken connection or an outage: the bytes are kept
                    raise
                if not ended_here:
                    logger.info("cannot ask %s which version it has (%s); starting over", url, error)
                    partial.restart(Validators())
                    return False
                info = RemoteInfo()
            if info.size is not None or not ended_here:  # a size from HEAD wins
                got, size = Validators.of(info), info.size
            else:
                size = offset
        if size == offset and got.tag == partial.name.tag != NO_VALIDATOR:
            partial.validators = got
            return True  # the partial file is the whole object
        logger.info("cannot resume %s at byte %d (416); starting over", url, offset)
        partial.restart(got)
        return False
    got = Validators.of(stream)
    if stream.start == 0:  # the whole object: the first request, or a Range not honoured
        if offset:
            logger.info("%s came whole instead of from byte %d; starting over", url, offset)
        partial.restart(got)
        return True
    if offset == 0:
        if stream.start == UNPLACED:
            raise DownloadError(
                url, "asked for the whole object, the server sent a range whose Content-Range cannot be read "
                "or contradicts itself or its Content-Length"
            )
        raise DownloadError(url, f"asked for the whole object, the server sent bytes from {stream.start} on")
    same = got.tag == partial.name.tag != NO_VALIDATOR
    # An encoded range counts encoded bytes: it cannot go after the object's bytes we have.
    if (
        stream.encoding is None
        and stream.start == offset
        and same
        and (stream.size is None or offset <= stream.size)
        and (stream.size is None or partial.size is None or stream.size == partial.size)
    ):
        partial.validators = got
        return True
    logger.info("cannot resume %s at byte %d (another version); starting over", url, offset)
    partial.restart(got)
    return False


class _EndedShort(NetworkError):
    """A ranged answer (206) that brought bytes and ended whole by its own account
    (backends count a body against its Content-Length, or against its range's length
    without one) before the object's end: a server that caps its ranged answers. What
    is left is asked for, and, as in a parallel fetch, that is not a failure as long as
    each such answer goes further into the object than any before it."""


def _receive(
    stream: ByteStream,
    partial: _Partial,
    url: str,
    bar: Any,
    on_size: Optional[Callable[[int], None]],
) -> Pipeline:
    """Write `stream`'s body after the partial's bytes, hashing on the side. Returns
    the pipeline, whose hash thread may still be working through its backlog."""
    if stream.size is not None:
        partial.size = stream.size
        if on_size is not None:
            on_size(stream.size)
        if bar is not None:
            bar.total, bar.n = stream.size, partial.offset
            bar.refresh()
    size = partial.size
    os.lseek(partial.fd, partial.offset, os.SEEK_SET)
    began = partial.offset
    pipeline = Pipeline(partial.fd, partial.hasher, partial.offset, url, partial.name.path)
    try:
        for chunk in stream.chunks:
            pipeline.put(chunk)
            partial.offset += len(chunk)
            if bar is not None:
                bar.update(len(chunk))
        pipeline.flush()
        # A range of an unknown total (`bytes a-b/*`), of a version no answer gave the
        # size of, may end before the object does: the next request says (a 416 at the
        # end, whose size or a HEAD confirms it).
        unknown_end = size is None and stream.status == 206
        if unknown_end and stream.encoding is None:  # a decoded body's end is no byte of its range
            partial.open_end = partial.offset
        if unknown_end or (size is not None and partial.offset != size):
            pipeline.finish()  # file, offset and digest agree before a retry resumes
            if size is not None and partial.offset > size:
                raise ChecksumError(url, str(size), str(partial.offset), what="size")
            capped = stream.status == 206 and partial.offset > began and partial.name.tag != NO_VALIDATOR
            ended = _EndedShort if capped else NetworkError
            of = "an unknown number of" if size is None else size
            raise ended(url, f"connection closed after {partial.offset} of {of} bytes")
    except BaseException as error:
        # Keep what arrived before a network failure (the retry resumes after it),
        # and wait for the hash: file, offset and digest agree.
        pipeline.finish(flush=isinstance(error, NetworkError))
        raise
    return pipeline


def _download(
    backend: DownloadBackend,
    url: str,
    partial: _Partial,
    attempts: int,
    backoff_factor: float,
    bar: Any,
    on_size: Optional[Callable[[int], None]],
) -> Pipeline:
    """The retry loop: a body that breaks off is resumed, up to `attempts` times."""
    failures, furthest = 0, partial.offset
    while True:
        if partial.offset and partial.name.tag == NO_VALIDATOR:
            partial.restart(Validators())  # no validator can vouch for the bytes we have
        if_range = partial.validators.if_range if partial.offset and partial.validators else None
        # A NetworkError from open is final: the backend already retried opening.
        # `if_range` goes only to backends that are given one, so older backends still work.
        opened = (
            backend.open(url, partial.offset, if_range=if_range)
            if if_range
            else backend.open(url, partial.offset)
        )
        with opened as stream:
            if not _place(backend, url, stream, partial):
                continue
            try:
                return _receive(stream, partial, url, bar, on_size)
            except NetworkError as error:
                if isinstance(error, _EndedShort) and partial.offset > furthest:
                    furthest = partial.offset
                    logger.info("%s; asking for the rest", error)
                    continue
                failures += 1
                if failures >= attempts:
                    raise
                broken = error
        delay = backoff_factor * (2 ** (failures - 1))
        logger.warning(
            "%s; resuming from byte %d in %.1fs (attempt %d of %d)",
            broken,
            partial.offset,
            delay,
            failures + 1,
            attempts,
        )
        time.sleep(delay)


@contextmanager
def _progress_bar(enabled: bool, total: Optional[int], desc: str) -> Iterator[Any]:
    if not enabled:
        yield None
        return
    from tqdm.auto import tqdm

    with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc) as bar:
        yield bar


def fetch(
    backend: DownloadBackend,
    url: str,
    final: Path,
    *,
    sha256: Optional[str],
    attempts: int,
    backoff_factor: float,
    progress: bool,
    on_size: Optional[Callable[[int], None]] = None,
    connections: int = 1,
    part_size: int = 8 << 20,
) -> Fetched:
    """Download `url` into a partial file next to `final`, resuming where possible.

    With `connections` > 1 and a backend that reads bounded ranges, an object larger
    than `part_size` comes in parts over several connections (`_parallel`).
    On a network failure or Ctrl-C the partial file is kept for a later call (of
    this or another process); on any other failure it is removed.
    """
    from framework.download import _parallel  # it builds on this module

    ranged = _parallel.serves_parts(backend)
    resumed = _parallel.adopt_parts(final) if ranged else None  # with one connection too
    parallel = resumed is not None or (connections > 1 and ranged)
    partial = resumed.partial if resumed is not None else _Partial.adopt(final)
    if partial is not None:
        logger.info("resuming %s from byte %d", url, partial.offset)
    else:
        partial = _Partial.create(final)
    keep = False
    try:
        with _progress_bar(progress, None, final.name.split("-", 1)[-1]) as bar:
            pending, failed = None, 0
            if parallel:
                pending, failed = _parallel.fetch_parts(
                    backend,
                    url,
                    partial,
                    resumed,
                    connections=connections,
                    part_size=part_size,
                    attempts=attempts,
                    backoff_factor=backoff_factor,
                    bar=bar,
                    on_size=on_size,
                )
            if pending is None:
                pending = _download(backend, url, partial, attempts - failed, backoff_factor, bar, on_size)
        try:
            os.fsync(partial.fd)  # meanwhile the hash thread works through its backlog
        except BaseException as error:
            pending.abandon(error)  # the hash thread never stays blocked
            raise
        pending.close()
        result = partial.verified(url, sha256)
        keep = True
        return result
    except FileNotFoundError as error:
        if os.path.lexists(partial.name.path) or not final.parent.is_dir():
            raise
        # This process was silent long enough (another host's view) for another to take
        # its partial file over: that one publishes; this one stops, with nothing kept.
        raise DownloadError(
            url,
            f"{partial.name.path} was taken over by another process while this one was silent "
            f"(longer than {STALE_AFTER_S:g}s); nothing published by this one",
        ) from error
    except BaseException as error:
        keep = resumable(error)
        raise
    finally:
        partial.close(keep)


def publish_file(temp: Path, final: Path) -> None:
    """Rename `temp` onto `final` (atomic) and make the rename durable."""
    try:
        os.replace(temp, final)  # a symlink at `final` is replaced itself, never followed
    finally:
        _ACTIVE.discard(str(temp))
    try:
        dir_fd = os.open(final.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def _still_ours(url: str, result: Fetched) -> None:
    """Refuse to publish a partial file that another process took over (renamed away)
    while this one was silent: it must not write the sidecar of the file that one
    publishes."""
    try:
        info = os.lstat(result.temp)
    except OSError:
        info = None
    if info is None or (info.st_dev, info.st_ino) != (result.info.st_dev, result.info.st_ino):
        raise DownloadError(
            url,
            f"{result.temp} was taken over by another process while this one was silent (longer "
            f"than {STALE_AFTER_S:g}s); nothing published by this one, the other publishes its own",
        )


def publish_fetched(entry: Entry, result: Fetched) -> None:
    """Publish a verified file as `entry`: its sidecar first, then the file (`publish_file`).

    The sidecar names the new file's inode before the file takes the final name: a
    crash in between leaves a sidecar that matches no file, never old metadata vouching
    for new bytes (or new metadata for old ones). On failure the file is removed.
    """
    try:
        _still_ours(entry.url, result)
        validators = result.validators
        entry.publish_metadata(
            validators.etag, validators.last_modified, result.sha256, result.info, result.fetched
        )
        publish_file(result.temp, entry.final)
    except IsADirectoryError as error:  # os.replace never removes a folder
        discard(result.temp)
        where = error.filename2 or error.filename or entry.final  # the file, or its sidecar
        raise DownloadError(
            entry.url,
            f"cannot publish {entry.final}: a folder sits at {where} (not one this cache "
            "makes); remove it, or use another cache folder",
        ) from error
    except BaseException:
        discard(result.temp)
        raise
