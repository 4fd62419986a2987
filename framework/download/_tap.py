"""Following a fetch as it lands: how much of an entry's partial file this process
has hashed, so that the cluster fetch sends those bytes on while the rest still
arrives from the origin.

A hash only ever takes in bytes that are already in the file (the single-stream path
hashes what it wrote; the parallel path reads its contiguous prefix back), in order
from byte 0, so the hashed length is a prefix of the file that will not change. A
fetch that starts over (another version, a parallel attempt given up) makes a new
hash: a new generation, whose bytes replace the earlier ones'.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

__all__ = ["Tap", "followed", "tapping"]

_TAPS: dict[Path, Tap] = {}


class Tap:
    """The hashed prefix of the partial file that this process writes for one entry."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.generation = 0  # 0: no hash yet
        self.hashed = 0
        self.fd: Optional[int] = None  # a descriptor of this generation's file, ours
        self._fds: list[int] = []  # closed by `close` only: a reader may still use an older one
        self._closed = False

    def follow(self, hasher: Any, fd: int, path: Path) -> Any:
        """`hasher`, a new generation's, counting what it takes in; `fd` its file, at `path`."""
        with self._cond:
            if self._closed:
                return hasher
            own = _reader(fd, path)  # outlives the partial file's descriptor, and its renames
            if own is not None:
                self._fds.append(own)
            self.generation += 1
            self.hashed, self.fd = 0, own
            self._cond.notify_all()
            return _Counted(hasher, self, self.generation)

    def _add(self, generation: int, count: int) -> None:
        with self._cond:
            if generation == self.generation:
                self.hashed += count
                self._cond.notify_all()

    def wait(self, generation: int, beyond: int, timeout: float, ended: threading.Event) -> None:
        """Until more than `beyond` bytes of `generation` are hashed, another generation
        began, `ended` is set (see `wake`), or `timeout` passed."""
        with self._cond:
            self._cond.wait_for(
                lambda: ended.is_set() or self.generation != generation or self.hashed > beyond,
                timeout=timeout,
            )

    def snapshot(self) -> tuple[int, Optional[int], int]:
        """(generation, a descriptor of its file, its hashed length)."""
        with self._cond:
            return self.generation, self.fd, self.hashed

    def wake(self) -> None:
        """End a `wait` now (its `ended` was set)."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            fds, self._fds, self.fd = self._fds, [], None
        for fd in fds:
            os.close(fd)


def _reader(fd: int, path: Path) -> Optional[int]:
    """A descriptor of our own that reads the file `fd` writes (opened by `path`, checked
    to be that file); None if there is none (then nothing is sent before it is published)."""
    try:
        own = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        mine, seen = os.fstat(fd), os.fstat(own)
        same = (mine.st_dev, mine.st_ino) == (seen.st_dev, seen.st_ino)
    except OSError:
        same = False
    if not same:
        os.close(own)
        return None
    return own


class _Counted:
    """A hash object that tells its `Tap` how many bytes it took in."""

    def __init__(self, inner: Any, tap: Tap, generation: int) -> None:
        self._inner = inner
        self._tap = tap
        self._generation = generation

    def update(self, data: Any) -> None:
        self._inner.update(data)
        self._tap._add(self._generation, memoryview(data).nbytes)

    def __getattr__(self, name: str) -> Any:  # hexdigest, digest, name, ...
        return getattr(self._inner, name)


@contextmanager
def tapping(final: Path, tap: Tap) -> Iterator[Tap]:
    """Follow the partial files this process writes for `final` meanwhile with `tap`."""
    _TAPS[final] = tap
    try:
        yield tap
    finally:
        if _TAPS.get(final) is tap:
            del _TAPS[final]


def followed(final: Path, hasher: Any, fd: int, path: Path) -> Any:
    """`hasher` for the partial file `fd` (at `path`) of `final`, counted if `final` is tapped."""
    tap = _TAPS.get(final)
    return hasher if tap is None else tap.follow(hasher, fd, path)
