"""The HTTP path end to end against a real server on 127.0.0.1 that injects faults."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from framework_plugins.http import HttpBackend

from framework.download import DownloadManager, _pipeline, cached_path
from framework.download._cache import Entry, unique_token
from framework.download._partial import PartialName
from framework.download._validators import _etag_tag
from framework.errors import (
    ChecksumError,
    DownloadError,
    HTTPStatusError,
    NetworkError,
    OfflineError,
)
from tests.support.download import (
    FaultServer,
    parts_manager,
    sha256,
    stray_files,
    unique_path,
)

pytestmark = pytest.mark.timeout(30)


def test_fetch_publishes_file_and_sidecar(
    http_server: FaultServer, manager: DownloadManager, cache: Path, payload: bytes
) -> None:
    url = http_server.add("/basic/data.bin", payload)
    path = manager.cached_path(url, sha256=sha256(payload))
    assert path.read_bytes() == payload
    assert path.parent == cache and path.name.endswith("-data.bin")
    meta = json.loads(Path(f"{path}.json").read_text())
    assert meta["url"] == url and meta["size"] == len(payload)
    assert meta["sha256"] == sha256(payload) and meta["etag"] == http_server.route(url).etag
    assert stray_files(cache) == []
    assert http_server.route(url).gets == 1


def test_cache_hit_opens_no_connection_and_hashes_nothing(
    http_server: FaultServer, manager: DownloadManager, payload: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = http_server.add("/hit/data.bin", payload)
    digest = sha256(payload)
    first = manager.cached_path(url, sha256=digest)
    hashed = []
    real_sha256 = hashlib.sha256

    class Counting:
        def __init__(self, data: bytes = b"") -> None:
            self._h = real_sha256(data)
            hashed.append(len(data))

        def update(self, data: bytes) -> None:
            hashed.append(len(data))
            self._h.update(data)

        def hexdigest(self) -> str:
            return self._h.hexdigest()

    def no_socket(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a cache hit opened a connection")

    monkeypatch.setattr(hashlib, "sha256", Counting)
    monkeypatch.setattr(socket.socket, "connect", no_socket)
    for _ in range(3):
        assert manager.cached_path(url, sha256=digest) == first
        assert manager.cached_path(url) == first
    assert sum(hashed) < 10_000  # only URLs were hashed, never the 1 MiB file
    assert http_server.route(url).gets == 1


def test_connection_reset_mid_body_resumes_with_range(
    http_server: FaultServer, manager: DownloadManager, payload: bytes
) -> None:
    url = http_server.add("/reset/data.bin", payload, drop_after=300_000, drops=2, delay=0.005)
    path = manager.cached_path(url, sha256=sha256(payload))
    assert path.read_bytes() == payload
    route = http_server.route(url)
    assert route.gets == 3 and route.full_gets == 1
    # A reset discards what the client had not read yet, so it resumes at or before 300000.
    resumed_at = int(route.ranges[1].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= 300_000


def test_short_body_is_resumed(http_server: FaultServer, manager: DownloadManager, payload: bytes) -> None:
    url = http_server.add("/short/data.bin", payload, drop_after=1000, drops=1, drop_kind="short")
    assert manager.cached_path(url).read_bytes() == payload
    assert http_server.route(url).ranges == ["", "bytes=1000-"]


def test_connection_always_dropping_fails_and_publishes_nothing(
    http_server: FaultServer, cache: Path, payload: bytes
) -> None:
    manager = DownloadManager(cache, retries=3, backoff_factor=0.01, progress=False)
    url = http_server.add("/drops/data.bin", payload, drop_after=0, drops=100)
    with pytest.raises(NetworkError) as info:
        manager.cached_path(url)
    assert info.value.url == url
    assert not Entry(cache, url).final.exists()
    assert http_server.route(url).gets == 3


@pytest.mark.parametrize("statuses", [[500, 500], [503, 502], [429, 408]])
def test_retryable_statuses_then_200(
    http_server: FaultServer, manager: DownloadManager, payload: bytes, statuses: list[int]
) -> None:
    url = http_server.add(f"/flaky/{statuses[0]}.bin", payload, fail_statuses=list(statuses))
    assert manager.cached_path(url).read_bytes() == payload
    assert http_server.route(url).gets == 3


def test_retry_after_is_capped() -> None:
    from framework_plugins.http import MAX_RETRY_AFTER_S, HttpBackend

    retry = HttpBackend().session.get_adapter("http://x").max_retries
    response = requests.Response()
    response.headers["Retry-After"] = "86400"
    response.status = 429  # what urllib3 reads
    assert retry.get_retry_after(response) == MAX_RETRY_AFTER_S


def test_stalled_body_times_out_instead_of_hanging(
    http_server: FaultServer, cache: Path, payload: bytes
) -> None:
    manager = DownloadManager(cache, retries=2, backoff_factor=0.01, timeout=0.3, progress=False)
    url = http_server.add("/stalled/data.bin", payload, delay=2.0)
    with pytest.raises(NetworkError):
        manager.cached_path(url)
    assert not Entry(cache, url).final.exists()


def test_progress_bar_on_a_terminal(
    http_server: FaultServer,
    cache: Path,
    payload: bytes,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = http_server.add("/progress/data.bin", payload)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    DownloadManager(cache, progress=False).cached_path(url)
    assert capsys.readouterr().err == ""
    DownloadManager(cache).cached_path(url, force=True)
    err = capsys.readouterr().err
    assert "data.bin" in err and "1.00M" in err and "B/s" in err


@pytest.mark.parametrize("status", [404, 403])
def test_client_errors_are_final(
    http_server: FaultServer, manager: DownloadManager, cache: Path, status: int
) -> None:
    url = http_server.add(f"/denied/{status}.bin", b"x", status=status)
    with pytest.raises(HTTPStatusError) as info:
        manager.cached_path(url)
    assert info.value.status == status and info.value.url == url
    assert str(status) in str(info.value) and url in str(info.value)
    assert http_server.route(url).gets == 1  # no retry
    assert not Entry(cache, url).final.exists() and stray_files(cache) == []


def test_5xx_forever_names_status_after_retries(http_server: FaultServer, cache: Path) -> None:
    manager = DownloadManager(cache, retries=2, backoff_factor=0.01, progress=False)
    url = http_server.add("/down/data.bin", b"x", status=502)
    with pytest.raises(HTTPStatusError) as info:
        manager.cached_path(url)
    assert info.value.status == 502
    assert http_server.route(url).gets == 3  # the first try and two retries


def test_checksum_mismatch_keeps_older_good_copy(
    http_server: FaultServer, manager: DownloadManager, cache: Path, payload: bytes
) -> None:
    url = http_server.add("/changing/data.bin", payload)
    good = manager.cached_path(url, sha256=sha256(payload))
    sidecar = Path(f"{good}.json").read_text()
    http_server.route(url).data = b"tampered" + payload[8:]
    with pytest.raises(ChecksumError) as info:
        manager.cached_path(url, sha256=sha256(payload), force=True)
    assert info.value.expected == sha256(payload)
    assert good.read_bytes() == payload and Path(f"{good}.json").read_text() == sidecar
    assert stray_files(cache) == []


def test_wrong_sha256_for_cached_copy_refetches(
    http_server: FaultServer, manager: DownloadManager, payload: bytes
) -> None:
    url = http_server.add("/rehash/data.bin", payload)
    manager.cached_path(url)
    new = os.urandom(1000)
    http_server.route(url).data = new
    assert manager.cached_path(url, sha256=sha256(new)).read_bytes() == new
    assert http_server.route(url).gets == 2


def test_force_refetches(http_server: FaultServer, manager: DownloadManager) -> None:
    url = http_server.add("/force/data.bin", b"one")
    manager.cached_path(url)
    http_server.route(url).data = b"two"
    assert manager.cached_path(url).read_bytes() == b"one"
    assert manager.cached_path(url, force=True).read_bytes() == b"two"


def test_redirect_to_file_scheme_is_refused(
    http_server: FaultServer, manager: DownloadManager, cache: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    url = http_server.add("/redirect/file", b"", redirect=secret.as_uri())
    with pytest.raises(DownloadError, match="refusing a redirect") as info:
        manager.cached_path(url)
    assert info.value.url == url
    assert not Entry(cache, url).final.exists()


def test_redirect_within_http_is_followed(
    http_server: FaultServer, manager: DownloadManager, payload: bytes
) -> None:
    target = http_server.add("/redirect/target.bin", payload)
    url = http_server.add("/redirect/source.bin", b"", redirect=target)
    assert manager.cached_path(url).read_bytes() == payload


def test_https_to_http_redirect_is_refused() -> None:
    from framework_plugins.http import HttpBackend

    response = requests.Response()
    response.status_code = 302
    response.url = "https://example.org/a"
    response.headers["Location"] = "http://example.org/a"
    with pytest.raises(requests.exceptions.RequestException, match="refusing a redirect"):
        HttpBackend().session.get_redirect_target(response)
    response.headers["Location"] = "https://mirror.example.org/a"
    assert HttpBackend().session.get_redirect_target(response) == "https://mirror.example.org/a"


def test_disk_full_gives_clear_error_and_leaves_no_temp_file(
    http_server: FaultServer,
    manager: DownloadManager,
    cache: Path,
    payload: bytes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = http_server.add("/full/data.bin", os.urandom(4 << 20))
    written = []

    def writev(fd: int, buffers: Any) -> int:
        if written:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written.append(len(buffers))
        return os.writev(fd, buffers)

    monkeypatch.setattr(_pipeline, "_writev", writev)
    with pytest.raises(DownloadError, match="no room on the device") as info:
        manager.cached_path(url)
    assert isinstance(info.value.__cause__, OSError)
    assert "free some space" in str(info.value) and "writable" not in str(info.value)  # not a permission
    assert not Entry(cache, url).final.exists()
    assert stray_files(cache) == []


def _orphan(cache: Path, url: str, data: bytes, etag: str, host: str = "", pid: int = 999_999) -> Path:
    """A partial file left by a process (by default a dead one: pid 999999 is not running)."""
    final = Entry(cache, url).final
    cache.mkdir(parents=True, exist_ok=True)
    token = unique_token().split(".")
    token[0] = host or token[0]
    token[1] = str(pid)
    part = PartialName(final, _etag_tag(etag), ".".join(token)).path
    part.parent.mkdir(exist_ok=True)
    part.write_bytes(data)
    return part


@pytest.mark.parametrize(
    ("mode", "expect_ranges"),
    [("honor", ["bytes=400000-"]), ("ignore", ["bytes=400000-"]), ("416", ["bytes=400000-", ""])],
)
def test_orphan_partial_is_adopted_and_range_answers_handled(
    http_server: FaultServer,
    manager: DownloadManager,
    cache: Path,
    payload: bytes,
    mode: str,
    expect_ranges: list[str],
) -> None:
    url = http_server.add(f"/orphan/{mode}.bin", payload, range_mode=mode)
    _orphan(cache, url, payload[:400_000], http_server.route(url).etag or "")
    path = manager.cached_path(url, sha256=sha256(payload))
    assert path.read_bytes() == payload
    assert http_server.route(url).ranges == expect_ranges
    assert stray_files(cache) == []


@pytest.mark.parametrize(
    ("host", "pid", "age", "adopted"),
    [
        # A live writer on this host: never taken (our parent; a partial of this very
        # process that no call is writing is left over from Ctrl-C, and is taken).
        ("", os.getppid(), 0, False),
        ("", 999_999, 0, True),  # a dead writer on this host
        ("elsewhere", 1, 0, False),  # another host, recently written: maybe alive
        ("elsewhere", 1, 3600, True),  # another host, untouched for an hour: orphaned
    ],
)
def test_only_orphaned_partials_are_adopted(
    http_server: FaultServer,
    manager: DownloadManager,
    cache: Path,
    payload: bytes,
    host: str,
    pid: int,
    age: int,
    adopted: bool,
) -> None:
    url = http_server.add(f"/adopt/{host}{pid}{age}.bin", payload)
    part = _orphan(cache, url, payload[:5000], http_server.route(url).etag or "", host, pid)
    past = time.time() - age
    os.utime(part, (past, past))
    assert manager.cached_path(url).read_bytes() == payload
    assert http_server.route(url).ranges == (["bytes=5000-"] if adopted else [""])
    assert part.exists() is not adopted


def test_temp_files_of_dead_processes_are_swept(
    http_server: FaultServer, manager: DownloadManager, cache: Path, payload: bytes
) -> None:
    url = http_server.add("/sweep/data.bin", payload)
    stale = _orphan(cache, url, b"{", "x")
    sidecar_temp = stale.with_name(stale.name.replace(".part", ".tmp"))
    stale.rename(sidecar_temp)
    assert stray_files(cache) == [f"{sidecar_temp.parent.name}/{sidecar_temp.name}"]
    manager.cached_path(url)
    assert stray_files(cache) == []


def test_complete_orphan_answered_416_needs_no_body(
    http_server: FaultServer, manager: DownloadManager, cache: Path, payload: bytes
) -> None:
    url = http_server.add("/orphan/complete.bin", payload)
    _orphan(cache, url, payload, http_server.route(url).etag or "")
    assert manager.cached_path(url, sha256=sha256(payload)).read_bytes() == payload
    assert http_server.route(url).ranges == [f"bytes={len(payload)}-"]
    assert http_server.route(url).full_gets == 0


def test_orphan_of_changed_object_is_discarded(
    http_server: FaultServer, manager: DownloadManager, cache: Path, payload: bytes
) -> None:
    url = http_server.add("/orphan/changed.bin", payload)
    _orphan(cache, url, b"old bytes of an older version", '"an-old-etag"')
    assert manager.cached_path(url, sha256=sha256(payload)).read_bytes() == payload
    assert http_server.route(url).full_gets == 1


def test_offline_serves_cache_and_opens_no_socket(
    http_server: FaultServer,
    manager: DownloadManager,
    cache: Path,
    payload: bytes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cached = http_server.add("/offline/cached.bin", payload)
    missing = http_server.add("/offline/missing.bin", payload)
    path = manager.cached_path(cached)

    def no_socket(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("offline mode opened a socket")

    monkeypatch.setattr(socket.socket, "connect", no_socket)
    monkeypatch.setenv("FRAMEWORK_OFFLINE", "1")
    assert cached_path(cached, cache_dir=cache) == path
    with pytest.raises(OfflineError, match="FRAMEWORK_OFFLINE") as info:
        cached_path(missing, cache_dir=cache)
    assert info.value.url == missing
    with pytest.raises(OfflineError):
        cached_path(cached, cache_dir=cache, force=True)
    assert http_server.route(missing).gets == 0


def test_read_only_cache_still_serves_a_hit(
    http_server: FaultServer,
    manager: DownloadManager,
    cache: Path,
    payload: bytes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = http_server.add("/readonly/data.bin", payload)
    path = manager.cached_path(url)
    for item in cache.iterdir():
        item.chmod(0o444)
    cache.chmod(0o555)
    # Root ignores permission bits, so refuse every write here too.
    real_open = os.open

    def read_only_open(file: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise PermissionError(errno.EROFS, "read-only file system", str(file))
        return real_open(file, flags, *args, **kwargs)

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise PermissionError(errno.EROFS, "read-only file system")

    monkeypatch.setattr(os, "open", read_only_open)
    for name in ("replace", "rename", "mkdir", "unlink"):
        monkeypatch.setattr(os, name, refuse)
    try:
        assert manager.cached_path(url) == path
        assert DownloadManager(cache, offline=True).cached_path(url) == path
    finally:
        monkeypatch.undo()
        cache.chmod(0o755)


def test_connection_refused_is_a_network_error(cache: Path) -> None:
    with socket.socket() as probe:  # a port with nobody listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    manager = DownloadManager(cache, retries=2, backoff_factor=0.01, progress=False)
    url = f"http://127.0.0.1:{port}/nothing.bin"
    with pytest.raises(NetworkError) as info:
        manager.cached_path(url)
    assert info.value.url == url and "retries" in str(info.value)
    assert stray_files(cache) == []


def test_unwritable_cache_folder_says_so(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = http_server.add("/unwritable/data.bin", b"x")

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise PermissionError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "mkdir", refuse)
    with pytest.raises(DownloadError, match=r"cannot create the cache folder .*FRAMEWORK_CACHE"):
        DownloadManager(tmp_path / "new-cache", progress=False).cached_path(url)
    assert http_server.route(url).gets == 0


def test_revalidate_asks_once_and_refetches_only_a_changed_object(
    http_server: FaultServer, manager: DownloadManager, payload: bytes
) -> None:
    url = http_server.add("/revalidate/data.bin", payload)
    path = manager.cached_path(url)
    assert manager.cached_path(url, revalidate=True) == path
    assert http_server.route(url).gets == 1 and http_server.route(url).heads == 1
    route = http_server.route(url)
    route.data, route.etag = b"new version", '"v2"'
    assert manager.cached_path(url).read_bytes() == payload  # no revalidation: the cache
    assert manager.cached_path(url, revalidate=True).read_bytes() == b"new version"
    assert route.gets == 2


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "value",
    [
        "-5",
        "1.5",
        "soon",
        "Wed, 21 Oct 2015 07:28:00 GMT",  # in the past: at once
        "Fri, 31 Dec 99999 23:59:59 GMT",  # ValueError in urllib3
        "Fri, 31 Dec 9999999999999 23:59:59 GMT",  # OverflowError in urllib3
    ],
)
def test_an_unreadable_retry_after_is_waited_out_with_the_backoff(
    http_server: FaultServer, tmp_path: Path, value: str
) -> None:
    """A 503 whose Retry-After is no delay-seconds nor an HTTP-date (negative, a fraction,
    a word; common in the wild) is retried with the backoff, as one without the header.
    urllib3 raised InvalidHeader from its retry sleep, which the backend turned into an
    InvalidArgumentError ("not a usable HTTP request"): no retry, the URL blamed, and a
    partial file removed as for a final error."""
    data = os.urandom(1000)
    url = http_server.add(unique_path("retry-after"), data, fail_statuses=[503, 503], retry_after=value)
    manager = parts_manager(tmp_path, connections=1, retries=3)
    assert manager.cached_path(url).read_bytes() == data
    assert http_server.route(url).gets == 3


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "value", ["soon", "Fri, 31 Dec 99999 23:59:59 GMT", "Fri, 31 Dec 9999999999999 23:59:59 GMT"]
)
def test_a_refused_part_with_an_unreadable_retry_after_is_an_http_status(
    http_server: FaultServer, value: str
) -> None:
    """A part request (refusals handed back at once) answered 503 with a Retry-After
    that cannot be read is an `HTTPStatusError` without a delay (the backoff applies),
    never a raw OverflowError from reading the header."""
    url = http_server.add(
        unique_path("part-retry-after"), os.urandom(1000), fail_statuses=[503], retry_after=value
    )
    with HttpBackend(retries=2, backoff_factor=0.01) as backend, pytest.raises(HTTPStatusError) as info:
        backend.open(url, 0, end=10, refusals_at_once=True)
    assert info.value.status == 503 and info.value.retry_after is None


# -- dependency floors -------------------------------------------------------------------


def _declared_floor(package: str) -> tuple[int, ...]:
    import configparser

    config = configparser.ConfigParser()
    config.read(Path(__file__).resolve().parents[2] / "setup.cfg")
    for line in config["options"]["install_requires"].split():
        name, _, floor = line.partition(">=")
        if name == package:
            return tuple(int(part) for part in floor.split("."))
    raise AssertionError(f"{package} is not in install_requires")


@pytest.mark.timeout(60)
def test_declared_urllib3_floor_has_read1() -> None:
    # HttpBackend reads bodies with `raw.read1`, which urllib3 has only since 2.2.
    assert _declared_floor("urllib3") >= (2, 2)
