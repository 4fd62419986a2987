"""The threads that follow a parallel fetch's parts as they complete: one hashes the
file's contiguous prefix of complete parts (overlapped with the download), one records
the progress durably for a later resume."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, Final, Optional

from framework.download._partial import READ_CHUNK, Partial, new_hasher
from framework.download.parallel._parts import _Plan, _save_record
from framework.errors import DownloadError

__all__ = ["HASH_AS_PARTS_COMPLETE", "PrefixHasher", "ProgressRecorder"]

logger = logging.getLogger("framework.download")

# fdatasync where the platform has it (not macOS), else fsync.
_datasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)

# Hash the file's prefix as its parts complete (overlapped with the download), else in one
# pass once every part is in; benchmarks/bench_parallel.py measures both.
HASH_AS_PARTS_COMPLETE = True


class PrefixHasher:
    """Hashes the file's contiguous prefix of complete parts, on its own thread, reading
    it back through a descriptor checked to be the partial file."""

    def __init__(self, url: str, partial: Partial, plan: _Plan, done: set[int]) -> None:
        self.url, self.plan = url, plan
        self.hasher = partial.followed(new_hasher())
        self.read_fd = os.open(partial.name.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        mine, seen = os.fstat(partial.fd), os.fstat(self.read_fd)
        if (mine.st_dev, mine.st_ino) != (seen.st_dev, seen.st_ino):
            os.close(self.read_fd)
            raise DownloadError(url, f"{partial.name.path} was replaced while it was written")
        self._done = set(done)
        self._next = 0  # the first part not hashed yet
        self._cond = threading.Condition()
        self._stopped = False
        self.error: Optional[BaseException] = None
        # Waited on instead of a join: a join interrupted by Ctrl-C leaves the thread
        # marked as stopped while it runs (CPython's bpo-45274 handling), so later joins return.
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._run, name="framework-parallel-hash", daemon=True)
        try:
            self._thread.start()  # the thread owns `read_fd` from here: it closes it as it ends
        except BaseException:
            os.close(self.read_fd)
            raise

    def _ready(self) -> bool:
        """Whether the next part can be hashed (under the condition's lock)."""
        if HASH_AS_PARTS_COMPLETE:
            return self._next in self._done
        return len(self._done) == self.plan.count

    def complete(self, index: int) -> None:
        with self._cond:
            self._done.add(index)
            self._cond.notify()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stopped and self._next < self.plan.count and not self._ready():
                        self._cond.wait()
                    if self._stopped or self._next >= self.plan.count:
                        return
                    index = self._next
                start, end = self.plan.bounds(index)
                while start < end:
                    chunk = os.pread(self.read_fd, min(READ_CHUNK, end - start), start)
                    if not chunk:
                        raise DownloadError(self.url, "the partial file shrank while it was hashed")
                    self.hasher.update(chunk)
                    start += len(chunk)
                with self._cond:
                    self._next += 1
        except BaseException as error:  # reported by `finish`
            self.error = error
        finally:
            try:
                os.close(self.read_fd)
            except OSError:
                pass  # read only: nothing of ours is lost
            finally:
                self._ended.set()

    def finish(self) -> Any:
        """Wait until every part is hashed; the hasher, or raise what stopped the thread."""
        self._ended.wait()
        if self.error is not None:
            raise DownloadError(
                self.url, f"hashing the download failed: {type(self.error).__name__}: {self.error}"
            ) from self.error
        return self.hasher

    def stop(self) -> None:
        """Stop hashing (the thread ends on its own if this wait is interrupted)."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._ended.wait()


class ProgressRecorder:
    """Records progress on its own thread, every `EVERY_S` while it changes or sooner
    once parts of `EVERY_BYTES` have completed since the last record, and when the fetch
    stops short. One `fdatasync` covers every byte written before it, then the record
    is rewritten: complete parts, and how far the others got. Workers never wait on the
    disk; bytes count (for a later resume) only once they are durable. (Not at each
    part: on a fast link that would put an fdatasync in the way every few milliseconds.
    A kill loses at most the last `EVERY_S` of progress; the bytes bound leaves the
    publishing fsync little to write once the last byte is in: at 128 MiB/s, about
    5 ms instead of 15-25.)"""

    EVERY_S: Final = 0.25
    EVERY_BYTES: Final = 8 << 20

    def __init__(
        self,
        partial: Partial,
        plan: _Plan,
        done: set[int],
        reached: Callable[[], dict[int, int]],
        on_error: Callable[[OSError], None],
    ) -> None:
        self.name, self.plan, self._reached = partial.name, plan, reached
        self.recorded = set(done)
        self._recorded_reached: dict[int, int] = {}
        self._pending: set[int] = set()
        self._pending_bytes = 0  # the size of the parts in `_pending`
        self._closing = self._flush = False
        self._cond = threading.Condition()
        # A failed fdatasync means written bytes may not be on the disk. Linux reports it
        # once per open file, so the publishing fsync could then succeed: the fetch fails,
        # at once (`on_error`).
        self.sync_error: Optional[OSError] = None
        self._on_error = on_error
        self._fd = os.dup(partial.fd)  # its own: the thread closes it as it ends
        self._ended = threading.Event()  # waited on instead of a join, as `PrefixHasher._ended`
        self._thread = threading.Thread(target=self._run, name="framework-parallel-record", daemon=True)
        try:
            self._thread.start()
        except BaseException:
            os.close(self._fd)
            raise

    def completed(self, index: int) -> None:
        start, end = self.plan.bounds(index)
        with self._cond:
            self._pending.add(index)
            self._pending_bytes += end - start
            if self._pending_bytes >= self.EVERY_BYTES:
                self._cond.notify()

    def _run(self) -> None:
        try:
            while self._record_once():
                pass
        finally:
            try:
                os.close(self._fd)  # NFS may report a write-back error here
            except OSError as error:
                self._failed(error)
            finally:
                self._ended.set()

    def _failed(self, error: OSError) -> None:
        if self.sync_error is None:
            self.sync_error = error
            self._on_error(error)

    def _record_once(self) -> bool:
        """Wait for the next record and write it; False once there is none to come."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._closing or self._pending_bytes >= self.EVERY_BYTES, timeout=self.EVERY_S
            )
            if self._closing and not self._flush:
                return False
            batch, self._pending, self._pending_bytes = self._pending, set(), 0
            last = self._closing
        reached = self._reached()  # taken before the fdatasync: those bytes are written
        if batch or reached != self._recorded_reached:
            try:
                _datasync(self._fd)  # the bytes are on disk before the record says so
            except OSError as error:
                self._failed(error)
                return False
            self.recorded |= batch
            try:
                _save_record(self.name, self.plan, self.recorded, reached)
            except OSError as error:  # only a later resume loses: it fetches those bytes again
                logger.warning("cannot record the progress of %s: %s", self.name.path, error)
                return False
            self._recorded_reached = reached
        return not last

    def close(self, flush: bool) -> None:
        """Stop; with `flush`, record the progress first (the fetch stops short). The
        thread ends on its own if this wait is interrupted."""
        with self._cond:
            self._closing, self._flush = True, flush
            self._cond.notify()
        self._ended.wait()
