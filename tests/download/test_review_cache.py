"""Attacks on the work folder and on `cached_paths`: each test failed before its fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from framework.download import DownloadManager
from framework.download._cache import Entry, work_folder
from tests.support.download import FaultServer, planted_partial, unique_path

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
