"""Issue 9, part A: workers, pool, transfer and protocol under hostile use.

Each test here failed on the code before the fix. Anything that could hang runs in a
subprocess with a timeout, so a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import ctypes
import gc
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from loader_helpers import (
    CountingReader,
    SlowReader,
    child_pids,
    new_shm_entries,
    shm_entries,
)

from framework.data._transfer import read_frame, set_pipe_size, write_frame
from framework.data.multiprocess import MultiProcessDataLoader
from framework.errors import WorkerError

pytestmark = pytest.mark.timeout(120)
HERE = Path(__file__).resolve().parent


def make(reader: Any, **kwargs: Any) -> MultiProcessDataLoader:
    kwargs.setdefault("quiet", True)
    kwargs.setdefault("batch_size", 4)
    return MultiProcessDataLoader(reader, "unused", **kwargs)


def run_script(tmp_path: Path, body: str, timeout: float = 60) -> str:
    """Run `body` in a fresh interpreter; a hang fails the test after `timeout` s."""
    script = tmp_path / "main.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(HERE)!r})\n" + textwrap.dedent(body))
    try:
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as hung:
        raise AssertionError(f"the script hung:\n{hung.stdout}\n{hung.stderr}") from None
    assert done.returncode == 0, done.stderr
    return done.stdout


# -- 1. tqdm's lock --------------------------------------------------------------------------


def test_tqdm_lock_held_by_another_thread_at_fork_does_not_hang(tmp_path: Path) -> None:
    # A progress bar in a background thread holds tqdm's lock while the loader forks:
    # the workers' copy of the thread lock stays held forever.
    out = run_script(tmp_path, """
        import sys
        from tqdm import tqdm
        from loader_helpers import CountingReader, LockHolder
        from framework.data.multiprocess import MultiProcessDataLoader

        class Says(CountingReader):  # a reader that writes around the bars, as readers do
            def _read(self, file_path):
                tqdm.write("reading", file=sys.stderr)  # takes tqdm's lock
                yield from super()._read(file_path)

        thread = LockHolder(tqdm.get_lock(), workers=2)  # a slow write to the terminal, say
        data = MultiProcessDataLoader(Says(40), "x", batch_size=4, num_workers=2,
                                      max_instances_in_memory=8)  # quiet=False
        batches = iter(data)
        next(batches)  # the workers fork while the lock is held (then it is let go:
        thread.release()  # the main process's bar waits for it too)
        print("BATCHES", 1 + sum(1 for _ in batches))
        print("HELD THROUGH THE FORK", not thread.timed_out)
    """, timeout=60)
    assert "BATCHES 10" in out and "HELD THROUGH THE FORK True" in out, out


def test_worker_killed_holding_tqdm_lock_leaves_main_bars_working(tmp_path: Path) -> None:
    out = run_script(tmp_path, """
        import os, signal
        from tqdm import tqdm
        from loader_helpers import CountingReader
        from framework.data.multiprocess import MultiProcessDataLoader
        from framework.errors import WorkerError

        class GrabsTheLockAndDies(CountingReader):
            def _read(self, file_path):
                tqdm.get_lock().acquire()  # e.g. killed mid-tqdm.write
                os.kill(os.getpid(), signal.SIGKILL)
                yield from ()

        tqdm.get_lock()
        try:
            MultiProcessDataLoader(GrabsTheLockAndDies(8), "x", batch_size=4, num_workers=1)
        except WorkerError as error:
            print("ERROR", error.signal)
        for _ in tqdm(range(3)):  # the main process's own bar must still draw
            pass
        print("BAR DONE")
    """, timeout=60)
    assert "ERROR SIGKILL" in out and "BAR DONE" in out


# -- 2. /dev/shm after early break -----------------------------------------------------------


class BusyReader(CountingReader):
    """Fast, with 256 KiB tensors: workers are busy sharing memory when told to stop."""

    def _read(self, file_path: Any) -> Any:
        for i in range(self.n):
            yield {"image": torch.full((64, 1024), float(i)), "label": i}


def test_no_shared_memory_left_after_many_early_breaks() -> None:
    # Counts only torch's segments named after our workers: other processes on the
    # machine create and remove their own at any time.
    before = shm_entries()
    workers: set[int] = set()
    data = make(BusyReader(400), num_workers=2, max_instances_in_memory=8,
                transfer="shared_memory")
    for _ in range(100):
        for i, _batch in enumerate(data):
            if i == 3:
                workers |= child_pids()
                break
    data.close()
    leaked = {name for name in new_shm_entries(before)
              if name.startswith("torch_") and int(name.split("_")[1]) in workers}
    assert leaked == set()


# -- 3. each tensor its own storage ----------------------------------------------------------


class BigBatches(CountingReader):
    """Instances with a 1 MiB image and an int label: 8 MiB a batch of 8."""

    def _read(self, file_path: Any) -> Any:
        for i in range(self.n):
            yield {"image": torch.full((256, 1024), float(i)), "label": i}


def rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_keeping_only_the_labels_does_not_keep_the_batches() -> None:
    data = make(BigBatches(160), batch_size=8, num_workers=2, max_instances_in_memory=8)
    gc.collect()
    start = rss()
    labels = [batch["label"] for batch in data]  # 20 batches of 8 MiB
    assert len(labels) == 20
    assert all(label.untyped_storage().nbytes() == 8 * 8 for label in labels)
    # The exact check is above; RSS is the coarse one. glibc keeps freed 8 MiB blocks in
    # its heap once its mmap threshold has grown, so hand them back before measuring.
    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)
    growth = rss() - start
    assert growth < 100 * 2**20, f"{growth / 2**20:.0f} MiB"  # the batches took 160 MiB


@pytest.fixture
def pipe() -> Any:
    read, write = os.pipe()
    set_pipe_size(write)
    yield read, write
    os.close(read)
    os.close(write)


def roundtrip(pipe: tuple[int, int], obj: Any) -> Any:
    write_frame(pipe[1], obj)
    return read_frame(pipe[0])


def test_received_tensors_have_their_own_resizable_storage(pipe: tuple[int, int]) -> None:
    got = roundtrip(pipe, {"a": torch.arange(6.0), "b": torch.arange(3)})
    assert got["a"].untyped_storage().nbytes() == 6 * 4
    assert got["a"].untyped_storage().data_ptr() != got["b"].untyped_storage().data_ptr()
    got["b"].resize_(10)  # as on a local tensor
    assert got["b"][:3].tolist() == [0, 1, 2]


def test_memory_formats_survive_like_a_clone(pipe: tuple[int, int]) -> None:
    image = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    transposed = torch.randn(4, 6).t()
    sliced = torch.arange(20).view(4, 5)[:, 1:3]  # not dense: compacted, as clone() does
    got = roundtrip(pipe, [image, transposed, sliced])
    for sent, back in zip([image, transposed, sliced], got):
        assert torch.equal(sent, back)
        assert back.stride() == sent.clone().stride()
    assert got[0].is_contiguous(memory_format=torch.channels_last)


# -- 4. errors -------------------------------------------------------------------------------


class RaisesBrokenPipe(CountingReader):
    def _read(self, file_path: Any) -> Any:
        yield from super()._read(file_path)
        raise BrokenPipeError("the reader's own socket broke")


@pytest.mark.parametrize("lazy", [None, 4])
def test_broken_pipe_raised_by_the_reader_is_reported(lazy: Any, no_leaks: None) -> None:
    with pytest.raises(WorkerError, match="the reader's own socket broke") as info:
        list(make(RaisesBrokenPipe(8), num_workers=1, max_instances_in_memory=lazy))
    assert "_read" in info.value.traceback
    assert isinstance(info.value.__cause__, BrokenPipeError)


class BadStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ is broken too")


class RaisesBadStr(CountingReader):
    def _read(self, file_path: Any) -> Any:
        yield from super()._read(file_path)
        raise BadStr()


def test_exception_whose_str_raises_keeps_the_traceback(no_leaks: None) -> None:
    with pytest.raises(WorkerError, match="BadStr") as info:
        list(make(RaisesBadStr(8), num_workers=1, max_instances_in_memory=4))
    assert "RaisesBadStr" in info.value.traceback or "_read" in info.value.traceback


# -- 5. lifecycle ----------------------------------------------------------------------------


class NestedReader(CountingReader):
    """Builds a loader with workers inside a worker."""

    def _read(self, file_path: Any) -> Any:
        inner = MultiProcessDataLoader(CountingReader(4), "x", batch_size=2, num_workers=1,
                                       quiet=True)
        yield from ({"id": int(b["id"][0])} for b in inner)


def test_nested_loader_in_a_worker_says_what_the_limit_is(no_leaks: None) -> None:
    with pytest.raises(WorkerError, match="num_workers=0") as info:
        make(NestedReader(), num_workers=1)
    assert "AssertionError" not in info.value.message


NOT_IMPORTABLE = f"""
import sys
sys.path.insert(0, {str(HERE)!r})
from loader_helpers import CountingReader
from framework.data.multiprocess import MultiProcessDataLoader

class MainReader(CountingReader):
    pass

try:
    MultiProcessDataLoader(MainReader(8), "x", batch_size=4, num_workers=1, quiet=True,
                           start_method="spawn")
except Exception as error:
    print("MESSAGE", type(error).__name__, error)
"""


@pytest.mark.parametrize("how", ["stdin", "notebook"])
def test_reader_not_importable_in_a_spawned_worker_says_why(how: str) -> None:
    # From stdin, spawn re-runs a main file that does not exist; with -c (as in a
    # notebook) the class cannot be found by name in the worker.
    command = [sys.executable, "-"] if how == "stdin" else [sys.executable, "-c", NOT_IMPORTABLE]
    done = subprocess.run(command, input=NOT_IMPORTABLE if how == "stdin" else None,
                          capture_output=True, text=True, timeout=60)
    assert "MESSAGE" in done.stdout, done.stderr
    message = done.stdout.split("MESSAGE", 1)[1]
    assert "importable module" in message and "start_method='fork'" in message, message
    if how == "notebook":
        assert message.startswith(" WorkerError") and "MainReader" in message, message


# -- 6. grandchildren, CUDA ------------------------------------------------------------------


def test_worker_dying_mid_frame_while_a_grandchild_holds_the_pipe(
    pipe: tuple[int, int],
) -> None:
    # The frame's writer is gone (its sentinel fired) but another process still holds
    # the pipe, so no end-of-file ever comes: the reader must ask `wait`, not block.
    read, write = pipe
    frame = bytearray()
    write_frame_to = os.pipe()
    write_frame(write_frame_to[1], torch.arange(1000))
    frame = os.read(write_frame_to[0], 1 << 20)
    os.close(write_frame_to[0])
    os.close(write_frame_to[1])
    os.write(write, frame[: len(frame) // 2])
    os.set_blocking(read, False)

    class WriterDied(Exception):
        pass

    def wait() -> None:
        raise WriterDied()

    with pytest.raises(WriterDied):
        read_frame(read, wait)


def test_cuda_target_under_spawn_with_pickle5_moves_in_the_main_process() -> None:
    data = make(CountingReader(8), num_workers=1, max_instances_in_memory=4,
                start_method="spawn", cuda_device="cuda:0")
    assert data._spec(None).device is None  # pickle-5 frames carry CPU bytes only
    shared = make(CountingReader(8), num_workers=1, max_instances_in_memory=4,
                  start_method="spawn", cuda_device="cuda:0", transfer="shared_memory")
    assert shared._spec(None).device == torch.device("cuda:0")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensor_in_a_pickle5_frame_arrives_on_the_cpu(pipe: tuple[int, int]) -> None:
    sent = torch.arange(6, device="cuda").view(2, 3)
    got = roundtrip(pipe, {"x": sent})
    assert got["x"].device.type == "cpu" and torch.equal(got["x"], sent.cpu())


# -- 7. timeouts -----------------------------------------------------------------------------


def test_timeout_counts_progress_not_frames_in_eager_mode(no_leaks: None) -> None:
    # 12 instances, one each 0.25 s: never silent for 2 s, though the frame (up to 64
    # instances) takes 3 s to fill.
    data = make(SlowReader(n=12, delay=0.25), num_workers=1, timeout=2.0)
    assert len(list(data)) == 3


def test_sub_second_timeout_on_a_stuck_worker(no_leaks: None) -> None:
    data = make(SlowReader(delay=30), num_workers=1, max_instances_in_memory=4, timeout=0.3)
    with pytest.raises(WorkerError, match=r"sent nothing for 0\.3s"):
        list(data)


def test_pickled_worker_messages_are_small() -> None:
    from framework.data import _protocol

    assert len(pickle.dumps(_protocol.Done(3))) < 80


def test_transfer_names_come_from_one_place() -> None:
    from framework.data import _checks, _transfer

    assert _checks.TRANSFERS is _transfer.TRANSFERS
    with pytest.raises(ValueError, match="pickle5"):
        make(CountingReader(4), transfer="bogus")


# -- 5. lifecycle: no reference cycle through a carried-over pass -----------------------------


@pytest.mark.parametrize("lazy", [None, 8])
def test_del_loader_after_a_carried_over_epoch_stops_workers_without_gc(lazy: Any) -> None:
    import time
    import weakref

    gc.disable()
    try:
        before = child_pids()
        data = make(CountingReader(40), num_workers=2, max_instances_in_memory=lazy,
                    batches_per_epoch=3)
        list(data)  # the rest of the pass carries over (in lazy mode, its workers stay up)
        if lazy:
            assert child_pids() - before
        freed = weakref.ref(data)
        del data
        assert freed() is None  # no reference cycle: freed at once, without gc
        deadline = time.monotonic() + 10
        while child_pids() - before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child_pids() - before == set()
    finally:
        gc.enable()


# -- second review: locks of the random streams copied held by fork ---------------------------


def test_numpy_rng_lock_held_by_another_thread_at_fork_does_not_hang(tmp_path: Path) -> None:
    # A thread drawing from numpy's global RandomState holds its lock (GIL released) while
    # the loader forks: each worker's seeding waited forever on the copy.
    out = run_script(tmp_path, """
        import numpy.random
        from loader_helpers import CountingReader, LockHolder
        from framework.data.multiprocess import MultiProcessDataLoader

        # what a long draw does
        thread = LockHolder(numpy.random.mtrand._rand._bit_generator.lock, workers=2)
        data = MultiProcessDataLoader(CountingReader(40), "x", batch_size=4, num_workers=2,
                                      max_instances_in_memory=8, quiet=True, seed=1)
        batches = iter(data)
        next(batches)  # the workers fork while the lock is held, and seed numpy
        thread.release()
        print("BATCHES", 1 + sum(1 for _ in batches))
        print("HELD THROUGH THE FORK", not thread.timed_out)
    """, timeout=60)
    assert "BATCHES 10" in out and "HELD THROUGH THE FORK True" in out, out


def test_torch_rng_mutex_held_by_another_thread_at_fork_is_an_error_not_a_hang(
    tmp_path: Path,
) -> None:
    # torch's generator mutex cannot be replaced from Python: a worker that inherited it
    # held says so (and what to do) instead of waiting forever at its first seeding.
    out = run_script(tmp_path, """
        import threading
        import torch
        from loader_helpers import CountingReader
        from framework.data import _rng
        from framework.data.multiprocess import MultiProcessDataLoader
        from framework.errors import WorkerError

        _rng.LOCK_WAIT = 2.0  # inherited by the forked workers
        stop = threading.Event()
        def spin():  # an augmentation thread: the mutex is held during each draw
            while not stop.is_set():
                torch.randn(4_000_000)
        thread = threading.Thread(target=spin)
        thread.start()
        try:
            for attempt in range(3):
                data = MultiProcessDataLoader(CountingReader(8), "x", batch_size=4, num_workers=2,
                                              max_instances_in_memory=8, quiet=True)
                try:
                    print("BATCHES", sum(1 for _ in data))
                except WorkerError as error:
                    assert "start_method='forkserver'" in str(error), error
                    print("REFUSED")
        finally:
            stop.set()
            thread.join()
    """, timeout=90)
    assert out.count("BATCHES 2") + out.count("REFUSED") == 3, out


def test_seeding_skips_a_numpy_random_another_thread_is_still_importing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # After fork, a module another thread was importing stays half-initialised forever
    # (CPython marks it with __spec__._initializing); seeding it raised AttributeError.
    import importlib.machinery
    import types

    from framework.data._rng import seed_everything

    half = types.ModuleType("numpy.random")
    half.__spec__ = importlib.machinery.ModuleSpec("numpy.random", None)
    half.__spec__._initializing = True  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "numpy.random", half)
    seed_everything(3)
    assert torch.initial_seed() == 3


# -- second review: timeout counts bytes arriving mid-frame as progress -----------------------


def test_timeout_counts_bytes_arriving_in_the_middle_of_a_frame() -> None:
    # A worker steadily writing one large batch (a piece every 20 ms) is never silent for
    # 0.2 s; the timeout used to run from the frame's first byte. Drives the real
    # WorkerPool._receive over a real non-blocking pipe, with a live process as the worker.
    import select
    import threading
    import types

    from framework.data._pool import WorkerPool

    r0, w0 = os.pipe()
    writer = threading.Thread(target=lambda: (write_frame(w0, {"x": torch.ones(1 << 19)}), os.close(w0)))
    writer.start()
    frame = bytearray()
    while chunk := os.read(r0, 1 << 20):
        frame += chunk
    writer.join()
    os.close(r0)
    r, w = os.pipe()
    os.set_blocking(r, False)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    sentinel = os.pidfd_open(alive.pid)
    poller = select.poll()
    poller.register(r, select.POLLIN)
    poller.register(sentinel, select.POLLIN)
    pool: Any = types.SimpleNamespace(
        data=[types.SimpleNamespace(fileno=lambda: r)], _pollers=[poller],
        _sentinels={sentinel: 0}, processes=[types.SimpleNamespace(pid=alive.pid)],
        transfer="pickle5", closed=False,
    )
    pool._wait = lambda wid, deadline, timeout: WorkerPool._wait(pool, wid, deadline, timeout)
    pool._death = lambda wid: WorkerError("died", wid)

    def slow_writer() -> None:
        try:
            for start in range(0, len(frame), 1 << 15):
                os.write(w, frame[start : start + (1 << 15)])
                time.sleep(0.02)
        except BrokenPipeError:
            pass  # the test failed and closed the reading end

    import time

    feeding = threading.Thread(target=slow_writer, daemon=True)
    feeding.start()
    try:
        message = WorkerPool._receive(pool, 0, 0.2)
        assert torch.equal(message["x"], torch.ones(1 << 19))
    finally:
        os.close(r)
        feeding.join()
        alive.kill()
        alive.wait()
        os.close(w)
        os.close(sentinel)


# -- second review: close() from another thread ------------------------------------------------


def test_close_from_another_thread_ends_the_iteration_with_a_clear_error() -> None:
    # A watchdog thread closes the loader while the main thread waits for a batch: the
    # main thread got a raw "OSError: handle is closed" from under the pool.
    import threading

    data = make(SlowReader(200, delay=0.2), num_workers=2, batch_size=2, max_instances_in_memory=4)
    timer = threading.Timer(1.0, data.close)
    timer.start()
    try:
        with pytest.raises(WorkerError, match="loader was closed"):
            for _ in data:
                pass
    finally:
        timer.join()


# -- second review: shared_memory frames from a dead or stopped worker -----------------------


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_shared_memory_frames_of_a_killed_or_stopped_worker(tmp_path: Path, how: str) -> None:
    # Unpickling a queued shared_memory frame connects to the sending worker for each
    # storage's file descriptor: a killed worker gave a raw ConnectionRefusedError, and a
    # stopped one hung the main process despite the timeout.
    out = run_script(tmp_path, f"""
        import os, signal, time
        from loader_helpers import CountingReader
        from framework.data.multiprocess import MultiProcessDataLoader
        from framework.errors import WorkerError

        data = MultiProcessDataLoader(CountingReader(400), "x", batch_size=2, num_workers=1,
                                      max_instances_in_memory=8, quiet=True,
                                      transfer="shared_memory", timeout=2)
        it = iter(data)
        next(it)
        time.sleep(1.0)  # the worker fills its prefetch slots
        pid = data._pool.processes[0].pid
        os.kill(pid, signal.{how})
        time.sleep(0.5)
        try:
            for _ in it:
                pass
        except WorkerError as error:
            print("CAUGHT", str(error).splitlines()[0])
        finally:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    """, timeout=60)
    assert "CAUGHT" in out, out
    if how == "SIGKILL":
        assert "SIGKILL" in out, out


# -- a forked worker stuck before its first line ---------------------------------------------


def _stuck_first(flag: Path, real: Any) -> Any:
    """A start-up step that hangs in the first forked child only (the one that creates `flag`)."""

    def step() -> None:
        import time

        try:
            os.close(os.open(flag, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return real()
        time.sleep(3600)

    return step


def test_a_worker_stuck_in_its_start_up_is_forked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leaks: None
) -> None:
    # A forked child can wait forever before running a line of ours: on a lock another
    # thread held at the fork (CPython before 3.11.10 takes one in its after-fork code,
    # gh-112275; gloo's threads hold it at times). Before: the pass waited on that child
    # forever, and under torch.distributed the other ranks timed out in a collective.
    from framework.data import _pool, _worker

    def ids() -> list[list[int]]:
        data = make(CountingReader(24), num_workers=2, max_instances_in_memory=8, shuffle=True, seed=3)
        return [batch["id"].tolist() for batch in data]

    expected = ids()
    flag = tmp_path / "stuck"
    monkeypatch.setattr(_worker, "_private_tqdm_lock", _stuck_first(flag, _worker._private_tqdm_lock))
    monkeypatch.setattr(_pool, "START_S", 1.0)
    with pytest.warns(RuntimeWarning, match="killed and forked again"):
        assert ids() == expected  # the same batches, from a worker forked again
    assert flag.exists()  # one child did hang


def test_a_worker_stuck_at_every_start_is_an_error_not_a_hang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leaks: None
) -> None:
    from framework.data import _pool, _worker

    started = tmp_path / "started"

    def stuck() -> None:
        import time

        with open(started, "a") as log:
            log.write(f"{os.getpid()}\n")
        time.sleep(3600)

    monkeypatch.setattr(_worker, "_private_tqdm_lock", stuck)
    monkeypatch.setattr(_pool, "START_S", 0.5)
    with pytest.raises(WorkerError, match="start_method='forkserver'") as info, pytest.warns(RuntimeWarning):
        list(make(CountingReader(8), num_workers=2, max_instances_in_memory=8))
    assert info.value.worker_id == 0 and "3 times in a row" in str(info.value)
    # Worker 0 forked three times; worker 1 once (stopped with the pool); none left (no_leaks).
    assert len(started.read_text().split()) == 4


def test_a_pools_finalizer_acts_only_in_the_process_that_started_its_workers(
    no_leaks: None,
) -> None:
    # A forked worker inherits the finalizers of the pools alive at its fork; garbage
    # collection there ran them: Stop sent down another pool's pipes (its worker quit),
    # then "can only join a child process". Seen as 1,666 tracebacks in a stress run.
    import multiprocessing

    data = make(CountingReader(8), num_workers=1, max_instances_in_memory=8, persistent_workers=True)
    first = [batch["id"].tolist() for batch in data]
    pool = data._pool
    assert pool is not None
    # What garbage collection in a forked worker runs: the finalizer, or shutdown() through
    # the loader's __del__ or a pass's finally (the second review found the guard bypassed).
    for inherited in (pool._finalizer, pool.shutdown):
        child = multiprocessing.get_context("fork").Process(target=inherited)
        child.start()
        child.join(10)
        assert child.exitcode == 0
        assert [batch["id"].tolist() for batch in data] == first  # the same worker still serves
    data.close()
    assert not pool._finalizer.alive  # shut down: nothing left for a later fork to inherit


def test_an_interrupted_shutdown_leaves_the_finalizer_to_reap(
    monkeypatch: pytest.MonkeyPatch, no_leaks: None
) -> None:
    # shutdown() detached the finalizer before reaping: Ctrl-C during the reap left the
    # workers with nothing to stop them once the pool was dropped.
    from framework.data import _pool

    data = make(CountingReader(8), num_workers=1, max_instances_in_memory=8, persistent_workers=True)
    list(data)
    pool = data._pool
    assert pool is not None
    real = _pool._reap

    def interrupted(*args: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(_pool, "_reap", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pool.shutdown()
    assert pool._finalizer.alive
    monkeypatch.setattr(_pool, "_reap", real)
    data._pool = None
    del pool
    gc.collect()  # the finalizer reaps the worker (no_leaks checks)


def test_ctrl_c_between_a_workers_start_and_its_place_in_the_pool(
    monkeypatch: pytest.MonkeyPatch, no_leaks: None
) -> None:
    # A worker started but not yet in the pool's lists was never reaped.
    from framework.data._pool import WorkerPool

    real = WorkerPool._place
    calls: list[int] = []

    def interrupted(self: WorkerPool, worker_id: int, *args: Any) -> None:
        calls.append(worker_id)
        if worker_id == 1:
            raise KeyboardInterrupt
        real(self, worker_id, *args)

    monkeypatch.setattr(WorkerPool, "_place", interrupted)
    with pytest.raises(KeyboardInterrupt):
        list(make(CountingReader(8), num_workers=2, max_instances_in_memory=8))
    assert calls == [0, 1]


def test_close_from_another_thread_while_the_workers_start_ends_the_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leaks: None
) -> None:
    # close() saw no pool while a stuck worker was being forked again, and the pass went
    # on, its pool outliving close().
    import threading

    from framework.data import _pool, _worker

    flag = tmp_path / "stuck"
    monkeypatch.setattr(_worker, "_private_tqdm_lock", _stuck_first(flag, _worker._private_tqdm_lock))
    monkeypatch.setattr(_pool, "START_S", 1.0)
    data = make(CountingReader(8), num_workers=2, max_instances_in_memory=8, persistent_workers=True)
    closer = threading.Timer(0.3, data.close)
    closer.start()
    try:
        with pytest.raises(WorkerError, match="closed"), pytest.warns(RuntimeWarning):
            list(data)
    finally:
        closer.join()
    assert data._pool is None
