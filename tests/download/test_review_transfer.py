"""Hostile review of the parallel fetch, the S3 client reuse and the pipelined cluster
fetch: each test is a promise of the docs, attacked at real parts (the fault server on
127.0.0.1, real processes)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.support.download import (
    PART,
    SLOW,
    FaultServer,
    parts_manager,
    refusal_before_the_second_start,
    unique_path,
)

pytestmark = pytest.mark.timeout(60)


def _access_key_sent(headers: dict[str, str]) -> str:
    authorization = headers.get("Authorization", "")
    return authorization.split("Credential=", 1)[1].split("/", 1)[0] if "Credential=" in authorization else ""


def test_s3_keys_set_in_the_environment_later_are_the_ones_sent(
    http_server: FaultServer, monkeypatch: pytest.MonkeyPatch, fresh_s3_clients: Any
) -> None:
    """Credentials come from boto3's chain, the environment first: keys rotated there
    (a notebook that sets them after a `NoCredentialsError`, a job refreshing a session
    token) sign the next call, not the keys a process-wide client read first."""
    from framework_plugins.s3 import S3Backend

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    data = os.urandom(1000)
    http_server.add("/bucket/rotated.bin", data)
    route = http_server.routes["/bucket/rotated.bin"]
    sent = []
    for key in ("FIRSTKEY", "SECONDKEY"):
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key.lower())
        backend = S3Backend(endpoint_url=http_server.base, retries=1)
        with backend.open("s3://bucket/rotated.bin") as stream:
            assert b"".join(stream.chunks) == data
        sent.append(_access_key_sent(route.headers[-1]))
    assert sent == ["FIRSTKEY", "SECONDKEY"]


@pytest.fixture
def fresh_s3_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    """No boto3 client kept from another test."""
    pytest.importorskip("boto3")
    from framework_plugins import s3

    monkeypatch.setattr(s3, "_CLIENTS", {})


def test_an_s3_refusal_with_a_retry_after_date_is_waited_as_asked(
    http_server: FaultServer, monkeypatch: pytest.MonkeyPatch, fresh_s3_clients: Any
) -> None:
    """Retry-After is delay-seconds or an HTTP-date (RFC 9110 10.2.3); a refused part
    waits what the server asked, as over HTTP, not the backoff: a date 30 s ahead is
    about 30 s (never more than 60), a date in the past is no wait."""
    from email.utils import formatdate

    from framework_plugins.s3 import S3Backend

    from framework.download.backend import refusals_at_once
    from framework.errors import HTTPStatusError

    for name, value in (
        ("AWS_ACCESS_KEY_ID", "t"),
        ("AWS_SECRET_ACCESS_KEY", "t"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)
    http_server.add("/bucket/dated.bin", os.urandom(1000))
    route = http_server.routes["/bucket/dated.bin"]
    backend = S3Backend(endpoint_url=http_server.base, retries=3)
    waits = []
    for ahead in (30, -3600):
        route.fail_statuses, route.retry_after = [503], formatdate(time.time() + ahead, usegmt=True)
        with refusals_at_once(), pytest.raises(HTTPStatusError) as caught:
            backend.open("s3://bucket/dated.bin", 0, end=100)
        waits.append(caught.value.retry_after)
    assert waits[0] is not None and 20 <= waits[0] <= 31
    assert waits[1] == 0.0


def _one_refusal_while_opening(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, connections: Optional[int]
) -> int:
    """Fetch 32 parts at a paced server that refuses one request once (503, Retry-After:
    0): the first new connection's, before the others of its step are started. The
    most bodies in flight at once."""
    monkeypatch.delenv("FRAMEWORK_CONNECTIONS", raising=False)
    refused = refusal_before_the_second_start(monkeypatch)
    data = os.urandom(32 * PART)
    url = http_server.add(
        unique_path("blip"), data, swap_at_get=2, then={"fail_statuses": [503]}, retry_after="0", **SLOW
    )
    assert parts_manager(tmp_path, connections=connections).cached_path(url).read_bytes() == data
    route = http_server.route(url)
    assert refused.is_set() and route.gets == 32 + 1  # every part once, and the one refusal
    return route.max_in_flight


def test_a_chosen_count_is_kept_after_one_refusal_while_it_opens(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """connections=8: "opens N connections ... and keeps them (fewer only if the server
    refuses them)". One request is refused once while the eight are being opened, and
    nothing after: the count stays eight, not the few that were open at that moment
    (the ones started after it were never refused)."""
    assert _one_refusal_while_opening(http_server, tmp_path, monkeypatch, 8) >= 8


def test_the_ramp_keeps_a_step_after_one_refusal_while_it_opens(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default ramp: "No connection is added while the server refuses". A step of
    the ramp (16 for this paced object) opening as one request is refused once, and
    nothing after: once the refused connection is answered the ramp grows again, not
    kept to the two that ran at the refusal."""
    assert _one_refusal_while_opening(http_server, tmp_path, monkeypatch, None) >= 8
