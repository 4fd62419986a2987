"""The entry lock: one process fetches, the others wait and then read the cache.

The lock only saves work; correctness never depends on it (every process
publishes through its own temporary file and ``os.replace``), so a filesystem
whose locks silently do nothing still ends up with complete, identical bytes.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Literal, Optional, Union

import filelock

from framework.download._cache import write_json_atomic
from framework.errors import LockTimeoutError

__all__ = ["EntryLock", "LockKind"]

LockKind = Literal["filelock", "softfilelock", "none"]
logger = logging.getLogger("framework.download")

# How often a waiter wakes up to log, update its progress bar and check the timeout.
_POLL_S = 0.05


class EntryLock:
    """A lock on one cache entry, with an owner file saying who holds it.

    `timeout` counts seconds without progress: a waiter whose holder keeps
    downloading (`progress()` keeps growing) waits on, so a large file never
    trips it; a holder that hangs does. `progress` returns bytes fetched so far.
    A waiter stops waiting, without taking the lock (`held` stays false), as soon
    as `done()` says the holder's result is published.
    """

    def __init__(
        self,
        path: Path,
        kind: LockKind,
        timeout: float,
        url: str,
        progress: Optional[Callable[[], int]] = None,
        on_wait: Optional[Callable[[int, Optional[int]], None]] = None,
        done: Optional[Callable[[], bool]] = None,
    ) -> None:
        self.path = path
        self.owner_path = path.with_name(path.name + ".owner")
        self.kind = kind
        self.timeout = timeout
        self.url = url
        self._progress = progress
        self._on_wait = on_wait
        self._done = done
        self.held = False
        self._lock: Optional[filelock.BaseFileLock] = None
        if kind == "filelock":
            self._lock = filelock.FileLock(str(path), thread_local=False)
        elif kind == "softfilelock":
            self._lock = filelock.SoftFileLock(str(path), thread_local=False)
        elif kind != "none":
            raise ValueError(f"lock kind must be 'filelock', 'softfilelock' or 'none', got {kind!r}")

    def holder(self) -> str:
        """Who holds the lock, as recorded in the owner file ('' when unknown)."""
        owner = self._read_owner()
        if not owner:
            return ""
        since = owner.get("since")
        ago = f", for {time.time() - since:.0f}s" if isinstance(since, (int, float)) else ""
        return f"pid {owner.get('pid')} on {owner.get('host')}{ago}"

    def _read_owner(self) -> dict[str, Any]:
        try:
            with open(self.owner_path, "rb") as file:
                data = json.loads(file.read())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def record(self, **fields: Union[int, str, float, None]) -> None:
        """Write (or update) the owner file while holding the lock."""
        if self._lock is None:
            return
        data: dict[str, Any] = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.time(),
            "url": self.url,
        }
        data.update(fields)
        try:
            write_json_atomic(self.owner_path, data, durable=False)
        except OSError:  # informative only
            pass

    def expected_size(self) -> Optional[int]:
        size = self._read_owner().get("size")
        return size if isinstance(size, int) else None

    def __enter__(self) -> EntryLock:
        if self._lock is None:
            return self
        deadline = time.monotonic() + self.timeout
        last_seen = -1
        logged = False
        while True:
            wait = max(0.0, min(_POLL_S, deadline - time.monotonic()))
            try:
                self._lock.acquire(timeout=wait, poll_interval=_POLL_S)
                break
            except filelock.Timeout:
                pass
            if self._done is not None and self._done():
                return self
            seen = self._progress() if self._progress is not None else 0
            if seen != last_seen:
                last_seen = seen
                deadline = time.monotonic() + self.timeout  # the holder is making progress
            if not logged:
                logged = True
                logger.info(
                    "waiting for %s: another process is fetching it (%s)",
                    self.url,
                    self.holder() or "holder unknown",
                )
            if self._on_wait is not None:
                self._on_wait(seen, self.expected_size())
            if time.monotonic() >= deadline:
                raise LockTimeoutError(self.url, str(self.path), self.timeout, self.holder())
        self.held = True
        self.record()
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if self._lock is None or not self.held:
            return
        self.held = False
        try:
            os.unlink(self.owner_path)
        except OSError:
            pass
        self._lock.release()
