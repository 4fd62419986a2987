"""Parallel fetch: a large object comes as byte-range parts over several connections.

One partial file (preallocated, sparse) is written with ``pwrite`` at each part's
offset. The first answer decides everything: it is a request for the whole object as a
range (``bytes=0-`` and a last byte past any end), and

- a 206 naming the total size and a strong validator, for an object larger than one
  part, makes the plan: that answer goes on as the first connection's stream, and the
  ramp (`Ramp`) decides whether more connections are worth it; every later request is
  conditioned on that validator (HTTP ``If-Range``, S3 ``IfMatch``);
- anything else (a 200 from a server that ignores Range, a small object, no strong
  validator) is streamed as the single-stream path does, so it costs one copy.

The ramp measures the one stream first: if it would bring the rest in under half a
second it stays alone, and the object is one request, as on the single-stream path.
Otherwise connections are added while throughput grows, up to the cap; each asks for
one part at a time, lowest missing part first, so the hashed prefix keeps growing.

A part answered whole (200), with another validator, another total size, or an
encoded body aborts the parallel attempt: what was written is dropped and the
single-stream path starts over from byte 0; two versions' bytes never mix.

Which parts are complete, and how far each begun part got, is recorded next to the
partial file (``<final>.P<tag>.<host>.<pid>.<random>.parts``, JSON written
atomically) every quarter second and when the fetch stops, only after those bytes are
fsynced; a later call, with any number of connections, adopts both (the same rules as
a single-stream partial: regular files of this user whose writer is gone) and asks
only for what is not recorded, each part from where it got to. Parallel partial files
carry a ``P`` tag, so the single-stream path never takes their holes for bytes. The
plan and its record are in `_parts`, the ramp in `_ramp`, the threads that hash and
record in `_followers`.

The sha256 is computed by a thread that reads the file back as its contiguous
prefix of written bytes grows, overlapped with the download; memory is bounded by
one chunk per connection.
"""

from __future__ import annotations

import collections
import errno
import inspect
import logging
import os
import threading
import time
from typing import Any, Callable, Final, Optional

import attrs

from framework.download._followers import PrefixHasher, ProgressRecorder
from framework.download._parts import MOST_PARTS, PARALLEL_TAG, Resumed, _Plan, adopt_parts, discard_record
from framework.download._publish import _ACTIVE, Validators, _new_hasher, _Partial, _place, _receive
from framework.download._ramp import Ramp
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

# The cap; `Ramp` decides how many of them an object gets (often one).
DEFAULT_CONNECTIONS: Final = 16
DEFAULT_PART_SIZE: Final = 8 << 20  # as s3transfer: large enough that a request's latency is amortized
# Parts are `part_size` at most, smaller for an object that would otherwise have fewer parts
# than connections, down to this.
_SMALLEST_PART: Final = 1 << 20
# Answers that say the object is missing or forbidden, whatever the Range.
_NOT_THERE: Final = frozenset({401, 403, 404, 407, 410})
# How long an interrupted fetch waits for its connections before it returns: one blocked in
# a read is left to its read timeout (on a daemon thread that writes nothing more).
STOP_WAIT_S: Final = 1.0
# A range end past any object: a server reads it as "to the end" (RFC 9110, 14.1.2), so the
# first request is one stream for the whole object that still tells whether ranges are served.
_TO_THE_END: Final = 1 << 62

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




@attrs.define
class _Connection:
    """One thread: its standing with the ramp, and where it is."""

    live: bool = True  # counted in `_Engine.live`
    waiting: bool = True  # no byte of its first answer yet (the ramp measures from the first)
    index: int = 0  # the part it fetches
    position: int = 0  # the next byte it writes (a break resumes here)


class _Engine:
    """The threads that fetch the plan's missing parts into `partial`.

    Parts are claimed lowest first, so the hashed prefix grows as they arrive. A
    connection asks for one part, except while it is alone: then it asks for the whole
    run of missing parts ahead and goes on part after part in one request (one stream is
    one request). The first answer is such a stream. When another connection claims the
    next part, the stream stops at the part's end. Workers write through their own
    descriptor, closed by whichever of them, or of the engine, leaves last: a worker
    still blocked in a read when the fetch is interrupted can never write elsewhere."""

    def __init__(
        self,
        backend: DownloadBackend,
        url: str,
        partial: _Partial,
        plan: _Plan,
        done: set[int],
        reached: dict[int, int],
        attempts: int,
        backoff_factor: float,
        bar: Any,
    ) -> None:
        self.backend, self.url, self.partial, self.plan = backend, url, partial, plan
        self.attempts, self.backoff_factor, self.bar = attempts, backoff_factor, bar
        self.todo = collections.deque(i for i in range(plan.count) if i not in done)
        self.reached = dict(reached)  # parts begun, not complete: the first byte not yet written
        self.stop = threading.Event()
        self.lock = threading.Condition()  # everything below, `reached`, the partial's offset and the bar
        self.errors: list[BaseException] = []
        self.received = 0  # bytes written by this run
        self.written_at = 0.0  # when the last of them were (time.monotonic)
        self.live = 0  # connections running
        self.waiting = 0  # of those, ones that have not had a byte of their first answer yet
        self.writing = 0  # of those, ones in a pwrite now
        self.ramp = Ramp(1)
        self.done_with_fd = False  # the engine no longer needs `fd`: the last worker out closes it
        self.hasher = PrefixHasher(url, partial, plan, done)
        try:
            self.recorder = ProgressRecorder(partial, plan, done, self._reached, self._recorder_failed)
        except BaseException:
            self.hasher.stop()
            raise
        try:
            self.fd: Optional[int] = os.dup(partial.fd)
        except BaseException:
            self.hasher.stop()
            self.recorder.close(flush=False)
            raise

    def _reached(self) -> dict[int, int]:
        with self.lock:
            return dict(self.reached)

    def run(self, cap: int, first: Optional[ByteStream]) -> None:
        """Fetch the missing parts; part 0 and on from `first` when given (the first answer)."""
        remaining = self.plan.size - self.partial.offset
        if first is not None:
            self.todo.popleft()  # part 0: a fresh plan has every part to do
        self.ramp = Ramp(cap)
        workers: list[threading.Thread] = []
        try:
            if first is None and not self.todo:
                self._confirm()  # a resume with every part here: still the version on the server?
            try:
                worker = self._start(first)
            except BaseException:
                if first is not None:
                    first.close()
                raise
            assert worker is not None  # the first one raises when it cannot start
            workers.append(worker)
            while self._steer(workers, remaining):
                with self.lock:  # woken as a worker leaves or fails; Ctrl-C reaches this thread here
                    if self.live and not self.stop.is_set():
                        self.lock.wait(0.1 if self.ramp.settled else 0.005)
            if self.errors:
                raise self.errors[0]
        except BaseException:
            self.stop.set()
            self._wind_down(workers, complete=False)
            raise
        try:
            self._wind_down(workers, complete=True)  # the record is removed next
            if self.errors:  # the recorder's last sync failed
                raise self.errors[0]
            self.partial.hasher = self.hasher.finish()
        except BaseException:
            self.hasher.stop()
            raise
        self.partial.offset = self.plan.size

    def _confirm(self) -> None:
        """Ask for the last byte with the plan's validator, as any part is asked for: a
        version that changed raises `_VersionChanged` (the fetch starts over)."""
        position = self.plan.size - 1
        with self._open(position, self.plan.size) as stream:
            self._check(stream, position)

    def _steer(self, workers: list[threading.Thread], remaining: int) -> bool:
        """Start the connections the ramp wants now; False once the fetch is over (every
        connection has left: no part is left, or one failed)."""
        with self.lock:
            if self.stop.is_set() or self.live == 0:
                return False
            at, received, ready = self.written_at, self.received, self.waiting == 0
            live, left = self.live, bool(self.todo)
        wanted = self.ramp.update(time.monotonic(), at, received, remaining - received, ready)
        if wanted > live and left:
            logger.debug("%s: %d connections (%d bytes so far)", self.url, wanted, received)
            for _ in range(wanted - live):
                worker = self._start(None)
                if worker is None:
                    break
                workers.append(worker)
        return True

    def _wind_down(self, workers: list[threading.Thread], complete: bool) -> None:
        """Wait for the workers (at most `STOP_WAIT_S` once stopped: one blocked in a read
        finishes on its own and writes nothing more), then stop the hasher (unless the
        fetch is complete: it finishes) and the recorder, which records the progress
        first. Whatever interrupts a wait, the descriptor is handed to the last worker
        out, and the hasher and recorder end on their own threads."""
        deadline = time.monotonic() + STOP_WAIT_S
        try:
            for worker in workers:
                worker.join(max(0.0, deadline - time.monotonic()) if self.stop.is_set() else None)
            with self.lock:  # a worker still live now writes nothing more once its pwrite is done
                self.lock.wait_for(lambda: self.writing == 0)
        finally:
            with self.lock:
                self.done_with_fd = True
                self._close_fd()
            try:
                if not complete:
                    self.hasher.stop()
            finally:
                # Recorded even when complete: a Ctrl-C during the final hash keeps the parts.
                self.recorder.close(flush=True)

    def _close_fd(self) -> None:
        """Close the workers' descriptor once the engine and every worker are done (under the lock)."""
        if self.done_with_fd and self.live == 0 and self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _start(self, first: Optional[ByteStream]) -> Optional[threading.Thread]:
        """Start a worker (on `first` if given). None if the system refuses another
        thread while others run: the ramp keeps to those (raised for the first one)."""
        with self.lock:
            self.live += 1
            self.waiting += 1
        worker = threading.Thread(
            target=self._work, args=(first,), name=f"framework-parallel-{self.live}", daemon=True
        )
        try:
            worker.start()
        except BaseException as error:
            with self.lock:
                self.live -= 1
                self.waiting -= 1
                self._close_fd()
                # The first worker, another error, or nobody left to fetch what remains: fail.
                stranded = self.live == 0 and bool(self.todo)
                if first is not None or not isinstance(error, RuntimeError) or stranded:
                    raise
                self.ramp.refused(self.live)
            logger.info("%s: cannot start another connection (%s); going on with fewer", self.url, error)
            return None
        return worker

    def _work(self, first: Optional[ByteStream]) -> None:
        connection = _Connection()
        stream = first
        try:
            index = 0 if first is not None else self._claim(connection)
            while index is not None and not self.stop.is_set():
                self._part(index, stream, connection)
                stream, index = None, self._claim(connection)
        except BaseException as error:
            with self.lock:
                self.errors.append(error)
            self.stop.set()
        finally:
            if first is not None:
                first.close()  # if it was never read (closing twice is nothing)
            with self.lock:
                self._leave(connection)

    def _leave(self, connection: _Connection) -> None:
        """Count `connection` out (under the lock); once only."""
        if connection.live:
            connection.live = False
            self.live -= 1
            self.waiting -= connection.waiting
            self._close_fd()
            self.lock.notify_all()

    def _claim(self, connection: _Connection) -> Optional[int]:
        """The lowest missing part, now this connection's; None when none is left or the
        ramp wants fewer connections (this one stops, counted out at once so that only
        the surplus stops)."""
        with self.lock:
            if connection.live and self.todo and self.live <= self.ramp.target:
                return self.todo.popleft()
            self._leave(connection)
            return None

    def _next(self, index: int, stream_end: int) -> Optional[int]:
        """Part `index` + 1 if the current stream covers it and nobody claimed it."""
        with self.lock:
            if (
                self.plan.bounds(index)[1] < stream_end
                and self.todo
                and self.todo[0] == index + 1
                and index + 1 not in self.reached  # begun before: its request starts where it got to
                and self.live <= self.ramp.target
            ):
                return self.todo.popleft()
        return None

    def _run_end(self, index: int) -> int:
        """Where a request from part `index` ends: that part's end, or, for a connection
        that is alone, the end of the run of missing, unbegun parts from there."""
        with self.lock:
            last = index
            if self.live == 1 and self.ramp.target == 1:
                for following in self.todo:
                    if following != last + 1 or following in self.reached:
                        break
                    last = following
        return self.plan.bounds(last)[1]

    def _give_back(self, connection: _Connection) -> bool:
        """The server refused this connection (429/503) while others are live: hand its
        part back (first in line), cap the ramp at the connections that remain and stop
        this one. False for the last connection: the refusal is the fetch's to handle."""
        with self.lock:
            if self.live <= 1:
                return False
            self.todo.appendleft(connection.index)
            self.ramp.refused(self.live - 1)
            self._leave(connection)
            return True

    def _part(self, index: int, stream: Optional[ByteStream], connection: _Connection) -> None:
        """Fetch part `index` (from `stream` if given) and, while that stream covers
        them, the parts after it nobody claimed. A break resumes at the byte reached; an
        answer shorter than asked (a server capping its ranges) is followed by another."""
        with self.lock:
            position = self.reached.get(index, self.plan.bounds(index)[0])
        connection.index, connection.position = index, position
        stream_end, failures = self.plan.size, 0
        while not self.stop.is_set():
            began = connection.position
            try:
                if stream is None:
                    stream_end = self._run_end(connection.index)
                    stream = self._open(connection.position, stream_end)
                with stream:
                    self._check(stream, connection.position)
                    if self._write(stream, stream_end, connection):
                        return
                if connection.position == began:
                    raise NetworkError(self.url, f"an answer for byte {began} on had no bytes")
                # A whole answer, shorter than asked (a server capping its ranges): not a
                # failure; ask for the rest.
            except HTTPStatusError as error:
                if error.status in (429, 503) and self._give_back(connection):
                    logger.info("%s refused one more connection (%s); going on with fewer", self.url, error)
                    return
                raise
            except NetworkError as error:
                failures += 1  # as on the single-stream path: progress does not reset it
                if failures >= self.attempts or self.stop.is_set():
                    raise
                logger.warning("%s; resuming the part at byte %d", error, connection.position)
                time.sleep(self.backoff_factor * (2 ** (failures - 1)))
            stream = None

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

    def _write(self, stream: ByteStream, stream_end: int, connection: _Connection) -> bool:
        """Write `stream` at the connection's part and byte, keeping them current (a
        break resumes there); True once the stream's work is done or the fetch stops,
        False if it ended short."""
        index, position = connection.index, connection.position
        end = self.plan.bounds(index)[1]
        for chunk in stream.chunks:
            view = memoryview(chunk)
            while view:
                piece = view[: end - position]
                with self.lock:
                    if self.stop.is_set():  # checked with `writing` raised: see `_wind_down`
                        return True
                    self.writing += 1
                try:
                    self._pwrite(piece, position)
                finally:
                    with self.lock:
                        self.writing -= 1
                        if self.stop.is_set():  # `_wind_down` waits for the last pwrite
                            self.lock.notify_all()
                position, view = position + len(piece), view[len(piece) :]
                connection.position = position
                with self.lock:
                    if position < end:
                        self.reached[index] = position
                    else:  # complete: recorded as done once `_complete` says so, never as reached
                        self.reached.pop(index, None)
                    self.partial.offset += len(piece)
                    self.received += len(piece)
                    self.written_at = time.monotonic()
                    self.waiting -= connection.waiting
                    connection.waiting = False
                    if self.bar is not None:
                        self.bar.update(len(piece))
                if position == end:
                    self._complete(index)
                    following = self._next(index, stream_end)
                    if following is None:
                        return True  # a stream that ran past its end is not read further
                    index, end = following, self.plan.bounds(following)[1]
                    connection.index = index
        return False

    def _pwrite(self, view: memoryview, position: int) -> None:
        assert self.fd is not None  # closed only once every worker has left
        while view:
            try:
                written = _pwrite(self.fd, view, position)
            except OSError as error:
                if error.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise self._write_error(error) from error
                raise
            view, position = view[written:], position + written

    def _write_error(self, error: OSError) -> DownloadError:
        """What a failed write or sync of the partial file tells the user."""
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            return DownloadError(
                self.url,
                f"no space left on the device holding {self.partial.name.path.parent} "
                f"({os.strerror(error.errno)}); free some space or point "
                "FRAMEWORK_CACHE at a larger disk",
            )
        return DownloadError(self.url, f"writing {self.partial.name.path} failed: {error}")

    def _recorder_failed(self, error: OSError) -> None:
        """The recorder could not make written bytes durable: the fetch stops now."""
        failure = self._write_error(error)
        failure.__cause__ = error
        with self.lock:
            self.errors.append(failure)
            self.stop.set()
            self.lock.notify_all()

    def _complete(self, index: int) -> None:
        self.recorder.completed(index)
        self.hasher.complete(index)


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
    reached: dict[int, int] = {}
    if resumed is not None:
        plan, done, reached = resumed.plan, resumed.done, resumed.reached
        logger.info("resuming %s: %d of %d parts are here", url, len(done), plan.count)
    else:
        if partial.name.tag.startswith(PARALLEL_TAG):
            _empty(partial)  # parts without their record: nothing says which bytes are real
        if partial.offset:
            return None, 0  # a single-stream partial file: that path resumes it
        try:
            first = backend.open(url, 0, end=_TO_THE_END)  # type: ignore[call-arg]
        except HTTPStatusError as error:
            if error.status in _NOT_THERE or (error.status >= 500 and error.status != 501):
                raise  # the object or the server, not the Range: one stream would fail alike
            # 416 (an empty object), or a server that refuses this Range (400, 501, ...):
            # the single-stream path asks without one.
            logger.info("%s refused a ranged request (%s); fetching it in one stream", url, error)
            return None, 0
        if first.status == 206 and first.size is None:
            # A range of an object of unknown size (``bytes 0-n/*``) cannot say it is the
            # whole object: the single-stream path asks for it without a Range.
            first.close()
            return None, 0
        validators = Validators.of(first)
        size = first.size or 0
        part_size = min(part_size, max(_SMALLEST_PART, -(-size // connections)))
        part_size = max(part_size, -(-size // MOST_PARTS))  # a huge object: fewer, larger parts
        if (
            first.status != 206
            or first.start != 0
            or size <= part_size
            or first.encoding is not None
            or validators.if_range is None
        ):
            return _whole(backend, url, first, partial, bar, on_size, attempts, backoff_factor)
        plan, done = _Plan(size, part_size, validators), set()
        partial.restart(validators)
        _retag(partial, PARALLEL_TAG + validators.tag)
        os.ftruncate(partial.fd, plan.size)  # sparse: blocks are allocated as parts arrive
        # No record yet: the recorder writes the first one. A P file without one is never
        # resumed (its holes are not bytes), only swept once its writer is gone.
    if on_size is not None:
        on_size(plan.size)
    if bar is not None:
        bar.total, bar.n = plan.size, partial.offset
        bar.refresh()
    try:
        engine = _Engine(backend, url, partial, plan, done, reached, attempts, backoff_factor, bar)
    except BaseException:
        if first is not None:
            first.close()
        discard_record(partial)
        raise
    try:
        # The first stream is the engine's now: its worker closes it. Closing it here could
        # wait on that worker's blocked read (a buffered reader's close takes its lock).
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
