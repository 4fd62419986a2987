"""Fixtures for the download tests: the fault-injecting HTTP server and moto's S3 server,
both real servers on 127.0.0.1."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from framework.download import DownloadManager, _partial
from tests.support.download import FaultServer, serving


@pytest.fixture(autouse=True)
def _booted_a_day_ago(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine booted at least a day ago, as far as this process's download manager
    knows: the tests date files back minutes or an hour to make them stale, and on a
    machine up for less those would rightly count as written before a crash ("lost in
    a reboot") and never be adopted. Tests of that rule read `_partial.boot_time()`."""
    booted = _partial.boot_time()
    day_ago = time.time() - 86_400
    monkeypatch.setattr(_partial, "boot_time", lambda: day_ago if booted is None else min(booted, day_ago))


@pytest.fixture(scope="session")
def http_server() -> Iterator[FaultServer]:
    with serving(FaultServer()) as server:
        yield server


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def manager(cache: Path) -> DownloadManager:
    """A manager with a short backoff so fault tests stay fast; one stream per object (the
    parallel path has its own tests, in test_parallel_fetch.py)."""
    return DownloadManager(cache, backoff_factor=0.01, progress=False, lock_timeout=20, connections=1)


@pytest.fixture
def payload() -> bytes:
    return os.urandom(1 << 20) + b"tail"


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    pytest.importorskip("boto3")
    moto_server = pytest.importorskip("moto.server")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_env(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return s3_server


@pytest.fixture(scope="session")
def listed_bucket(s3_server: str) -> Iterator[tuple[str, dict[str, str]]]:
    """A bucket with 210 objects under train/ (more than 4 pages of 50 keys), two under
    train/sub/ and one under valid/; yields its name and each key's ETag as PutObject
    answered it. The body of each object is its key."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=s3_server,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    bucket = f"listing-{os.getpid()}-{os.urandom(3).hex()}"
    client.create_bucket(Bucket=bucket)
    keys = [f"train/part-{index:05d}.jsonl.gz" for index in range(210)]
    keys += ["train/sub/a.jsonl.gz", "train/sub/b.jsonl.gz", "valid/part-00000.jsonl.gz"]
    etags = {key: client.put_object(Bucket=bucket, Key=key, Body=key.encode())["ETag"] for key in keys}
    yield bucket, etags


@pytest.fixture
def list_calls(s3_env: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The prefixes of the ListObjectsV2 calls the S3 backend sends, 50 keys a page."""
    from framework_plugins.s3 import S3Backend

    monkeypatch.setattr(S3Backend, "list_page_size", 50)
    calls: list[str] = []

    def count(params: dict[str, Any], **_: Any) -> None:
        calls.append(params["Prefix"])

    events = S3Backend().client.meta.events
    events.register("before-parameter-build.s3.ListObjectsV2", count)
    yield calls
    events.unregister("before-parameter-build.s3.ListObjectsV2", count)
