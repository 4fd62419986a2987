"""The optional fsspec backend, end to end: fsspec's ``memory://`` filesystem, and fsspec's
HTTP filesystem against the test server (forced onto ``http`` through ``backends=``)."""

from __future__ import annotations

import importlib.util
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dl_helpers import FaultServer, sha256

from framework.download import DownloadBackend, DownloadManager
from framework.download._schemes import backend_name_for
from framework.errors import HTTPStatusError, InvalidArgumentError, MissingDependencyError, NetworkError
from framework.testing import MemoryBackend

fsspec = pytest.importorskip("fsspec")

from framework_plugins.fsspec import FsspecBackend  # noqa: E402  (after the skip)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def memfs() -> Iterator[Any]:
    fs = fsspec.filesystem("memory")
    yield fs
    fs.rm("/fsspec-tests", recursive=True) if fs.exists("/fsspec-tests") else None


def test_memory_filesystem_end_to_end(memfs: Any, manager: DownloadManager) -> None:
    data = os.urandom(3 << 20)
    memfs.pipe("/fsspec-tests/data.bin", data)
    url = "memory://fsspec-tests/data.bin"
    assert backend_name_for(url) == "fsspec"  # no backend declares memory://: the fallback
    path = manager.cached_path(url, sha256=sha256(data))
    assert path.read_bytes() == data and path.name.endswith("-data.bin")
    assert manager.cached_path(url) == path  # a hit
    with pytest.raises(HTTPStatusError) as missing:
        manager.cached_path("memory://fsspec-tests/missing.bin")
    assert missing.value.status == 404 and missing.value.url == "memory://fsspec-tests/missing.bin"
    with pytest.raises(InvalidArgumentError, match="not a file"):
        manager.cached_path("memory://fsspec-tests")


def test_opens_at_an_offset_and_reports_an_offset_past_the_end(memfs: Any) -> None:
    memfs.pipe("/fsspec-tests/ranged.bin", b"0123456789")
    url = "memory://fsspec-tests/ranged.bin"
    with FsspecBackend() as backend:
        with backend.open(url, 4) as stream:
            assert (stream.start, stream.size, stream.status) == (4, 10, 206)
            assert b"".join(stream.chunks) == b"456789"
        with backend.open(url, 11) as stream:
            assert stream.status == 416 and stream.size == 10
        info = backend.stat(url)
    assert info.size == 10 and info.last_modified is not None


def test_http_filesystem_against_the_test_server(http_server: FaultServer, cache: Path) -> None:
    data = os.urandom(2 << 20)
    url = http_server.add("/fsspec/data.bin", data)
    with DownloadManager(cache, progress=False, backends={"http": FsspecBackend()}) as manager:
        assert isinstance(manager.backend_for(url), FsspecBackend)
        assert manager.cached_path(url, sha256=sha256(data)).read_bytes() == data
        with pytest.raises(HTTPStatusError) as missing:
            manager.cached_path(http_server.base + "/fsspec/missing.bin")
        assert missing.value.status == 404
    assert http_server.route(url).gets >= 1
    with FsspecBackend() as backend, backend.open(url, 1000) as stream:
        assert stream.start == 1000 and b"".join(stream.chunks) == data[1000:]


def test_http_filesystem_connection_refused_is_a_network_error(cache: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    manager = DownloadManager(cache, progress=False, retries=1, backends={"http": FsspecBackend()})
    with pytest.raises(NetworkError) as info:
        manager.cached_path(f"http://127.0.0.1:{port}/nothing.bin")
    assert info.value.url.endswith("/nothing.bin")


def test_a_registered_backend_wins_over_the_fallback(memfs: Any, manager: DownloadManager) -> None:
    DownloadBackend.register("memory")(MemoryBackend)
    MemoryBackend.objects["memory://fsspec-tests/x"] = b"from the plugin"
    try:
        assert backend_name_for("memory://fsspec-tests/x") == "memory"
        assert manager.cached_path("memory://fsspec-tests/x").read_bytes() == b"from the plugin"
    finally:
        MemoryBackend.reset()


@pytest.mark.skipif(importlib.util.find_spec("gcsfs") is not None, reason="gcsfs is installed")
def test_a_filesystem_package_that_is_missing_says_what_to_install(manager: DownloadManager) -> None:
    with pytest.raises(MissingDependencyError, match="gcsfs") as info:
        manager.cached_path("gs://bucket/object.bin")
    assert info.value.url == "gs://bucket/object.bin" and isinstance(info.value, ImportError)
