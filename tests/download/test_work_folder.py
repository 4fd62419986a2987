"""The per-user work folder under attack: something planted at its name is never listed,
renamed or written through, and an extraction or an outage there leaves no stray file."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from framework.download import DownloadManager
from framework.download import _extract as extract_module
from framework.download._cache import Entry, work_folder
from framework.errors import DownloadError
from tests.support.download import FaultServer, one_member_tar, planted_partial, unique_path, wait_for

pytestmark = pytest.mark.timeout(60)


def planted_work_folder(tmp_path: Path, url: str) -> tuple[Path, Path]:
    """A cache folder whose work folder for `url` is a link planted to another folder."""
    cache = tmp_path / "cache"
    cache.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    work_folder(Entry(cache, url).final).symlink_to(elsewhere)
    return cache, elsewhere


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


def test_an_outage_with_a_refused_work_folder_leaves_no_partial_next_to_the_entry(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """With the work folder refused (a link planted at its name), an outage must keep no
    partial file next to the entry, where no later call looks (it would never be resumed
    nor swept, a file's worth of disk per failed call), nor where the link points."""
    data = os.urandom(300_000)
    url = http_server.add(unique_path("outage"), data, drop_after=100_000, drops=100)
    cache, elsewhere = planted_work_folder(tmp_path, url)
    manager = DownloadManager(cache, connections=1, retries=1, backoff_factor=0.01, progress=False)
    for _attempt in range(2):
        with pytest.raises(DownloadError):
            manager.cached_path(url)
    assert [name for name in os.listdir(cache) if name.endswith((".part", ".parts"))] == []
    assert os.listdir(elsewhere) == []


def test_a_killed_writers_partial_next_to_the_entry_does_not_stay_forever(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """The security page: "a crashed process leaves temporary files and folders | they are
    swept". With a link planted at the work folder's name, a process killed mid-fetch
    (preempted, OOM) leaves its partial file in the cache folder itself; the next fetch
    of that entry publishes it and leaves no partial file of a dead writer behind."""
    data = os.urandom(300_000)
    url = http_server.add(unique_path("killed-next-to"), data, hold_after=100_000, chunk=16_384)
    route = http_server.route(url)
    cache, _elsewhere = planted_work_folder(tmp_path, url)
    pid = os.fork()
    if pid == 0:  # the writer: no pytest past this point
        try:
            DownloadManager(cache, progress=False, connections=1).cached_path(url)
        finally:
            os._exit(1)
    try:
        wait_for(lambda: route.body_bytes >= 80_000, what="the writer to be held")
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    finally:
        route.hold_after = None
        route.released.set()
    assert DownloadManager(cache, progress=False, connections=1).cached_path(url).read_bytes() == data
    assert [name for name in os.listdir(cache) if name.endswith((".part", ".parts", ".tmp"))] == []
