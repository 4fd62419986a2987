"""Parallel fetch: a large object comes as byte-range parts over several connections.

One partial file (preallocated, sparse) is written with ``pwrite`` at each part's
offset. The first answer decides everything: it is a ranged request for part 0, and

- a 206 naming the total size and a strong validator, for an object larger than
  one part, makes the plan: the other parts are asked for by a pool of threads, each
  with its own stream, every request conditioned on that validator (HTTP
  ``If-Range``, S3 ``IfMatch``);
- anything else (a 200 from a server that ignores Range, a small object, no strong
  validator) is streamed as the single-stream path does, so it costs one copy.

A part answered whole (200), with another validator, another total size, or an
encoded body aborts the parallel attempt: what was written is dropped and the
single-stream path starts over from byte 0; two versions' bytes never mix.

Which parts are complete is recorded next to the partial file
(``<final>.P<tag>.<host>.<pid>.<random>.parts``, JSON written atomically), only
after the part's bytes are fsynced; a later call adopts both (the same rules as a
single-stream partial: regular files of this user whose writer is gone) and fetches
only the parts not recorded. Parallel partial files carry a ``P`` tag, so the
single-stream path never takes their holes for bytes. The plan and its record are
in `_parts`.

The sha256 is computed by a thread that reads the file back as its contiguous
prefix of written bytes grows, overlapped with the download; memory is bounded by
one chunk per connection.
"""

from __future__ import annotations

import errno
import inspect
import logging
import os
import queue
import threading
import time
from typing import Any, Callable, Final, Optional

from framework.download._parts import (
    PARALLEL_TAG,
    Resumed,
    _Plan,
    _save_record,
    adopt_parts,
    discard_record,
)
from framework.download._publish import (
    _ACTIVE,
    _READ_CHUNK,
    Validators,
    _new_hasher,
    _Partial,
    _place,
    _receive,
)
from framework.download.backend import ByteStream, DownloadBackend
from framework.errors import DownloadError, HTTPStatusError, NetworkError

__all__ = [
    "DEFAULT_CONNECTIONS",
    "DEFAULT_PART_SIZE",
    "adopt_parts",
    "connections_from",
    "fetch_parts",
    "serves_parts",
]

logger = logging.getLogger("framework.download")

# One stream until the adaptive default lands: on a 2-CPU machine over loopback, 8
# connections measured 0.71x one stream (threads and a read-back hash compete for the CPU).
DEFAULT_CONNECTIONS: Final = 1
DEFAULT_PART_SIZE: Final = 8 << 20  # as s3transfer: large enough that a request's latency is amortized

# Module-level so a test can inject a write failure (ENOSPC), as `_pipeline._writev`.
_pwrite = os.pwrite


def connections_from(value: Optional[int]) -> int:
    """The connection cap: `value`, else ``$FRAMEWORK_CONNECTIONS``, else the default."""
    if value is None:
        text = os.environ.get("FRAMEWORK_CONNECTIONS", "").strip()
        if not text:
            return DEFAULT_CONNECTIONS
        try:
            value = int(text)
        except ValueError:
            raise ValueError(
                f"FRAMEWORK_CONNECTIONS must be a whole number of connections (1 = one stream), "
                f"got {text!r}; set it to e.g. 8, or unset it for the default"
            ) from None
        what = "FRAMEWORK_CONNECTIONS"
    else:
        what = "connections"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a whole number of at least 1 (1 = one stream), got {value!r}")
    return value


def serves_parts(backend: DownloadBackend) -> bool:
    """Whether `backend.open` takes an `end` (reads a bounded byte range)."""
    try:
        return "end" in inspect.signature(backend.open).parameters
    except (TypeError, ValueError):
        return False


class _VersionChanged(Exception):
    """A part did not come from the version the plan was made for."""


class _Hasher:
    """Hashes the file's contiguous prefix of complete parts, on its own thread, reading
    it back through a descriptor checked to be the partial file."""

    def __init__(self, url: str, partial: _Partial, plan: _Plan, done: set[int]) -> None:
        self.url, self.plan = url, plan
        self.hasher = _new_hasher()
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
        self._thread = threading.Thread(target=self._run, name="framework-parallel-hash", daemon=True)
        self._thread.start()

    def complete(self, index: int) -> None:
        with self._cond:
            self._done.add(index)
            self._cond.notify()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stopped and self._next not in self._done and self._next < self.plan.count:
                        self._cond.wait()
                    if self._stopped or self._next >= self.plan.count:
                        return
                    index = self._next
                start, end = self.plan.bounds(index)
                while start < end:
                    chunk = os.pread(self.read_fd, min(_READ_CHUNK, end - start), start)
                    if not chunk:
                        raise DownloadError(self.url, "the partial file shrank while it was hashed")
                    self.hasher.update(chunk)
                    start += len(chunk)
                with self._cond:
                    self._next += 1
        except BaseException as error:  # reported by `finish`
            self.error = error

    def finish(self) -> Any:
        """Wait until every part is hashed; the hasher, or raise what stopped the thread."""
        self._thread.join()
        os.close(self.read_fd)
        if self.error is not None:
            raise DownloadError(
                self.url, f"hashing the download failed: {type(self.error).__name__}: {self.error}"
            ) from self.error
        return self.hasher

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join()
        os.close(self.read_fd)


class _Recorder:
    """Records complete parts on its own thread: one ``fdatasync`` covers every part
    completed before it, then the record is rewritten. Workers never wait on the disk;
    a part counts (for a later resume) only once its bytes are durable."""

    def __init__(self, partial: _Partial, plan: _Plan, done: set[int]) -> None:
        self.partial, self.plan = partial, plan
        self.recorded = set(done)
        self._pending: set[int] = set()
        self._closing = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="framework-parallel-record", daemon=True)
        self._thread.start()

    def completed(self, index: int) -> None:
        with self._cond:
            self._pending.add(index)
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._pending:
                    return
                batch, self._pending = self._pending, set()
            try:
                os.fdatasync(self.partial.fd)  # the bytes are on disk before the record says so
                self.recorded |= batch
                _save_record(self.partial.name, self.plan, self.recorded)
            except OSError as error:  # only a later resume loses: it fetches those parts again
                logger.warning("cannot record the complete parts of %s: %s", self.partial.name.path, error)
                return

    def close(self, flush: bool) -> None:
        """Stop; with `flush`, record what completed first (the fetch stops short)."""
        with self._cond:
            self._closing = True
            if not flush:
                self._pending.clear()
            self._cond.notify()
        self._thread.join()


class _Engine:
    """The threads that fetch the plan's missing parts into `partial`."""

    def __init__(
        self,
        backend: DownloadBackend,
        url: str,
        partial: _Partial,
        plan: _Plan,
        done: set[int],
        attempts: int,
        backoff_factor: float,
        bar: Any,
    ) -> None:
        self.backend, self.url, self.partial, self.plan = backend, url, partial, plan
        self.done = set(done)
        self.attempts, self.backoff_factor, self.bar = attempts, backoff_factor, bar
        self.todo: queue.SimpleQueue[int] = queue.SimpleQueue()
        self.stop = threading.Event()
        self.lock = threading.Lock()  # the offset, the bar, `errors`
        self.errors: list[BaseException] = []
        self.hasher = _Hasher(url, partial, plan, done)
        self.recorder = _Recorder(partial, plan, done)

    def run(self, connections: int, first: Optional[ByteStream]) -> None:
        """Fetch the missing parts; part 0 from `first` when given (the first answer)."""
        for index in range(0 if first is None else 1, self.plan.count):
            if index not in self.done:
                self.todo.put(index)
        workers = [
            threading.Thread(
                target=self._work,
                args=(first if i == 0 else None,),
                name=f"framework-parallel-{i}",
                daemon=True,
            )
            for i in range(max(1, min(connections, self.plan.count - len(self.done))))
        ]
        try:
            for worker in workers:
                worker.start()
            for worker in workers:
                while worker.is_alive():  # a timed join: Ctrl-C still reaches this thread
                    worker.join(0.1)
        except BaseException:
            self.stop.set()
            for worker in workers:
                worker.join()
            self.hasher.stop()
            self.recorder.close(flush=True)
            raise
        if self.errors:
            self.hasher.stop()
            self.recorder.close(flush=True)
            raise self.errors[0]
        self.recorder.close(flush=False)  # complete: the record is removed next
        self.partial.hasher = self.hasher.finish()
        self.partial.offset = self.plan.size

    def _work(self, first: Optional[ByteStream]) -> None:
        try:
            if first is not None:
                self._part(0, first)
            while not self.stop.is_set():
                try:
                    index = self.todo.get_nowait()
                except queue.Empty:
                    return
                self._part(index, None)
        except BaseException as error:
            with self.lock:
                self.errors.append(error)
            self.stop.set()

    def _part(self, index: int, stream: Optional[ByteStream]) -> None:
        """Fetch part `index` (from `stream` if given), resuming within it after a break."""
        start, end = self.plan.bounds(index)
        position, failures = start, 0
        while position < end:
            if self.stop.is_set():
                return
            try:
                if stream is None:
                    stream = self._open(position, end)
                with stream:
                    self._check(stream, position)
                    position = self._write(stream, position, end)
                if position < end:
                    raise NetworkError(self.url, f"a part broke off at byte {position} of {start}-{end}")
            except NetworkError as error:
                failures += 1
                if failures >= self.attempts or self.stop.is_set():
                    raise
                logger.warning("%s; resuming the part at byte %d", error, position)
                time.sleep(self.backoff_factor * (2 ** (failures - 1)))
            stream = None
        if self.stop.is_set():
            return
        with self.lock:
            self.partial.offset += end - start
        self.recorder.completed(index)
        self.hasher.complete(index)

    def _open(self, position: int, end: int) -> ByteStream:
        if_range = self.plan.validators.if_range
        try:
            return self.backend.open(self.url, position, if_range=if_range, end=end)  # type: ignore[call-arg]
        except HTTPStatusError as error:
            if error.status == 412:  # S3 IfMatch: the object is another version now
                raise _VersionChanged(str(error)) from error
            raise

    def _check(self, stream: ByteStream, position: int) -> None:
        got = Validators.of(stream)
        if (
            stream.status != 206
            or stream.start != position
            or stream.encoding is not None
            or stream.size != self.plan.size
            or got.tag != self.plan.validators.tag
        ):
            raise _VersionChanged(
                f"a part came as status {stream.status}, from byte {stream.start} of {stream.size}, "
                f"version {got.version!r}; the plan was for {self.plan.validators.version!r}"
            )

    def _write(self, stream: ByteStream, position: int, end: int) -> int:
        fd = self.partial.fd
        for chunk in stream.chunks:
            if self.stop.is_set():
                return position
            if position + len(chunk) > end:
                raise _VersionChanged(f"a part ran past its end ({position + len(chunk)} > {end})")
            view = memoryview(chunk)
            while view:
                try:
                    written = _pwrite(fd, view, position)
                except OSError as error:
                    if error.errno in (errno.ENOSPC, errno.EDQUOT):
                        raise DownloadError(
                            self.url,
                            f"no space left on the device holding {self.partial.name.path.parent} "
                            f"({os.strerror(error.errno)}); free some space or point "
                            "FRAMEWORK_CACHE at a larger disk",
                        ) from error
                    raise
                view, position = view[written:], position + written
                if self.bar is not None:
                    with self.lock:
                        self.bar.update(written)
        return position


class _Hashed:
    """What `fetch_parts` hands back in place of a pipeline: the hash is already done."""

    def close(self) -> None:
        pass


def fetch_parts(
    backend: DownloadBackend,
    url: str,
    partial: _Partial,
    resumed: Optional[Resumed],
    *,
    connections: int,
    part_size: int,
    attempts: int,
    backoff_factor: float,
    bar: Any,
    on_size: Optional[Callable[[int], None]],
) -> tuple[Optional[Any], int]:
    """Fetch `url` into `partial` in parts.

    Returns an object with ``close()``, as `_download` does, once the partial file
    holds the whole object and its hash; or None when the single-stream path is to go
    on (with `partial` empty, or holding the bytes of a whole answer it resumes), with
    the attempts already spent (a first answer that broke off counts as one)."""
    first: Optional[ByteStream] = None
    if resumed is not None:
        plan, done = resumed.plan, resumed.done
        logger.info("resuming %s: %d of %d parts are here", url, len(done), plan.count)
    else:
        if partial.name.tag.startswith(PARALLEL_TAG):
            _empty(partial)  # parts without their record: nothing says which bytes are real
        if partial.offset:
            return None, 0  # a single-stream partial file: that path resumes it
        try:
            first = backend.open(url, 0, end=part_size)  # type: ignore[call-arg]
        except HTTPStatusError as error:
            if error.status != 416:
                raise
            return None, 0  # an empty object answers 416 to any range
        validators = Validators.of(first)
        if (
            first.status != 206
            or first.start != 0
            or first.size is None
            or first.size <= part_size
            or first.encoding is not None
            or validators.if_range is None
        ):
            return _whole(backend, url, first, partial, bar, on_size, attempts, backoff_factor)
        plan, done = _Plan(first.size, part_size, validators), set()
        partial.restart(validators)
        _retag(partial, PARALLEL_TAG + validators.tag)
        os.ftruncate(partial.fd, plan.size)  # sparse: blocks are allocated as parts arrive
        _save_record(partial.name, plan, done)
    if on_size is not None:
        on_size(plan.size)
    if bar is not None:
        bar.total, bar.n = plan.size, partial.offset
        bar.refresh()
    engine = _Engine(backend, url, partial, plan, done, attempts, backoff_factor, bar)
    try:
        engine.run(connections, first)
    except _VersionChanged as error:
        logger.info("%s changed while it was fetched in parts (%s); starting over", url, error)
        discard_record(partial)
        _empty(partial)
        return None, 0
    except BaseException as error:
        if partial.offset == 0 or not isinstance(error, (NetworkError, KeyboardInterrupt)):
            discard_record(partial)  # the partial file is removed too: nothing to resume
        raise
    finally:
        if first is not None:
            first.close()
    discard_record(partial)  # complete: verified and published next, or removed
    return _Hashed(), 0


def _whole(
    backend: DownloadBackend,
    url: str,
    stream: ByteStream,
    partial: _Partial,
    bar: Any,
    on_size: Optional[Callable[[int], None]],
    attempts: int,
    backoff_factor: float,
) -> tuple[Optional[Any], int]:
    """Stream the first answer as the single-stream path does (one copy of traffic);
    None when that path is to go on (a 416, or a body that broke off: it resumes,
    with one attempt fewer)."""
    with stream:
        if stream.status == 416 or not _place(backend, url, stream, partial):
            return None, 0
        try:
            return _receive(stream, partial, url, bar, on_size), 0
        except NetworkError as error:  # bytes so far are kept: the single-stream path resumes
            if attempts <= 1:
                raise
            logger.warning("%s; resuming from byte %d", error, partial.offset)
    time.sleep(backoff_factor)
    return None, 1


def _empty(partial: _Partial) -> None:
    """Make `partial` an empty file with no version (its bytes cannot be trusted)."""
    os.ftruncate(partial.fd, 0)
    partial.offset, partial.hasher = 0, _new_hasher()
    partial.restart(Validators())


def _retag(partial: _Partial, tag: str) -> None:
    """Rename `partial` to carry `tag` (as `_Partial.restart` does for a validator's tag)."""
    renamed = partial.name.renamed(tag)
    _ACTIVE.add(str(renamed.path))
    os.rename(partial.name.path, renamed.path)
    _ACTIVE.discard(str(partial.name.path))
    partial.name = renamed
