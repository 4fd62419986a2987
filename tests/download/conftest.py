"""Fixtures for the download tests: the fault-injecting HTTP server and moto's S3 server,
both real servers on 127.0.0.1."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from framework.download import DownloadManager
from tests.support.download import FaultServer, serving


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
