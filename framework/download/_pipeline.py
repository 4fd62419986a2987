"""Hashing received bytes on a second thread, overlapped with receiving and writing.

Receiving, writing to the page cache and sha256 each cost about the same per byte;
done one after the other they would make a cold download ~2x slower than a raw
copy. `hashlib` releases the GIL on large updates, so a worker thread hashes while
the receiving thread writes. A body that ends before its first batch is full (a small
file) is hashed in the receiving thread: starting a thread would cost more. Writeback
to disk is started early (Linux `sync_file_range`), so the final `fsync` has little
left to wait for.
"""

from __future__ import annotations

import errno
import os
import queue
import threading
from pathlib import Path
from typing import Any, Callable, Final, Optional

from framework.errors import DownloadError

__all__ = ["Pipeline", "no_room", "write_all"]

BATCH_BYTES: Final = 1 << 20  # hand chunks over in ~1 MiB batches: fewer queue operations
# At most ~32 MiB waiting to be hashed; the backlog is hashed while the file is fsynced.
_QUEUE_BATCHES: Final = 32
_WRITEBACK_EVERY: Final = 16 << 20

_SYNC_RANGE: Optional[Callable[[int, int, int, int], None]] = getattr(os, "sync_file_range", None)
_SYNC_WRITE: Final[int] = getattr(os, "SYNC_FILE_RANGE_WRITE", 2)

# Module-level so a test can inject a write failure (ENOSPC) without touching `os`.
_writev = os.writev


# A write that failed for want of room (a full disk or quota, a file larger than the
# filesystem takes), not of permission.
_NO_ROOM: Final = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def no_room(url: str, folder: Path, error: OSError) -> Optional[DownloadError]:
    """The `DownloadError` for a write in `folder` that failed for want of room, else None."""
    if error.errno not in _NO_ROOM:
        return None
    return DownloadError(
        url,
        f"no room on the device holding {folder} ({os.strerror(error.errno)}); free some "
        "space or point FRAMEWORK_CACHE at a larger disk",
    )


def write_all(fd: int, buffers: list[bytes], url: str, where: Path) -> None:
    """Write every buffer, turning a full disk into a `DownloadError` that says so."""
    try:
        written = _writev(fd, buffers)
        if written < sum(len(b) for b in buffers):  # a short write: finish the rest
            view = memoryview(b"".join(buffers))[written:]
            while view:
                view = view[_writev(fd, [view]) :]
    except OSError as error:
        full = no_room(url, where.parent, error)
        if full is not None:
            raise full from error
        raise


class Pipeline:
    """Feed it chunks with `put`; `finish` writes what is batched and waits for the hash."""

    def __init__(self, fd: int, hasher: Any, start: int, url: str, where: Path) -> None:
        self.fd = fd
        self.hasher = hasher
        self.url = url
        self.where = where
        self._batch: list[bytes] = []
        self._batch_bytes = 0
        self._offset = self._synced = start
        self._error: Optional[BaseException] = None  # what stopped the hash thread
        self._queue: queue.Queue[Optional[list[bytes]]] = queue.Queue(_QUEUE_BATCHES)
        self._thread: Optional[threading.Thread] = None  # started by the first full batch

    def put(self, chunk: bytes) -> None:
        self._batch.append(chunk)
        self._batch_bytes += len(chunk)
        if self._batch_bytes >= BATCH_BYTES:
            self._flush(last=False)

    def _flush(self, last: bool = True) -> None:
        if not self._batch:
            return
        self._check()
        batch, self._batch, self._batch_bytes = self._batch, [], 0
        write_all(self.fd, batch, self.url, self.where)
        # Hashed only once written: bytes and digest agree.
        if self._thread is None and last:
            self._hash_here(batch)
        else:
            if self._thread is None:
                self._thread = threading.Thread(target=self._hash, name="framework-hash", daemon=True)
                self._thread.start()
            self._queue.put(batch)
        self._offset += sum(len(b) for b in batch)
        if _SYNC_RANGE is not None and self._offset - self._synced >= _WRITEBACK_EVERY:
            try:  # start writing back to disk now; this does not wait
                _SYNC_RANGE(self.fd, self._synced, self._offset - self._synced, _SYNC_WRITE)
            except OSError:
                pass
            self._synced = self._offset

    def flush(self) -> None:
        """Write what is batched; the hash thread may still be catching up."""
        self._flush()

    def close(self) -> None:
        """Wait for the hash thread to take in everything written (idempotent); raise
        if it failed, since the digest then covers only part of the file."""
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self._check()

    def abandon(self, error: BaseException) -> None:
        """The file will not be published (`error`): end the hash thread, raising
        nothing over `error`."""
        try:
            self.close()
        except DownloadError:
            pass

    def _check(self) -> None:
        if self._error is not None:
            raise DownloadError(
                self.url, f"hashing the download failed: {type(self._error).__name__}: {self._error}"
            ) from self._error

    def finish(self, flush: bool = True) -> None:
        """Write what is batched (unless `flush` is false) and wait for the hash thread."""
        try:
            if flush:
                self._flush()
        finally:
            self.close()

    def _hash_here(self, batch: list[bytes]) -> None:
        """Hash `batch` in this thread; a failure is reported as the hash thread's is."""
        try:
            for chunk in batch:
                self.hasher.update(chunk)
        except Exception as error:
            self._error = error
            self._check()

    def _hash(self) -> None:
        update = self.hasher.update
        while (batch := self._queue.get()) is not None:
            if self._error is not None:
                continue  # keep draining, so the writer never blocks on a full queue
            try:
                for chunk in batch:
                    update(chunk)
            except BaseException as error:  # reported by the writer's next put or close
                self._error = error
