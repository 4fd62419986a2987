"""Attacks on the work folder and on `cached_paths`: each test failed before its fix."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from framework.download import DownloadManager
from framework.download import _extract as extract_module
from framework.download._cache import Entry, work_folder
from framework.errors import DownloadError, InvalidArgumentError
from tests.support.download import FaultServer, one_member_tar, planted_partial, sha256, unique_path, wait_for

pytestmark = pytest.mark.timeout(60)


def test_a_planted_work_folder_link_is_never_listed_or_renamed_through(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """A symlink planted at the work folder points to a folder of this user holding a
    partial file of the same entry (its other cache): the fetch refuses the link, so it
    must not adopt, rename or remove anything where the link points."""
    data = os.urandom(4096)
    url = http_server.add(unique_path("linked"), data)
    private = tmp_path / "private"
    kept = planted_partial(private, url, '"v1"', data[:1000])
    shared = tmp_path / "shared"
    shared.mkdir()
    work_folder(Entry(shared, url).final).symlink_to(kept.parent)
    assert DownloadManager(shared, progress=False).cached_path(url).read_bytes() == data
    assert os.listdir(kept.parent) == [kept.name]
    assert kept.read_bytes() == data[:1000]


def test_a_concurrent_extraction_never_loses_its_work_folder(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two entries are extracted at once where this user has no work folder yet (the
    archives were fetched by another user, or the folder was cleaned): the extraction
    that made the folder must not remove it under the other one."""
    cache = tmp_path / "cache"
    manager = DownloadManager(cache, progress=False)
    first = http_server.add(unique_path("a.tar"), one_member_tar("a.txt", b"a"))
    second = http_server.add(unique_path("b.tar"), one_member_tar("b.txt", b"b"))
    manager.cached_path(first)
    manager.cached_path(second)
    os.rmdir(work_folder(Entry(cache, first).final))

    unpacking, first_done = threading.Event(), threading.Event()
    unpack, sweep = extract_module._unpack, extract_module._sweep

    def signalling_unpack(*args: Any) -> None:
        unpacking.set()
        unpack(*args)

    def late_sweep(*args: Any) -> None:  # the second extraction is slower to get going
        first_done.wait(10)
        sweep(*args)

    monkeypatch.setattr(extract_module, "_unpack", signalling_unpack)
    monkeypatch.setattr(extract_module, "_sweep", late_sweep)
    results: dict[str, Any] = {}

    def extract(url: str) -> None:
        try:
            results[url] = manager.cached_path(url, extract=True)
        except Exception as error:
            results[url] = error

    runner = threading.Thread(target=extract, args=(first,))
    runner.start()
    assert unpacking.wait(10)
    other = threading.Thread(target=extract, args=(second,))
    other.start()
    runner.join(20)
    first_done.set()
    other.join(20)
    assert isinstance(results[first], Path), results[first]
    assert isinstance(results[second], Path), results[second]
    assert (results[second] / "b.txt").read_bytes() == b"b"


def test_cached_paths_refuses_two_digests_for_one_file_in_a_mapping(tmp_path: Path) -> None:
    """A mapping naming one file twice (two spellings) with two digests is a mistake:
    refused, as a list with two digests for one URL is, never one silently dropped."""
    local = tmp_path / "data.bin"
    local.write_bytes(b"payload")
    right, wrong = sha256(b"payload"), sha256(b"other")
    manager = DownloadManager(tmp_path / "cache", progress=False)
    with pytest.raises(InvalidArgumentError):
        manager.cached_paths([local], sha256={str(local): wrong, f"{tmp_path}/./data.bin": right})
    same = {str(local): right.upper(), f"{tmp_path}/./data.bin": right}  # one digest, two cases
    assert manager.cached_paths([local], sha256=same)[0].read_bytes() == b"payload"


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


def test_two_processes_with_overlapping_lists_fetch_each_file_once(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """Two processes ask for overlapping lists at once (and one names a file twice):
    every file is fetched once in all, and both get every file whole."""
    cache = tmp_path / "cache"
    blobs = {name: os.urandom(200_000) for name in "abcdef"}
    urls = {
        name: http_server.add(unique_path(name), data, chunk=16_384, delay=0.01)
        for name, data in blobs.items()
    }
    lists = [[urls[n] for n in "abcd"], [urls[n] for n in "fedcc"]]
    children = []
    for chosen in lists:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                paths = DownloadManager(cache, progress=False).cached_paths(chosen, max_workers=4)
                wanted = [blobs[url.rsplit("/", 1)[-1].split("-")[0]] for url in chosen]
                code = 0 if [path.read_bytes() for path in paths] == wanted else 2
            finally:
                os._exit(code)
        children.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
    assert codes == [0, 0]
    assert {name: http_server.route(url).gets for name, url in urls.items()} == dict.fromkeys(blobs, 1)


def test_ctrl_c_in_cached_paths_cancels_what_has_not_begun(http_server: FaultServer, tmp_path: Path) -> None:
    """Ctrl-C while three files are under way and one has failed: the call raises
    KeyboardInterrupt once those three finished (published), and no file not yet begun
    is ever asked for."""
    cache = tmp_path / "cache"
    held = [
        http_server.add(unique_path(f"held{i}"), os.urandom(200_000), hold_after=50_000) for i in range(2)
    ]
    failing = http_server.add(unique_path("failing"), b"", status=404)
    later = [http_server.add(unique_path(f"later{i}"), os.urandom(1000), hold_after=0) for i in range(10)]
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            DownloadManager(cache, progress=False).cached_paths([*held, failing, *later], max_workers=3)
        except KeyboardInterrupt:
            code = 0
        finally:
            os._exit(code)
    try:
        # The failed file's worker took the next file, held too: three under way.
        wait_for(lambda: all(http_server.route(url).gets for url in [*held, failing, later[0]]))
        os.kill(pid, signal.SIGINT)
        time.sleep(0.5)
        assert os.waitpid(pid, os.WNOHANG) == (0, 0), "the files under way must finish first"
    finally:
        for url in [*held, *later]:
            http_server.route(url).released.set()
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert all(Entry(cache, url).lookup(None) is not None for url in [*held, later[0]])
    assert [http_server.route(url).gets for url in later[1:]] == [0] * 9


def test_an_outage_with_a_refused_work_folder_leaves_no_partial_next_to_the_entry(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """With the work folder refused (a link planted at its name), an outage must keep no
    partial file next to the entry, where no later call looks (it would never be resumed
    nor swept, a file's worth of disk per failed call), nor where the link points."""
    cache = tmp_path / "cache"
    cache.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    data = os.urandom(300_000)
    url = http_server.add(unique_path("outage"), data, drop_after=100_000, drops=100)
    work_folder(Entry(cache, url).final).symlink_to(elsewhere)
    manager = DownloadManager(cache, connections=1, retries=1, backoff_factor=0.01, progress=False)
    for _attempt in range(2):
        with pytest.raises(DownloadError):
            manager.cached_path(url)
    assert [name for name in os.listdir(cache) if name.endswith((".part", ".parts"))] == []
    assert os.listdir(elsewhere) == []


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
