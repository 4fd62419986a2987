"""The download benchmarks' proxy (``benchmarks/rig.py``): its connection limit answers
as the matrix's servers are meant to, and it counts what it saw."""

from __future__ import annotations

import http.client
import importlib.util
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def load_rig() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_rig", REPO_ROOT / "benchmarks" / "rig.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[tuple[ModuleType, int, Any]]:
    """A proxy allowing one connection (429, Retry-After: 1, S3's XML beyond it) in front
    of the HTTP origin serving `tmp_path`; yields (rig, the proxy's port, its counters)."""
    rig = load_rig()
    (tmp_path / "f").write_bytes(b"x" * 1000)
    origin, listen = rig.free_port(), rig.free_port()
    counters = rig.FORK.Array("i", 3, lock=False)
    link = rig.Link(max_connections=1, refuse_status=429, retry_after_s=1, s3=True)
    processes = [
        rig.FORK.Process(target=rig.serve_http, args=(str(tmp_path), origin), daemon=True),
        rig.FORK.Process(target=rig.proxy, args=(listen, origin, link, counters), daemon=True),
    ]
    for process in processes:
        process.start()
    try:
        rig.wait_port(origin)
        rig.wait_port(listen)
        yield rig, listen, counters
    finally:
        for process in processes:
            process.kill()
            process.join()


def raw_answer(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(request)
        answer = b""
        while data := connection.recv(65536):
            answer += data
    return answer


@pytest.mark.timeout(30)
def test_a_connection_beyond_the_limit_is_refused_as_s3_throttles(
    limited: tuple[ModuleType, int, Any],
) -> None:
    rig, port, counters = limited
    for _ in range(100):  # until wait_port's probe connection is gone
        first = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        first.request("GET", "/f")
        answer = first.getresponse()
        if answer.status == 200:
            break
        first.close()
        time.sleep(0.01)
    assert answer.read() == b"x" * 1000  # the connection stays open
    requests, refusals = counters[rig.REQUESTS], counters[rig.REFUSED]

    refused = raw_answer(port, b"GET /f HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _, body = refused.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 429 Too Many Requests\r\n")
    assert b"\r\nRetry-After: 1" in head and b"\r\nConnection: close" in head
    assert b"<Code>SlowDown</Code>" in body
    assert raw_answer(port, b"HEAD /f HTTP/1.1\r\nHost: x\r\n\r\n").endswith(b"\r\n\r\n")  # no body
    assert counters[rig.OPEN] == 1
    assert (counters[rig.REQUESTS] - requests, counters[rig.REFUSED] - refusals) == (0, 2)

    first.close()
    deadline = time.monotonic() + 10
    while counters[rig.OPEN] and time.monotonic() < deadline:
        time.sleep(0.01)
    again = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    again.request("GET", "/f")
    assert again.getresponse().status == 200
    again.close()
    assert (counters[rig.REQUESTS] - requests, counters[rig.REFUSED] - refusals) == (1, 2)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("head", [True, False])
def test_the_proxy_counts_the_bytes_it_sends_back_and_head_is_answered_when_asked(
    tmp_path: Path, head: bool
) -> None:
    rig = load_rig()
    (tmp_path / "f").write_bytes(b"x" * 100_000)
    origin, listen = rig.free_port(), rig.free_port()
    counters = rig.FORK.Array("q", 4, lock=False)
    processes = [
        rig.FORK.Process(target=rig.serve_http, args=(str(tmp_path), origin, head), daemon=True),
        rig.FORK.Process(target=rig.proxy, args=(listen, origin, rig.Link(), counters), daemon=True),
    ]
    for process in processes:
        process.start()
    try:
        rig.wait_port(origin)
        rig.wait_port(listen)
        answer = raw_answer(listen, b"GET /f HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert answer.endswith(b"x" * 100_000)
        assert counters[rig.BYTES] == len(answer)
        asked = raw_answer(origin, b"HEAD /f HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        if head:
            assert asked.startswith(b"HTTP/1.1 200 ") and b"\r\nContent-Length: 100000\r\n" in asked
            assert asked.endswith(b"\r\n\r\n")  # no body
        else:
            assert asked.startswith(b"HTTP/1.1 501 ")
    finally:
        for process in processes:
            process.kill()
            process.join()
