"""The entry lock: one process fetches, the others wait and then read the cache.

The lock only saves work; correctness never depends on it (every process
publishes through its own temporary file and `os.replace`), so a filesystem
whose locks silently do nothing still ends up with complete, identical bytes. For
the same reason a lock path that is not a regular file (a symlink, FIFO or folder
someone planted) is never opened: the call goes on without the lock.

While the holder works (`EntryLock.working`: fetching, extracting), a heartbeat
touches the owner file, so waiters wait as long as the holder is alive and working,
however long that takes, and time out only on a holder that stopped. One thread per
process beats for every lock it holds: a small file's fetch starts no thread.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Literal, Optional, Union

import filelock

from framework._redact import redact_url
from framework.download._cache import (
    HOST,
    enter_work_folder,
    is_alive_local,
    parse_json,
    read_small_file,
    write_json_atomic,
)
from framework.errors import LockTimeoutError

__all__ = ["EntryLock", "LockKind", "UseLock", "WaitCancelled", "in_use"]

LockKind = Literal["filelock", "softfilelock", "none"]
logger = logging.getLogger("framework.download")

# How often a waiter wakes up to log, update its progress bar and check the timeout.
_POLL_S = 0.05
# How long the lock is held before its owner file says who holds it.
_OWNER_AFTER_S = 0.05


class WaitCancelled(Exception):
    """A waiter stopped waiting because its `cancelled` event was set: nothing was
    fetched, and the lock was never held."""


class EntryLock:
    """A lock on one cache entry, with an owner file saying who holds it.

    `timeout` counts seconds without progress: a waiter whose holder keeps
    downloading (`progress()` keeps growing) waits on, so a large file never
    trips it; a holder that hangs does. `progress` returns bytes fetched so far.
    A waiter stops waiting, without taking the lock (`held` stays false), as soon
    as `done()` says the holder's result is published, and raises `WaitCancelled`
    as soon as `cancelled` is set (a bulk call interrupted by Ctrl-C).
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
        cancelled: Optional[threading.Event] = None,
    ) -> None:
        self.path = path
        self.owner_path = path.with_name(path.name + ".owner")
        self.kind = kind
        self.timeout = timeout
        self.url = url
        self._progress = progress
        self._on_wait = on_wait
        self._done = done
        self._cancelled = cancelled
        self.held = False
        self._recorded: dict[str, Any] = {}  # what the owner file says besides who and since
        self._noted: dict[str, Any] = {}  # fields for the next heartbeat to write
        self._owner_written = False
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
        data = parse_json(read_small_file(self.owner_path))
        return data if isinstance(data, dict) else {}

    def _heartbeat(self) -> int:
        """When the holder last said it is working (the owner file's mtime), 0 if unknown."""
        try:
            return os.lstat(self.owner_path).st_mtime_ns
        except OSError:
            return 0

    def _advice(self) -> str:
        """What to do about a holder that made no progress: never 'delete it' while it lives."""
        owner = self._read_owner()
        pid, host = owner.get("pid"), owner.get("host")
        if isinstance(pid, int) and host == HOST and is_alive_local(HOST, pid):
            return (
                f"Its holder, pid {pid}, is alive but stopped working (suspended or hung?): "
                "do not delete the lock; look at that process, or raise the lock timeout"
            )
        if self.kind == "filelock":
            return (
                "The lock is held by a live process, here or on another host (a dead one "
                "releases it): deleting the file does not help; raise the lock timeout"
            )
        return "If no process is downloading, the lock is stale: delete it, or raise the lock timeout"

    @contextmanager
    def working(self) -> Iterator[None]:
        """Beat (touch the owner file) while the holder works, so waiters keep waiting."""
        if not self.held:
            yield
            return
        interval = min(5.0, max(0.05, self.timeout / 4))  # several beats per timeout
        _BEATS.add(self, interval, first=interval if self._owner_written else _OWNER_AFTER_S)
        try:
            yield
        finally:
            _BEATS.remove(self)

    def _usable(self) -> bool:
        """False when something other than a regular file with no other name sits at the
        lock path: a hard link to a file elsewhere (planted by another user) would be
        opened, and by older filelock versions truncated, through that name."""
        try:
            info = os.lstat(self.path)
            return stat.S_ISREG(info.st_mode) and info.st_nlink == 1
        except FileNotFoundError:
            return True
        except OSError:
            return False

    def note(self, **fields: Union[int, str, float, None]) -> None:
        """Add `fields` to the owner file at the next heartbeat (`working`): a fetch over
        before it (a small file) writes nothing more."""
        self._noted.update(fields)

    def beat(self) -> None:
        if not self._owner_written or self._noted:
            fields, self._noted = self._noted, {}
            self.record(**fields)  # a new owner file: a new mtime too
            return
        try:
            os.utime(self.owner_path, follow_symlinks=False)
        except OSError:  # informative only
            pass

    def record(self, **fields: Union[int, str, float, None]) -> None:
        """Write (or update) the owner file while holding the lock."""
        if self._lock is None:
            return
        self._recorded.update(fields)
        data: dict[str, Any] = {
            "pid": os.getpid(),
            "host": HOST,  # with the PID namespace: a pid means nothing outside it
            "since": time.time(),
            "url": redact_url(self.url),  # others can read the lock's owner file
        }
        data.update(self._recorded)
        try:
            # Its temporary file goes where a dead writer's are swept (by name, not listing).
            temp_folder = enter_work_folder(self.path).path
            write_json_atomic(self.owner_path, data, durable=False, temp_folder=temp_folder)
            self._owner_written = True
        except OSError:  # informative only
            pass

    def expected_size(self) -> Optional[int]:
        size = self._read_owner().get("size")
        return size if isinstance(size, int) else None

    def __enter__(self) -> EntryLock:
        if self._lock is None:
            return self
        if not self._usable():
            logger.warning(
                "%s is not a regular file with one name (planted?); going on without the lock", self.path
            )
            return self
        deadline = time.monotonic() + self.timeout
        last_seen: tuple[int, int] = (-1, -1)
        logged = named = False  # said that it waits; named the holder
        while True:
            wait = max(0.0, min(_POLL_S, deadline - time.monotonic()))
            try:
                self._lock.acquire(timeout=wait, poll_interval=_POLL_S)
                break
            except filelock.Timeout:
                pass
            except OSError as error:  # swapped for a symlink or folder since `_usable`
                logger.warning("cannot use the lock %s (%s); going on without it", self.path, error)
                return self
            if self._cancelled is not None and self._cancelled.is_set():
                raise WaitCancelled(self.url)
            if self._done is not None and self._done():
                return self
            seen = self._progress() if self._progress is not None else 0
            if (seen, beat := self._heartbeat()) != last_seen:  # pulse: fetching or extracting
                last_seen = (seen, beat)
                deadline = time.monotonic() + self.timeout  # the holder is making progress
            if not named:
                # Once, and again once the holder is known (it writes its name just after
                # it takes the lock: a waiter that came at that moment has not seen it yet).
                holder = self.holder()
                if not logged or holder:
                    logger.info(
                        "waiting for %s: another process is fetching it (%s)",
                        self.url,
                        holder or "holder unknown",
                    )
                logged, named = True, bool(holder)
            if self._on_wait is not None:
                self._on_wait(seen, self.expected_size())
            if time.monotonic() >= deadline:
                raise LockTimeoutError(self.url, str(self.path), self.timeout, self.holder(), self._advice())
        self.held = True
        # Who holds the lock is written once it is held for a moment: a small file's
        # fetch is over before anyone could wait for it, and writes no owner file.
        _BEATS.add(self, None, first=_OWNER_AFTER_S)
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        _BEATS.remove(self)  # the owner file is never touched once removed
        if self._lock is None or not self.held:
            return
        self.held = False
        # Ours, or one a killed holder left (we hold the lock): either way, stale now.
        self._owner_written = False
        try:
            os.unlink(self.owner_path)
        except OSError:
            pass
        self._lock.release()


class _Heartbeats:
    """The one thread of a process that beats for every lock it holds while working,
    each at its own interval; idle (waiting on a condition) when none is held."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # the thread is not forked; its lock may be held

    def _reset(self) -> None:
        self._changed = threading.Condition()
        # id -> lock, interval (None: beat once), next beat
        self._due: dict[int, tuple[EntryLock, Optional[float], float]] = {}
        self._thread: Optional[threading.Thread] = None

    def add(self, lock: EntryLock, interval: Optional[float], first: float) -> None:
        """Beat for `lock` in `first` seconds, then every `interval` (None: once)."""
        with self._changed:
            self._due[id(lock)] = (lock, interval, time.monotonic() + first)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="framework-lock-heartbeat", daemon=True
                )
                self._thread.start()
            self._changed.notify()

    def remove(self, lock: EntryLock) -> None:
        """Stop beating for `lock`; a beat under way ends first."""
        with self._changed:
            self._due.pop(id(lock), None)

    def _run(self) -> None:
        with self._changed:
            while True:
                now = time.monotonic()
                for key, (lock, interval, due) in list(self._due.items()):
                    if due <= now:
                        lock.beat()
                        if interval is None:
                            del self._due[key]
                        else:
                            self._due[key] = (lock, interval, now + interval)
                soonest = min((due for _lock, _interval, due in self._due.values()), default=None)
                self._changed.wait(None if soonest is None else max(0.0, soonest - time.monotonic()))


_BEATS = _Heartbeats()


class UseLock:
    """Whether an entry is being read: readers hold a shared lock on its use file
    (`use_of`) while they read it, and whoever removes the entry first takes the
    exclusive lock without waiting, so a file in use is never removed.

    `flock` locks belong to an open file, so two holds in one process conflict as two
    processes' do, and the kernel drops them when a process dies: a crashed reader
    leaves no stale hold. A use file that is not a regular file (planted) is never
    opened: a reader then reads without the hold, and a removal does not happen.

    The remover deletes the use file with the entry, while it holds it: a lock taken
    on a file that is no longer at the path is dropped and taken again on the new one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: Optional[int] = None
        _USES.add(self)

    def share(self) -> None:
        """Hold the entry in use (waits while a removal holds it: milliseconds)."""
        self._fd = self._locked(fcntl.LOCK_SH)

    def exclusive(self) -> bool:
        """Take the lock if no reader holds it; False (at once) when one does."""
        try:
            self._fd = self._locked(fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return self._fd is not None

    def _locked(self, mode: int) -> Optional[int]:
        """A descriptor of the use file now at the path, locked in `mode` (None: none usable)."""
        for _ in range(16):  # each retry follows a removal: a few at most
            fd = self._open()
            if fd is None:
                return None
            try:
                fcntl.flock(fd, mode)
                held = os.fstat(fd)
                now = os.lstat(self.path)
            except FileNotFoundError:  # removed with its entry while this waited
                os.close(fd)
                continue
            except BaseException:
                os.close(fd)
                raise
            if (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
                return fd
            os.close(fd)
        return None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # which drops the lock

    def _open(self) -> Optional[int]:
        # Read-only: `flock` needs no write access, so a use file another user of a
        # shared cache made (mode 0644 under the usual umask) still takes this user's holds.
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags | os.O_CREAT, 0o666)
        except PermissionError:  # a folder this user cannot write, the file made already
            try:
                fd = os.open(self.path, flags)
            except OSError:
                return None
        except OSError:  # a planted link or FIFO
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        return fd

    def __del__(self) -> None:
        self.release()


def in_use(path: Path) -> bool:
    """Whether a reader (of any process, this one included) holds the use file at `path`
    now. A missing one is held by nobody: none is made to find out."""
    if not os.path.lexists(path):
        return False
    probe = UseLock(path)
    free = probe.exclusive()
    probe.release()
    return not free


# A forked child gets a copy of each held use file's descriptor, and `flock` lets go
# only when every copy is closed: the parent's holds are the parent's to release.
_USES: weakref.WeakSet[UseLock] = weakref.WeakSet()


def _drop_inherited_uses() -> None:
    for use in list(_USES):
        fd, use._fd = use._fd, None
        if fd is not None:
            os.close(fd)


os.register_at_fork(after_in_child=_drop_inherited_uses)
