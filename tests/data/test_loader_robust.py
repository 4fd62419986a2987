"""Never hangs: worker errors, crashes, signals, early exit, Ctrl-C, a killed main process."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from framework.data._transfer import read_frame, set_pipe_size, write_frame
from framework.data.multiprocess import MultiProcessDataLoader
from framework.data.sampler import BatchSampler
from framework.errors import CollateError, WorkerError
from tests.support.loader import (
    CountingReader,
    DyingReader,
    EmptyReader,
    FailingReader,
    FileReader,
    ProgressReader,
    SlowReader,
    StallThenDie,
    alive,
    child_pids,
    flat,
)

pytestmark = pytest.mark.timeout(60)
REPO_ROOT = Path(__file__).resolve().parents[2]


def make(reader: Any, **kwargs: Any) -> MultiProcessDataLoader:
    kwargs.setdefault("quiet", True)
    kwargs.setdefault("batch_size", 4)
    return MultiProcessDataLoader(reader, "unused", **kwargs)


@pytest.mark.parametrize("lazy", [None, 8])
def test_worker_exception_carries_its_traceback(lazy: Any, no_leaks: None) -> None:
    with pytest.raises(WorkerError) as info:
        list(make(FailingReader(40, fail_after=5), num_workers=2, max_instances_in_memory=lazy))
    error = info.value
    assert "reader broke on purpose" in error.message
    assert "tests/support/loader.py" in error.traceback and "_read" in error.traceback
    assert "Traceback from the worker" in str(error)
    assert isinstance(error.__cause__, RuntimeError)
    assert error.worker_id in (0, 1)


@pytest.mark.parametrize("how,name", [("SIGKILL", "SIGKILL"), ("SIGSEGV", "SIGSEGV"),
                                      ("abort", "SIGABRT")])
def test_worker_killed_by_a_signal_is_named_quickly(how: str, name: str, no_leaks: None) -> None:
    data = make(DyingReader(how, victim=1), num_workers=2, max_instances_in_memory=8)
    started = time.monotonic()
    with pytest.raises(WorkerError) as info:
        list(data)
    assert time.monotonic() - started < 10
    assert info.value.signal == name and info.value.worker_id == 1
    assert "worker 1" in str(info.value) and name in str(info.value)


def test_worker_exiting_silently_is_reported(no_leaks: None) -> None:
    with pytest.raises(WorkerError, match="exit code 3") as info:
        list(make(DyingReader("exit", victim=0), num_workers=2, max_instances_in_memory=8))
    assert info.value.exitcode == 3


def test_eager_loading_worker_crash_is_reported(no_leaks: None) -> None:
    with pytest.raises(WorkerError, match="SIGKILL"):
        make(DyingReader("SIGKILL", victim=0), num_workers=2)


@pytest.mark.parametrize("persistent", [False, True])
def test_early_break_reaps_workers_and_leaves_no_shm(persistent: bool, no_leaks: None) -> None:
    data = make(SlowReader(delay=0.001), num_workers=2, max_instances_in_memory=8,
                persistent_workers=persistent, transfer="shared_memory")
    for i, _ in enumerate(data):
        if i == 5:
            break
    assert data._pool is None  # an unfinished epoch cannot be resumed by live workers


def test_persistent_workers_survive_epochs(no_leaks: None) -> None:
    data = make(CountingReader(20), num_workers=2, max_instances_in_memory=8,
                persistent_workers=True)
    list(data)
    assert data._pool is not None
    pids = [p.pid for p in data._pool.processes]
    second = list(data)
    assert [p.pid for p in data._pool.processes] == pids
    assert sorted(flat(b["id"].tolist() for b in second)) == list(range(20))
    data.close()


def test_persistent_workers_are_kept_unless_a_setting_changes(no_leaks: None) -> None:
    """Assigning a setting its own value keeps the workers; a new value starts new ones
    (the old ones were started with the old value)."""
    data = make(CountingReader(20), num_workers=2, max_instances_in_memory=8,
                persistent_workers=True)  # fmt: skip
    list(data)
    pids = [p.pid for p in data._pool.processes]
    data.batch_size, data.collate_fn = data.batch_size, data.collate_fn
    list(data)
    assert [p.pid for p in data._pool.processes] == pids
    data.batch_size = 5
    assert [len(b["id"]) for b in data] == [5] * 4
    assert not set(p.pid for p in data._pool.processes) & set(pids)
    data.close()


def test_workers_use_one_thread() -> None:
    class ThreadsCollator:
        def __call__(self, instances: list[Any]) -> Any:
            return {"threads": torch.get_num_threads()}

    data = make(CountingReader(8), num_workers=2, max_instances_in_memory=4,
                collate_fn=ThreadsCollator())
    assert {batch["threads"] for batch in data} == {1}


def test_timeout_on_a_stuck_worker(no_leaks: None) -> None:
    data = make(SlowReader(delay=30), num_workers=1, max_instances_in_memory=4, timeout=1)
    with pytest.raises(WorkerError, match="sent nothing for 1s"):
        list(data)


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers,lazy", [(0, None), (2, None), (0, 4), (2, 4)])
def test_reader_that_yields_nothing(num_workers: int, lazy: Any) -> None:
    with pytest.raises(ValueError, match="read no instances"):
        list(make(EmptyReader(), num_workers=num_workers, max_instances_in_memory=lazy))


def test_missing_data_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    for num_workers in (0, 2):  # eager mode reads when built: the reader's error, wrapped
        with pytest.raises(WorkerError, match=r"FileNotFoundError.*nope\.txt") as info:
            MultiProcessDataLoader(FileReader(), missing, batch_size=2, num_workers=num_workers,
                                   quiet=True)
        assert isinstance(info.value.__cause__, FileNotFoundError)


def test_reads_a_real_file(text_file: Path) -> None:
    data = MultiProcessDataLoader(FileReader(), text_file, batch_size=8, num_workers=2,
                                  max_instances_in_memory=8, quiet=True)
    assert sorted(flat(b["id"].tolist() for b in data)) == list(range(40))


class Unbatchable(CountingReader):
    def _read(self, file_path: Any) -> Any:
        for instance in super()._read(file_path):
            instance["when"] = object()
            yield instance


@pytest.mark.parametrize("num_workers", [0, 2])
def test_instances_the_collator_cannot_batch(num_workers: int) -> None:
    data = make(Unbatchable(8), num_workers=num_workers, max_instances_in_memory=4)
    with pytest.raises(WorkerError, match=r"'when'.*object") as info:
        list(data)
    assert type(info.value.__cause__) is CollateError


class OutOfRange(BatchSampler):
    def get_batch_indices(self, instances: Any) -> Any:
        yield [0, len(instances)]

    def get_num_batches(self, instances: Any) -> int:
        return 1


@pytest.mark.parametrize("num_workers,lazy", [(0, None), (2, 4)])
def test_sampler_with_out_of_range_indices(num_workers: int, lazy: Any) -> None:
    data = MultiProcessDataLoader(CountingReader(8), "x", batch_sampler=OutOfRange(),
                                  num_workers=num_workers, max_instances_in_memory=lazy,
                                  quiet=True)
    with pytest.raises(WorkerError, match=r"OutOfRange.*index \d+ for \d+") as info:
        list(data)
    assert type(info.value.__cause__) is ValueError


@pytest.mark.parametrize("lazy", [None, 4])
def test_more_workers_than_instances(lazy: Any, no_leaks: None) -> None:
    data = make(CountingReader(3), num_workers=5, max_instances_in_memory=lazy)
    assert sorted(flat(b["id"].tolist() for b in data)) == [0, 1, 2]


# -- the main process dies or is interrupted ---------------------------------------------

SCRIPT = """
import faulthandler, os, signal, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)  # a stuck run says where (see below)
sys.path.insert(0, {here!r})
from tests.support.loader import SlowReader
from framework.data.multiprocess import MultiProcessDataLoader

if __name__ == "__main__":
    data = MultiProcessDataLoader(SlowReader(delay=0.01), "x", batch_size=2, num_workers=2,
                                  max_instances_in_memory=4, start_method={method!r}, quiet=True)
    try:
        for i, batch in enumerate(data):
            if i == 3:
                print("READY", flush=True)
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
        time.sleep(0.5)
        from tests.support.loader import child_pids, shm_entries
        print("CHILDREN", len(child_pids()), flush=True)
"""


def start_script(tmp_path: Path, text: str) -> subprocess.Popen[str]:
    """Run the script `text` until it prints READY (at most 60 s: else it is killed)."""
    script = tmp_path / "main.py"
    script.write_text(text)
    process = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    line = process.stdout.readline() if select.select([process.stdout], [], [], 60)[0] else ""
    if line.strip() != "READY":
        end_script(process, child_pids(process.pid))
        raise AssertionError(f"the script did not get going: {line!r}; {process.stderr.read()}")
    return process


def end_script(process: subprocess.Popen[str], workers: set[int]) -> list[int]:
    """SIGKILL `process` and, once given 10 s to go with it, any of its `workers` left
    (they hold its pipes); which were left."""
    process.kill()
    process.wait(timeout=10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(pid) for pid in workers):
        time.sleep(0.1)
    left = [pid for pid in workers if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def assert_workers_die_with(process: subprocess.Popen[str], workers: set[int]) -> None:
    """SIGKILL `process`; its `workers` must be gone within 10 s."""
    assert not end_script(process, workers), "workers outlived the main process"
    process.communicate(timeout=10)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_killed_main_process_takes_its_workers(tmp_path: Path, method: str) -> None:
    process = start_script(tmp_path, textwrap.dedent(SCRIPT.format(here=str(REPO_ROOT), method=method)))
    workers = child_pids(process.pid)
    assert len(workers) >= 2
    assert_workers_die_with(process, workers)


THREADED = """
import signal, sys, threading, time
sys.path.insert(0, {here!r})
from tests.support.loader import SlowReader
from framework.data.multiprocess import MultiProcessDataLoader
{setup}
def run():
    data = MultiProcessDataLoader(SlowReader(delay=0.01), "x", batch_size=2, num_workers=2,
                                  max_instances_in_memory=4, quiet=True)
    for i, batch in enumerate(data):
        if i == 3:
            print("READY", flush=True)

{launch}
"""

# The watchdog never wakes: only the death signal (PR_SET_PDEATHSIG) is left to act.
NO_WATCHDOG = """
import framework.data._worker as worker_module

class Clock:  # the worker module's `time`, whose sleep never ends in the watchdog
    monotonic = staticmethod(time.monotonic)

    @staticmethod
    def sleep(seconds):
        forever = threading.current_thread().name == "framework-loader-watchdog"
        time.sleep(3600 if forever else seconds)

worker_module.time = Clock
"""


@pytest.mark.parametrize(
    ("setup", "launch"),
    [
        # A loader iterated in a thread: the death signal is not armed (it would fire when
        # that thread ends), so the watchdog alone must see the main process go.
        ("", "threading.Thread(target=run, daemon=True).start()\ntime.sleep(3600)"),
        # In the main thread with the watchdog asleep: the death signal alone must do it.
        (NO_WATCHDOG, "run()"),
    ],
    ids=["loader-in-a-thread", "death-signal-alone"],
)
def test_each_guard_alone_takes_the_workers_of_a_killed_main_process(
    tmp_path: Path, setup: str, launch: str
) -> None:
    process = start_script(tmp_path, THREADED.format(here=str(REPO_ROOT), setup=setup, launch=launch))
    workers = child_pids(process.pid)
    assert len(workers) == 2
    assert_workers_die_with(process, workers)


def test_persistent_workers_started_in_a_thread_outlive_that_thread(no_leaks: None) -> None:
    # The death signal fires when the thread that started a worker ends: armed from a
    # thread, it would kill these workers as soon as the first epoch's thread is done.
    data = make(CountingReader(16), batch_size=2, num_workers=2, max_instances_in_memory=4,
                persistent_workers=True)
    first: list[int] = []
    thread = threading.Thread(target=lambda: first.extend(flat(b["id"].tolist() for b in data)))
    thread.start()
    thread.join()
    second = flat(b["id"].tolist() for b in data)  # the same workers, from the main thread
    data.close()
    assert sorted(first) == sorted(second) == list(range(16))


def test_ctrl_c_caught_outside_the_loop_leaves_the_workers_working(tmp_path: Path) -> None:
    # A Ctrl-C reaches the whole process group; the workers ignore it (the main process
    # decides), so a program that catches it can go on with the same iterator.
    script = tmp_path / "main.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys, time
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from tests.support.loader import CountingReader
        from framework.data.multiprocess import MultiProcessDataLoader

        data = MultiProcessDataLoader(CountingReader(40), "x", batch_size=2, num_workers=2,
                                      max_instances_in_memory=4, quiet=True,
                                      persistent_workers=True)
        batches = iter(data)
        got = [next(batches)]  # the workers run
        try:
            os.killpg(os.getpgrp(), signal.SIGINT)
            time.sleep(10)
        except KeyboardInterrupt:
            print("CAUGHT", flush=True)
        got.extend(batches)
        print("BATCHES", len(got), flush=True)
    """))
    process = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group: the SIGINT reaches nothing else
    )
    try:
        out, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the script and its workers
        out, err = process.communicate(timeout=10)
        pytest.fail(f"the script did not end in 60 s: {out!r}\n{err[-2000:]}")
    assert "CAUGHT" in out and "BATCHES 20" in out, (out, err[-2000:])


def test_a_worker_that_fails_at_start_is_reported_with_its_error(
    monkeypatch: pytest.MonkeyPatch, no_leaks: None
) -> None:
    # Worker 1 fails before its first instance and exits while worker 0 is slow: the main
    # process finds it dead, and says why from what it left in its pipe, not "exit code 1".
    import multiprocessing

    from framework.data import _worker

    real = _worker.after_fork

    def fails_in_worker_1() -> None:
        if multiprocessing.current_process().name == "framework-loader-worker-1":
            raise RuntimeError("set-up failed in worker 1")
        real()

    monkeypatch.setattr(_worker, "after_fork", fails_in_worker_1)
    data = make(SlowReader(n=8, delay=1.0), batch_size=2, num_workers=2, max_instances_in_memory=4)
    with pytest.raises(WorkerError, match="set-up failed in worker 1"):
        list(data)


def test_ctrl_c_reaps_every_worker(tmp_path: Path) -> None:
    from tests.support.loader import new_shm_entries, shm_entries

    before = shm_entries()
    process = start_script(tmp_path, textwrap.dedent(SCRIPT.format(here=str(REPO_ROOT), method="fork")))
    workers = child_pids(process.pid)
    os.killpg(os.getpgid(process.pid), 0)  # the group exists
    process.send_signal(signal.SIGINT)
    try:
        out, _ = process.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGUSR1)  # every thread's stack to its stderr
        time.sleep(1)
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"Ctrl-C did not end the main process in 20 s; it printed {out!r} and:\n{err}")
    assert "INTERRUPTED" in out and "CHILDREN 0" in out
    assert not any(alive(pid) for pid in workers)
    assert new_shm_entries(before) == set()


def test_spawn_with_an_unpicklable_reader_says_what_to_do() -> None:
    class Local(CountingReader):  # defined in a function: spawn cannot import it
        pass

    data = make(Local(8), num_workers=1, max_instances_in_memory=4, start_method="spawn")
    with pytest.raises(TypeError, match="module level"):
        list(data)


def test_lazy_workers_run_only_a_bounded_distance_ahead(tmp_path: Path, no_leaks: None) -> None:
    log = tmp_path / "progress"
    data = make(ProgressReader(str(log)), batch_size=1, num_workers=2, max_instances_in_memory=2)
    iterator = iter(data)

    def produced() -> list[int]:
        return [read_count(Path(f"{log}.{w}")) if Path(f"{log}.{w}").exists() else 0 for w in range(2)]

    try:
        next(iterator)
        # Until both workers have stood still for half a second (held back), or 30 s have
        # gone: the reader is endless, so workers that are not held back never stand still.
        counts, steady, deadline = produced(), 0, time.monotonic() + 30
        while steady < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
            counts, before = produced(), counts
            steady = steady + 1 if counts == before and 0 not in counts else 0
    finally:
        iterator.close()
    # prefetch is max(2, 2 * 2 // 1) = 4 batches per worker, plus the one in hand; each
    # worker's _read sees every instance and keeps every other one (automatic sharding).
    assert steady == 5 and all(count <= 2 * 6 + 1 for count in counts), counts


def read_count(path: Path) -> int:
    for _ in range(100):
        text = path.read_text()
        if text:  # not caught between truncate and write
            return int(text)
        time.sleep(0.01)
    raise AssertionError(f"{path} stayed empty")


class Unrebuildable(Exception):
    def __init__(self, code: int, detail: str) -> None:  # pickles, but cannot be rebuilt
        super().__init__(f"code {code}: {detail}")


class RaisesUnrebuildable(CountingReader):
    def _read(self, file_path: Any) -> Any:
        yield from super()._read(file_path)
        raise Unrebuildable(7, "custom failure")


def test_exception_that_cannot_be_rebuilt_still_reports(no_leaks: None) -> None:
    with pytest.raises(WorkerError, match="code 7: custom failure") as info:
        list(make(RaisesUnrebuildable(4), num_workers=2, max_instances_in_memory=4))
    assert "Unrebuildable" in info.value.traceback


@pytest.mark.parametrize("persistent", [False, True])
def test_two_open_iterations_of_one_loader(persistent: bool, no_leaks: None) -> None:
    data = make(CountingReader(16), num_workers=2, max_instances_in_memory=8,
                persistent_workers=persistent)
    pairs = list(zip(data, data))
    assert len(pairs) == 4
    assert all(a["id"].tolist() == b["id"].tolist() for a, b in pairs)
    data.close()


def test_death_of_a_worker_is_seen_while_waiting_on_another(no_leaks: None) -> None:
    data = make(StallThenDie(8), num_workers=2, max_instances_in_memory=4)
    started = time.monotonic()
    with pytest.raises(WorkerError, match=r"worker 1.*SIGKILL"):
        list(data)  # the round-robin waits on worker 0 first, which stalls for a minute
    assert time.monotonic() - started < 10


@pytest.mark.timeout(120)
def test_a_script_that_ends_with_an_unfinished_iterator_exits_silently() -> None:
    # The pass's generator holds the loader weakly; its cleanup at exit raised
    # ReferenceError ("Exception ignored in ...") once the loader was gone. One script
    # leaves a pass unfinished in each mode (one interpreter: each start costs seconds).
    import subprocess
    import sys
    import textwrap

    lazy = {"max_instances_in_memory": 8}
    modes = [{}, {"num_workers": 2, **lazy}, {"num_workers": 0, **lazy},
             {"num_workers": 2, **lazy, "persistent_workers": True}]  # fmt: skip
    script = textwrap.dedent(f"""
        import torch
        from framework.data.multiprocess import MultiProcessDataLoader
        from framework.data.reader import DatasetReader

        class Reader(DatasetReader):  # defined in __main__, torn down with it
            def _read(self, path):
                for i in range(40):
                    yield {{"x": torch.tensor([i])}}

        loaders = [MultiProcessDataLoader(Reader(), "x", batch_size=2, quiet=True, **options)
                   for options in {modes!r}]
        passes = [iter(loader) for loader in loaders]
        firsts = [next(it) for it in passes]  # peek at a batch of each, then the script ends
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "ReferenceError" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr


@pytest.fixture
def pipe() -> Any:
    read, write = os.pipe()
    set_pipe_size(write)
    yield read, write
    os.close(read)
    os.close(write)


# -- a grandchild holding the pipe -------------------------------------------------------


@pytest.mark.timeout(120)
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


# -- timeouts ----------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_timeout_counts_progress_not_frames_in_eager_mode(no_leaks: None) -> None:
    # 12 instances, one each 0.25 s: never silent for 2 s, though the frame (up to 64
    # instances) takes 3 s to fill.
    data = make(SlowReader(n=12, delay=0.25), num_workers=1, timeout=2.0)
    assert len(list(data)) == 3


@pytest.mark.timeout(120)
def test_sub_second_timeout_on_a_stuck_worker(no_leaks: None) -> None:
    data = make(SlowReader(delay=30), num_workers=1, max_instances_in_memory=4, timeout=0.3)
    with pytest.raises(WorkerError, match=r"sent nothing for 0\.3s"):
        list(data)


# -- timeout counts bytes arriving mid-frame as progress ---------------------------------


@pytest.mark.timeout(120)
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
