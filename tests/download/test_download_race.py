"""Real processes racing on one URL, and processes killed at the worst moment."""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from framework.download import DownloadManager
from framework.download._cache import Entry
from framework.download._lock import EntryLock
from framework.errors import LockTimeoutError, OfflineError
from tests.support.download import FORK, FaultServer, cache_files, sha256, stray_files, unique_path, wait_for

pytestmark = pytest.mark.timeout(60)


def _race_child(url: str, cache: str, lock: str, barrier: Any, results: Any) -> None:
    try:
        manager = DownloadManager(cache, lock=lock, progress=False, backoff_factor=0.01)
        barrier.wait(timeout=20)
        path = manager.cached_path(url)
        results.put((os.getpid(), str(path), hashlib.sha256(path.read_bytes()).hexdigest()))
    except BaseException as error:
        results.put((os.getpid(), "error", repr(error)))


def _race(url: str, cache: Path, lock: str, n: int = 16) -> list[tuple[int, str, str]]:
    barrier = FORK.Barrier(n)
    results = FORK.Queue()
    procs = [
        FORK.Process(target=_race_child, args=(url, str(cache), lock, barrier, results)) for _ in range(n)
    ]
    for proc in procs:
        proc.start()
    try:
        out = [results.get(timeout=40) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    return out


def test_16_processes_one_get_identical_bytes(http_server: FaultServer, cache: Path) -> None:
    data = os.urandom(3 << 20)
    # Slow enough that every racer arrives while the first is still downloading.
    url = http_server.add("/race/locked.bin", data, delay=0.005)
    results = _race(url, cache, "filelock")
    assert {r[1] for r in results} == {str(Entry(cache, url).final)}, results
    assert {r[2] for r in results} == {sha256(data)}
    route = http_server.route(url)
    # One fetch: one request from byte 0, and less than a second copy served. Not one
    # request: the racers have the default connections, and a fetch slowed by 16
    # processes on the cores may have its ramp add ranged requests.
    assert route.full_gets == 1 and route.body_bytes < 2 * len(data), route
    assert stray_files(cache) == []


def test_16_processes_without_lock_still_get_correct_bytes(http_server: FaultServer, cache: Path) -> None:
    data = os.urandom(1 << 20)
    url = http_server.add("/race/unlocked.bin", data, delay=0.002)
    results = _race(url, cache, "none")
    assert {r[2] for r in results} == {sha256(data)}, results
    assert Entry(cache, url).final.read_bytes() == data
    assert stray_files(cache) == []
    assert not Entry(cache, url).lock.exists()
    assert http_server.route(url).gets >= 1


def _download_child(url: str, cache: str, connections: Optional[int] = None) -> None:
    DownloadManager(cache, progress=False, connections=connections).cached_path(url)


def _largest_partial(cache: Path) -> int:
    """The size of the largest partial file in `cache` (0 if none). The fetch renames its
    partial file once it knows the version, so one listed may be gone when it is stat'ed."""
    sizes = [0]
    for path in (cache / name for name in cache_files(cache)):
        if path.name.endswith(".part"):
            try:
                sizes.append(path.stat().st_size)
            except FileNotFoundError:
                pass
    return max(sizes)


def test_sigkill_mid_body_then_offline_then_resume(http_server: FaultServer, cache: Path) -> None:
    data = os.urandom(4 << 20)
    url = http_server.add("/kill/data.bin", data, chunk=32 * 1024, delay=0.01)
    entry = Entry(cache, url)
    proc = FORK.Process(target=_download_child, args=(url, str(cache), 1))
    proc.start()
    try:
        wait_for(lambda: _largest_partial(cache) > 256 * 1024, what="a partial file")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=10)
    assert proc.exitcode == -signal.SIGKILL
    assert not entry.final.exists() and not entry.sidecar.exists()
    with pytest.raises(OfflineError):
        DownloadManager(cache, offline=True).cached_path(url)

    http_server.route(url).delay = 0
    # One stream: the parallel path's kill and resume have their own tests
    # (test_parallel_fetch.py), and its sparse partial file is as long as the object at once.
    path = DownloadManager(cache, progress=False, connections=1).cached_path(url, sha256=sha256(data))
    assert path.read_bytes() == data
    route = http_server.route(url)
    assert route.full_gets == 1 and route.ranges[-1].startswith("bytes=")  # resumed
    assert stray_files(cache) == []


def _hold_lock(lock_path: str, kind: str, ready: Any) -> None:
    with EntryLock(Path(lock_path), kind, 60, "http://holder/"):  # type: ignore[arg-type]
        ready.set()
        time.sleep(60)


@pytest.mark.parametrize("kind", ["filelock", "softfilelock"])
def test_lock_timeout_names_holder_then_sigkill_lets_next_in(
    http_server: FaultServer, cache: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="framework.download")
    url = http_server.add(f"/holder/{kind}.bin", b"payload")
    entry = Entry(cache, url)
    cache.mkdir(parents=True)
    ready = FORK.Event()
    proc = FORK.Process(target=_hold_lock, args=(str(entry.lock), kind, ready))
    proc.start()
    try:
        assert ready.wait(timeout=20)
        manager = DownloadManager(cache, lock=kind, lock_timeout=0.6, progress=False)  # type: ignore[arg-type]
        with pytest.raises(LockTimeoutError) as info:
            manager.cached_path(url)
        assert f"pid {proc.pid}" in info.value.holder and info.value.url == url
        assert f"another process is fetching it (pid {proc.pid}" in caplog.text
        assert http_server.route(url).gets == 0
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=10)
    manager = DownloadManager(cache, lock=kind, lock_timeout=10, progress=False)  # type: ignore[arg-type]
    assert manager.cached_path(url).read_bytes() == b"payload"


def test_a_child_forked_while_a_thread_holds_a_lock_fetches_and_waits(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """A thread holds an entry's lock (its fetch is held by the server) when the process
    forks: the child fetches another file (its own heartbeat), and waits for the held
    entry, with a short lock timeout, as long as the parent's holder works, then
    reads what the parent published."""
    cache = tmp_path / "cache"
    held_data, other_data = os.urandom(300_000), os.urandom(5000)
    held = http_server.add(unique_path("held"), held_data, hold_after=100_000, chunk=16_384)
    other = http_server.add(unique_path("other"), other_data)
    route = http_server.route(held)
    manager = DownloadManager(cache, progress=False, lock_timeout=0.5)
    results: dict[str, Any] = {}
    holder = threading.Thread(target=lambda: results.setdefault("held", manager.cached_path(held)))
    holder.start()
    try:
        wait_for(lambda: route.body_bytes >= 80_000, what="the holder to be held")
        pid = os.fork()
        if pid == 0:  # the child: no pytest past this point
            code = 1
            try:
                child = DownloadManager(cache, progress=False, lock_timeout=0.5)
                ok = child.cached_path(other).read_bytes() == other_data
                code = 0 if ok and child.cached_path(held).read_bytes() == held_data else 2
            finally:
                os._exit(code)
        time.sleep(1.5)  # three lock timeouts: the child must still be waiting, not failed
        assert os.waitpid(pid, os.WNOHANG) == (0, 0)
    finally:
        route.released.set()
    holder.join(20)
    _pid, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert results["held"].read_bytes() == held_data


def test_a_killed_holders_owner_file_goes_with_the_next_holder(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """A holder killed after writing the lock's owner file leaves it behind; the next
    holder, even one done before its own owner file is due (a small file), removes it,
    so no later waiter is told a dead process holds the lock, nor its size."""
    cache = tmp_path / "cache"
    cache.mkdir()
    url = http_server.add(unique_path("owner"), os.urandom(1000))
    owner = Entry(cache, url).lock.with_name(Entry(cache, url).lock.name + ".owner")
    owner.write_text('{"pid": 999999, "host": "gone", "since": 0, "size": 123456789}')
    DownloadManager(cache, progress=False).cached_path(url)
    assert not owner.exists()
