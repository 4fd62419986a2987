"""The main process's side of the workers: start, command, read round-robin, reap.

Each worker has its own data pipe, so the main process reads batches in a fixed
round-robin order (deterministic whatever the timing) and can tell which worker
went quiet. Waiting is on the pipe *and* the process sentinel together, so a worker
that dies (even by SIGKILL or a segfault) is noticed at once, never waited on.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Optional

from framework.data._batching import derive_seed
from framework.data._transfer import read_frame, set_pipe_size
from framework.data._worker import WorkerSpec, worker_main
from framework.errors import WorkerError

__all__ = ["Position", "WorkerPool"]

_HINTS = {
    "SIGKILL": " (often the out-of-memory killer: lower max_instances_in_memory or num_workers)",
    "SIGSEGV": " (a crash in native code inside the reader or collate_fn)",
    "SIGBUS": " (often /dev/shm is too small)",
    "SIGABRT": " (a native library called abort())",
}


@dataclass
class Position:
    """Where a pass over the data stands: enough to resume it exactly."""

    epoch: int
    seed: int
    consumed: int = 0
    per_worker: list[int] = field(default_factory=list)
    done: list[bool] = field(default_factory=list)
    next_worker: int = 0
    instances: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "seed": self.seed,
            "consumed": self.consumed,
            "per_worker": list(self.per_worker),
            "done": list(self.done),
            "next_worker": self.next_worker,
            "instances": self.instances,
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> Position:
        return cls(**{key: state[key] for key in cls.__dataclass_fields__})


class WorkerPool:
    """`num_workers` worker processes; one `run()` per pass over the data."""

    def __init__(self, spec: WorkerSpec, num_workers: int, context: Any, tqdm_lock: Any):
        self.num_workers = num_workers
        self.processes: list[Any] = []
        self.data: list[Connection] = []
        self.control: list[Connection] = []
        self.slots: list[Any] = []
        self.busy = False
        self.closed = False
        try:
            for worker_id in range(num_workers):
                slots = context.Semaphore(spec.prefetch)
                data_read, data_write = context.Pipe(duplex=False)
                control_read, control_write = context.Pipe(duplex=False)
                set_pipe_size(data_write.fileno())
                process = context.Process(
                    target=worker_main,
                    args=(worker_id, spec, data_write, control_read, os.getpid(), tqdm_lock,
                          slots),
                    name=f"framework-loader-worker-{worker_id}",
                    daemon=True,
                )
                process.start()
                # Close our copies of the worker's ends right away, so that later forks
                # do not inherit them and a dead worker's pipe reads as end-of-file.
                data_write.close()
                control_read.close()
                self.processes.append(process)
                self.data.append(data_read)
                self.control.append(control_write)
                self.slots.append(slots)
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
        self._finalizer = weakref.finalize(self, _reap, self.processes, self.data, self.control)

    def run(self, position: Position, kind: str, timeout: Optional[float]) -> Iterator[Any]:
        """Yield ``(kind, payload)`` messages of one pass, round-robin from `position`."""
        if not position.per_worker:
            position.per_worker = [0] * self.num_workers
            position.done = [False] * self.num_workers
        self.busy = True
        for worker_id in range(self.num_workers):
            if not position.done[worker_id]:
                skip = position.per_worker[worker_id]
                self._command(worker_id, ("epoch", position.epoch, self._seed(position, worker_id),
                                          skip, kind))
        worker_id = position.next_worker
        while not all(position.done):
            if position.done[worker_id]:
                worker_id = (worker_id + 1) % self.num_workers
                continue
            message = self._receive(worker_id, timeout)
            if message[0] == "done":
                position.done[worker_id] = True
                position.instances += message[1]
            elif message[0] == "error":
                _, summary, text, original = message
                raise WorkerError(
                    f"loader worker {worker_id} raised {summary}", worker_id, text
                ) from original
            else:
                if kind == "batches":
                    self.slots[worker_id].release()
                position.per_worker[worker_id] += 1
                position.next_worker = (worker_id + 1) % self.num_workers
                yield message
            worker_id = (worker_id + 1) % self.num_workers
        self.busy = False

    @staticmethod
    def _seed(position: Position, worker_id: int) -> int:
        return derive_seed(position.seed, "worker", worker_id)

    def _command(self, worker_id: int, command: tuple[Any, ...]) -> None:
        try:
            self.control[worker_id].send(command)
        except (BrokenPipeError, OSError):
            raise self._death(worker_id) from None

    def _receive(self, worker_id: int, timeout: Optional[float]) -> Any:
        conn = self.data[worker_id]
        process = self.processes[worker_id]
        poller = self._pollers[worker_id]
        started = time.monotonic()
        while True:
            # One poll on the pipe and the process sentinel: data, or death, wakes us.
            ready = {fd for fd, _ in poller.poll(1000)}
            if conn.fileno() in ready or (ready and conn.poll(0)):
                try:
                    return read_frame(conn.fileno())
                except EOFError:
                    raise self._death(worker_id) from None
            if ready:  # only sentinels: a worker exited without a word
                dead = sorted(self._sentinels[fd] for fd in ready if fd in self._sentinels)
                raise self._death(worker_id if worker_id in dead else dead[0])
            if timeout is not None and time.monotonic() - started > timeout:
                raise WorkerError(
                    f"loader worker {worker_id} (pid {process.pid}) sent nothing for "
                    f"{timeout:g}s (timeout={timeout:g}); it may be stuck in the reader",
                    worker_id,
                )

    def _death(self, worker_id: int) -> WorkerError:
        process = self.processes[worker_id]
        process.join(timeout=5.0)
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
            f"loader worker {worker_id} (pid {process.pid}) exited unexpectedly "
            f"with exit code {code}",
            worker_id,
            exitcode=code,
        )

    def shutdown(self) -> None:
        """Stop every worker and release every pipe; safe to call twice."""
        self.closed = True
        _reap(self.processes, self.data, self.control, graceful=not self.busy)


def _reap(
    processes: list[Any], data: list[Connection], control: list[Connection], graceful: bool = True
) -> None:
    """Stop workers: idle ones are asked to, busy ones (mid-epoch) get SIGTERM at once."""
    # Closing the data pipes first unblocks workers stuck writing a batch (EPIPE).
    for conn in data:
        conn.close()
    for conn in control:
        try:
            conn.send(("stop",))
        except (OSError, ValueError):
            pass
        conn.close()
    deadline = time.monotonic() + (2.0 if graceful else 0.0)
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


def main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
