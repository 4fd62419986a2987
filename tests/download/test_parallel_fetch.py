"""Parallel fetch: byte-range parts over several connections, against the real test HTTP
server and moto's S3 server, with real processes for kills and races."""

from __future__ import annotations

import hashlib
import os
import signal
import uuid
from pathlib import Path
from typing import Any, Optional

import pytest
from dl_helpers import FORK, FaultServer, sha256, stray_files, wait_for

from framework.download import DownloadManager
from framework.errors import ChecksumError

pytestmark = pytest.mark.timeout(60)

PART = 256 * 1024


def _manager(cache: Path, connections: Optional[int] = 4, **options: Any) -> DownloadManager:
    options.setdefault("lock_timeout", 20)
    return DownloadManager(
        cache, connections=connections, part_size=PART, backoff_factor=0.01, progress=False, **options
    )


def _data(parts: float) -> bytes:
    return os.urandom(int(PART * parts))


def _path(name: str) -> str:
    return f"/{name}-{uuid.uuid4().hex[:8]}.bin"


def test_large_object_comes_over_several_connections(http_server: FaultServer, tmp_path: Path) -> None:
    data = _data(12.5)
    url = http_server.add(_path("large"), data, delay=0.002)
    path = _manager(tmp_path).cached_path(url)
    route = http_server.route(url)
    assert path.read_bytes() == data
    assert route.max_in_flight >= 2  # parts overlapped
    assert route.gets == 13  # one request per part, no more
    assert route.body_bytes == len(data)  # one copy of traffic
    assert route.ranges[0] == f"bytes=0-{PART - 1}"
    etag = route.etag or ""
    assert route.if_ranges[1:] == [etag] * 12  # every later part names the first answer's version
    assert stray_files(tmp_path) == []
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".parts")]


def test_small_object_takes_one_request(http_server: FaultServer, tmp_path: Path) -> None:
    data = _data(0.7)
    url = http_server.add(_path("small"), data)
    assert _manager(tmp_path).cached_path(url).read_bytes() == data
    assert http_server.route(url).gets == 1


def test_one_connection_is_one_stream(http_server: FaultServer, tmp_path: Path) -> None:
    data = _data(6)
    url = http_server.add(_path("single"), data)
    assert _manager(tmp_path, connections=1).cached_path(url).read_bytes() == data
    route = http_server.route(url)
    assert (route.gets, route.ranges) == (1, [""])  # today's path: no Range at all


def test_connections_from_the_environment(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _data(6)
    url = http_server.add(_path("env"), data)
    monkeypatch.delenv("FRAMEWORK_CONNECTIONS", raising=False)
    manager = _manager(tmp_path, connections=None)
    assert manager.connections == 1  # the default: one stream until an adaptive default lands
    monkeypatch.setenv("FRAMEWORK_CONNECTIONS", "3")
    assert manager.connections == 3
    assert manager.cached_path(url).read_bytes() == data
    assert http_server.route(url).gets > 1
    monkeypatch.setenv("FRAMEWORK_CONNECTIONS", "many")
    with pytest.raises(ValueError, match=r"FRAMEWORK_CONNECTIONS must be a whole number.*'many'"):
        _ = manager.connections
    with pytest.raises(
        ValueError, match=r"connections must be a whole number of at least 1 \(1 = one stream\), got 0"
    ):
        DownloadManager(tmp_path, connections=0)


def test_range_ignoring_server_costs_one_copy(http_server: FaultServer, tmp_path: Path) -> None:
    data = _data(10)
    url = http_server.add(_path("ignore"), data, range_mode="ignore")
    assert _manager(tmp_path).cached_path(url).read_bytes() == data
    route = http_server.route(url)
    assert route.gets == 1
    assert route.body_bytes == len(data)


def test_object_without_strong_validator_is_one_stream(http_server: FaultServer, tmp_path: Path) -> None:
    data = _data(6)
    url = http_server.add(_path("weak"), data, etag='W/"weak"')
    assert _manager(tmp_path).cached_path(url).read_bytes() == data
    route = http_server.route(url)
    assert route.max_in_flight == 1  # parts of a version nothing vouches for are never combined
    assert route.if_ranges.count('W/"weak"') == 0


@pytest.mark.parametrize("validator", ["etag", "last_modified"])
def test_swap_mid_fetch_never_publishes_a_mix(
    http_server: FaultServer, tmp_path: Path, validator: str
) -> None:
    old, new = _data(8), _data(8)
    if validator == "etag":
        options: dict[str, Any] = {"etag": '"old"', "then": {"data": new, "etag": '"new"'}}
    else:
        options = {
            "etag": None,
            "last_modified": "Mon, 02 Jan 2023 00:00:00 GMT",
            "then": {"data": new, "last_modified": "Tue, 03 Jan 2023 00:00:00 GMT"},
        }
    url = http_server.add(_path("swap"), old, swap_at_get=4, delay=0.001, **options)
    path = _manager(tmp_path).cached_path(url)
    assert sha256(path.read_bytes()) == sha256(new)  # the new version, whole; never a mix
    assert stray_files(tmp_path) == []


def test_wrong_sha256_publishes_nothing(http_server: FaultServer, tmp_path: Path) -> None:
    data = _data(6)
    url = http_server.add(_path("sha"), data)
    with pytest.raises(ChecksumError):
        _manager(tmp_path).cached_path(url, sha256="0" * 64)
    assert stray_files(tmp_path) == []
    assert not [n for n in os.listdir(tmp_path) if n.endswith((".parts", ".bin"))]
    assert _manager(tmp_path).cached_path(url, sha256=sha256(data)).read_bytes() == data


def _fetch_child(url: str, cache: str) -> None:
    _manager(Path(cache)).cached_path(url)


def _parts_done(cache: Path) -> int:
    for name in os.listdir(cache) if cache.exists() else []:
        if name.endswith(".parts"):
            try:
                import json

                return len(json.loads((cache / name).read_text())["done"])
            except (OSError, ValueError):
                return 0
    return 0


def test_kill_half_way_then_resume_fetches_the_other_half(http_server: FaultServer, tmp_path: Path) -> None:
    data = _data(16)
    url = http_server.add(_path("kill"), data, delay=0.02)
    child = FORK.Process(target=_fetch_child, args=(url, str(tmp_path)))
    child.start()
    try:
        wait_for(lambda: _parts_done(tmp_path) >= 8, what="half of the parts recorded")
        os.kill(child.pid or 0, signal.SIGKILL)
    finally:
        child.join(10)
    done = _parts_done(tmp_path)
    assert 8 <= done < 16
    route = http_server.route(url)
    route.body_bytes, route.delay = 0, 0.0
    path = _manager(tmp_path).cached_path(url)
    assert path.read_bytes() == data
    missing = (16 - done) * PART
    # only the unfinished parts come again (those in flight at the kill were unfinished)
    assert missing <= route.body_bytes <= missing + PART
    assert stray_files(tmp_path) == []


def test_resume_of_another_version_starts_over(http_server: FaultServer, tmp_path: Path) -> None:
    old, new = _data(8), _data(8)
    url = http_server.add(_path("resume-swap"), old, etag='"v1"', delay=0.02)
    child = FORK.Process(target=_fetch_child, args=(url, str(tmp_path)))
    child.start()
    try:
        wait_for(lambda: _parts_done(tmp_path) >= 3, what="some parts recorded")
        os.kill(child.pid or 0, signal.SIGKILL)
    finally:
        child.join(10)
    assert 3 <= _parts_done(tmp_path) < 8  # killed before it was complete
    route = http_server.route(url)
    route.data, route.etag, route.delay = new, '"v2"', 0.0
    assert _manager(tmp_path).cached_path(url).read_bytes() == new
    assert stray_files(tmp_path) == []


def _race_child(url: str, cache: str, results: Any, lock: str = "filelock") -> None:
    try:
        path = _manager(Path(cache), lock=lock).cached_path(url)
        results.put(hashlib.sha256(path.read_bytes()).hexdigest())
    except BaseException as error:
        results.put(repr(error))


def test_racing_processes_fetch_one_copy(http_server: FaultServer, tmp_path: Path) -> None:
    data = _data(12)
    url = http_server.add(_path("race"), data, delay=0.001)
    results = FORK.Queue()
    procs = [FORK.Process(target=_race_child, args=(url, str(tmp_path), results)) for _ in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(40)
    assert [results.get(timeout=5) for _ in procs] == [sha256(data)] * 4
    assert http_server.route(url).body_bytes == len(data)


def test_racing_processes_without_a_lock_each_publish_whole_bytes(
    http_server: FaultServer, tmp_path: Path
) -> None:
    data = _data(12)
    url = http_server.add(_path("race-nolock"), data, delay=0.001)
    results = FORK.Queue()
    procs = [FORK.Process(target=_race_child, args=(url, str(tmp_path), results, "none")) for _ in range(3)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(40)
    assert [results.get(timeout=5) for _ in procs] == [sha256(data)] * 3
    assert stray_files(tmp_path) == []


# --- S3 through moto's server ---------------------------------------------------------


@pytest.fixture
def bucket(s3_env: str) -> str:
    import boto3

    name = f"parallel-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_env).create_bucket(Bucket=name)
    return name


def _s3_backend(on_open: Any = None) -> Any:
    from framework_plugins.s3 import S3Backend

    class Counting(S3Backend):
        ends: list[Optional[int]] = []

        def open(
            self, url: str, offset: int = 0, *, if_range: Optional[str] = None, end: Optional[int] = None
        ) -> Any:
            self.ends.append(end)
            if on_open is not None:
                on_open(len(self.ends))
            return super().open(url, offset, if_range=if_range, end=end)

    return Counting(retries=2, backoff_factor=0.01)


def test_s3_parts_over_several_connections(bucket: str, s3_env: str, tmp_path: Path) -> None:
    import boto3

    data = _data(6.5)
    boto3.client("s3", endpoint_url=s3_env).put_object(Bucket=bucket, Key="big.bin", Body=data)
    backend = _s3_backend()
    path = _manager(tmp_path, backends={"s3": backend}).cached_path(f"s3://{bucket}/big.bin")
    assert path.read_bytes() == data
    assert len(backend.ends) == 7 and None not in backend.ends  # one ranged get per part


def test_s3_swap_mid_fetch_is_refused_by_if_match(bucket: str, s3_env: str, tmp_path: Path) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=s3_env)
    old, new = _data(6), _data(6)
    client.put_object(Bucket=bucket, Key="swap.bin", Body=old)

    def swap(opens: int) -> None:
        if opens == 3:
            client.put_object(Bucket=bucket, Key="swap.bin", Body=new)

    backend = _s3_backend(swap)
    path = _manager(tmp_path, connections=2, backends={"s3": backend}).cached_path(f"s3://{bucket}/swap.bin")
    assert sha256(path.read_bytes()) == sha256(new)
    assert stray_files(tmp_path) == []


def test_waiters_see_the_parts_arrive(http_server: FaultServer, tmp_path: Path) -> None:
    """The partial file is preallocated sparse: a waiter's view counts bytes written, not
    the file's length (which is the whole object from the start)."""
    from framework.download._cache import Entry
    from framework.download._publish import partial_bytes

    data = _data(16)
    url = http_server.add(_path("progress"), data, delay=0.01)
    child = FORK.Process(target=_fetch_child, args=(url, str(tmp_path)))
    child.start()
    final = Entry(tmp_path, url).final
    seen: list[int] = []
    try:
        wait_for(lambda: seen.append(partial_bytes(final)) or 0 < seen[-1], what="bytes of the holder")
        wait_for(lambda: final.exists(), what="the published file")
    finally:
        child.join(20)
    assert 0 < seen[-1] < len(data)
