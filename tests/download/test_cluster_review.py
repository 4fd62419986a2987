"""Regression tests from a hostile review of ``cached_path(..., distributed=True)``.

Real gloo groups of 2 processes (`cluster_rank.py`), the counting HTTP server of this
test process, short group timeouts; or one rank of a real gloo group in this process.
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from dl_helpers import FaultServer, sha256, stray_files
from test_cluster_fetch import run_calls, run_group

from framework.download import DownloadManager
from framework.download._cache import Entry

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


def test_the_transfer_uses_the_callers_current_cuda_device_not_the_step_threads(tmp_path: Path) -> None:
    """CUDA's current device is per host thread (``torch.cuda.set_device`` in the main
    thread is not seen by a new thread, which starts on device 0). With NCCL the bytes
    must travel on the device the caller set, or every rank of a node piles onto cuda:0
    (NCCL then fails on duplicate GPUs). Modelled here with a thread-local fake of
    ``current_device``, since this machine has no GPU."""
    import torch
    import torch.distributed as dist

    from framework.download._cluster import _Call

    local = threading.local()
    patches = [
        (torch.cuda, "is_available", lambda: True),
        (torch.cuda, "current_device", lambda: getattr(local, "device", 0)),
        (dist, "get_backend_config", lambda *args, **kwargs: "cpu:gloo,cuda:nccl"),
    ]
    source = tmp_path / "origin.bin"
    source.write_bytes(b"local bytes")
    dist.init_process_group(
        "gloo", init_method=(tmp_path / "store").as_uri(), rank=0, world_size=1, timeout=timedelta(seconds=10)
    )
    try:
        with pytest.MonkeyPatch.context() as monkeypatch:
            for target, name, value in patches:
                monkeypatch.setattr(target, name, value)
            local.device = 1  # the caller's torch.cuda.set_device(local_rank)
            call = _Call(DownloadManager(tmp_path / "cache", progress=False), str(source), None, None,
                         False, False, False, False)  # fmt: skip
            path: Any = call.run()
        assert Path(path).read_bytes() == b"local bytes"
        assert call.device == torch.device("cuda", 1)
    finally:
        dist.destroy_process_group()


def test_a_received_copy_keeps_its_versions_fetch_time_so_it_never_beats_a_newer_fetch(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """A server without Last-Modified: versions are dated by when they were fetched. A
    copy that arrived over the process group is as old as the sender's fetch, not the
    transfer: dated by the transfer, an older version sent later would beat a newer one
    fetched in between, and replace it."""
    path = "/review/dated.bin"
    older, newer = os.urandom(1 << 16), os.urandom(1 << 16)
    url = http_server.add(path, older)  # no Last-Modified: an ETag only
    DownloadManager(tmp_path / "a", progress=False).cached_path(url)  # node a: the older version
    http_server.add(path, newer)
    DownloadManager(tmp_path / "c", progress=False).cached_path(url)  # node c: the newer one, later
    calls = [
        {"url": url, "caches": [str(tmp_path / "a"), str(tmp_path / "b")]},  # a sends the older to b
        {"url": url, "caches": [str(tmp_path / "b"), str(tmp_path / "c")]},  # b and c: c is newer
    ]
    first, second = run_calls(tmp_path, [tmp_path / "a", tmp_path / "b"], calls, pg_timeout=20, timeout=50)
    assert {r.get("sha256") for r in first} == {sha256(older)}, first
    assert {r.get("sha256") for r in second} == {sha256(newer)}, second
    assert Entry(tmp_path / "c", url).lookup(sha256(newer)) is not None
    assert http_server.route(url).gets == 1  # c's own fetch: the calls asked the origin nothing


def test_revalidate_asks_the_origin_only_where_a_plain_call_would(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """A plain call serves the cached copy without asking when it is offline, or when
    the copy has the sha256 asked for, revalidate=True or not. The cluster call must
    too: one folder missing the file gets it from the folder that holds it, instead
    of an OfflineError (offline) or a GET the caller's pin made needless (online)."""
    data = {name: os.urandom(1 << 16) for name in ("offline", "pinned")}
    urls = {name: http_server.add(f"/review/revalidate-{name}.bin", body) for name, body in data.items()}
    for name in data:
        DownloadManager(tmp_path / name / "b", progress=False).cached_path(urls[name])  # b holds it
    calls = [
        {"url": urls["offline"], "revalidate": True, "offline": True},
        {"url": urls["pinned"], "revalidate": True, "sha256": sha256(data["pinned"])},
    ]
    for call, name in zip(calls, data):
        call["caches"] = [str(tmp_path / name / "a"), str(tmp_path / name / "b")]
    results = run_calls(tmp_path, [tmp_path / "a", tmp_path / "b"], calls, pg_timeout=20, timeout=50)
    for (name, body), outcome in zip(data.items(), results):
        assert [r.get("sha256") for r in outcome] == [sha256(body)] * 2, (name, outcome)
        assert "rank 1 sends" in outcome[1]["log"], (name, outcome)
        assert http_server.route(urls[name]).gets == 1, name  # the setup's fetch only
        assert Entry(tmp_path / name / "a", urls[name]).lookup(sha256(body)) is not None


def test_a_killed_receivers_partial_file_is_swept_by_a_call_for_another_url(tmp_path: Path) -> None:
    """The partial file of a receiver killed mid-transfer is removed "by the next call
    on that folder" (security.md), not only by one for the same URL: a URL that is
    never asked for again would otherwise keep its dead partial file forever."""
    import torch.distributed as dist
    from test_cluster_fetch import _plant_orphan

    from framework.download._cluster import _Call

    cache = tmp_path / "cache"
    orphan = _plant_orphan(cache, "https://example.org/never-again.bin")
    source = tmp_path / "other.bin"
    source.write_bytes(b"another file")
    dist.init_process_group(
        "gloo", init_method=(tmp_path / "store").as_uri(), rank=0, world_size=1, timeout=timedelta(seconds=10)
    )
    try:
        manager = DownloadManager(cache, progress=False)
        call = _Call(manager, str(source), None, None, False, False, False, False)
        assert Path(call.run()).read_bytes() == b"another file"
    finally:
        dist.destroy_process_group()
    assert not orphan.exists()
    assert stray_files(cache) == []


def test_ranks_that_see_different_devices_agree_on_one_for_the_transfer(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """torch's default group is ``cpu:gloo,cuda:nccl``. On a node whose GPU is not
    visible (a broken driver, a CPU-only node in the job) the transfer would go over
    gloo on the CPU while the others send over NCCL on CUDA: the ranks' collectives
    never meet. The device is a collective decision: every rank the same one (here the
    CPU, which every rank has a backend for)."""
    data = os.urandom(1 << 16)
    url = http_server.add("/review/devices.bin", data)
    caches = [tmp_path / "node0", tmp_path / "node1"]
    results = run_group(
        tmp_path,
        url,
        caches,
        inject={"0": "cuda_node"},
        backend_config="cpu:gloo,cuda:nccl",
        pg_timeout=10,
        timeout=50,
    )
    assert [r.get("error") for r in results] == [None, None], results
    assert [r.get("sha256") for r in results] == [sha256(data)] * 2, results
    assert http_server.route(url).gets == 1


def test_ranks_on_different_devices_without_a_cpu_backend_are_refused_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    import torch.distributed as dist

    from framework.download._cluster import _Call, _Probe
    from framework.errors import DownloadError

    monkeypatch.setattr(dist, "get_backend_config", lambda *args, **kwargs: "cuda:nccl")
    call = _Call(DownloadManager(tmp_path, progress=False), "https://example.org/a.bin", None, None,
                 False, False, False, False)  # fmt: skip
    probes = [_Probe((), None, None, False, device) for device in ("cuda", "cpu")]
    with pytest.raises(DownloadError, match=r"different devices \(cuda, cpu by rank\)"):
        call._agree_on_device(probes)
    monkeypatch.setattr(dist, "get_backend_config", lambda *args, **kwargs: "cpu:gloo,cuda:nccl")
    call.device = torch.device("cuda", 0)
    call._agree_on_device(probes)
    assert call.device == torch.device("cpu")
