"""The engine of a parallel fetch: the threads that fetch a plan's missing parts into
one partial file, steered by the ramp (see `_fetch` for the whole design)."""

from __future__ import annotations

import bisect
import collections
import contextlib
import errno
import logging
import os
import threading
import time
from typing import Any, Callable, Final, Iterator, Optional

import attrs

from framework.download._partial import Partial, resumable
from framework.download._pipeline import no_room
from framework.download._stream import open_stream
from framework.download.backend import ByteStream, DownloadBackend, refusals_at_once
from framework.download.parallel._followers import PrefixHasher, ProgressRecorder
from framework.download.parallel._parts import VersionChanged, _Plan, discard_record
from framework.download.parallel._ramp import Ramp
from framework.download.parallel._runs import Runs
from framework.errors import DownloadError, HTTPStatusError, NetworkError

__all__ = ["STOP_WAIT_S", "Engine"]

logger = logging.getLogger("framework.download")

# How long an interrupted fetch waits for its connections before it returns: one blocked in
# a read is left to its read timeout (on a daemon thread that writes nothing more).
STOP_WAIT_S: Final = 1.0
# Module-level so a test can inject a write failure (ENOSPC), as `_pipeline._writev`.
_pwrite = os.pwrite


def _rest(lock: threading.Condition, over: Callable[[], bool], seconds: float) -> None:
    """Wait `seconds` on `lock`, unless `over()` first (module-level: a test counts the waits)."""
    with lock:
        lock.wait_for(over, seconds)


@attrs.define(eq=False)  # identity: kept in `Engine.connections`
class _Connection:
    """One thread: its standing with the ramp, and where it is; live while it is in
    `Engine.connections`."""

    waiting: bool = True  # no byte of its first answer yet (the ramp measures from the first)
    index: int = 0  # the part it fetches
    last: int = 0  # the last part of the run it holds (its request ends there)
    position: int = 0  # the next byte it writes (a break resumes here)
    refusals: int = 0  # its requests refused (429, 503) in a row
    refused_from: int = 0  # the bytes received by all when that row began


class Engine:
    """The threads that fetch the plan's missing parts into `partial`.

    Parts are claimed lowest first, so the hashed prefix grows as they arrive. A
    connection claims a run of parts and asks for it in one request: its share of what
    is left (guided self-scheduling), at most `run_parts` parts, so requests are large
    while much is left and small at the end, where the connections then finish together
    and the hash has little left once the last byte is in. Small, not tiny: a request is
    worth its wait for an answer (`Runs.paying_run`). While a connection
    is alone it asks for the whole run of missing parts ahead instead and goes on part
    after part (one stream is one request); the first answer is such a stream. When
    another connection claims the next part, the stream stops at the part's end.

    Workers write through their own descriptor, closed by whichever of them, or of the
    engine, leaves last: a worker still blocked in a read when the fetch is interrupted
    can never write elsewhere."""

    def __init__(
        self,
        backend: DownloadBackend,
        url: str,
        partial: Partial,
        plan: _Plan,
        done: set[int],
        reached: dict[int, int],
        attempts: int,
        backoff_factor: float,
        bar: Any,
        *,
        run_parts: int,
        first_wait: Optional[float] = None,
    ) -> None:
        self.backend, self.url, self.partial, self.plan = backend, url, partial, plan
        self.attempts, self.backoff_factor, self.bar = attempts, backoff_factor, bar
        self.todo = collections.deque(i for i in range(plan.count) if i not in done)
        self.reached = dict(reached)  # parts begun, not complete: the first byte not yet written
        self.breaks: dict[int, int] = {}  # answers broken off in each part, across the runs claiming it
        self.stop = threading.Event()
        self.lock = threading.Condition()  # everything below, `reached`, the partial's offset and the bar
        self.errors: list[BaseException] = []
        self.received = 0  # bytes written by this run
        self.written_at = 0.0  # when the last of them were (time.monotonic)
        self.connections: set[_Connection] = set()  # the live ones: their count is `live`
        self.waiting = 0  # of those, ones that have not had a byte of their first answer yet
        self.writing = 0  # of those, ones in a pwrite now
        self.first_written_at = 0.0  # when this run's first bytes were written
        self.runs = Runs(run_parts, plan.part_size, first_wait)  # how many parts a request asks for
        self.ramp = Ramp(1)
        # The connection whose request runs on to the end of the missing parts (it was alone
        # when it asked): when others join, it claims a run first and goes on uncut.
        self.open_ended: Optional[_Connection] = None
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

    @property
    def live(self) -> int:
        """How many connections are running (under the lock)."""
        return len(self.connections)

    def _reached(self) -> dict[int, int]:
        with self.lock:
            return dict(self.reached)

    def run(self, cap: int, first: Optional[ByteStream], *, fixed: bool = False) -> None:
        """Fetch the missing parts; part 0 and on from `first` (the first answer) when
        given; over up to `cap` connections, all of them once one stream is not enough
        if `fixed` (see `Ramp`)."""
        remaining = self.plan.size - self.partial.offset
        self.ramp = Ramp(cap, fixed=fixed)
        if first is not None:
            self.todo.popleft()  # part 0: a fresh plan has every part to do
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
                # Woken as a worker leaves, fails or has its first byte; Ctrl-C reaches this thread here.
                with self.lock:
                    if self.live and not self.stop.is_set():
                        self.lock.wait(self.ramp.poll_s)
            if self.errors:
                raise self.errors[0]
        except BaseException:
            self.stop.set()
            with self.lock:
                self.lock.notify_all()  # a connection waiting out a refusal leaves now
            self._wind_down(workers, complete=False)
            raise
        try:
            self._wind_down(workers, complete=True)  # the record is removed next
            if self.errors:  # the recorder's last sync failed
                raise self.errors[0]
        except BaseException:
            self.hasher.stop()
            raise
        self.partial.offset = self.plan.size

    def close(self) -> None:
        """Wait for the hash of the whole file (the parts that completed last are hashed
        while the caller fsyncs the file), hand it to the partial file and remove the
        record. Interrupted, it stops as `abandon` does."""
        try:
            self.partial.hasher = self.hasher.finish()
        except BaseException as error:
            self.abandon(error)
            raise
        discard_record(self.partial)  # verified and published next, or removed

    def abandon(self, error: BaseException) -> None:
        """The file will not be published (`error`): stop hashing. The record stays if
        the partial file does (an interruption: a later call resumes the parts), else it
        goes with it."""
        self.hasher.stop()
        if not resumable(error):
            discard_record(self.partial)

    def _confirm(self) -> None:
        """Ask for the last byte with the plan's validator, as any part is asked for: a
        version that changed raises `VersionChanged` (the fetch starts over). No other
        connection runs to take a refusal's turn: the backend's retries wait it out
        (its Retry-After, else the backoff), as for any request."""
        position = self.plan.size - 1
        with self._open(position, self.plan.size, at_once=False) as stream:
            self.plan.check(stream, position)

    def _steer(self, workers: list[threading.Thread], remaining: int) -> bool:
        """Start the connections the ramp wants now; False once the fetch is over (every
        connection has left: no part is left, or one failed)."""
        with self.lock:
            if self.stop.is_set() or self.live == 0:
                return False
            at, received, ready = self.written_at, self.received, self.waiting == 0
            live, left = self.live, bool(self.todo)
            wanted = self.ramp.update(
                time.monotonic(), at, received, remaining - received, ready, self.runs.median_wait
            )
            if wanted > live and left:
                self._bound_open_ended(wanted)
        if wanted > live and left:
            logger.debug("%s: %d connections (%d bytes so far)", self.url, wanted, received)
            for _ in range(wanted - live):
                with self.lock:
                    if self.live >= self.ramp.target:  # a refusal came as they opened
                        break
                worker = self._start(None)
                if worker is None:
                    break
                workers.append(worker)
        return True

    def _bound_open_ended(self, connections: int) -> None:
        """Others are about to join: the connection asking for the rest of the object
        claims its share first, so it goes on uncut (cutting a stream closes its
        connection and wastes what is in flight), and they claim after it (under the lock)."""
        connection, self.open_ended = self.open_ended, None
        if connection is not None and connection in self.connections:
            self._extend_run(connection, self._share(connections, connection.last - connection.index + 1))

    def _extend_run(self, connection: _Connection, share: int) -> None:
        """Claim the missing, unbegun parts right after the connection's run until the
        run holds `share` parts (under the lock)."""
        while connection.last - connection.index + 1 < share and self._unbegun_next(connection.last):
            connection.last = self.todo.popleft()

    def _share(self, connections: int, held: int) -> int:
        """How many parts a run that holds `held` claims to hold now (under the lock;
        see `Runs.share`), among the connections there are or will soon be."""
        connections = max(connections, self.ramp.target)
        unwritten = len(self.todo) + sum(max(0, other.last - other.index) for other in self.connections)
        return self.runs.share(connections, len(self.todo), unwritten, self._pace(), held)

    def _pace(self) -> Optional[float]:
        """Bytes/s per connection before any answer has flowed whole: the first stream's
        alone, as the probe measured it, else each connection's so far, waits included;
        None before two writes (under the lock)."""
        elapsed = self.written_at - self.first_written_at
        if elapsed <= 0:
            return None
        return self.ramp.alone_rate or self.received / elapsed / max(1, self.ramp.target)

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
        connection = _Connection()
        with self.lock:
            self.connections.add(connection)
            self.waiting += 1
            if first is not None:
                self.open_ended = connection  # the first answer runs to the end
        worker = threading.Thread(
            target=self._work, args=(connection, first), name=f"framework-parallel-{self.live}", daemon=True
        )
        try:
            worker.start()
        except BaseException as error:
            with self.lock:
                self.connections.discard(connection)
                self.waiting -= 1
                self._close_fd()
                # The first worker, another error, or nobody left to fetch what remains: fail.
                stranded = self.live == 0 and bool(self.todo)
                if first is not None or not isinstance(error, RuntimeError) or stranded:
                    raise
                self.ramp.keep_to(self.live)
            logger.info("%s: cannot start another connection (%s); going on with fewer", self.url, error)
            return None
        return worker

    def _work(self, connection: _Connection, first: Optional[ByteStream]) -> None:
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
        if connection in self.connections:
            self.connections.discard(connection)
            self.waiting -= connection.waiting
            self._close_fd()
            self.lock.notify_all()

    def _claim(self, connection: _Connection) -> Optional[int]:
        """The lowest missing part, now this connection's with the run after it (see the
        class); None when none is left or the ramp wants fewer connections (this one
        stops, counted out at once so that only the surplus stops)."""
        with self.lock:
            if not (connection in self.connections and self.todo and self.live <= self.ramp.target):
                self._leave(connection)
                return None
            connection.index = connection.last = self.todo.popleft()
            self._extend_run(connection, self._share(self.live, 1))
            return connection.index

    def _unbegun_next(self, index: int) -> bool:
        """Whether part `index` + 1 is the next missing part and nothing of it is written
        yet (a begun part's request starts where it got to), under the lock."""
        return bool(self.todo) and self.todo[0] == index + 1 and index + 1 not in self.reached

    def _next(self, connection: _Connection, stream_end: int) -> Optional[int]:
        """The part after the connection's, if its stream covers it: the next of its run,
        or one nobody claimed (a stream that is alone runs on)."""
        index = connection.index
        with self.lock:
            if index < connection.last:
                return index + 1
            if (
                self.plan.bounds(index)[1] < stream_end
                and self._unbegun_next(index)
                and self.live <= self.ramp.target
            ):
                connection.last = self.todo.popleft()
                return connection.last
        return None

    def _run_end(self, connection: _Connection) -> int:
        """Where a request from the connection's part ends: its run's end, or, for a
        connection that is alone, the end of the run of missing, unbegun parts from there
        (it is then the open-ended one)."""
        with self.lock:
            last = connection.last
            if self.live == 1 and self.ramp.target == 1:
                self.open_ended = connection
                for following in self.todo:
                    if following != last + 1 or following in self.reached:
                        break
                    last = following
        return self.plan.bounds(last)[1]

    def _refused(self, connection: _Connection, error: HTTPStatusError) -> None:
        """The server refused this connection's request (429, 503): its run goes back,
        first in line, to the connections the server serves, and this one waits as the
        server asks (its Retry-After, else the backoff) holding no part, then claims
        again; no connection is added while the server refuses (the ramp keeps to
        those running and goes on once every refused one is answered, see `Ramp`; a
        chosen count keeps its connections: those being opened as one is refused were
        not). After
        `attempts` refusals in a row it stops, the count kept to the others; the last
        one raises once the server served none meanwhile (refused while the others
        took the rest, it begins a new row when it is left alone)."""
        with self.lock:
            connection.refusals += 1
            if connection.refusals == 1:
                connection.refused_from = self.received
            for index in range(connection.index, connection.last + 1):
                bisect.insort(self.todo, index)  # kept in order: claims take the lowest
            connection.last = connection.index - 1  # holds nothing now
            if self.open_ended is connection:
                self.open_ended = None
            if connection.refusals >= self.attempts or self.stop.is_set():
                alone = self.live <= 1 and not self.stop.is_set()
                if alone and self.received == connection.refused_from:
                    raise error
                if not alone:
                    # A chosen count loses this one only: those not yet opened were never refused.
                    self.ramp.keep_to(self.ramp.target - 1 if self.ramp.fixed else self.live - 1)
                    self._leave(connection)
                    logger.info("%s refused one more connection (%s); going on with fewer", self.url, error)
                    return
                connection.refusals, connection.refused_from = 1, self.received  # alone now: a new row
            if not self.ramp.fixed:  # a chosen count is kept: fewer only as refused ones stop (above)
                self.ramp.refused(self.live)  # none added until the refused are answered (`_answered`)
        delay = error.retry_after
        if delay is None:
            delay = self.backoff_factor * (2 ** (connection.refusals - 1))
        logger.info("%s; a connection asks again in %.1fs, its parts go to the others", error, delay)
        # Over sooner once nothing is left to claim (the others took it all) or the fetch stops.
        _rest(self.lock, lambda: self.stop.is_set() or not self.todo, delay)

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
                    stream_end = self._run_end(connection)
                    asked = time.monotonic()
                    stream = self._open(connection.position, stream_end)
                    answered = time.monotonic()
                    waited: Optional[float] = answered - asked
                    if connection.refusals:
                        self._answered(connection)
                else:
                    waited, answered = None, 0.0  # the first answer: asked before the engine began
                with stream:
                    if waited is not None:
                        with self.lock:
                            self.runs.answered(waited)
                    self.plan.check(stream, connection.position)
                    done = self._write(stream, stream_end, connection)
                    if waited is not None:
                        self._answered_at_rate(connection.position - began, time.monotonic() - answered)
                    if done:
                        return
                if connection.position == began:
                    raise NetworkError(self.url, f"an answer for byte {began} on had no bytes")
                # A whole answer, shorter than asked (a server capping its ranges): not a
                # failure; ask for the rest.
            except HTTPStatusError as error:
                if error.status not in (429, 503):
                    raise
                self._refused(connection, error)
                return
            except NetworkError as error:
                failures += 1  # as on the single-stream path: progress does not reset it
                with self.lock:  # nor a refusal that hands the part to a later claim
                    broken = self.breaks[connection.index] = self.breaks.get(connection.index, 0) + 1
                if failures >= self.attempts or broken >= self.attempts or self.stop.is_set():
                    raise
                logger.warning("%s; resuming the part at byte %d", error, connection.position)
                time.sleep(self.backoff_factor * (2 ** (failures - 1)))
            stream = None

    def _answered(self, connection: _Connection) -> None:
        """A connection the server refused was answered: once none that it refused is
        still waiting to ask again, the ramp goes on."""
        with self.lock:
            connection.refusals = 0
            if not any(other.refusals for other in self.connections):
                self.ramp.served()

    def _answered_at_rate(self, count: int, seconds: float) -> None:
        """An answer's `count` bytes came over `seconds` from its first byte on."""
        with self.lock:
            self.runs.flowed(count, seconds)

    def _open(self, position: int, end: int, *, at_once: bool = True) -> ByteStream:
        if_range = self.plan.validators.if_range
        # A refusal (429, 503) comes back at once where the backend can say so: a
        # connection that would sleep in its retries holds its parts while others idle.
        hint = refusals_at_once() if at_once else contextlib.nullcontext()
        try:
            with hint:
                return open_stream(self.backend, self.url, position, end=end, if_range=if_range)
        except HTTPStatusError as error:
            if error.status == 412:  # S3 IfMatch: the object is another version now
                raise VersionChanged(str(error)) from error
            raise

    def _write(self, stream: ByteStream, stream_end: int, connection: _Connection) -> bool:
        """Write `stream` at the connection's part and byte, keeping them current (a
        break resumes there); True once the stream's work is done or the fetch stops,
        False if it ended short."""
        index, position = connection.index, connection.position
        end = self.plan.bounds(index)[1]
        stream.want(end - position)  # a stream stops at a part's end when others hold the next
        chunks = iter(stream.chunks)
        for chunk in chunks:
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
                    if not self.first_written_at:
                        self.first_written_at = self.written_at
                    if connection.waiting:
                        self.waiting -= 1
                        connection.waiting = False
                        if not self.ramp.settled:
                            self.lock.notify_all()  # the ramp measures from a first byte: now
                    if not self.ramp.measuring:
                        stream.steady()  # no write is timed any more: larger reads cost less CPU
                    if self.bar is not None:
                        self.bar.update(len(piece))
                if position == end:
                    if position == stream_end:
                        _read_the_end(chunks)
                    self._complete(index)
                    following = self._next(connection, stream_end)
                    if following is None:
                        return True  # a stream asked past its run is not read further
                    index, end = following, self.plan.bounds(following)[1]
                    connection.index = index
                stream.want(end - position)
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
        full = no_room(self.url, self.partial.name.path.parent, error)
        return full or DownloadError(self.url, f"writing {self.partial.name.path} failed: {error}")

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


def _read_the_end(chunks: Iterator[bytes]) -> None:
    """The last byte asked for is in: read the answer's end before its last part counts,
    so the backend checks what it checks there (the length; S3's checksum of a whole
    object, which raises). A break there loses nothing: every byte asked for is in."""
    try:
        next(chunks, None)
    except NetworkError:
        pass
