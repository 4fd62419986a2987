"""`cached_path(..., distributed=True)` over real gloo groups of 4 processes.

Two "nodes" are simulated by cache folders: ranks 0-1 share one, ranks 2-3 another
(node-local disks), or all four share one (a shared filesystem). Each rank is its own
Python process (`tests/support/cluster_rank.py`); the origin is the counting HTTP server of this test
process. Every wait has a timeout: a hang fails the test.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import tarfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional

import pytest

from framework.download import DownloadManager
from framework.download._cache import Entry
from tests.support import cluster_rank
from tests.support.download import FaultServer, cache_files, sha256, stray_files

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
RANK_SCRIPT = REPO_ROOT / "tests" / "support" / "cluster_rank.py"
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
    # Forked from the forkserver the tests share (torch imported once, not per rank).
    context = multiprocessing.get_context("forkserver")
    procs = []
    for rank, cache in enumerate(caches):
        rank_spec = dict(
            spec, rank=rank, world=len(caches), port=port, url=url, cache=str(cache), out=str(out)
        )
        log = str(out / f"rank{rank}.log")
        procs.append(context.Process(target=cluster_rank.forked_main, args=(rank_spec, log, rank_env())))
        procs[-1].start()
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    hung = any(proc.is_alive() for proc in procs)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(10)
    logs = [(out / f"rank{rank}.log").read_text(errors="replace") for rank in range(len(caches))]
    if hung:
        pytest.fail(f"the ranks did not finish within {timeout}s (a hang)\n" + "\n".join(logs))
    codes = {rank: 0 for rank in range(len(caches))} | (exits or {})
    assert [proc.exitcode for proc in procs] == list(codes.values()), "\n".join(logs)
    results = []
    for rank, code in codes.items():
        path = out / f"rank{rank}.json"
        result = json.loads(path.read_text()) if (path.exists() and "calls" in spec) or code == 0 else None
        if code != 0:  # the calls it finished, then its exit
            result = [*(result or []), {"exit": code}] if "calls" in spec else {"exit": code}
        results.append(result)
    for result, log in zip(results, logs):
        for one in result if isinstance(result, list) else [result]:
            one["log"] = log
    return results


def run_calls(
    tmp_path: Path, caches: list[Path], calls: list[dict[str, Any]], **spec: Any
) -> list[list[dict[str, Any]]]:
    """Make `calls` (overrides of the spec) in turn in one group: starting 4 processes
    costs more than most scenarios. Each call's outcome on every rank (a rank that
    exited: {"exit": code}, from the call where it did). Only the last call may break
    the group."""
    per_rank = run_group(tmp_path, calls[0]["url"], caches, calls=calls, **spec)
    return [[r[min(i, len(r) - 1)] for r in per_rank] for i in range(len(calls))]


def two_nodes(tmp_path: Path) -> list[Path]:
    return [tmp_path / "node0"] * 2 + [tmp_path / "node1"] * 2


def verified_hit(cache: Path, url: str, data: bytes) -> None:
    """The cache serves `url` with no connection, and it holds the right bytes."""
    meta = Entry(cache, url).lookup(sha256(data))
    assert meta is not None, f"{cache} holds no verified copy"
    path = DownloadManager(cache, progress=False).cached_path(url, sha256=sha256(data))
    assert path.read_bytes() == data


@pytest.fixture(scope="module")
def node_local(http_server: FaultServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The calls that succeed on node-local caches, in one group; its last call loses
    rank 2 mid-transfer."""
    tmp_path = tmp_path_factory.mktemp("node-local")
    data = {
        "two": os.urandom(20 << 20) + b"odd tail",  # more than two chunks, not a multiple of one
        "half": os.urandom(1 << 20),
        "dies": os.urandom(3 << 20),
    }
    urls = {name: http_server.add(f"/cluster/{name}.bin", body) for name, body in data.items()}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        member = tarfile.TarInfo("data/a.txt")
        member.size = 5
        tar.addfile(member, io.BytesIO(b"hello"))
    urls["archive"] = http_server.add("/cluster/archive.tar.gz", buffer.getvalue())
    DownloadManager(tmp_path / "node1", progress=False).cached_path(urls["half"])  # node1 holds it
    # The origin holds back its last bytes until the receiving folder's partial file has
    # some: the receiver writes while the origin fetch still arrives (else it never ends).
    data["piped"] = os.urandom(6 << 20)
    urls["piped"] = http_server.add("/cluster/piped.bin", data["piped"], hold_after=(6 << 20) - 4096)
    piped = release_when_received(http_server.route(urls["piped"]), tmp_path / "piped" / "node1")
    # The origin resets the connection after it sent half, once the receiver wrote some.
    data["cut"] = os.urandom(6 << 20)
    urls["cut"] = http_server.add(
        "/cluster/cut.bin", data["cut"], hold_after=3 << 20, drop_after=(3 << 20) + (64 << 10) + 1, drops=9
    )
    cut = release_when_received(http_server.route(urls["cut"]), tmp_path / "cut" / "node1")
    # The object changes once the receiver wrote some of the first version: the fetch
    # starts over (the resumed request's If-Range fails), and so must the receiver.
    data["swapped"] = os.urandom(5 << 20)
    urls["swap"] = http_server.add(
        "/cluster/swap.bin",
        os.urandom(6 << 20),
        hold_after=3 << 20,
        drop_after=(3 << 20) + (64 << 10) + 1,
        drops=1,
        then={"data": data["swapped"], "etag": '"swapped"'},
    )
    swap = release_when_received(http_server.route(urls["swap"]), tmp_path / "swap" / "node1")
    one_stream = {"connections": 1, "retries": 0}  # the origin's bytes counted exactly
    calls = [
        {"url": urls["two"]},
        {"url": urls["two"], "sha256": sha256(data["two"])},  # every cache holds a hit now
        {"url": urls["half"]},
        {"url": urls["archive"], "extract": True},
        {"url": urls["piped"], "caches": [str(c) for c in two_nodes(tmp_path / "piped")], **one_stream},
        {"url": urls["cut"], "caches": [str(c) for c in two_nodes(tmp_path / "cut")], **one_stream},
        {"url": urls["swap"], "caches": [str(c) for c in two_nodes(tmp_path / "swap")], "connections": 1},
        # Its own caches: the killed rank's partial file stays (its process cleans nothing).
        {
            "url": urls["dies"],
            "inject": {"2": "die"},
            "caches": [str(c) for c in two_nodes(tmp_path / "dies")],
        },
    ]
    results = run_calls(tmp_path, two_nodes(tmp_path), calls, exits={2: 7}, pg_timeout=15, timeout=150)
    watched = {"piped": piped, "cut": cut, "swap": swap}
    return {"tmp": tmp_path, "data": data, "urls": urls, "results": results, "watched": watched}


def release_when_received(route: Any, folder: Path) -> dict[str, bool]:
    """Set `route.released` once a partial file in `folder` holds bytes while the origin
    holds back the rest of the body (`grew`; after the server's own 60 s hold it stays
    false, and the test fails)."""
    seen = {"grew": False}

    def watch() -> None:
        while not route.released.wait(0.01):
            for name in cache_files(folder):
                try:
                    grew = name.endswith(".part") and os.path.getsize(folder / name) > 0
                except OSError:
                    continue
                if grew:
                    seen["grew"] = route.body_bytes <= route.hold_after
                    route.released.set()

    threading.Thread(target=watch, daemon=True).start()
    return seen


@pytest.mark.timeout(200)
def test_a_receiver_writes_while_the_origin_fetch_still_arrives(
    http_server: FaultServer, node_local: dict[str, Any]
) -> None:
    """The origin sends its last bytes only once the receiving folder's partial file
    holds some: the transfer is pipelined. One copy from the origin, one copy into the
    receiving folder, none into the fetching one."""
    results, data, url = node_local["results"][4], node_local["data"]["piped"], node_local["urls"]["piped"]
    assert node_local["watched"]["piped"]["grew"], results
    assert [r.get("error") for r in results] == [None] * WORLD, results
    assert {r["sha256"] for r in results} == {sha256(data)}
    route = http_server.route(url)
    assert (route.gets, route.body_bytes) == (1, len(data))
    folders = two_nodes(node_local["tmp"] / "piped")
    received = {
        folder: sum(r["received_bytes"] for r, f in zip(results, folders) if f == folder)
        for folder in folders
    }
    assert received == {folders[0]: 0, folders[2]: len(data)}
    for cache in set(folders):
        verified_hit(cache, url, data)
        assert stray_files(cache) == []


@pytest.mark.timeout(200)
def test_the_origin_failing_mid_stream_fails_every_rank_and_publishes_nothing(
    http_server: FaultServer, node_local: dict[str, Any]
) -> None:
    """The receiving folder already holds some of the bytes when the origin resets the
    connection: every rank raises the same error, nothing is published, the receiver's
    partial file is gone, and the fetching node keeps its own for a later call to resume."""
    results, url = node_local["results"][5], node_local["urls"]["cut"]
    assert node_local["watched"]["cut"]["grew"], results
    assert [r.get("error") for r in results] == ["NetworkError"] * WORLD, results
    assert len({r["message"] for r in results}) == 1, results
    fetching, receiving = two_nodes(node_local["tmp"] / "cut")[::2]
    for cache in (fetching, receiving):
        assert Entry(cache, url).cached() is None
    assert stray_files(receiving) == []
    assert http_server.route(url).gets == 1


@pytest.mark.timeout(200)
def test_a_fetch_starting_over_for_a_new_version_starts_the_receivers_copy_over(
    http_server: FaultServer, node_local: dict[str, Any]
) -> None:
    """The receiver already wrote some of the first version when the object changes: the
    fetch starts over from byte 0 with the new one, and the receiver's copy with it."""
    results, url, data = node_local["results"][6], node_local["urls"]["swap"], node_local["data"]["swapped"]
    assert node_local["watched"]["swap"]["grew"], results
    assert [r.get("error") for r in results] == [None] * WORLD, results
    assert {r["sha256"] for r in results} == {sha256(data)}, results
    assert http_server.route(url).gets == 2
    for cache in set(two_nodes(node_local["tmp"] / "swap")):
        verified_hit(cache, url, data)
        assert stray_files(cache) == []


@pytest.mark.timeout(200)
def test_node_local_caches_one_get_and_both_caches_hold_a_hit(
    http_server: FaultServer, node_local: dict[str, Any]
) -> None:
    tmp_path, data, url = node_local["tmp"], node_local["data"]["two"], node_local["urls"]["two"]
    results, again = node_local["results"][:2]
    assert [r.get("error") for r in results] == [None] * WORLD, results
    assert {r["sha256"] for r in results} == {sha256(data)}
    assert [Path(r["path"]).parent for r in results] == two_nodes(tmp_path)
    # One copy from the origin (in parts), for both calls: the second found every cache
    # holding a hit, so nothing was fetched or sent.
    assert [r.get("error") for r in again] == [None] * WORLD, again
    assert http_server.route(url).body_bytes == len(data)
    connections = http_server.connections
    for cache in set(two_nodes(tmp_path)):
        verified_hit(cache, url, data)
        assert stray_files(cache) == []
        assert [n for n in os.listdir(cache) if n.startswith(".framework-cluster")] == []
    assert http_server.connections == connections  # the later plain calls opened none


@pytest.mark.timeout(200)
def test_one_node_missing_the_file_gets_it_from_the_other_not_the_origin(
    http_server: FaultServer, node_local: dict[str, Any]
) -> None:
    tmp_path, data, url = node_local["tmp"], node_local["data"]["half"], node_local["urls"]["half"]
    results = node_local["results"][2]
    assert {r["sha256"] for r in results} == {sha256(data)}, results
    assert http_server.route(url).gets == 1  # node0 got it from node1's cache
    assert "rank 2 sends" in results[2]["log"] and "rank 0 receives" in results[0]["log"]
    verified_hit(tmp_path / "node0", url, data)


@pytest.mark.timeout(200)
def test_extract_each_cache_extracts_its_own_copy(
    http_server: FaultServer, node_local: dict[str, Any]
) -> None:
    results = node_local["results"][3]
    assert [r.get("error") for r in results] == [None] * WORLD, results
    assert [Path(r["path"]).parent for r in results] == two_nodes(node_local["tmp"])
    for r in results:
        assert (Path(r["path"]) / "data" / "a.txt").read_bytes() == b"hello"
    assert http_server.route(node_local["urls"]["archive"]).gets == 1


@pytest.mark.timeout(200)
def test_a_rank_dying_mid_transfer_fails_the_others_instead_of_hanging(node_local: dict[str, Any]) -> None:
    results = node_local["results"][7]
    assert results[2] == {"exit": 7, "log": results[2]["log"]}
    others = [results[rank] for rank in (0, 1, 3)]
    assert [r.get("error") for r in others] == ["DownloadError"] * 3, results
    assert all("process group failed" in r["message"] for r in others), results


@pytest.fixture(scope="module")
def shared(http_server: FaultServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp_path = tmp_path_factory.mktemp("shared")
    data = os.urandom(3 << 20)
    urls = {
        "ok": http_server.add("/cluster/shared.bin", data),
        "missing": http_server.base + "/cluster/gone.bin",
    }
    caches = [tmp_path / "shared"] * WORLD
    results = run_calls(tmp_path, caches, [{"url": urls["ok"]}, {"url": urls["missing"]}])
    return {"tmp": tmp_path, "data": data, "urls": urls, "caches": caches, "results": results}


def test_shared_cache_one_get_and_no_copy(http_server: FaultServer, shared: dict[str, Any]) -> None:
    data, url, folder = shared["data"], shared["urls"]["ok"], shared["caches"][0]
    results = shared["results"][0]
    assert {r["sha256"] for r in results} == {sha256(data)}, results
    assert {r["path"] for r in results} == {str(Entry(folder, url).final)}
    assert http_server.route(url).gets == 1
    entry = Entry(folder, url)
    assert sorted(n for n in cache_files(folder) if not n.endswith(".lock")) == sorted(
        [entry.final.name, entry.sidecar.name]
    )
    assert not any(" receives " in r["log"] for r in results), results  # nothing was sent


def assert_same_error_everywhere(
    results: list[dict[str, Any]], error: str, caches: list[Path], url: str
) -> None:
    assert [r.get("error") for r in results] == [error] * WORLD, results
    assert len({r["message"] for r in results}) == 1, results
    for cache in set(caches):
        assert Entry(cache, url).cached() is None, f"{cache} published something"
        assert stray_files(cache) == []


@pytest.fixture(scope="module")
def failing(http_server: FaultServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The calls that fail on node-local caches, in one group with a 6 s timeout (the
    slow link and the stall each cost about that much); its last call stalls rank 2."""
    tmp_path = tmp_path_factory.mktemp("failing")
    data = {
        "wrong-sum": os.urandom(1 << 20),
        "mismatch": os.urandom(1000),
        "bad-cache": os.urandom(1000),
        "full-disk-2": os.urandom(20 << 20),
        "full-disk-0": os.urandom(20 << 20),
        "flipped": os.urandom(3 << 20),
        "slow-link": os.urandom(5 << 20),  # five pieces at a quarter of the timeout each: 1.25 timeouts
        "stalled": os.urandom(24 << 20),
    }
    urls = {name: http_server.add(f"/cluster/{name}.bin", body) for name, body in data.items()}
    urls["missing"] = http_server.base + "/cluster/missing.bin"
    calls = {
        "missing": {},
        "wrong-sum": {"sha256": "0" * 64},
        "mismatch": {"per_rank": {"1": {"sha256": sha256(data["mismatch"])}}},
        "bad-cache": {"per_rank": {"1": {"cache_dir": BAD_CACHE}}},
        "full-disk-2": {"inject": {"2": "enospc"}},
        "full-disk-0": {"inject": {"0": "enospc"}},
        "flipped": {"inject": {"2": "corrupt"}},
        "slow-link": {"inject": {"2": "slow"}, "chunk_bytes": 1 << 20},
        # Rank 2's disk hangs in its first write until rank 0's call has ended (or three
        # timeouts): the sender's wait is bounded by the group's timeout, so it ends first.
        "stalled": {"inject": {"2": "stall"}, "chunk_bytes": 1 << 20},
    }
    results = run_calls(
        tmp_path,
        two_nodes(tmp_path),
        [{"url": urls[name], **call} for name, call in calls.items()],
        pg_timeout=6,
        timeout=180,
    )
    return {"tmp": tmp_path, "data": data, "urls": urls, "results": dict(zip(calls, results))}


BAD_CACHE = "~no_such_user_framework_test/cache"


@pytest.mark.timeout(240)
def test_origin_404_reaches_every_rank(failing: dict[str, Any], shared: dict[str, Any]) -> None:
    for run in failing, shared:
        caches = shared["caches"] if run is shared else two_nodes(failing["tmp"])
        results = run["results"][1] if run is shared else run["results"]["missing"]
        assert_same_error_everywhere(results, "HTTPStatusError", caches, run["urls"]["missing"])
        assert "404" in results[3]["message"]


@pytest.mark.timeout(240)
def test_wrong_sha256_reaches_every_rank(http_server: FaultServer, failing: dict[str, Any]) -> None:
    url = failing["urls"]["wrong-sum"]
    assert_same_error_everywhere(
        failing["results"]["wrong-sum"], "ChecksumError", two_nodes(failing["tmp"]), url
    )
    assert http_server.route(url).gets == 1  # the others did not try again on their own


@pytest.mark.timeout(240)
@pytest.mark.parametrize("failing_rank", [2, 0], ids=["receiving-node", "fetching-rank"])
def test_a_full_disk_on_one_rank_makes_every_rank_raise(failing: dict[str, Any], failing_rank: int) -> None:
    name = f"full-disk-{failing_rank}"
    results = failing["results"][name]
    assert [r.get("error") for r in results] == ["DownloadError"] * WORLD, results
    assert len({r["message"] for r in results}) == 1
    assert "no room on the device" in results[1]["message"]
    failing_cache = two_nodes(failing["tmp"])[failing_rank]
    assert Entry(failing_cache, failing["urls"][name]).cached() is None
    assert stray_files(failing_cache) == []


@pytest.mark.timeout(240)
def test_bytes_damaged_in_transfer_are_refused_on_every_rank(failing: dict[str, Any]) -> None:
    tmp_path, url = failing["tmp"], failing["urls"]["flipped"]
    results = failing["results"]["flipped"]
    assert [r.get("error") for r in results] == ["ChecksumError"] * WORLD, results
    assert len({r["message"] for r in results}) == 1
    assert Entry(tmp_path / "node1", url).cached() is None  # the damaged copy is not published
    assert stray_files(tmp_path / "node1") == []
    verified_hit(tmp_path / "node0", url, failing["data"]["flipped"])  # the fetching node's good copy stays


@pytest.mark.timeout(240)
def test_ranks_passing_different_arguments_all_raise(
    http_server: FaultServer, failing: dict[str, Any]
) -> None:
    results = failing["results"]["mismatch"]
    assert [r.get("error") for r in results] == ["InvalidArgumentError"] * WORLD, results
    assert "rank 1" in results[0]["message"]
    assert http_server.route(failing["urls"]["mismatch"]).gets == 0


@pytest.mark.timeout(240)
def test_a_cache_dir_one_rank_cannot_use_fails_every_rank_alike(
    http_server: FaultServer, failing: dict[str, Any]
) -> None:
    results = failing["results"]["bad-cache"]
    assert [r.get("error") for r in results] == ["DownloadError"] * WORLD, results
    assert len({r["message"] for r in results}) == 1, results
    assert BAD_CACHE in results[0]["message"]
    assert http_server.route(failing["urls"]["bad-cache"]).gets == 0


@pytest.mark.timeout(240)
def test_a_transfer_longer_than_the_group_timeout_succeeds(failing: dict[str, Any]) -> None:
    """Every chunk is shorter than the timeout, the whole transfer longer: the ranks
    outside it wait chunk by chunk, never for the whole transfer in one collective."""
    results = failing["results"]["slow-link"]
    assert [r.get("error") for r in results] == [None] * WORLD, results
    assert {r["sha256"] for r in results} == {sha256(failing["data"]["slow-link"])}


@pytest.mark.timeout(240)
def test_a_stalled_receiver_fails_the_sender_within_the_group_timeout(failing: dict[str, Any]) -> None:
    results = failing["results"]["stalled"]
    assert [r.get("error") for r in results] == ["DownloadError"] * WORLD, results
    assert "process group failed" in results[0]["message"], results
    assert results[2]["stall_ended_by_rank0"] is True, results
    assert Entry(failing["tmp"] / "node1", failing["urls"]["stalled"]).cached() is None
    assert stray_files(failing["tmp"] / "node1") == []


def test_a_step_thread_left_running_never_closes_the_applications_files(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """Rank 3 dies in the publish step while rank 2's publish thread is in a slow fsync:
    rank 2's call raises at once, the thread finishes later and must release only its
    own descriptor, not the number the application's next open() got."""
    data = os.urandom(1 << 20)
    url = http_server.add("/cluster/late-thread.bin", data)
    results = run_group(
        tmp_path, url, two_nodes(tmp_path), exits={3: 9}, inject={"2": "slow_fsync", "3": "die_at_publish"}
    )
    assert results[2]["error"] == "DownloadError", results
    assert results[2]["app_files"] == "ok", results
    assert stray_files(tmp_path / "node1") == []


def test_a_plugin_error_with_unpicklable_fields_is_shared_as_its_framework_class() -> None:
    import pickle
    import threading

    from framework.download._cluster import _decode, _encode
    from framework.errors import HTTPStatusError

    class VaultDenied(HTTPStatusError):  # a plugin's class: other ranks cannot import it
        def __init__(self, url: str, response: object) -> None:
            self.response = response
            super().__init__(url, 403, "vault says no")

    encoded = _encode(VaultDenied("vault://b/k", threading.Lock()), "vault://b/k", 1)
    error = _decode(*pickle.loads(pickle.dumps(encoded)))
    assert type(error) is HTTPStatusError
    assert error.status == 403 and "vault says no" in str(error)
    assert "lock" in error.response  # type: ignore[attr-defined]


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


def test_an_answer_of_the_wrong_kind_is_a_download_error_not_a_crash(tmp_path: Path) -> None:
    """Collectives out of step (another thread's all_gather_object on the default group)
    hand a step something else than its answers: a DownloadError saying so."""
    import torch.distributed as dist

    from framework.download._cluster import _Call, _Probe
    from framework.errors import DownloadError

    dist.init_process_group("gloo", init_method=(tmp_path / "store").as_uri(), rank=0, world_size=1)
    try:
        manager = DownloadManager(tmp_path, progress=False)
        call = _Call(manager, "https://example.org/a.bin", None, None, False, False, False, False)
        with pytest.raises(DownloadError, match="out of step"):
            call._step(lambda: ["not", "a", "probe"], _Probe)
    finally:
        dist.destroy_process_group()


def test_a_killed_calls_marker_is_swept_by_a_later_call(tmp_path: Path) -> None:
    from framework.download._cluster import _MARKER_PREFIX, _sweep, _write_marker

    stale, fresh = tmp_path / f"{_MARKER_PREFIX}old", tmp_path / f"{_MARKER_PREFIX}new"
    stale.touch()
    fresh.touch()  # another call's, still running
    os.utime(stale, (0, 0))
    _sweep(tmp_path)  # what a later call's probe does before it writes its marker
    marker = _write_marker(tmp_path)
    assert marker is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([fresh.name, marker.name])


# Issue 24: a hung step, a FIFO, copied caches, leftovers, leaders that cannot lead,
# one copy per folder, differing versions. -------------------------------------------

HANG_TIMEOUT = 6  # the group's timeout in the hang group: each hang costs about that much


@pytest.fixture(scope="module")
def hangs(http_server: FaultServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Calls in which one rank's step hangs (until its own call has ended, or three
    timeouts), one in which a FIFO replaces the sender's published file, and last the
    fetching rank killed mid-stream."""
    tmp_path = tmp_path_factory.mktemp("hangs")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        member = tarfile.TarInfo("data/a.txt")
        member.size = 5
        tar.addfile(member, io.BytesIO(b"hello"))
    data = {
        "probe": os.urandom(1000),
        "fsync": os.urandom(1 << 20),
        "extract": buffer.getvalue(),
        "fifo": os.urandom(1 << 20),
        "fetcher-dies": os.urandom(3 << 20),
    }
    urls = {name: http_server.add(f"/cluster/hang-{name}.bin", body) for name, body in data.items()}
    # The origin holds its last MiB until the receiver wrote; the fetching rank dies
    # when it sends its second piece, while its fetch still runs.
    route = http_server.route(urls["fetcher-dies"])
    route.hold_after = 2 << 20
    dies = two_nodes(tmp_path / "fetcher-dies")
    release_when_received(route, dies[2])
    calls = {
        "probe": {"inject": {"1": "hang_probe"}},
        "fsync": {"inject": {"2": "hang_fsync"}},
        "extract": {"inject": {"2": "hang_extract"}, "extract": True},
        "fifo": {"inject": {"0": "fifo"}},
        "fetcher-dies": {
            "inject": {"0": "die_sending"},
            "chunk_bytes": 1 << 20,
            "connections": 1,
            "caches": [str(cache) for cache in dies],
        },
    }
    results = run_calls(
        tmp_path,
        two_nodes(tmp_path),
        [{"url": urls[name], **call} for name, call in calls.items()],
        pg_timeout=HANG_TIMEOUT,
        timeout=150,
        exits={0: 8},
    )
    return {"tmp": tmp_path, "data": data, "urls": urls, "results": dict(zip(calls, results))}


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    ("step", "hung_rank"),
    [("probe", 1), ("fsync", 2), ("extract", 2)],
    ids=["probe", "publish-fsync", "extract"],
)
def test_a_step_hanging_on_one_rank_fails_every_rank_within_the_group_timeout(
    hangs: dict[str, Any], step: str, hung_rank: int
) -> None:
    results = hangs["results"][step]
    assert [r.get("error") for r in results] == ["StepTimeoutError"] * WORLD, results
    assert len({r["message"] for r in results}) == 1, results
    assert f"rank {hung_rank}" in results[0]["message"], results
    # Every rank gave up while the hung rank was still hanging, the hung rank too (it
    # wakes only once its own call has ended, or after three timeouts).
    assert results[hung_rank]["hang"] == "hanging", results
    node1 = hangs["tmp"] / "node1"
    if step == "fsync":  # the verified copy is not published after the call raised
        assert Entry(node1, hangs["urls"][step]).cached() is None
    if step == "probe":  # the marker the probe wrote once it woke is gone too
        assert [n for n in os.listdir(hangs["tmp"] / "node0") if n.startswith(".framework-cluster")] == []


@pytest.mark.timeout(200)
def test_a_fifo_renamed_over_the_senders_file_is_never_waited_on(hangs: dict[str, Any]) -> None:
    results = hangs["results"]["fifo"]
    assert [r.get("error") for r in results] == ["DownloadError"] * WORLD, results
    assert "was replaced during the call" in results[0]["message"], results
    assert len({r["message"] for r in results}) == 1, results


@pytest.mark.timeout(200)
def test_the_fetching_rank_dying_mid_stream_fails_the_others_and_publishes_nothing(
    hangs: dict[str, Any],
) -> None:
    results, url = hangs["results"]["fetcher-dies"], hangs["urls"]["fetcher-dies"]
    assert results[0] == {"exit": 8, "log": results[0]["log"]}
    others = results[1:]
    assert [r.get("error") for r in others] == ["DownloadError"] * 3, results
    assert all("process group failed" in r["message"] for r in others), results
    assert results[2]["received_bytes"] > 0, results  # it was mid-stream
    node1 = two_nodes(hangs["tmp"] / "fetcher-dies")[2]
    assert Entry(node1, url).cached() is None
    assert stray_files(node1) == []


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _plant_orphan(cache: Path, url: str) -> Path:
    """The partial file a receiver killed mid-transfer leaves (its process is dead)."""
    from framework.download._cache import HOST
    from framework.download._partial import PartialName
    from framework.download._validators import NO_VALIDATOR

    cache.mkdir(parents=True, exist_ok=True)
    name = PartialName(Entry(cache, url).final, NO_VALIDATOR, f"{HOST}.{_dead_pid()}.0badc0de")
    name.path.parent.mkdir(exist_ok=True)
    name.path.write_bytes(os.urandom(4096))
    return name.path


@pytest.fixture(scope="module")
def leaders(http_server: FaultServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Copied caches, ranks that cannot lead their folder, and folders holding
    different versions, in one group."""
    tmp_path = tmp_path_factory.mktemp("leaders")
    data = {name: os.urandom(1 << 20) for name in ("offline", "online", "rank0-offline", "readonly")}
    urls = {name: http_server.add(f"/cluster/lead-{name}.bin", body) for name, body in data.items()}
    caches: dict[str, list[Path]] = {name: two_nodes(tmp_path / name) for name in data}
    for name in ("offline", "online"):  # node1 holds a copy made with cp -a: it needs re-binding
        origin = tmp_path / f"{name}-origin"
        DownloadManager(origin, progress=False).cached_path(urls[name])
        caches[name][2].parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-a", str(origin), str(caches[name][2])], check=True)
        assert Entry(caches[name][2], urls[name]).cached() is None  # not bound to the copy
    orphans = [_plant_orphan(cache, urls["online"]) for cache in set(caches["online"])]
    caches["readonly"][2].mkdir(parents=True)  # a read-only folder exists
    # Two versions: node0 holds the older, node1 the newer.
    versions = [os.urandom(1 << 20), os.urandom(1 << 20)]
    path = "/cluster/lead-versions.bin"
    for cache, body, when in zip(
        (tmp_path / "v-node0", tmp_path / "v-node1"),
        versions,
        ("Mon, 01 Jan 2024 00:00:00 GMT", "Tue, 02 Jan 2024 00:00:00 GMT"),
    ):
        urls["versions"] = http_server.add(path, body, last_modified=when)
        DownloadManager(cache, progress=False).cached_path(urls["versions"])
    caches["versions"] = [tmp_path / "v-node0"] * 2 + [tmp_path / "v-node1"] * 2
    calls = [
        {"url": urls["offline"], "offline": True},
        {"url": urls["online"]},
        {"url": urls["rank0-offline"], "per_rank": {"0": {"offline": True}}},
        {"url": urls["readonly"], "inject": {"2": "readonly"}},
        {"url": urls["versions"]},
    ]
    names = ["offline", "online", "rank0-offline", "readonly", "versions"]
    for call, name in zip(calls, names):
        call["caches"] = [str(c) for c in caches[name]]
    results = run_calls(tmp_path, caches["offline"], calls, pg_timeout=15, timeout=150)
    return {
        "tmp": tmp_path,
        "data": data,
        "urls": urls,
        "caches": caches,
        "versions": versions,
        "orphans": orphans,
        "results": dict(zip(names, results)),
    }


@pytest.mark.timeout(200)
@pytest.mark.parametrize("mode", ["offline", "online"])
def test_a_copied_cache_counts_as_holding_the_file(
    http_server: FaultServer, leaders: dict[str, Any], mode: str
) -> None:
    """node1's cache was copied with cp -a (new inodes): like a plain call, the cluster
    call re-binds it, so node0 gets the bytes from it, with no GET, offline too."""
    results, url, data = leaders["results"][mode], leaders["urls"][mode], leaders["data"][mode]
    assert [r.get("error") for r in results] == [None] * WORLD, results
    assert {r["sha256"] for r in results} == {sha256(data)}
    assert http_server.route(url).gets == 1  # the one that filled the cache copied later
    assert "rank 2 sends" in results[2]["log"], results
    for cache in set(leaders["caches"][mode]):
        verified_hit(cache, url, data)


@pytest.mark.timeout(200)
def test_an_offline_lowest_rank_does_not_lead(http_server: FaultServer, leaders: dict[str, Any]) -> None:
    results, url = leaders["results"]["rank0-offline"], leaders["urls"]["rank0-offline"]
    assert [r.get("error") for r in results] == [None] * WORLD, results
    assert {r["sha256"] for r in results} == {sha256(leaders["data"]["rank0-offline"])}
    assert http_server.route(url).gets == 1


@pytest.mark.timeout(200)
def test_a_rank_seeing_its_folder_read_only_does_not_lead(leaders: dict[str, Any]) -> None:
    results, url = leaders["results"]["readonly"], leaders["urls"]["readonly"]
    assert [r.get("error") for r in results] == [None] * WORLD, results
    assert {r["sha256"] for r in results} == {sha256(leaders["data"]["readonly"])}
    assert "rank 3 receives" in results[3]["log"], results
    verified_hit(leaders["caches"]["readonly"][2], url, leaders["data"]["readonly"])


@pytest.mark.timeout(200)
def test_a_killed_receivers_partial_file_is_swept(leaders: dict[str, Any]) -> None:
    """A partial file whose writer (a receiver killed mid-transfer) is dead is removed
    by the next cluster call on that folder."""
    assert [r.get("error") for r in leaders["results"]["online"]] == [None] * WORLD
    for orphan in leaders["orphans"]:
        assert not orphan.exists(), orphan
    for cache in set(leaders["caches"]["online"]):
        assert stray_files(cache) == []


@pytest.mark.timeout(200)
def test_a_receiving_folder_gets_one_copy_however_many_ranks_share_it(leaders: dict[str, Any]) -> None:
    """Over the process group, each receiving folder's ranks receive the file once in
    all (node ingress: one copy, not one per rank), the sending folder none."""
    checked = 0
    for name in ("versions", "online", "offline", "rank0-offline", "readonly"):
        results = leaders["results"][name]
        url = leaders["urls"][name]
        senders = [r["rank"] for r in results if f"rank {r['rank']} sends {url} " in r["log"]]
        if len(senders) != 1:
            continue
        size = len(leaders["versions"][1] if name == "versions" else leaders["data"][name])
        folders = [str(cache) for cache in leaders["caches"][name]]
        received: dict[str, int] = {}
        for rank, result in enumerate(results):
            received[folders[rank]] = received.get(folders[rank], 0) + result["received_bytes"]
        sending = folders[senders[0]]
        assert received == {f: 0 if f == sending else size for f in folders}, (name, received)
        checked += 1
    assert checked >= 2


@pytest.mark.timeout(200)
def test_without_sha256_the_newest_copy_wins_over_older_ones(
    http_server: FaultServer, leaders: dict[str, Any]
) -> None:
    """node0 holds an older version than node1: the older copy never replaces the newer."""
    results, url = leaders["results"]["versions"], leaders["urls"]["versions"]
    newer = leaders["versions"][1]
    assert [r.get("error") for r in results] == [None] * WORLD, results
    assert {r["sha256"] for r in results} == {sha256(newer)}, results
    assert http_server.route(url).gets == 1  # the setup's fetch of the newer version only
    verified_hit(leaders["caches"]["versions"][0], url, newer)


@pytest.mark.parametrize(
    ("config", "cuda", "expected"),
    [
        ("cpu:gloo,cuda:gloo", True, "cpu"),
        ("cpu:gloo,cuda:nccl", True, "cuda"),  # torch 2.13's "undefined" default group
        ("cuda:nccl", True, "cuda"),  # a device-bound group: get_backend() says "cuda:nccl"
        ("nccl", True, "cuda"),
        ("gloo", False, "cpu"),
        ("cpu:gloo,cuda:nccl", False, "cpu"),  # no GPU here: the CPU's backend
        ("cpu:gloo,xpu:xccl", False, "xpu"),
        ("cuda:nccl", False, None),  # refused before any download, on every rank
    ],
)
def test_the_transfer_device_is_picked_from_the_groups_backends(
    config: str, cuda: bool, expected: Optional[str]
) -> None:
    from framework.download._cluster import _device_type

    assert _device_type(config, accelerators={"cuda"} if cuda else {"xpu"}) == expected


def test_the_transfer_device_of_a_gloo_group_is_the_cpu(tmp_path: Path) -> None:
    import torch.distributed as dist

    from framework.download._cluster import _transfer_device

    dist.init_process_group("gloo", init_method=(tmp_path / "store").as_uri(), rank=0, world_size=1)
    try:
        assert _transfer_device("https://example.org/a.bin").type == "cpu"
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(60)
def test_a_step_longer_than_the_timeout_goes_on_while_it_makes_progress(tmp_path: Path) -> None:
    """The bound is on a step without progress: a download that keeps adding bytes may
    outlast the group's timeout; one that adds none for longer is given up."""
    import threading
    import time
    from datetime import timedelta

    import torch.distributed as dist

    from framework.download._cluster import _Call
    from framework.errors import StepTimeoutError

    dist.init_process_group(
        "gloo",
        init_method=(tmp_path / "store").as_uri(),
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=1),
    )
    try:
        call = _Call(DownloadManager(tmp_path, progress=False), "https://example.org/a.bin", None, None,
                     False, False, False, False)  # fmt: skip
        ticks = iter(range(1_000_000))
        finished = threading.Event()

        def slow() -> str:
            time.sleep(2.5)  # more than twice the timeout
            finished.set()
            return "done"

        assert call._step(slow, str, "fetching the file", lambda: next(ticks)) == ["done"]
        finished.clear()
        with pytest.raises(StepTimeoutError, match="rank 0 made no progress fetching the file") as caught:
            call._step(slow, str, "fetching the file", lambda: 0)
        assert not finished.is_set()  # given up while the step still ran
        assert caught.value.rank == 0 and caught.value.timeout == 1
    finally:
        dist.destroy_process_group()


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
