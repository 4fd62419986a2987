"""Attacks on the work folder and on `cached_paths`: each test failed before its fix."""

from __future__ import annotations

import io
import os
import tarfile
import threading
from pathlib import Path
from typing import Any

import pytest

from framework.download import DownloadManager
from framework.download import _extract as extract_module
from framework.download._cache import Entry, work_folder
from framework.errors import InvalidArgumentError
from tests.support.download import FaultServer, planted_partial, sha256, unique_path

pytestmark = pytest.mark.timeout(60)


def _tar(name: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


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
    first = http_server.add(unique_path("a.tar"), _tar("a.txt", b"a"))
    second = http_server.add(unique_path("b.tar"), _tar("b.txt", b"b"))
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
