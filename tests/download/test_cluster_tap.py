"""`_tap`: what the cluster fetch's sender sends while the origin fetch arrives is the
hashed prefix of this process's partial file, a new generation when the fetch starts over."""

from __future__ import annotations

import os
from pathlib import Path

from framework.download import DownloadManager
from framework.download._cache import Entry
from framework.download._tap import Tap, tapping
from tests.support.download import FaultServer, unique_path


def _tapped_fetch(url: str, cache: Path) -> Tap:
    tap = Tap()
    with tapping(Entry(cache, url).final, tap):
        DownloadManager(cache, progress=False, connections=1, backoff_factor=0.01).cached_path(url)
    return tap


def test_a_tap_counts_the_hashed_prefix_and_reads_the_file(http_server: FaultServer, tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    url = http_server.add(unique_path("tap"), data)
    tap = _tapped_fetch(url, tmp_path)
    try:
        generation, fd, hashed = tap.snapshot()
        assert (generation, hashed) == (1, len(data))
        assert fd is not None and os.pread(fd, len(data) + 1, 0) == data  # the published file's bytes
    finally:
        tap.close()
    assert tap.snapshot()[1] is None


def test_a_fetch_starting_over_is_a_new_generation(http_server: FaultServer, tmp_path: Path) -> None:
    new = os.urandom(1 << 20)
    url = http_server.add(
        unique_path("tap-swap"),
        os.urandom(2 << 20),
        drop_after=1 << 20,
        drops=1,
        then={"data": new, "etag": '"new"'},
    )
    tap = _tapped_fetch(url, tmp_path)
    try:
        generation, fd, hashed = tap.snapshot()
        assert (generation, hashed) == (2, len(new))
        assert fd is not None and os.pread(fd, len(new) + 1, 0) == new
    finally:
        tap.close()


def test_an_untapped_fetch_is_not_followed(http_server: FaultServer, tmp_path: Path) -> None:
    url = http_server.add(unique_path("untapped"), os.urandom(1 << 16))
    tap = Tap()
    with tapping(tmp_path / "another-entry", tap):
        DownloadManager(tmp_path, progress=False).cached_path(url)
    assert tap.snapshot() == (0, None, 0)
