"""Worker processes from start to end: locks held at fork time (tqdm, the random
streams), start-up that hangs or is interrupted, nested loaders, readers a spawned worker
cannot import, close() from another thread, the pool's finalizer. Anything that could
hang runs in a subprocess with a timeout, so a regression fails instead of hanging."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from framework.data.multiprocess import MultiProcessDataLoader
from framework.errors import WorkerError
from tests.support.loader import (
    REPO_ROOT,
    CountingReader,
    SlowReader,
    child_pids,
    make,
    run_script,
)

# -- tqdm's lock -------------------------------------------------------------------------


def test_tqdm_lock_held_by_another_thread_at_fork_does_not_hang(tmp_path: Path) -> None:
    # A progress bar in a background thread holds tqdm's lock while the loader forks:
    # the workers' copy of the thread lock stays held forever.
    out = run_script(
        tmp_path,
        """
        import sys
        from tqdm import tqdm
        from tests.support.loader import CountingReader, LockHolder
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
    """,
        timeout=60,
    )
    assert "BATCHES 10" in out and "HELD THROUGH THE FORK True" in out, out


def test_worker_killed_holding_tqdm_lock_leaves_main_bars_working(tmp_path: Path) -> None:
    out = run_script(
        tmp_path,
        """
        import os, signal
        from tqdm import tqdm
        from tests.support.loader import CountingReader
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
    """,
        timeout=60,
    )
    assert "ERROR SIGKILL" in out and "BAR DONE" in out


# -- nested loaders, readers a spawned worker cannot import ---------------------------


class NestedReader(CountingReader):
    """Builds a loader with workers inside a worker."""

    def _read(self, file_path: Any) -> Any:
        inner = MultiProcessDataLoader(CountingReader(4), "x", batch_size=2, num_workers=1, quiet=True)
        yield from ({"id": int(b["id"][0])} for b in inner)


def test_nested_loader_in_a_worker_says_what_the_limit_is(no_leaks: None) -> None:
    with pytest.raises(WorkerError, match="num_workers=0") as info:
        make(NestedReader(), num_workers=1)
    assert "AssertionError" not in info.value.message


NOT_IMPORTABLE = f"""
import sys
sys.path.insert(0, {str(REPO_ROOT)!r})
from tests.support.loader import CountingReader
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
    done = subprocess.run(
        command, input=NOT_IMPORTABLE if how == "stdin" else None, capture_output=True, text=True, timeout=60
    )
    assert "MESSAGE" in done.stdout, done.stderr
    message = done.stdout.split("MESSAGE", 1)[1]
    assert "importable module" in message and "start_method='fork'" in message, message
    if how == "notebook":
        assert message.startswith(" WorkerError") and "MainReader" in message, message


# -- no reference cycle through a carried-over pass --------------------------------------


@pytest.mark.parametrize("lazy", [None, 8])
def test_del_loader_after_a_carried_over_epoch_stops_workers_without_gc(lazy: Any) -> None:
    import time
    import weakref

    gc.disable()
    try:
        before = child_pids()
        data = make(CountingReader(40), num_workers=2, max_instances_in_memory=lazy, batches_per_epoch=3)
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


# -- a device change while a pass reads from the workers ---------------------------------


def _ids(batches: Any) -> list[list[int]]:
    return [batch["id"].tolist() for batch in batches]


def test_set_target_device_between_epochs_keeps_the_carried_pass() -> None:
    # A device change keeps the pool the carried-over pass reads from: shutting it down would
    # make the next epoch raise WorkerError "the loader was closed".
    before = child_pids()
    data = make(
        CountingReader(20),
        batch_size=2,
        num_workers=2,
        max_instances_in_memory=4,
        batches_per_epoch=3,
        seed=1,
    )
    first = _ids(data)
    data.set_target_device("cpu")
    second = _ids(data)
    assert len(second) == 3
    assert not set(map(tuple, first)) & set(map(tuple, second))
    data.close()
    assert child_pids() - before == set()


@pytest.mark.parametrize("persistent", [False, True])
def test_set_target_device_mid_pass_keeps_the_live_iterator(persistent: bool) -> None:
    before = child_pids()
    data = make(
        CountingReader(20),
        batch_size=2,
        num_workers=2,
        max_instances_in_memory=4,
        persistent_workers=persistent,
        seed=1,
    )
    iterator = iter(data)
    taken = [next(iterator)["id"].tolist()]
    data.set_target_device("cpu")
    taken += _ids(iterator)
    assert sorted(i for batch in taken for i in batch) == list(range(20))
    # the retired workers stopped with their pass; the next pass starts its own
    assert sorted(i for batch in _ids(data) for i in batch) == list(range(20))
    data.close()
    assert child_pids() - before == set()


# -- locks of the random streams, copied held by fork ------------------------------------


def test_numpy_rng_lock_held_by_another_thread_at_fork_does_not_hang(tmp_path: Path) -> None:
    # A thread drawing from numpy's global RandomState holds its lock (GIL released) while
    # the loader forks: each worker's seeding waited forever on the copy.
    out = run_script(
        tmp_path,
        """
        import numpy.random
        from tests.support.loader import CountingReader, LockHolder
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
    """,
        timeout=60,
    )
    assert "BATCHES 10" in out and "HELD THROUGH THE FORK True" in out, out


def test_torch_rng_mutex_held_by_another_thread_at_fork_is_an_error_not_a_hang(
    tmp_path: Path,
) -> None:
    # torch's generator mutex cannot be replaced from Python: a worker that inherited it
    # held says so (and what to do) instead of waiting forever at its first seeding.
    out = run_script(
        tmp_path,
        """
        import threading
        import torch
        from tests.support.loader import CountingReader
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
    """,
        timeout=90,
    )
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


# -- close() from another thread ---------------------------------------------------------


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


# -- a forked worker stuck before its first line -----------------------------------------


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
