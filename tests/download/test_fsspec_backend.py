"""The optional fsspec backend, end to end: fsspec's ``memory://`` filesystem, and fsspec's
HTTP filesystem against the test server (forced onto ``http`` through ``backends=``)."""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from framework.download import DownloadBackend, DownloadManager
from framework.download._schemes import backend_name_for
from framework.errors import (
    DownloadError,
    HTTPStatusError,
    InvalidArgumentError,
    MissingDependencyError,
    NetworkError,
)
from framework.testing import MemoryBackend
from tests.support.download import FaultServer, sha256

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


class _ChangingObject(BaseHTTPRequestHandler):
    """Serves version 1 to the first GET, version 2 afterwards (HEADs follow suit);
    records the connections it saw open and closed."""

    protocol_version = "HTTP/1.1"
    size = 12 << 20  # fsspec's HTTP file reads 5 MiB ranges: several GETs
    gets = 0
    open_connections: set[Any] = set()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.open_connections.add(self.client_address)

    def finish(self) -> None:
        super().finish()
        self.open_connections.discard(self.client_address)

    def _answer(self, body: bool) -> None:
        version = b"1" if type(self).gets <= 1 else b"2"
        data = version * self.size
        match = re.match(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        first, last = (
            (int(match[1]), int(match[2] or self.size - 1)) if match and body else (0, self.size - 1)
        )
        last = min(last, self.size - 1)
        self.send_response(206 if match and body else 200)
        if match and body:
            self.send_header("Content-Range", f"bytes {first}-{last}/{self.size}")
        self.send_header("Content-Length", str(last + 1 - first))
        self.send_header("ETag", f'"v{version.decode()}"')
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if body:
            self.wfile.write(data[first : last + 1])

    def do_HEAD(self) -> None:
        self._answer(False)

    def do_GET(self) -> None:
        type(self).gets += 1
        self._answer(True)


@pytest.fixture
def changing_server() -> Iterator[str]:
    handler = type("Handler", (_ChangingObject,), {"gets": 0, "open_connections": set()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/big.bin"
    finally:
        server.shutdown()
        server.server_close()


def test_an_object_changing_between_range_requests_is_read_again(changing_server: str, cache: Path) -> None:
    with DownloadManager(
        cache, progress=False, backoff_factor=0, backends={"http": FsspecBackend()}
    ) as manager:
        data = manager.cached_path(changing_server).read_bytes()
    assert data in (b"1" * _ChangingObject.size, b"2" * _ChangingObject.size)  # never a mix


def test_close_closes_the_filesystems_sessions(http_server: FaultServer, cache: Path) -> None:
    url = http_server.add("/fsspec/closed.bin", b"hello")
    backend = FsspecBackend()
    with DownloadManager(cache, progress=False, backends={"http": backend}) as manager:
        manager.cached_path(url)
        sessions = [fs._session for fs in backend._filesystems.values()]
        assert sessions and not any(session.closed for session in sessions)
    assert all(session.closed for session in sessions) and backend._filesystems == {}
    assert fsspec.filesystem("http")._session is not sessions[0]  # not fsspec's shared instance


def test_headers_for_http_are_refused_not_sent_to_a_redirect(http_server: FaultServer, cache: Path) -> None:
    target = http_server.add("/fsspec/target.bin", b"hello").replace("127.0.0.1", "localhost")
    start = http_server.add("/fsspec/start", b"", redirect=target)
    backend = FsspecBackend(storage_options={"headers": {"X-Api-Key": "KEYSECRET"}})
    with DownloadManager(cache, progress=False, backends={"http": backend}) as manager:
        with pytest.raises(InvalidArgumentError, match="HttpBackend") as info:
            manager.cached_path(start)
    assert "KEYSECRET" not in str(info.value)
    sent = http_server.route(start).headers + http_server.route(target).headers
    assert not [h for h in sent if "KEYSECRET" in h.values()]


@pytest.mark.parametrize(
    "url",
    [
        "zip://x::file:///etc/hostname",
        "tar://x::file:///etc/hostname",
        "reference://x",
        "dir://x",
        "generic://x",
    ],
)
def test_odd_fsspec_urls_are_download_errors(manager: DownloadManager, url: str) -> None:
    with pytest.raises(DownloadError) as info:
        manager.cached_path(url)
    assert info.value.url == url
