"""Streaming a remote object into a temporary file, and publishing it atomically.

Bytes go to a temporary file that only this process writes (named with its host,
pid and a random token), are hashed in the same pass, checked against the
expected size and sha256, fsynced, and only then renamed to the final path.
An interrupted download leaves its ``.part`` file behind; a later process adopts
it by renaming it to its own name first, so two processes never append to one file.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Final, Optional

import attrs

from framework.download._cache import (
    HOST,
    dead_leftovers,
    is_alive_local,
    parse_owner,
    unique_token,
)
from framework.download._pipeline import Pipeline
from framework.download.backend import ByteStream, DownloadBackend
from framework.errors import ChecksumError, NetworkError

__all__ = ["Fetched", "fetch", "partial_bytes", "publish_file", "remove_quietly"]

logger = logging.getLogger("framework.download")

_READ_CHUNK: Final = 1 << 20
# A partial file of another host's process, untouched this long, is taken to be orphaned;
# longer than any read timeout, so a stalled but live writer is not robbed.
STALE_AFTER_S: Final = 300.0


@attrs.frozen
class Fetched:
    """A verified temporary file, ready for `publish_file`."""

    temp: Path
    size: int
    sha256: str
    etag: Optional[str]


def _etag_tag(etag: Optional[str]) -> str:
    if not etag:
        return "noetag"
    return hashlib.sha256(etag.encode("utf-8")).hexdigest()[:12]


def _resumable(stream: ByteStream, offset: int, tag: str) -> bool:
    """Whether `stream` continues our partial file: not if the server ignored the
    Range (200), or the object changed (another etag, or now shorter than our file)."""
    if stream.start != offset:
        return False
    if stream.etag is not None and _etag_tag(stream.etag) != tag:
        return False
    return stream.size is None or offset <= stream.size


def _partials(final: Path) -> list[Path]:
    prefix = final.name + "."
    try:
        names = os.listdir(final.parent)
    except OSError:
        return []
    return [final.parent / n for n in names if n.startswith(prefix) and n.endswith(".part")]


def partial_bytes(final: Path) -> int:
    """Bytes in every partial file of `final`: a waiter's view of the holder's progress."""
    total = 0
    for path in _partials(final):
        try:
            total += os.stat(path).st_size
        except OSError:
            pass
    return total


def remove_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _adopt(final: Path) -> Optional[tuple[Path, str]]:
    """Take over the largest orphaned partial file by renaming it to our own name.

    A partial is an orphan when its writer is dead (a pid on this host), or, for a
    writer on another host, when the file has not changed for `STALE_AFTER_S`.
    This does not trust the lock, which may silently not work on a shared
    filesystem: a live writer's file is never taken. Other orphans are removed.
    """
    orphans = []
    now = time.time()
    for path in _partials(final):
        owner = parse_owner(path.name)
        if owner is None:
            continue
        try:
            stat = os.stat(path)
        except OSError:
            continue
        if is_alive_local(*owner) and (owner[0] == HOST or now - stat.st_mtime < STALE_AFTER_S):
            continue
        orphans.append((stat.st_size, path))
    _sweep_temp_files(final)
    orphans.sort(reverse=True)
    adopted: Optional[tuple[Path, str]] = None
    for _size, path in orphans:
        tag = path.name.split(".")[-5]
        if adopted is None:
            mine = final.with_name(f"{final.name}.{tag}.{unique_token()}.part")
            try:
                os.rename(path, mine)  # atomic: at most one adopter wins
            except OSError:
                continue
            adopted = (mine, tag)
        else:
            remove_quietly(path)
    return adopted


def _sweep_temp_files(final: Path) -> None:
    """Remove sidecar and owner temp files (``*.tmp``) left by dead processes on this host."""
    for leftover in dead_leftovers(final, (".tmp",)):
        remove_quietly(leftover)


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
) -> Fetched:
    """Download `url` into a temporary file next to `final`, resuming where possible.

    A stream that breaks off (`NetworkError`) is resumed from the bytes already
    written, up to `attempts` times. On a network failure the partial file is
    kept for a later run; on any other failure it is removed.
    """
    adopted = _adopt(final)
    temp, tag = adopted if adopted else (None, "")
    hasher = hashlib.sha256()
    offset = 0
    fd = -1
    keep_partial = False
    pending: Optional[Pipeline] = None
    try:
        if temp is not None:
            offset = _rehash(temp, hasher)
            logger.info("resuming %s from byte %d", url, offset)
        failures = 0
        bar_ctx = _progress_bar(progress, None, final.name.split("-", 1)[-1])
        with bar_ctx as bar:
            while True:
                opened = False
                try:
                    with backend.open(url, offset) as stream:
                        opened = True
                        if temp is not None and offset and not _resumable(stream, offset, tag):
                            logger.info("cannot resume %s at byte %d; starting over", url, offset)
                            os.truncate(temp, 0)
                            offset, hasher = 0, hashlib.sha256()
                            tag = _etag_tag(stream.etag)
                            renamed = final.with_name(f"{final.name}.{tag}.{unique_token()}.part")
                            os.rename(temp, renamed)
                            temp = renamed
                            if stream.start != 0:
                                continue  # this body starts mid-file: ask again from 0
                        if temp is None:
                            tag = _etag_tag(stream.etag)
                            temp = final.with_name(f"{final.name}.{tag}.{unique_token()}.part")
                        if fd < 0:
                            fd = os.open(temp, os.O_WRONLY | os.O_CREAT, 0o644)
                        os.lseek(fd, offset, os.SEEK_SET)
                        if stream.size is not None:
                            if on_size is not None:
                                on_size(stream.size)
                            if bar is not None:
                                bar.total = stream.size
                                bar.n = offset
                                bar.refresh()
                        pipeline = Pipeline(fd, hasher, offset, url, temp)
                        try:
                            for chunk in stream.chunks:
                                pipeline.put(chunk)
                                offset += len(chunk)
                                if bar is not None:
                                    bar.update(len(chunk))
                            pipeline.flush()
                        except BaseException as error:
                            # Keep what arrived before a network failure (the retry resumes
                            # after it), and wait for the hash: file, offset, digest agree.
                            pipeline.finish(flush=isinstance(error, NetworkError))
                            raise
                        pending = pipeline  # still hashing its backlog: joined after fsync
                        size, etag = stream.size, stream.etag
                    if size is not None and offset < size:
                        raise NetworkError(url, f"connection closed after {offset} of {size} bytes")
                    if size is not None and offset > size:
                        raise ChecksumError(url, str(size), str(offset), what="size")
                    break
                except NetworkError as error:
                    if pending is not None:  # the next attempt goes on with the same hasher
                        pending.close()
                        pending = None
                    failures += 1
                    # The backend already retried opening; resuming is for broken bodies.
                    if failures >= attempts or not opened:
                        keep_partial = True
                        raise
                    delay = backoff_factor * (2 ** (failures - 1))
                    logger.warning(
                        "%s; resuming from byte %d in %.1fs (attempt %d of %d)",
                        error,
                        offset,
                        delay,
                        failures + 1,
                        attempts,
                    )
                    time.sleep(delay)
        os.fsync(fd)  # meanwhile the hash thread works through its backlog
        if pending is not None:
            pending.close()
            pending = None
        os.close(fd)
        fd = -1
        digest = hasher.hexdigest()
        if sha256 is not None and digest != sha256.lower():
            raise ChecksumError(url, sha256.lower(), digest)
        assert temp is not None
        return Fetched(temp, offset, digest, etag)
    except BaseException as error:
        if pending is not None:
            pending.close()
        if fd >= 0:
            os.close(fd)
        if temp is not None and not (keep_partial or isinstance(error, KeyboardInterrupt)):
            remove_quietly(temp)
        raise


def _rehash(path: Path, hasher: Any) -> int:
    """Hash the bytes already in an adopted partial file; returns their count."""
    size = 0
    with open(path, "rb") as file:
        while chunk := file.read(_READ_CHUNK):
            hasher.update(chunk)
            size += len(chunk)
    return size


def publish_file(temp: Path, final: Path) -> None:
    """Rename `temp` onto `final` (atomic) and make the rename durable."""
    os.replace(temp, final)
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
