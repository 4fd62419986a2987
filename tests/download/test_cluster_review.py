"""Regression tests from a hostile review of ``cached_path(..., distributed=True)``.

Real gloo groups of 2 processes (`cluster_rank.py`), the counting HTTP server of this
test process, short group timeouts; or one rank of a real gloo group in this process.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from dl_helpers import FaultServer, stray_files
from test_cluster_fetch import run_group

pytestmark = pytest.mark.timeout(60)


def test_a_rank_passing_no_url_fails_every_rank_alike_at_once(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """One node's ``os.environ.get("DATA_URL")`` is None: that rank must not leave the
    call before its first collective (the others would wait for the group's timeout, or
    see "the process group failed"); every rank raises the same InvalidArgumentError."""
    url = http_server.add("/review/no-url.bin", os.urandom(1000))
    caches = [tmp_path / "node0", tmp_path / "node1"]
    results = run_group(tmp_path, url, caches, per_rank={"1": {"url": None}}, pg_timeout=20, timeout=50)
    assert [r.get("error") for r in results] == ["InvalidArgumentError"] * 2, results
    assert len({r["message"] for r in results}) == 1, results
    assert "rank 1" in results[0]["message"] and "NoneType" in results[0]["message"], results
    assert http_server.route(url).gets == 0
    for cache in caches:
        assert stray_files(cache) == []

