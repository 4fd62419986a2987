"""The loader worker process: reads its shard, batches it, ships frames to the main process.

A worker serves one command at a time from its control pipe (``("epoch", ...)`` or
``("stop",)``), so the same process can serve many epochs (persistent workers). It
dies with the main process: ``PR_SET_PDEATHSIG`` on Linux, plus a watchdog thread
that notices being re-parented.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Optional

import torch

from framework.data._batching import BatchPlan, derive_seed, groups_of
from framework.data._rng import seed_everything
from framework.data._transfer import TransferMode, write_frame
from framework.data.collate import DataCollator
from framework.data.loader import move_to_device
from framework.data.reader import DatasetReader, DistributedInfo, WorkerInfo

__all__ = ["WorkerSpec", "seed_everything", "worker_main"]

INSTANCE_CHUNK = 64  # instances per frame when shipping instances (eager mode)


@dataclass
class WorkerSpec:
    """Everything a worker needs; picklable for "spawn" and "forkserver"."""

    reader: DatasetReader
    data_path: Any
    plan: BatchPlan
    collate_fn: DataCollator
    collate_in_worker: bool
    num_workers: int
    distributed: Optional[DistributedInfo]
    device: Optional[torch.device]
    transfer: TransferMode
    quiet: bool
    set_death_signal: bool
    start_method: str
    prefetch: int  # batches a worker may run ahead of the main process


def _die_with_parent(main_pid: int, start_method: str, set_death_signal: bool) -> None:
    # Under forkserver the parent is the fork server, which exits when the main
    # process does; under fork and spawn it is the main process itself.
    parent_pid = os.getppid()
    if start_method != "forkserver" and parent_pid != main_pid:
        os._exit(1)  # the main process died before this worker got going
    if set_death_signal and sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:
        os._exit(1)  # the parent died before the death signal was armed

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="framework-loader-watchdog", daemon=True).start()


def worker_main(
    worker_id: int,
    spec: WorkerSpec,
    data_conn: Connection,
    control: Connection,
    parent_pid: int,
    tqdm_lock: Any,
    slots: Any,
) -> None:
    """Entry point of a worker process."""
    _die_with_parent(parent_pid, spec.start_method, spec.set_death_signal)
    # Ctrl-C goes to the whole process group; the main process decides how to shut down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Several intra-op threads per worker oversubscribe the cores and can deadlock
    # after fork (AllenNLP #4848).
    torch.set_num_threads(1)
    if tqdm_lock is not None:
        from tqdm import tqdm

        tqdm.set_lock(tqdm_lock)
    spec.reader._set_worker_info(WorkerInfo(spec.num_workers, worker_id))
    spec.reader._set_distributed_info(spec.distributed)
    fd = data_conn.fileno()
    while True:
        try:
            command = control.recv()
        except (EOFError, OSError):
            return
        if command[0] != "epoch":
            return
        _, _epoch, seed, skip, kind = command
        try:
            if kind == "instances":
                _serve_instances(worker_id, spec, fd, seed)
            else:
                _serve_batches(worker_id, spec, fd, seed, skip, slots)
        except BrokenPipeError:
            return  # the main process stopped listening
        except BaseException as error:
            _send_error(fd, worker_id, error, spec.transfer)


def _progress(spec: WorkerSpec, worker_id: int, unit: str) -> Any:
    if spec.quiet:
        return None
    from tqdm import tqdm

    return tqdm(desc=f"worker {worker_id}", unit=unit, position=worker_id + 1, leave=False)


def _serve_instances(worker_id: int, spec: WorkerSpec, fd: int, seed: int) -> None:
    seed_everything(seed)
    bar = _progress(spec, worker_id, "instance")
    count = 0
    for chunk in groups_of(spec.reader.read(spec.data_path), INSTANCE_CHUNK):
        _ship(fd, ("instances", chunk), spec.transfer, "instance")
        count += len(chunk)
        if bar is not None:
            bar.update(len(chunk))
    if bar is not None:
        bar.close()
    write_frame(fd, ("done", count))


def _serve_batches(
    worker_id: int, spec: WorkerSpec, fd: int, seed: int, skip: int, slots: Any
) -> None:
    seed_everything(seed)
    counted = _Counted(spec.reader.read(spec.data_path))
    bar = _progress(spec, worker_id, "batch")
    for index, instances in enumerate(spec.plan.stream(counted, derive_seed(seed, "batches"))):
        if index < skip:
            continue  # resuming: these batches were consumed before the state was saved
        # Backpressure: at most `prefetch` batches in flight; the main process frees a
        # slot per batch it takes. (The pipe alone bounds bytes, not batches.)
        slots.acquire()
        if spec.collate_in_worker:
            payload = spec.collate_fn(instances)
            if spec.device is not None:
                payload = move_to_device(payload, spec.device)
            _ship(fd, ("batch", payload), spec.transfer, "batch")
        else:
            _ship(fd, ("instances", instances), spec.transfer, "instance")
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    write_frame(fd, ("done", counted.count))


class _Counted:
    def __init__(self, iterable: Any) -> None:
        self.iterable = iterable
        self.count = 0

    def __iter__(self) -> Any:
        for item in self.iterable:
            self.count += 1
            yield item


def _ship(fd: int, message: tuple[str, Any], mode: TransferMode, what: str) -> None:
    try:
        write_frame(fd, message, mode)
    except BrokenPipeError:
        raise
    except Exception as error:
        if not isinstance(error, (pickle.PicklingError, TypeError, AttributeError)):
            raise
        raise TypeError(_unpicklable(message[1], what, error)) from error


def _unpicklable(payload: Any, what: str, error: Exception) -> str:
    """Name the field that cannot cross to the main process, and the fix."""
    culprit = "it"
    items = payload if isinstance(payload, list) else [payload]
    for item in items:
        fields = item.items() if isinstance(item, dict) else [("<instance>", item)]
        found = False
        for name, value in fields:
            try:
                pickle.dumps(value, protocol=5)
            except Exception:
                culprit = f"field {name!r} (a {type(value).__qualname__})"
                found = True
                break
        if found:
            break
    return (
        f"a {what} cannot be sent from the worker to the main process: {culprit} cannot be "
        f"pickled ({type(error).__name__}: {error}). Objects that cannot cross processes "
        "(vocabularies, tokenizer handles, open files, lambdas) belong in "
        "DatasetReader.apply_token_indexers(instance), which runs in the main process "
        "after the instance arrives; or use num_workers=0."
    )


def _send_error(fd: int, worker_id: int, error: BaseException, mode: TransferMode) -> None:
    text = traceback.format_exc()
    original: Optional[BaseException] = error
    try:
        pickle.loads(pickle.dumps(error))  # some exceptions pickle but cannot be rebuilt
    except Exception:
        original = None
    try:
        write_frame(fd, ("error", f"{type(error).__name__}: {error}", text, original))
    except Exception:
        write_frame(fd, ("error", f"{type(error).__name__}: {error}", text, None))
