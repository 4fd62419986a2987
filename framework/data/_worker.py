"""The loader worker process: reads its shard, batches it, ships frames to the main process.

A worker serves one `Start` at a time from its control pipe, so the same process can
serve many epochs (persistent workers), and checks that pipe between batches, so a
`Stop` ends even a busy worker cooperatively (its shared-memory segments are released
by a normal exit, not lost to a signal). It dies with the main process:
`PR_SET_PDEATHSIG` on Linux, plus a watchdog thread that notices being re-parented.

A worker draws no progress bars and shares no lock with the main process: a lock
inherited held by `fork` (another thread had it) or orphaned by a killed worker
would hang the main process. Progress reaches the main process as messages.
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
from typing import Any, Optional, Union

import torch

from framework.data._batching import BatchPlan, batch_seed, groups_of, slot_batches
from framework.data._protocol import (
    Batch,
    Done,
    Failed,
    Instances,
    Progress,
    Ready,
    Start,
    ToMain,
)
from framework.data._rng import after_fork, draws_nothing, scoped, seed_everything
from framework.data._shards import ShardPlan, slot_reading
from framework.data._transfer import TransferMode, write_frame
from framework.data.collate import DataCollator
from framework.data.loader import move_to_device
from framework.data.reader import DatasetReader, DistributedInfo, WorkerInfo
from framework.data.shard_files import let_go, read_since

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
    set_death_signal: bool
    start_method: str
    prefetch: int  # batches a worker may run ahead of the main process
    heartbeat: Optional[float] = None  # send `Progress` this often while reading (timeout)


class _Stopped(Exception):
    """The main process asked this worker to stop, or stopped listening."""


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


def _private_tqdm_lock() -> None:
    """Give tqdm in this process a lock of its own (the reader may draw bars).

    After `fork` tqdm's lock is the main process's: its thread lock may have been
    copied held, and its cross-process lock would stay held if this worker died
    inside it. Only done if tqdm is already imported (importing it costs time).
    """
    module = sys.modules.get("tqdm.std")
    if module is None:
        return
    classes = [module.tqdm]
    while classes:
        cls = classes.pop()
        classes.extend(cls.__subclasses__())
        if cls is module.tqdm or "_lock" in vars(cls):
            cls._lock = threading.RLock()


def worker_main(
    worker_id: int,
    spec: Union[WorkerSpec, bytes],
    data_conn: Connection,
    control: Connection,
    parent_pid: int,
    slots: Any,
) -> None:
    """Entry point of a worker process (`spec` arrives pickled under spawn/forkserver)."""
    fd = data_conn.fileno()
    if isinstance(spec, bytes):
        try:
            spec = pickle.loads(spec)
        except Exception as error:  # the pool reads this as the answer to its Start
            _send_failure(fd, error, _unimportable(error))
            return
    assert isinstance(spec, WorkerSpec)
    _die_with_parent(parent_pid, spec.start_method, spec.set_death_signal)
    # Ctrl-C goes to the whole process group; the main process decides how to shut down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Several intra-op threads per worker oversubscribe the cores and can deadlock
    # after fork (AllenNLP #4848).
    torch.set_num_threads(1)
    _private_tqdm_lock()
    if spec.start_method == "fork":
        try:
            _send(fd, Ready(), spec.transfer)  # the pool waits for it, bounded (`WorkerPool`)
        except _Stopped:
            return
        try:
            after_fork()
        except RuntimeError as error:  # the pool reads this as the answer to its Start
            _send_failure(fd, error)
            return
    spec.reader._set_worker_info(WorkerInfo(spec.num_workers, worker_id))
    spec.reader._set_distributed_info(spec.distributed)
    while True:
        try:
            command = control.recv()
        except (EOFError, OSError):
            return
        if not isinstance(command, Start):
            return  # Stop
        try:
            if command.kind == "instances":
                _serve_instances(spec, fd, control, command)
            else:
                _serve_batches(spec, fd, control, command, slots)
        except _Stopped:
            return
        except BaseException as error:
            try:
                _send_failure(fd, error)
            except _Stopped:
                return
        finally:
            let_go(spec.data_path if command.source is None else command.source)


class _Sender:
    """Writes messages to the main process; `Progress` at most every `heartbeat` s."""

    def __init__(self, spec: WorkerSpec, fd: int, control: Connection) -> None:
        self.spec = spec
        self.fd = fd
        self.control = control
        self.last = time.monotonic()
        self.count = 0  # instances read

    def send(self, message: ToMain, what: str = "") -> None:
        _send(self.fd, message, self.spec.transfer, what)
        self.last = time.monotonic()

    def check_stop(self) -> None:
        if self.control.poll():  # only a Stop can come in the middle of a pass
            raise _Stopped()

    def counted(self, instances: Any) -> Any:
        """The reader's instances, counted, with a heartbeat while it produces them."""
        heartbeat = self.spec.heartbeat
        for item in instances:
            self.count += 1
            if heartbeat is not None and time.monotonic() - self.last > heartbeat:
                self.send(Progress())
            yield item


def _serve_instances(spec: WorkerSpec, fd: int, control: Connection, command: Start) -> None:
    seed_everything(command.seed)
    sender = _Sender(spec, fd, control)
    shards = ShardPlan(command.slot, command.slots, command.base)
    spec.reader._set_shard_plan(shards)
    data = spec.data_path if command.source is None else command.source
    pairs = ((x, shards.take()) for x in sender.counted(spec.reader.read(data)))
    for chunk in groups_of(pairs, INSTANCE_CHUNK):
        sender.check_stop()
        read = read_since(data)
        sender.send(Instances([x for x, _ in chunk], [i for _, i in chunk], shards_read=read), "instance")
    let_go(data)  # before Done: once the pass ends here, this worker holds no shard
    sender.send(Done(sender.count, shards.where()[0]))


def _serve_batches(spec: WorkerSpec, fd: int, control: Connection, command: Start, slots: Any) -> None:
    seed_everything(command.seed)
    sender = _Sender(spec, fd, control)
    source = spec.data_path if command.source is None else command.source
    shards, source, start = slot_reading(
        command.slot, command.slots, command.base, command.point, source, command.deal, command.split
    )
    spec.reader._set_shard_plan(shards)
    batches = slot_batches(
        _Counting(spec.reader, sender),
        source,
        spec.plan,
        command.seed,
        shards,
        start,
        seed_everything,
    )
    plain = draws_nothing(spec.collate_fn)
    for instances, indexes, point in batches:
        # Backpressure: at most `prefetch` batches in flight; the main process frees a
        # slot per batch it takes. (The pipe alone bounds bytes, not batches.) A Stop
        # also frees one, so check for it after waking.
        slots.acquire()
        sender.check_stop()
        if spec.collate_in_worker:
            if plain:
                payload = spec.collate_fn(instances)
            else:  # its own streams: the reader's go on as if it drew nothing
                with scoped(batch_seed(command.seed, point)):
                    payload = spec.collate_fn(instances)
            if spec.device is not None:
                payload = move_to_device(payload, spec.device)
            sender.send(Batch(payload, indexes, point, read_since(source)), "batch")
        else:
            seed = batch_seed(command.seed, point)
            sender.send(Instances(instances, indexes, point, seed, read_since(source)), "instance")
    let_go(source)  # before Done: once the pass ends here, this worker holds no shard
    sender.send(Done(sender.count, shards.where()[0]))


class _Counting:
    """A reader whose `read` counts its instances on `sender` (and sends heartbeats)."""

    def __init__(self, reader: DatasetReader, sender: _Sender) -> None:
        self.reader = reader
        self.sender = sender

    def read(self, data_path: Any) -> Any:
        return self.sender.counted(self.reader.read(data_path))


def _send(fd: int, message: ToMain, mode: TransferMode, what: str = "") -> None:
    try:
        write_frame(fd, message, mode)
    except BrokenPipeError:
        raise _Stopped() from None  # the main process stopped listening
    except (pickle.PicklingError, TypeError, AttributeError) as error:
        if not isinstance(message, (Batch, Instances)):
            raise
        payload = message.payload if isinstance(message, Batch) else message.instances
        raise TypeError(_unpicklable(payload, what, error)) from error


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


def _unimportable(error: BaseException) -> str:
    return (
        f"could not rebuild the reader, sampler or collate_fn in the new worker process "
        f"({_summary(error)}). Under start_method='spawn' or 'forkserver' a worker imports "
        "them by module and name: define them in an importable module (not in a script "
        "run from stdin, a notebook or an interactive session), or use start_method='fork'"
    )


def _summary(error: BaseException) -> str:
    """ "TypeName: message", even when the exception's __str__ itself raises."""
    return traceback.format_exception_only(type(error), error)[-1].strip()


def _send_failure(fd: int, error: BaseException, summary: Optional[str] = None) -> None:
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    original: Optional[BaseException] = error
    try:
        pickle.loads(pickle.dumps(error))  # some exceptions pickle but cannot be rebuilt
    except Exception:
        original = None
    message = Failed(summary or _summary(error), text, original)
    try:
        _send(fd, message, "pickle5")
    except _Stopped:
        raise
    except Exception:
        _send(fd, Failed(message.summary, text, None), "pickle5")
