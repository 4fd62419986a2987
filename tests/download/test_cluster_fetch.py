"""`cached_path(..., distributed=True)` over real gloo groups of 4 processes.

Two "nodes" are simulated by cache folders: ranks 0-1 share one, ranks 2-3 another
(node-local disks), or all four share one (a shared filesystem). Each rank is its own
Python process (`cluster_rank.py`); the origin is the counting HTTP server of this test
process. Every wait has a timeout: a hang fails the test.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dl_helpers import FaultServer, sha256, stray_files

from framework.download import DownloadManager
from framework.download._cache import Entry

pytestmark = pytest.mark.timeout(120)

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
RANK_SCRIPT = HERE / "cluster_rank.py"
WORLD = 4


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def rank_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEWORK_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = "1"
    return env


def run_group(
    tmp_path: Path,
    url: str,
    caches: list[Path],
    timeout: float = 90,
    exits: dict[int, int] | None = None,
    **spec: Any,
) -> list[dict[str, Any]]:
    """Start one process per rank, wait for all (killing them all at `timeout`), and
    return each rank's outcome; `exits` are the exit codes expected other than 0."""
    out = tmp_path / f"out-{os.urandom(4).hex()}"
    out.mkdir()
    port = free_port()
    procs = []
    for rank, cache in enumerate(caches):
        rank_spec = dict(
            spec, rank=rank, world=len(caches), port=port, url=url, cache=str(cache), out=str(out)
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(RANK_SCRIPT), json.dumps(rank_spec)],
                env=rank_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.communicate(timeout=10)
        pytest.fail(f"the ranks did not finish within {timeout}s (a hang)")
    codes = {rank: 0 for rank in range(len(caches))} | (exits or {})
    assert [proc.returncode for proc in procs] == list(codes.values()), "\n".join(logs)
    results = [
        json.loads((out / f"rank{rank}.json").read_text()) if code == 0 else {"exit": code}
        for rank, code in codes.items()
    ]
    for result, log in zip(results, logs):
        result["log"] = log
    return results


def two_nodes(tmp_path: Path) -> list[Path]:
    return [tmp_path / "node0"] * 2 + [tmp_path / "node1"] * 2


def verified_hit(cache: Path, url: str, data: bytes) -> None:
    """The cache serves `url` with no connection, and it holds the right bytes."""
    meta = Entry(cache, url).lookup(sha256(data))
    assert meta is not None, f"{cache} holds no verified copy"
    path = DownloadManager(cache, progress=False).cached_path(url, sha256=sha256(data))
    assert path.read_bytes() == data


def test_node_local_caches_one_get_and_both_caches_hold_a_hit(
    http_server: FaultServer, tmp_path: Path
) -> None:
    data = os.urandom(20 << 20) + b"odd tail"  # more than two chunks, not a multiple of one
    url = http_server.add("/cluster/two-nodes.bin", data)
    results = run_group(tmp_path, url, two_nodes(tmp_path))
    assert [r.get("error") for r in results] == [None] * WORLD, results
    assert {r["sha256"] for r in results} == {sha256(data)}
    assert [Path(r["path"]).parent for r in results] == two_nodes(tmp_path)
    assert http_server.route(url).body_bytes == len(data)  # one copy from the origin (in parts)
    connections = http_server.connections
    for cache in set(two_nodes(tmp_path)):
        verified_hit(cache, url, data)
        assert stray_files(cache) == []
        assert [n for n in os.listdir(cache) if n.startswith(".framework-cluster")] == []
    assert http_server.connections == connections  # the later plain calls opened none
    # A second collective call finds every cache holding a hit: nothing is fetched or sent.
    gets = http_server.route(url).gets
    again = run_group(tmp_path, url, two_nodes(tmp_path), sha256=sha256(data))
    assert [r.get("error") for r in again] == [None] * WORLD, again
    assert http_server.route(url).gets == gets
    assert http_server.connections == connections


def test_one_node_missing_the_file_gets_it_from_the_other_not_the_origin(
    http_server: FaultServer, tmp_path: Path
) -> None:
    data = os.urandom(1 << 20)
    url = http_server.add("/cluster/half-cached.bin", data)
    DownloadManager(tmp_path / "node1", progress=False).cached_path(url)
    assert http_server.route(url).gets == 1
    results = run_group(tmp_path, url, two_nodes(tmp_path))
    assert {r["sha256"] for r in results} == {sha256(data)}, results
    assert http_server.route(url).gets == 1  # node0 got it from node1's cache
    assert "rank 2 sends" in results[2]["log"] and "rank 0 receives" in results[0]["log"]
    verified_hit(tmp_path / "node0", url, data)


def test_shared_cache_one_get_and_no_copy(http_server: FaultServer, tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    url = http_server.add("/cluster/shared.bin", data)
    shared = tmp_path / "shared"
    results = run_group(tmp_path, url, [shared] * WORLD)
    assert {r["sha256"] for r in results} == {sha256(data)}, results
    assert {r["path"] for r in results} == {str(Entry(shared, url).final)}
    assert http_server.route(url).gets == 1
    entry = Entry(shared, url)
    assert sorted(n for n in os.listdir(shared) if not n.endswith(".lock")) == sorted(
        [entry.final.name, entry.sidecar.name]
    )
    assert not any(" receives " in r["log"] for r in results), results  # nothing was sent


def test_extract_each_cache_extracts_its_own_copy(http_server: FaultServer, tmp_path: Path) -> None:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        member = tarfile.TarInfo("data/a.txt")
        member.size = 5
        tar.addfile(member, io.BytesIO(b"hello"))
    url = http_server.add("/cluster/archive.tar.gz", buffer.getvalue())
    results = run_group(tmp_path, url, two_nodes(tmp_path), extract=True)
    assert [r.get("error") for r in results] == [None] * WORLD, results
    assert [Path(r["path"]).parent for r in results] == two_nodes(tmp_path)
    for r in results:
        assert (Path(r["path"]) / "data" / "a.txt").read_bytes() == b"hello"
    assert http_server.route(url).gets == 1


def assert_same_error_everywhere(
    results: list[dict[str, Any]], error: str, caches: list[Path], url: str
) -> None:
    assert [r.get("error") for r in results] == [error] * WORLD, results
    assert len({r["message"] for r in results}) == 1, results
    for cache in set(caches):
        assert Entry(cache, url).cached() is None, f"{cache} published something"
        assert stray_files(cache) == []


@pytest.mark.parametrize("shared", [False, True], ids=["node-local", "shared"])
def test_origin_404_reaches_every_rank(http_server: FaultServer, tmp_path: Path, shared: bool) -> None:
    url = http_server.base + "/cluster/missing.bin"
    caches = [tmp_path / "shared"] * WORLD if shared else two_nodes(tmp_path)
    results = run_group(tmp_path, url, caches)
    assert_same_error_everywhere(results, "HTTPStatusError", caches, url)
    assert "404" in results[3]["message"]


def test_wrong_sha256_reaches_every_rank(http_server: FaultServer, tmp_path: Path) -> None:
    data = os.urandom(1 << 20)
    url = http_server.add("/cluster/wrong-sum.bin", data)
    results = run_group(tmp_path, url, two_nodes(tmp_path), sha256="0" * 64)
    assert_same_error_everywhere(results, "ChecksumError", two_nodes(tmp_path), url)
    assert http_server.route(url).gets == 1  # the others did not try again on their own


@pytest.mark.parametrize("failing", [2, 0], ids=["receiving-node", "fetching-rank"])
def test_a_full_disk_on_one_rank_makes_every_rank_raise(
    http_server: FaultServer, tmp_path: Path, failing: int
) -> None:
    data = os.urandom(20 << 20)
    url = http_server.add(f"/cluster/full-disk-{failing}.bin", data)
    results = run_group(tmp_path, url, two_nodes(tmp_path), inject={str(failing): "enospc"})
    assert [r.get("error") for r in results] == ["DownloadError"] * WORLD, results
    assert len({r["message"] for r in results}) == 1
    assert "no space left" in results[1]["message"]
    failing_cache = two_nodes(tmp_path)[failing]
    assert Entry(failing_cache, url).cached() is None
    assert stray_files(failing_cache) == []


def test_bytes_damaged_in_transfer_are_refused_on_every_rank(
    http_server: FaultServer, tmp_path: Path
) -> None:
    data = os.urandom(3 << 20)
    url = http_server.add("/cluster/flipped.bin", data)
    results = run_group(tmp_path, url, two_nodes(tmp_path), inject={"2": "corrupt"})
    assert [r.get("error") for r in results] == ["ChecksumError"] * WORLD, results
    assert len({r["message"] for r in results}) == 1
    assert Entry(tmp_path / "node1", url).cached() is None  # the damaged copy is not published
    assert stray_files(tmp_path / "node1") == []
    verified_hit(tmp_path / "node0", url, data)  # the fetching node's good copy stays


def test_a_rank_dying_mid_transfer_fails_the_others_instead_of_hanging(
    http_server: FaultServer, tmp_path: Path
) -> None:
    data = os.urandom(3 << 20)
    url = http_server.add("/cluster/dies.bin", data)
    results = run_group(tmp_path, url, two_nodes(tmp_path), exits={2: 7}, inject={"2": "die"}, pg_timeout=15)
    others = [results[rank] for rank in (0, 1, 3)]
    assert [r.get("error") for r in others] == ["DownloadError"] * 3, results
    assert all("process group failed" in r["message"] for r in others), results


def test_ranks_passing_different_arguments_all_raise(http_server: FaultServer, tmp_path: Path) -> None:
    data = os.urandom(1000)
    url = http_server.add("/cluster/mismatch.bin", data)
    results = run_group(tmp_path, url, two_nodes(tmp_path), per_rank={"1": {"sha256": sha256(data)}})
    assert [r.get("error") for r in results] == ["InvalidArgumentError"] * WORLD, results
    assert "rank 1" in results[0]["message"]
    assert http_server.route(url).gets == 0


def test_without_a_process_group_it_is_a_plain_call(http_server: FaultServer, tmp_path: Path) -> None:
    data = os.urandom(1000)
    url = http_server.add("/cluster/plain.bin", data)
    manager = DownloadManager(tmp_path / "plain", progress=False)
    path = manager.cached_path(url, distributed=True)
    assert path.read_bytes() == data
    assert http_server.route(url).gets == 1


def test_two_torchrun_launches_example_fetches_once(tmp_path: Path) -> None:
    """`examples/two_node_fetch.py`: two torchrun launches (2 ranks each, c10d on
    127.0.0.1) running `framework run` with separate caches; one GET from its origin."""
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / "two_node_fetch.py"), "--workdir", str(tmp_path),
         "--timeout", "80"],
        capture_output=True, text=True, env=rank_env(), timeout=100,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout[: result.stdout.rindex("}") + 1])
    assert report["origin_gets"] == 1
    assert list(report["caches"].values()) == [[True], [True]]


def test_groups_join_ranks_that_saw_each_others_markers_either_way() -> None:
    from framework.download._cluster import _groups

    # Rank 3's folder is read-only (it wrote no marker) but it saw rank 2's: one folder.
    assert _groups([[0, 1], [0, 1], [2], [2]]) == [0, 0, 2, 2]
    # Seen through a third rank: 0 saw 2, 2 saw 4; 1 and 3 are alone.
    assert _groups([[0, 2], [1], [2, 4], [3], [4]]) == [0, 1, 0, 3, 0]
