"""The main process's side of the workers: start, command, read round-robin, reap.

Each worker has its own data pipe, so the main process reads batches in a fixed
round-robin order (deterministic whatever the timing) and can tell which worker
went quiet. Waiting is on the pipe *and* every worker's process sentinel together,
even in the middle of a frame (the pipe is non-blocking), so a worker that dies
(even by SIGKILL or a segfault, even while a process it forked still holds its
pipe) is noticed at once, never waited on. The pool is the only writer of
`Position`, and progress bars are drawn here, never in a worker.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import select
import signal
import sys
import threading
import time
import traceback
import warnings
import weakref
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any, Optional, Union

from framework.data._batching import derive_seed
from framework.data._position import Position
from framework.data._protocol import Batch, Done, Failed, Instances, PassKind, Progress, Ready, Start, Stop
from framework.data._transfer import read_frame, set_pipe_size
from framework.data._worker import WorkerSpec, _summary, worker_main
from framework.errors import WorkerError

__all__ = ["WorkerPool"]

_HINTS = {
    "SIGKILL": " (often the out-of-memory killer: lower max_instances_in_memory or num_workers)",
    "SIGSEGV": " (a crash in native code inside the reader or collate_fn)",
    "SIGBUS": " (often /dev/shm is too small)",
    "SIGABRT": " (a native library called abort())",
}

GRACE = 1.0  # seconds a stopped worker gets to exit cleanly before it is signalled
# A forked worker's start-up takes milliseconds; one that has not said `Ready` in
# START_S is stuck for good, and is killed and forked again (see `_await_start`).
START_S = 30.0
START_ATTEMPTS = 3

_MAX_POLL_MS = 2**31 - 1  # poll() takes a C int of milliseconds: about 24.8 days


def _poll_ms(seconds: float) -> int:
    """`seconds` as poll()'s timeout; a longer wait (a timeout of 1e7 s) polls again."""
    return math.ceil(min(seconds * 1000, _MAX_POLL_MS))


class _Late(Exception):
    """A forked worker's `Ready` did not come within `START_S`."""


class WorkerPool:
    """`num_workers` worker processes; one `run()` per pass over the data."""

    def __init__(self, spec: WorkerSpec, num_workers: int, context: Any, quiet: bool = True):
        if multiprocessing.current_process().daemon:
            raise RuntimeError(
                "a loader with num_workers > 0 was built inside a loader worker; worker "
                "processes are daemonic and cannot start processes of their own. Build "
                "the inner loader with num_workers=0 (or read without a loader there)"
            )
        if spec.start_method != "fork":
            _check_main_is_runnable(spec.start_method)
        self.owner = os.getpid()  # a forked worker inherits this object: it must not reap
        self.num_workers = num_workers
        self.quiet = quiet
        self.transfer = spec.transfer
        self.processes: list[Any] = []
        self.data: list[Connection] = []
        self.control: list[Connection] = []
        self.slots: list[Any] = []
        self.busy = False
        self.closed = False
        # Under spawn/forkserver the worker unpickles the spec itself, so that a reader
        # it cannot import is reported with the reason, not as "exit code 1".
        payload = spec if spec.start_method == "fork" else pickle.dumps(spec, protocol=5)
        try:
            for worker_id in range(num_workers):
                self._launch(worker_id, spec, payload, context)
            if spec.start_method == "fork":
                for worker_id in range(num_workers):
                    self._await_start(worker_id, spec, payload, context)
        except BaseException:
            self.shutdown()
            raise
        # Waiting on one worker's pipe also watches every worker's sentinel, so a death
        # anywhere is noticed at once, not when the round-robin comes to that worker.
        self._sentinels = {process.sentinel: index for index, process in enumerate(self.processes)}
        self._pollers = []
        for conn in self.data:
            poller = select.poll()
            poller.register(conn.fileno(), select.POLLIN)
            for sentinel in self._sentinels:
                poller.register(sentinel, select.POLLIN)
            self._pollers.append(poller)
        self._finalizer = weakref.finalize(
            self, _reap, self.processes, self.data, self.control, self.slots, self.owner
        )

    def _launch(self, worker_id: int, spec: WorkerSpec, payload: Any, context: Any) -> None:
        """Start worker `worker_id` (in its place in the lists if it had one)."""
        slots = context.Semaphore(spec.prefetch)
        data_read, data_write = context.Pipe(duplex=False)
        control_read, control_write = context.Pipe(duplex=False)
        set_pipe_size(data_write.fileno())
        os.set_blocking(data_read.fileno(), False)  # reads ask _wait, never block
        process = context.Process(
            target=worker_main,
            args=(worker_id, payload, data_write, control_read, os.getpid(), slots),
            name=f"framework-loader-worker-{worker_id}",
            daemon=True,
        )
        try:
            try:
                process.start()
            finally:
                # Close our copies of the worker's ends right away, so that later forks
                # do not inherit them and a dead worker's pipe reads as end-of-file.
                data_write.close()
                control_read.close()
            self._place(worker_id, process, data_read, control_write, slots)
        except BaseException:  # a failed start, or Ctrl-C before shutdown could see it
            _discard(process, data_read, control_write)
            raise

    def _place(self, worker_id: int, process: Any, data: Connection, control: Connection, slots: Any) -> None:
        """Put a started worker in its place in the lists (appended if it is new)."""
        if worker_id < len(self.processes):
            self.processes[worker_id], self.data[worker_id] = process, data
            self.control[worker_id], self.slots[worker_id] = control, slots
        else:
            self.processes.append(process)
            self.data.append(data)
            self.control.append(control)
            self.slots.append(slots)

    def _await_start(self, worker_id: int, spec: WorkerSpec, payload: Any, context: Any) -> None:
        """Wait for a forked worker's `Ready`, at most `START_S`; one that does not come
        is killed and forked again, `START_ATTEMPTS` times in all, whatever `timeout`.

        A forked child can be stuck for good before running a line of ours: on a lock
        that another thread of this process held at the fork (CPython 3.8 to 3.11 before
        3.11.10 takes one in its own after-fork code, gh-112275; gloo's threads hold it
        at times). Without this the pass would wait on it forever, and under
        torch.distributed the other ranks would time out in their collectives.
        """
        for attempt in range(1, START_ATTEMPTS + 1):
            if self._ready(worker_id):
                return
            process = self.processes[worker_id]
            _discard(process, self.data[worker_id], self.control[worker_id])
            if attempt < START_ATTEMPTS:
                warnings.warn(
                    f"loader worker {worker_id} (pid {process.pid}) did not get through its "
                    f"start-up in {START_S:g}s (forked while another thread held a lock it "
                    "needs?); it was killed and forked again. start_method='forkserver' "
                    "avoids this",
                    RuntimeWarning,
                    stacklevel=2,
                )
                self._launch(worker_id, spec, payload, context)
        raise WorkerError(
            f"loader worker {worker_id} did not get through its start-up in {START_S:g}s, "
            f"{START_ATTEMPTS} times in a row: a forked worker waits forever on a lock that "
            "another thread of the main process held when it was forked. Use "
            "start_method='forkserver' or 'spawn' (workers that do not inherit the main "
            "process's threads), or a Python with gh-112275 fixed (3.11.10 or later, or 3.12)",
            worker_id,
        )

    def _ready(self, worker_id: int) -> bool:
        """Whether the worker's `Ready` came within `START_S` (its death raises as `_death`)."""
        deadline = time.monotonic() + START_S
        fd = self.data[worker_id].fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.register(self.processes[worker_id].sentinel, select.POLLIN)

        def wait() -> None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Late
            ready = {ready_fd for ready_fd, _ in poller.poll(_poll_ms(remaining))}
            if ready and fd not in ready:
                raise EOFError  # only the sentinel: the worker exited

        try:
            message = read_frame(fd, wait)
        except _Late:
            return False
        except EOFError:
            raise self._death(worker_id) from None
        if not isinstance(message, Ready):  # the protocol's first frame is Ready
            raise WorkerError(f"loader worker {worker_id} began with {type(message).__name__}", worker_id)
        return True

    def run(
        self,
        position: Position,
        kind: PassKind,
        timeout: Optional[float],
        rank: int = 0,
        world: int = 1,
        prepare: Optional[Callable[[Union[Batch, Instances]], Any]] = None,
        source: Any = None,
    ) -> Iterator[Any]:
        """Yield the `Batch` or `Instances` messages of one pass, round-robin from `position`.

        Worker w serves slot `rank + world * w` of `world * num_workers`. With
        `prepare`, yield `prepare(message)` instead, made before `position` counts the
        message: one whose `prepare` raised is not counted (a resume asks for it again).
        """
        position.begin(self.num_workers)
        self.busy = True
        slots = world * self.num_workers
        for worker_id in range(self.num_workers):
            if not position.done[worker_id]:
                seed = self._seed(position, worker_id)
                start = Start(
                    kind,
                    seed,
                    rank + world * worker_id,
                    slots,
                    position.base,
                    position.points[worker_id],
                    source,
                    position.deal or 0,
                    position.split or 1,
                )
                self._command(worker_id, start)
        bars = self._bars(kind)
        worker_id = position.next_worker
        try:
            while not all(position.done):
                if position.done[worker_id]:
                    worker_id = (worker_id + 1) % self.num_workers
                    continue
                message = self._receive(worker_id, timeout)
                if isinstance(message, Progress):
                    continue  # the reader is alive: wait again, with a fresh timeout
                if isinstance(message, Done):
                    position.finish(worker_id, message.instances, message.end)
                elif isinstance(message, Failed):
                    raise _failure(worker_id, message)
                else:
                    if kind == "batches":
                        self.slots[worker_id].release()
                    item = message if prepare is None else prepare(message)
                    if kind == "batches":
                        position.consumed += 1
                        position.record(worker_id, message.indexes, message.point, message.shards_read)
                    position.per_worker[worker_id] += 1
                    position.next_worker = (worker_id + 1) % self.num_workers
                    if bars:
                        bars[worker_id].update(1)
                    yield item
                worker_id = (worker_id + 1) % self.num_workers
        finally:
            for bar in bars:
                bar.close()
        self.busy = False

    def _bars(self, kind: PassKind) -> list[Any]:
        # Per-worker bars, drawn by this process only (instances have the loader's bar).
        if self.quiet or kind != "batches":
            return []
        from tqdm import tqdm

        return [
            tqdm(desc=f"worker {worker_id}", unit="batch", position=worker_id + 1, leave=False)
            for worker_id in range(self.num_workers)
        ]

    @staticmethod
    def _seed(position: Position, worker_id: int) -> int:
        return derive_seed(position.seed, "worker", worker_id)

    def _command(self, worker_id: int, command: Start) -> None:
        try:
            self.control[worker_id].send(command)
        except (BrokenPipeError, OSError):
            raise self._death(worker_id) from None

    def _receive(self, worker_id: int, timeout: Optional[float]) -> Any:
        """The next message from `worker_id`; `timeout` bounds the silence before it.

        Silence, not the time a frame takes: every read that brings bytes (even in the
        middle of a frame) starts the timeout again.
        """
        deadline = [None if timeout is None else time.monotonic() + timeout]

        def moved() -> None:
            if timeout is not None:
                deadline[0] = time.monotonic() + timeout

        def rebuild(load: Callable[[], Any]) -> Any:
            return self._rebuild(worker_id, load, timeout)

        try:
            return read_frame(
                self.data[worker_id].fileno(),
                lambda: self._wait(worker_id, deadline[0], timeout),
                moved,
                rebuild if self.transfer == "shared_memory" else None,
            )
        except EOFError:
            raise self._death(worker_id) from None
        except (OSError, ValueError):
            if self.closed:  # shut down by another thread (loader.close()) under our read
                raise closed_error() from None
            raise

    def _rebuild(self, worker_id: int, load: Callable[[], Any], timeout: Optional[float]) -> Any:
        """Unpickle a "shared_memory" frame: it connects to the worker for each storage's
        file descriptor, so a dead worker is its death, and a stopped one its timeout."""
        try:
            if timeout is None:
                return load()
            # In a helper thread, so that the timeout holds while the worker does not answer.
            outcome: list[Any] = []
            thread = threading.Thread(
                target=lambda: outcome.append(_attempt(load)),
                name="framework-loader-rebuild",
                daemon=True,
            )
            thread.start()
            thread.join(timeout)
            if not outcome:
                process = self.processes[worker_id]
                raise WorkerError(
                    f"loader worker {worker_id} (pid {process.pid}) did not hand over a "
                    f"batch's shared memory for {timeout:g}s (timeout={timeout:g}); it may be "
                    "stopped or stuck",
                    worker_id,
                )
            ok, value = outcome[0]
            if not ok:
                raise value
            return value
        except (OSError, EOFError) as error:  # ConnectionRefusedError: the worker is gone
            raise self._death(worker_id) from error

    def _wait(self, worker_id: int, deadline: Optional[float], timeout: Optional[float]) -> None:
        """Return when `worker_id`'s pipe has bytes (or end-of-file); raise on a death."""
        if deadline is None:
            ready = {fd for fd, _ in self._pollers[worker_id].poll()}
        else:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                process = self.processes[worker_id]
                raise WorkerError(
                    f"loader worker {worker_id} (pid {process.pid}) sent nothing for "
                    f"{timeout:g}s (timeout={timeout:g}); it may be stuck in the reader",
                    worker_id,
                )
            ready = {fd for fd, _ in self._pollers[worker_id].poll(_poll_ms(remaining))}
        if not ready or self.data[worker_id].fileno() in ready:
            return
        # Only sentinels: a worker exited. It may have said why first (a Failed).
        dead = sorted(self._sentinels[fd] for fd in ready if fd in self._sentinels)
        raise self._death(worker_id if worker_id in dead else dead[0])

    def _death(self, worker_id: int) -> WorkerError:
        if self.closed:
            return closed_error()  # its workers were stopped on purpose
        process = self.processes[worker_id]
        process.join(timeout=5.0)
        last = self._last_words(worker_id)
        if last is not None:
            return last
        code = process.exitcode
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            return WorkerError(
                f"loader worker {worker_id} (pid {process.pid}) was killed by signal "
                f"{name}{_HINTS.get(name, '')}",
                worker_id,
                signal=name,
                exitcode=code,
            )
        return WorkerError(
            f"loader worker {worker_id} (pid {process.pid}) exited unexpectedly with exit code {code}",
            worker_id,
            exitcode=code,
        )

    def _last_words(self, worker_id: int) -> Optional[WorkerError]:
        """A `Failed` a dead worker left in its pipe (it could not start, say)."""

        def no_more() -> None:
            raise EOFError

        try:
            while True:
                message = read_frame(self.data[worker_id].fileno(), no_more)
                if isinstance(message, Failed):
                    return _failure(worker_id, message)
        except (EOFError, OSError, ValueError):
            return None

    def shutdown(self) -> None:
        """Stop every worker and release every pipe; safe to call twice; nothing in a
        process other than the one that started the workers (a forked worker collecting
        an inherited loader or pass)."""
        if os.getpid() != self.owner:
            return
        self.closed = True
        _reap(self.processes, self.data, self.control, self.slots, self.owner)
        finalizer = getattr(self, "_finalizer", None)  # none if __init__ failed
        if finalizer is not None:
            finalizer.detach()  # reaped: an interrupted _reap leaves it to run again


def _check_main_is_runnable(start_method: str) -> None:
    """Refuse what would make every spawned worker die with only "exit code 1".

    "spawn" and "forkserver" re-run the main module from its file in each new process
    (as multiprocessing does); a script read from stdin names a file that is not there.
    """
    main = sys.modules["__main__"]
    if getattr(getattr(main, "__spec__", None), "name", None) is not None:
        return  # run with -m: re-imported by name
    path = getattr(main, "__file__", None)
    if path is None:
        return  # interactive or a notebook: not re-run (a reader there is reported later)
    start_dir = getattr(multiprocessing.process, "ORIGINAL_DIR", None) or ""  # as spawn joins it
    if not os.path.exists(os.path.join(start_dir, path)):
        raise RuntimeError(
            f"start_method={start_method!r} starts each worker by re-running the main "
            f"module from its file, and {path!r} is not a file (a script read from stdin?). "
            "Run the script from a file, with the reader, sampler and collate_fn in an "
            "importable module, or use start_method='fork'"
        )


def _attempt(call: Callable[[], Any]) -> tuple[bool, Any]:
    try:
        return True, call()
    except BaseException as error:  # handed to the waiting thread, which raises it
        return False, error


def closed_error() -> WorkerError:
    return WorkerError(
        "the loader was closed (close() from another thread) while this iteration was "
        "waiting for a batch; build a new iterator to read again"
    )


def _failure(worker_id: int, message: Failed) -> WorkerError:
    error = WorkerError(f"loader worker {worker_id} raised {message.summary}", worker_id, message.traceback)
    error.__cause__ = message.original
    return error


def in_process(error: Exception) -> WorkerError:
    """`error`, raised by reader, sampler or collator code in the main process, as the
    `WorkerError` a worker's would arrive as: one caught type whatever `num_workers`."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    wrapped = WorkerError(
        f"the loader's reader, sampler or collator raised {_summary(error)} (in the main process)",
        None,
        text,
    )
    wrapped.__cause__ = error
    return wrapped


class UserCode:
    """`with UserCode():` raises an error of reader, sampler or collator code as
    `in_process` does (one try per pass: no cost per batch). An error raised under
    `LoaderCode` inside it is the loader's own and passes as it is."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: Optional[BaseException], trace: Any) -> None:
        # KeyboardInterrupt, SystemExit and GeneratorExit are not Exceptions: never wrapped.
        if isinstance(error, Exception) and not isinstance(error, WorkerError):
            if getattr(error, _OWN, False):
                return None
            raise in_process(error) from error


_OWN = "_framework_loader_own"


class LoaderCode:
    """`with LoaderCode():` inside `UserCode`: an error raised here is the loader's own
    work (moving a batch to the device: CUDA out of memory, say), not the reader's or
    collator's, and is raised as it is, never wrapped as `in_process` does."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: Optional[BaseException], trace: Any) -> None:
        if isinstance(error, Exception):
            try:
                setattr(error, _OWN, True)
            except (AttributeError, TypeError):  # a type without attributes: wrapped, still raised
                pass


def _reap(
    processes: list[Any],
    data: list[Connection],
    control: list[Connection],
    slots: list[Any],
    owner: int,
) -> None:
    """Stop workers cooperatively; only one still busy after `GRACE` seconds gets a signal.

    A worker exits at its next batch boundary on `Stop`: a free slot wakes one waiting
    for backpressure, and closing its data pipe ends a write in progress (EPIPE). Its
    normal exit releases what it holds (shared-memory segments, files); a signal would not.
    Only in the process that started them (`owner`): a forked worker inherits the
    finalizers of the pools alive at its fork, and garbage collection there would run them.
    """
    if os.getpid() != owner:
        return
    for conn in control:
        try:
            conn.send(Stop())
        except (OSError, ValueError):
            pass
        conn.close()
    for slot in slots:
        slot.release()
    for conn in data:
        conn.close()
    deadline = time.monotonic() + GRACE
    for process in processes:
        process.join(timeout=max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.exitcode is None:
            process.terminate()
    for process in processes:
        process.join(timeout=1.0)
        if process.exitcode is None:
            process.kill()
            process.join(timeout=1.0)


def _discard(process: Any, data: Connection, control: Connection) -> None:
    """Kill a worker that never got going (if it was started) and close our pipe ends."""
    if process.pid is not None:
        process.kill()
        process.join(timeout=5.0)
    data.close()
    control.close()


def main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
