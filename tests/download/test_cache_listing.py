"""A cache of any size: a miss, a resume and a waiter's polls look up an entry's files by
name and never list the cache folder (counted, with 10 and 5,000 unrelated entries)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import filelock
import pytest

from framework.download import DownloadManager
from framework.download._cache import WORK_FALLBACKS, Entry, work_folder
from framework.errors import DownloadError
from tests.support.download import (
    FaultServer,
    Listings,
    counted_listings,
    one_member_tar,
    planted_partial,
    sha256,
    stray_files,
    unique_path,
    wait_for,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def listings() -> Iterator[Listings]:
    with counted_listings() as seen:
        yield seen


def _filled(cache: Path, entries: int) -> Path:
    """`cache` holding `entries` unrelated names (published files, sidecars, locks)."""
    cache.mkdir(parents=True)
    for index in range(entries):
        (cache / f"{index:020x}-unrelated-{index}.bin").touch()
    return cache


@pytest.mark.parametrize("connections", [1, 4])
def test_a_miss_lists_no_cache_folder_whatever_it_holds(
    http_server: FaultServer, tmp_path: Path, listings: Listings, connections: int
) -> None:
    """Only the work folder (what is being written or was kept) is looked into: as many
    listings per miss with 10 entries as with 5,000, none of the cache folder."""
    counts = []
    for entries in (10, 5000):
        cache = _filled(tmp_path / f"cache-{entries}-{connections}", entries)
        manager = DownloadManager(cache, progress=False, connections=connections)
        listings.folders.clear()
        for index in range(3):
            data = os.urandom(4096)
            url = http_server.add(unique_path(f"miss-{index}"), data)
            path = manager.cached_path(url)
            assert path.read_bytes() == data
            assert manager.cached_path(url) == path  # a hit
        counts.append(len(listings.folders))
        assert listings.of(cache) == 0
        assert set(listings.folders) <= {str(work_folder(cache / "any"))}
    assert counts[0] == counts[1]


def test_a_kept_partial_is_found_by_name_and_resumed(
    http_server: FaultServer, tmp_path: Path, listings: Listings
) -> None:
    cache = _filled(tmp_path / "cache", 5000)
    data = os.urandom(200_000)
    url = http_server.add(unique_path("resume"), data)
    planted_partial(cache, url, http_server.route(url).etag or "", data[:50_000])
    listings.folders.clear()
    manager = DownloadManager(cache, progress=False, connections=1)
    assert sha256(manager.cached_path(url).read_bytes()) == sha256(data)
    assert http_server.route(url).ranges == ["bytes=50000-"]  # resumed, not fetched again
    assert listings.of(cache) == 0
    # Only the entry's own work folder was listed, whatever the cache holds.
    assert set(listings.folders) <= {str(work_folder(Entry(cache, url).final))}
    assert stray_files(cache) == []


def test_a_waiters_polls_list_no_cache_folder(
    http_server: FaultServer, tmp_path: Path, listings: Listings
) -> None:
    """Another process holds the entry's lock for a while: the waiter polls (progress,
    done) by name, then finds the file published."""
    cache = _filled(tmp_path / "cache", 5000)
    data = os.urandom(4096)
    url = http_server.add(unique_path("wait"), data)
    entry = Entry(cache, url)
    holder = filelock.FileLock(str(entry.lock), thread_local=False)
    holder.acquire()
    polls: list[int] = []
    manager = DownloadManager(cache, progress=False, connections=1, lock_timeout=30)
    import framework.download.manager as manager_module

    original = manager_module.partial_bytes

    def counted(final: Path) -> int:
        polls.append(1)
        return original(final)

    result: dict[str, Path] = {}
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(manager_module, "partial_bytes", counted)
            waiter = threading.Thread(target=lambda: result.setdefault("path", manager.cached_path(url)))
            listings.folders.clear()
            waiter.start()
            wait_for(lambda: len(polls) >= 5, what="the waiter polling")
            during = list(listings.folders)
            holder.release()
            waiter.join(30)
    finally:
        if holder.is_locked:
            holder.release()
    assert result["path"].read_bytes() == data
    assert [folder for folder in during if os.path.realpath(folder) == os.path.realpath(cache)] == []
    assert len(during) <= len(polls)  # at most the entry's work folder, once per poll
    assert listings.of(cache) == 0


def test_a_planted_work_folder_is_never_written_through(
    http_server: FaultServer, tmp_path: Path, listings: Listings
) -> None:
    """Another user plants a symlink at this user's work folder: the fetch writes in the
    next work folder name instead, nothing lands where the link points, and the cache
    folder is still never listed."""
    cache = tmp_path / "cache"
    cache.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    data = os.urandom(4096)
    url = http_server.add(unique_path("planted"), data)
    final = Entry(cache, url).final
    work_folder(final).symlink_to(elsewhere)
    listings.folders.clear()
    assert DownloadManager(cache, progress=False).cached_path(url).read_bytes() == data
    assert os.listdir(elsewhere) == []
    assert work_folder(final).is_symlink() and work_folder(final, 1).is_dir()
    assert listings.of(cache) == 0


def test_a_work_folder_planted_at_every_name_is_a_clear_error(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """Links planted at every work folder name this user may use: the fetch writes
    through none of them and says what to remove, rather than writing in the cache
    folder itself, where no later call would find what it left."""
    cache = tmp_path / "cache"
    cache.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    url = http_server.add(unique_path("all-planted"), os.urandom(4096))
    final = Entry(cache, url).final
    for fallback in range(WORK_FALLBACKS + 1):
        work_folder(final, fallback).symlink_to(elsewhere)
    with pytest.raises(DownloadError, match=r"planted\?\); remove them") as caught:
        DownloadManager(cache, progress=False).cached_path(url)
    assert str(work_folder(final)) in str(caught.value)
    assert os.listdir(elsewhere) == [] and http_server.route(url).gets == 0
    assert [name for name in os.listdir(cache) if name.endswith((".part", ".parts", ".tmp"))] == []


def test_an_extraction_with_a_refused_work_folder_lists_no_cache_folder(
    http_server: FaultServer, tmp_path: Path, listings: Listings
) -> None:
    """Something planted at the work folder's name (here a symlink) makes the fetch
    write next to the entry; "The cache folder itself is never listed" still holds for
    a fetch, and must for the extraction too."""
    cache = tmp_path / "cache"
    cache.mkdir()
    for index in range(50):
        (cache / f"{index:020x}-unrelated.bin").touch()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    url = http_server.add(unique_path("refused.tar"), one_member_tar("a.txt", b"a"))
    work_folder(Entry(cache, url).final).symlink_to(elsewhere)
    listings.folders.clear()
    folder = DownloadManager(cache, progress=False).cached_path(url, extract=True)
    assert (folder / "a.txt").read_bytes() == b"a"
    assert listings.of(cache) == 0, listings.folders
