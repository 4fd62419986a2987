"""A steady `ReadPace` reads a window of bytes at a time: a link that is slow, stalls
or breaks loses at most the read under way. Counted: where the manager resumes (the
second request's Range), i.e. how many received bytes a break threw away."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from framework.download import DownloadManager
from framework.download.backend import ReadPace
from tests.support.download import FaultServer, unique_path

KIB = 1 << 10


# A server sends 48 KiB in three 16 KiB pieces, then stalls past the read timeout: the
# bytes of earlier reads are kept, the read under way (at most LEAST here) is lost.
@pytest.mark.timeout(60)
def test_bytes_that_came_before_a_stall_are_kept_when_the_read_times_out(
    http_server: FaultServer, tmp_path: Path
) -> None:
    data = os.urandom(256 * KIB)
    before_stall = 48 * KIB
    url = http_server.add(
        unique_path("stall-timeout"), data, chunk=16 * KIB, delay=0.05, stall_after=before_stall, stall_s=3.0
    )
    route = http_server.route(url)
    try:
        with DownloadManager(
            tmp_path, connections=1, progress=False, timeout=1.0, backoff_factor=0
        ) as manager:
            assert manager.cached_path(url).read_bytes() == data
    finally:
        route.released.set()
    assert len(route.ranges) == 2, route.ranges
    resumed_at = int(route.ranges[1].split("=")[1].rstrip("-"))
    assert 0 < resumed_at <= before_stall, route.ranges  # the first read is kept
    assert before_stall - resumed_at <= ReadPace.LEAST, route.ranges


# A slow link (4 KiB every 50 ms) reset after 60 KiB: a read there is LEAST, which is
# all a break may lose.
@pytest.mark.timeout(60)
def test_a_break_on_a_slow_link_loses_about_a_window_of_traffic(
    http_server: FaultServer, tmp_path: Path
) -> None:
    data = os.urandom(96 * KIB)
    piece, cut = 4 * KIB, 60 * KIB
    url = http_server.add(
        unique_path("slow-reset"), data, chunk=piece, delay=0.05, drop_after=cut, drops=1, drop_kind="reset"
    )
    route = http_server.route(url)
    with DownloadManager(tmp_path, connections=1, progress=False, backoff_factor=0) as manager:
        assert manager.cached_path(url).read_bytes() == data
    assert len(route.ranges) == 2, route.ranges
    resumed_at = int(route.ranges[1].split("=")[1].rstrip("-"))
    assert 0 < resumed_at <= cut and cut - resumed_at <= ReadPace.LEAST, route.ranges


# Steady reads of bodies without a Content-Length, or
# decoded, broken off on a slow link, are resumed or restarted to the right bytes.
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("body", "kind"),
    # A close-delimited 200 closed cleanly is, by HTTP, a whole body: not a case here.
    [
        ("chunked", "reset"),
        ("chunked", "short"),
        ("close_delimited", "reset"),
        ("gzip_whole", "reset"),
        ("gzip_whole", "short"),
    ],
)
def test_a_steady_body_of_any_framing_broken_off_comes_whole(
    http_server: FaultServer, tmp_path: Path, body: str, kind: str
) -> None:
    data = os.urandom(200 * KIB)
    url = http_server.add(
        unique_path(f"steady-{body}-{kind}"),
        data,
        chunk=16 * KIB,
        delay=0.005,
        drop_after=100 * KIB + 123,
        drops=1,
        drop_kind=kind,
        **{body: True},
    )
    with DownloadManager(tmp_path, connections=1, progress=False, backoff_factor=0) as manager:
        assert manager.cached_path(url).read_bytes() == data
    assert http_server.route(url).gets == 2


# A steady S3 body cut short (a clean close) hands over every byte that came, then
# raises; nothing past the cut, nothing lost.
@pytest.mark.timeout(60)
def test_a_steady_s3_body_cut_short_keeps_what_came(s3_env: str) -> None:
    import uuid

    import boto3
    from framework_plugins.s3 import S3Backend

    from framework.errors import NetworkError
    from tests.support.download import PacedProxy

    bucket = f"review-{uuid.uuid4().hex[:8]}"
    client = boto3.client("s3", endpoint_url=s3_env)
    client.create_bucket(Bucket=bucket)
    data = os.urandom(1 << 20)
    client.put_object(Bucket=bucket, Key="cut.bin", Body=data)
    cut = 600_000
    with PacedProxy(int(s3_env.rsplit(":", 1)[1]), chunk=16 * KIB, delay=0.002, cut_after=cut) as proxy:
        backend = S3Backend(endpoint_url=proxy.url, retries=0)
        got = bytearray()
        with pytest.raises(NetworkError, match="broke off"):
            with backend.open(f"s3://{bucket}/cut.bin", 0, end=len(data) - 1) as stream:
                stream.steady()
                for chunk in stream.chunks:
                    got += chunk
        backend.close()
    assert data.startswith(bytes(got))
    assert len(got) > cut - 4 * KIB  # all but the answer's headers
