"""The fetch -> verify -> publish -> metadata path under a hostile cache folder, a
server whose object changes between requests, crashes and Ctrl-C, and odd answers.

Each test here failed on the code before the hardening (see the security page,
docs/concepts/security.md, for the threat each one attacks)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from dl_helpers import FORK, FaultServer, Route, sha256, stray_files, wait_for

from framework.download import DownloadManager
from framework.download._cache import HOST, Entry, unique_token
from framework.download._lock import EntryLock
from framework.download._partial import partial_bytes
from framework.download._validators import NO_VALIDATOR, Validators
from framework.download.backend import parse_content_range
from framework.errors import (
    DownloadError,
    InvalidArgumentError,
    LockTimeoutError,
    NetworkError,
    OfflineError,
)

pytestmark = pytest.mark.timeout(60)

VICTIM = b"precious bytes outside the cache"


def _dead_pid() -> int:
    """A pid that is not running here (a child that has exited and been reaped)."""
    child = FORK.Process(target=os._exit, args=(0,))
    child.start()
    child.join()
    assert child.pid is not None
    return child.pid


def _partial_name(cache: Path, url: str, tag: str, host: str = HOST, pid: int = 0) -> Path:
    """Where a crashed process (by default a dead one on this host) left its partial file."""
    final = Entry(cache, url).final
    cache.mkdir(parents=True, exist_ok=True)
    _host, _pid, token = unique_token().split(".")
    return final.with_name(f"{final.name}.{tag}.{host}.{pid or _dead_pid()}.{token}.part")


def _tag(etag: str) -> str:
    return Validators(etag).tag


# Files planted in the cache -------------------------------------------------------


def test_symlink_planted_as_a_partial_is_never_written_through(
    http_server: FaultServer, manager: DownloadManager, cache: Path, payload: bytes, tmp_path: Path
) -> None:
    url = http_server.add("/planted/symlink-partial.bin", payload)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    _partial_name(cache, url, _tag(http_server.route(url).etag or "")).symlink_to(victim)
    path = manager.cached_path(url, sha256=sha256(payload))
    assert victim.read_bytes() == VICTIM
    assert stat.S_ISREG(os.lstat(path).st_mode) and path.read_bytes() == payload


def test_symlinks_planted_at_final_sidecar_and_lock_are_not_followed(
    http_server: FaultServer, manager: DownloadManager, cache: Path, payload: bytes, tmp_path: Path
) -> None:
    url = http_server.add("/planted/symlink-final.bin", payload)
    entry = Entry(cache, url)
    cache.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    # The planted sidecar vouches for the victim's bytes as if they were the payload.
    fake = tmp_path / "fake.json"
    fake.write_text(json.dumps({"url": url, "etag": None, "size": len(VICTIM), "sha256": sha256(payload)}))
    entry.final.symlink_to(victim)
    entry.sidecar.symlink_to(fake)
    entry.lock.symlink_to(victim)
    path = manager.cached_path(url, sha256=sha256(payload))
    assert stat.S_ISREG(os.lstat(path).st_mode) and path.read_bytes() == payload
    assert victim.read_bytes() == VICTIM


def test_folder_planted_as_a_partial_is_ignored(
    http_server: FaultServer, manager: DownloadManager, cache: Path, payload: bytes
) -> None:
    url = http_server.add("/planted/folder-partial.bin", payload)
    planted = _partial_name(cache, url, _tag(http_server.route(url).etag or ""))
    planted.mkdir()
    assert manager.cached_path(url).read_bytes() == payload
    assert planted.is_dir()  # not ours to remove


def test_folder_planted_at_the_final_path_is_a_clear_error(
    http_server: FaultServer, manager: DownloadManager, cache: Path, payload: bytes
) -> None:
    url = http_server.add("/planted/folder-final.bin", payload)
    final = Entry(cache, url).final
    (final / "inside").mkdir(parents=True)
    with pytest.raises(DownloadError, match="a folder sits at") as info:
        manager.cached_path(url)
    assert f"a folder sits at {final} " in str(info.value)
    assert info.value.url == url and (final / "inside").is_dir()
    assert stray_files(cache) == []


_FIFO_CHILD = """
import sys
from framework.download import DownloadManager
path = DownloadManager(sys.argv[1], progress=False, lock_timeout=5).cached_path(sys.argv[2])
print(path.read_bytes() == bytes.fromhex(sys.argv[3]))
"""


@pytest.mark.parametrize("where", ["partial", "sidecar"])
def test_fifo_planted_in_the_cache_never_hangs(
    http_server: FaultServer, cache: Path, tmp_path: Path, where: str
) -> None:
    data = os.urandom(4096)
    url = http_server.add(f"/planted/fifo-{where}.bin", data)
    entry = Entry(cache, url)
    if where == "partial":
        os.mkfifo(_partial_name(cache, url, _tag(http_server.route(url).etag or "")))
    else:  # a published-looking file whose sidecar is a FIFO
        cache.mkdir()
        entry.final.write_bytes(data)
        os.mkfifo(entry.sidecar)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        result = subprocess.run(
            [sys.executable, "-c", _FIFO_CHILD, str(cache), url, data.hex()],
            capture_output=True,
            text=True,
            timeout=40,
            env=env,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"a FIFO planted as the {where} made cached_path hang")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"


# Crash windows ------------------------------------------------------------------


def test_old_sidecar_never_vouches_for_new_bytes(
    http_server: FaultServer, manager: DownloadManager, cache: Path, payload: bytes
) -> None:
    url = http_server.add("/crash/window.bin", payload)
    path = manager.cached_path(url, sha256=sha256(payload))
    # The state a crash leaves between "file replaced" and "sidecar written" (or what
    # a reader sees in that window): other bytes of the same size, the old sidecar.
    other = bytes(reversed(payload))
    temp = path.with_name("elsewhere.tmp")
    temp.write_bytes(other)
    os.replace(temp, path)
    got = manager.cached_path(url, sha256=sha256(payload))
    assert hashlib.sha256(got.read_bytes()).hexdigest() == sha256(payload)
    assert http_server.route(url).gets == 2  # fetched again, not served


def _crash_before_rename(cache: str, url: str) -> None:
    from framework.download import _partial as _publish

    def crash(temp: Path, final: Path) -> None:
        os._exit(3)  # the sidecar is written, the file not yet renamed into place

    _publish.publish_file = crash  # type: ignore[assignment]
    DownloadManager(cache, progress=False).cached_path(url, force=True)


def test_crash_between_sidecar_and_rename_serves_no_mixed_entry(
    http_server: FaultServer, manager: DownloadManager, cache: Path, payload: bytes
) -> None:
    url = http_server.add("/crash/rename.bin", payload)
    manager.cached_path(url)
    route = http_server.route(url)
    new = bytes(reversed(payload))
    route.data, route.etag = new, '"v2"'
    child = FORK.Process(target=_crash_before_rename, args=(str(cache), url))
    child.start()
    child.join(timeout=30)
    assert child.exitcode == 3
    # New sidecar, old file: neither digest may be served for the other's bytes.
    assert Entry(cache, url).lookup(None) is None
    assert manager.cached_path(url, sha256=sha256(new)).read_bytes() == new


# Resume across versions ------------------------------------------------------------


@pytest.mark.parametrize("validator", ["none", "weak_etag", "etag", "last_modified", "weak_etag_kept_date"])
def test_resume_never_splices_two_versions(
    http_server: FaultServer, manager: DownloadManager, payload: bytes, validator: str
) -> None:
    v2 = os.urandom(len(payload))
    first = {
        "none": {},
        "weak_etag": {"etag": 'W/"same"'},  # a weak ETag may stay while the bytes change
        "etag": {"etag": '"v1"'},
        "last_modified": {"last_modified": "Mon, 01 Jan 2024 00:00:00 GMT"},
        # A strong date vouches for the range, but the weak ETag beside it changes with
        # the bytes while the date stays (a copy that kept the file's mtime).
        "weak_etag_kept_date": {"etag": 'W/"v1"', "last_modified": "Mon, 01 Jan 2024 00:00:00 GMT"},
    }
    second = {
        "none": {},
        "weak_etag": {},
        "etag": {"etag": '"v2"'},
        "last_modified": {"last_modified": "Tue, 02 Jan 2024 00:00:00 GMT"},
        "weak_etag_kept_date": {"etag": 'W/"v2"'},
    }
    url = http_server.add(
        f"/versions/{validator}.bin",
        payload,
        **{"etag": None, **first[validator]},
        drop_after=300_000,
        drops=1,
        then={"data": v2, **second[validator]},
    )
    path = manager.cached_path(url)
    assert path.read_bytes() == v2
    assert json.loads(Path(f"{path}.json").read_text())["sha256"] == sha256(v2)
    route = http_server.route(url)
    if validator in ("none", "weak_etag"):
        assert route.ranges == ["", ""]  # no strong validator: never resumed
    else:
        assert route.if_ranges[1] == first[validator].get("last_modified", first[validator].get("etag"))
        assert route.full_gets == 2


def test_resume_with_the_same_last_modified_continues(
    http_server: FaultServer, manager: DownloadManager, payload: bytes
) -> None:
    url = http_server.add(
        "/versions/same-lm.bin",
        payload,
        etag=None,
        last_modified="Mon, 01 Jan 2024 00:00:00 GMT",
        drop_after=300_000,
        drops=1,
    )
    assert manager.cached_path(url, sha256=sha256(payload)).read_bytes() == payload
    route = http_server.route(url)
    assert route.ranges[0] == "" and route.ranges[1].startswith("bytes=") and route.full_gets == 1


def test_local_partial_without_validator_is_not_resumed(
    manager: DownloadManager, cache: Path, tmp_path: Path
) -> None:
    source = tmp_path / "source.bin"
    v1, v2 = os.urandom(100_000), os.urandom(100_000)
    source.write_bytes(v2)
    url = source.resolve().as_uri()
    part = _partial_name(cache, url, NO_VALIDATOR)
    part.write_bytes(v1[:30_000])  # a crashed earlier fetch of version 1
    assert manager.cached_path(url).read_bytes() == v2
    assert stray_files(cache) == []


def test_206_with_unknown_total_resumes(
    http_server: FaultServer, manager: DownloadManager, payload: bytes
) -> None:
    url = http_server.add("/star/total.bin", payload, star_total=True, drop_after=300_000, drops=1)
    assert manager.cached_path(url, sha256=sha256(payload)).read_bytes() == payload
    route = http_server.route(url)
    assert route.ranges[0] == "" and route.ranges[1].startswith("bytes=") and route.full_gets == 1


@pytest.mark.parametrize("capped", [False, True])
def test_a_resume_of_unknown_total_is_counted_against_the_size_first_said(
    http_server: FaultServer, manager: DownloadManager, payload: bytes, capped: bool
) -> None:
    """The first answer said the object's size; resumes say ``bytes a-b/*`` and, from a
    server capping its ranges, bring 100 kB each: they go on until that size, never
    taken for the rest of the object (no sha256 given: nothing else would catch it)."""
    url = http_server.add(
        f"/star/total-{capped}.bin",
        payload,
        etag='"v1"',
        star_total=True,
        drop_after=300_000,
        drops=1,
        range_cap=100_000 if capped else None,
    )
    assert manager.cached_path(url).read_bytes() == payload
    route = http_server.route(url)
    assert route.full_gets == 1 and all(asked.startswith("bytes=") for asked in route.ranges[1:])
    assert len(route.ranges) > 2 if capped else len(route.ranges) == 2


@pytest.mark.parametrize("chunked", [False, True], ids=["adopted", "chunked-first"])
def test_a_resume_of_unknown_total_for_a_size_never_said_goes_on_to_the_end(
    http_server: FaultServer, cache: Path, payload: bytes, chunked: bool
) -> None:
    """No answer of this process gave the object's size (a partial adopted from a call
    that failed, or a first answer in chunks), and resumes say ``bytes a-b/*`` with
    100 kB each: a range's end is not taken for the object's; requests go on until the
    server says the end (416)."""
    resumes = {"star_total": True, "range_cap": 100_000, "chunked": False}
    url = http_server.add(
        f"/star/never-said-{chunked}.bin",
        payload,
        etag='"v1"',
        drop_after=300_000,
        drops=1,
        chunked=chunked,
        swap_at_get=2,
        then=resumes,
    )
    if not chunked:  # a call that fails leaves its partial file to the next one
        with pytest.raises(NetworkError):
            DownloadManager(cache, connections=1, retries=1, progress=False).cached_path(url)
    route = http_server.route(url)
    manager = DownloadManager(cache, connections=1, retries=3, backoff_factor=0.01, progress=False)
    assert manager.cached_path(url).read_bytes() == payload
    assert route.full_gets == 1 and all(asked.startswith("bytes=") for asked in route.ranges[1:])


def test_a_server_that_never_says_the_size_is_resumed_to_the_end(
    http_server: FaultServer, cache: Path, payload: bytes
) -> None:
    """A server that does not know its object's size: a whole answer in chunks (cut),
    ranges of ``bytes a-b/*``, and a 416 past the end that names the version but no size,
    with no HEAD. The 416 for the byte where a range of that version ended says the
    object ends there: resumed, not fetched again."""
    url = http_server.add(
        "/size-unknown/object.bin",
        payload,
        etag='"v1"',
        chunked=True,
        drop_after=300_000,
        drops=1,
        swap_at_get=2,
        then={"star_total": True, "size_unknown": True, "head_status": 405},
    )
    manager = DownloadManager(cache, connections=1, retries=3, backoff_factor=0.01, progress=False)
    assert manager.cached_path(url).read_bytes() == payload
    route = http_server.route(url)
    assert route.full_gets == 1 and len(route.ranges) == 3  # the cut whole, the rest, the 416


@pytest.mark.parametrize("lie", ["encoded", "416-before-the-end"])
def test_a_416_where_a_range_ended_never_publishes_a_prefix(
    http_server: FaultServer, cache: Path, lie: str
) -> None:
    """Where the end of a range of unknown total is not the object's: a gzip-encoded 206
    (its decoded bytes end at no byte of its encoded range) followed by a 416 naming the
    version there, with no HEAD; or a 416 naming the version where a range ended,
    though HEAD gives the object's real, larger size (HEAD wins). Each is a failure after
    the retries; neither publishes the prefix."""
    rows = b"".join(b"row %d,%d\n" % (i % 100, i % 7) for i in range(120_000))  # compresses ~10x
    options: dict[str, Any] = {"star_total": True, "size_unknown": True, "range_cap": 100_000}
    options["range_mode"] = "always"  # a GET without a Range gets a 206 too
    if lie == "encoded":
        options.update(gzip_all=True, head_status=405)
    else:
        options.update(unsatisfiable_from=100_000)
    url = http_server.add(f"/prefix/{lie}.bin", rows, etag='"v1"', **options)
    manager = DownloadManager(cache, connections=1, retries=2, backoff_factor=0.01, progress=False)
    with pytest.raises(NetworkError):
        manager.cached_path(url)
    assert not Entry(cache, url).final.exists()


def test_chunked_ranges_keep_their_connection(http_server: FaultServer, tmp_path: Path) -> None:
    """Ranges of exactly their length in chunks (no Content-Length), from a server capping
    them: each is read to its last chunk, so its connection goes back to the pool."""
    payload = os.urandom(600_000)
    url = http_server.add("/chunked/capped.bin", payload, etag='"v1"', chunked=True, range_cap=100_000)
    manager = DownloadManager(tmp_path, connections=1, retries=2, backoff_factor=0.01, progress=False)
    before = http_server.connections
    assert manager.cached_path(url, sha256=sha256(payload)).read_bytes() == payload
    assert http_server.route(url).gets == 1  # the first answer is whole: no Range yet
    manager.close()

    manager = DownloadManager(tmp_path / "parts", connections=2, part_size=128 << 10, progress=False)
    gets = http_server.route(url).gets
    assert manager.cached_path(url).read_bytes() == payload
    assert http_server.route(url).gets - gets >= 6  # capped ranges, one after another
    assert http_server.connections - before <= 3  # the first GET's, then at most two for all ranges


def test_a_stalled_last_chunk_does_not_hold_a_range_whose_bytes_are_here(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """A server that sends each chunked range's bytes, then waits 3 s before its
    terminating chunk: the range is done once its bytes are here (its connection is
    closed rather than kept), not after the wait, nor after the read timeout."""
    payload = os.urandom(400_000)
    url = http_server.add(
        "/chunked/stalls.bin",
        payload,
        etag='"v1"',
        chunked=True,
        range_cap=100_000,
        last_chunk_wait=3.0,
        drop_after=50_000,
        drops=1,
    )
    manager = DownloadManager(tmp_path, connections=1, retries=2, backoff_factor=0.01, progress=False)
    started = time.monotonic()
    assert manager.cached_path(url).read_bytes() == payload
    assert len(http_server.route(url).ranges) >= 5  # the cut whole answer, then 4 capped ranges
    assert time.monotonic() - started < 6  # one 3 s wait per range would be 12 s


def test_a_resume_that_names_another_total_starts_over(
    http_server: FaultServer, manager: DownloadManager, payload: bytes
) -> None:
    """The same ETag, but the resume's Content-Range names another total than the first
    answer's Content-Length: not the same object, so not resumed after."""
    url = http_server.add(
        "/total/changes.bin",
        payload,
        etag='"v1"',
        drop_after=300_000,
        drops=1,
        swap_at_get=2,
        then={"total_delta": 1000},
    )
    assert manager.cached_path(url).read_bytes() == payload
    ranges = http_server.route(url).ranges
    assert len(ranges) == 3 and ranges[0] == ranges[2] == "" and ranges[1].startswith("bytes=")


# Loops ------------------------------------------------------------------------------


def test_server_answering_416_to_everything_is_one_clear_error(
    http_server: FaultServer, manager: DownloadManager, cache: Path
) -> None:
    url = http_server.add("/loop/416.bin", b"x", status=416)
    with pytest.raises(DownloadError, match="416") as info:
        manager.cached_path(url)
    assert info.value.url == url
    assert http_server.route(url).gets == 1
    assert stray_files(cache) == []


def test_416_for_a_partial_then_416_again_is_bounded(
    http_server: FaultServer, manager: DownloadManager, cache: Path, payload: bytes
) -> None:
    url = http_server.add("/loop/416-partial.bin", payload, range_mode="416")
    _partial_name(cache, url, _tag(http_server.route(url).etag or "")).write_bytes(payload[:1000])
    assert manager.cached_path(url).read_bytes() == payload
    assert http_server.route(url).ranges == ["bytes=1000-", ""]


# Coordination -------------------------------------------------------------------------


def _racer_child(url: str, cache: str, barrier: Any, results: Any, options: dict[str, Any]) -> None:
    try:
        manager = DownloadManager(cache, progress=False, backoff_factor=0.01)
        barrier.wait(timeout=20)
        path = manager.cached_path(url, **options)
        results.put(hashlib.sha256(path.read_bytes()).hexdigest())
    except BaseException as error:
        results.put(repr(error))


def _race_on_a_changed_object(
    http_server: FaultServer,
    manager: DownloadManager,
    payload: bytes,
    name: str,
    racers: int,
    **options: Any,
) -> tuple[str, Route]:
    """Cache `payload`, change the object on the server, then let `racers` processes ask
    for it at once with `options`; each must get the new bytes. Returns the URL and route."""
    url = http_server.add(f"/coord/{name}", payload)
    manager.cached_path(url)
    route = http_server.route(url)
    new = os.urandom(2 << 20)
    route.data, route.etag, route.delay = new, '"v2"', 0.005
    barrier, results = FORK.Barrier(racers), FORK.Queue()
    args = (url, str(manager.cache_dir), barrier, results, options)
    procs = [FORK.Process(target=_racer_child, args=args) for _ in range(racers)]
    for proc in procs:
        proc.start()
    try:
        assert [results.get(timeout=40) for _ in procs] == [sha256(new)] * racers
    finally:
        for proc in procs:
            proc.join(timeout=10)
    return url, route


def test_revalidate_in_two_processes_fetches_a_changed_object_once(
    http_server: FaultServer, manager: DownloadManager, payload: bytes
) -> None:
    _, route = _race_on_a_changed_object(http_server, manager, payload, "revalidate.bin", 2, revalidate=True)
    # The first fetch, then one for the new version (not two). Fetches, not requests: the
    # racers' manager has the default connections, and on a slowed server a fetch's ramp
    # may add ranged requests (a full run in CI once counted 3 GETs for 2 fetches).
    assert route.full_gets == 2


def _extract_slowly(cache: str, url: str, holding: Any) -> None:
    from framework.download import manager as manager_module

    real = manager_module.extract_archive

    def slow(*args: Any, **kwargs: Any) -> None:
        holding.set()
        time.sleep(2.0)  # a healthy holder, busy extracting: no partial file grows
        real(*args, **kwargs)

    manager_module.extract_archive = slow  # type: ignore[assignment]
    DownloadManager(cache, progress=False, lock_timeout=0.5).cached_path(url, extract=True)


def test_waiter_keeps_waiting_while_the_holder_extracts(
    http_server: FaultServer, cache: Path, tmp_path: Path
) -> None:
    import zipfile

    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("inside.txt", "hello")
    url = http_server.add("/coord/extract.zip", archive.read_bytes())
    holding = FORK.Event()
    holder = FORK.Process(target=_extract_slowly, args=(str(cache), url, holding))
    holder.start()
    try:
        assert holding.wait(timeout=20)
        folder = DownloadManager(cache, progress=False, lock_timeout=0.5).cached_path(url, extract=True)
        assert (folder / "inside.txt").read_text() == "hello"
    finally:
        holder.join(timeout=20)
    assert holder.exitcode == 0
    assert http_server.route(url).gets == 1


def _hold_idle(lock_path: str, ready: Any) -> None:
    with EntryLock(Path(lock_path), "filelock", 60, "http://holder/"):
        ready.set()
        time.sleep(60)


def test_lock_timeout_never_says_to_delete_a_live_holders_lock(http_server: FaultServer, cache: Path) -> None:
    url = http_server.add("/coord/live-holder.bin", b"payload")
    cache.mkdir()
    ready = FORK.Event()
    holder = FORK.Process(target=_hold_idle, args=(str(Entry(cache, url).lock), ready))
    holder.start()
    try:
        assert ready.wait(timeout=20)
        with pytest.raises(LockTimeoutError) as info:
            DownloadManager(cache, lock_timeout=0.5, progress=False).cached_path(url)
        message = str(info.value)
        assert f"pid {holder.pid}" in message and "alive" in message
        assert "do not delete" in message and "delete it" not in message
    finally:
        os.kill(holder.pid or 0, signal.SIGKILL)
        holder.join(timeout=10)


def _wait_for_lock(cache: str, url: str, results: Any) -> None:
    try:
        DownloadManager(cache, lock_timeout=0.5, progress=False).cached_path(url)
        results.put("got the file")
    except LockTimeoutError as error:
        results.put(f"LockTimeoutError: {error}")


def test_fifo_planted_as_the_lock_owner_file_never_hangs_a_waiter(
    http_server: FaultServer, cache: Path
) -> None:
    url = http_server.add("/planted/fifo-owner.bin", b"payload")
    cache.mkdir()
    entry = Entry(cache, url)
    ready = FORK.Event()
    holder = FORK.Process(target=_hold_idle, args=(str(entry.lock), ready))
    holder.start()
    waiter = None
    try:
        assert ready.wait(timeout=20)
        owner = entry.lock.with_name(entry.lock.name + ".owner")
        owner.unlink()
        os.mkfifo(owner)  # what a waiter reads to say who holds the lock
        results = FORK.Queue()
        waiter = FORK.Process(target=_wait_for_lock, args=(str(cache), url, results))
        waiter.start()
        try:
            outcome = results.get(timeout=20)
        except Exception:
            outcome = "hung"
        assert outcome.startswith("LockTimeoutError"), outcome
    finally:
        for proc in (holder, waiter):
            if proc is not None:
                proc.kill()
                proc.join(timeout=10)


def _interrupted_then_again(cache: str, url: str, results: Any) -> None:
    manager = DownloadManager(cache, progress=False, backoff_factor=0.01)
    try:
        manager.cached_path(url)
        results.put("not interrupted")
        return
    except KeyboardInterrupt:
        pass
    path = manager.cached_path(url)  # the same process, a later call
    results.put(hashlib.sha256(path.read_bytes()).hexdigest())


def test_after_ctrl_c_a_later_call_in_the_same_process_resumes(http_server: FaultServer, cache: Path) -> None:
    data = os.urandom(4 << 20)  # 64 chunks, 50 ms apart: interrupted well before the end
    url = http_server.add("/coord/ctrl-c.bin", data, delay=0.05)
    results = FORK.Queue()
    child = FORK.Process(target=_interrupted_then_again, args=(str(cache), url, results))
    child.start()
    final = Entry(cache, url).final
    try:
        # Bytes written, not the file's length: a parallel fetch's file is sparse, as long
        # as the object from the start.
        wait_for(lambda: partial_bytes(final) > 256 * 1024, what="a partial file")
        http_server.route(url).delay = 0
        os.kill(child.pid or 0, signal.SIGINT)
        assert results.get(timeout=30) == sha256(data)
    finally:
        child.join(timeout=10)
    route = http_server.route(url)
    assert route.full_gets == 1 and route.ranges[-1].startswith("bytes=")  # resumed
    assert stray_files(cache) == []


# Also ----------------------------------------------------------------------------------


class _FailingHash:
    """A sha256 whose third update fails, as a MemoryError in the hash thread would."""

    real = hashlib.sha256

    def __init__(self, data: bytes = b"") -> None:
        self._h = self.real(data)
        self.updates = 0

    def update(self, data: bytes) -> None:
        self.updates += 1
        if self.updates == 3:
            raise MemoryError("injected")
        self._h.update(data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def _fetch_with_failing_hash(source: str, cache: str, results: Any) -> None:
    hashlib.sha256 = _FailingHash  # type: ignore[assignment,misc]
    try:
        DownloadManager(cache, progress=False).cached_path(source)
        results.put("published")
    except DownloadError as error:
        results.put(f"DownloadError: {error}")


@pytest.mark.parametrize("size_mib", [4, 48])  # 48 MiB: more than the hash queue holds
def test_hash_thread_failure_is_an_error_never_a_hang_or_a_partial_digest(
    http_server: FaultServer, cache: Path, size_mib: int
) -> None:
    url = http_server.add(f"/hash/fails-{size_mib}.bin", os.urandom(size_mib << 20))
    results = FORK.Queue()
    child = FORK.Process(target=_fetch_with_failing_hash, args=(url, str(cache), results))
    child.start()
    try:
        outcome = results.get(timeout=40)
    except Exception:
        outcome = "hung"
    finally:
        child.kill()
        child.join(timeout=10)
    assert outcome.startswith("DownloadError: hashing the download failed: MemoryError"), outcome
    assert not Entry(cache, url).final.exists()
    assert stray_files(cache) == []


@pytest.mark.parametrize("host_kind", ["same hostname, no namespace", "same hostname, other namespace"])
def test_partial_from_another_pid_namespace_is_not_taken(
    http_server: FaultServer, manager: DownloadManager, cache: Path, payload: bytes, host_kind: str
) -> None:
    hostname = HOST.rsplit("-", 1)[0] if "-" in HOST else HOST
    host = hostname if host_kind.endswith("no namespace") else f"{hostname}-1"
    url = http_server.add(f"/pidns/{host_kind.replace(' ', '-').replace(',', '')}.bin", payload)
    part = _partial_name(cache, url, _tag(http_server.route(url).etag or ""), host=host)
    part.write_bytes(payload[:5000])  # fresh: its writer, in another container, may be alive
    assert manager.cached_path(url).read_bytes() == payload
    assert http_server.route(url).ranges == [""]
    assert part.read_bytes() == payload[:5000]


@pytest.mark.parametrize("bad", ["abc", "g" * 64, sha256(b"x") + "0", 12345])
def test_invalid_sha256_is_refused_before_any_request(
    http_server: FaultServer, manager: DownloadManager, bad: Any
) -> None:
    url = http_server.add(f"/badsha/{bad!s:.8}.bin", b"data")
    with pytest.raises(InvalidArgumentError, match="sha256 must be 64 hexadecimal digits") as info:
        manager.cached_path(url, sha256=bad)
    assert isinstance(info.value, ValueError) and info.value.url == url
    assert http_server.route(url).gets == 0 and http_server.route(url).heads == 0


def test_upper_case_sha256_is_accepted(http_server: FaultServer, manager: DownloadManager) -> None:
    url = http_server.add("/badsha/upper.bin", b"data")
    assert manager.cached_path(url, sha256=sha256(b"data").upper()).read_bytes() == b"data"


def test_offline_message_names_the_cached_copy_with_another_digest(
    http_server: FaultServer,
    manager: DownloadManager,
    cache: Path,
    payload: bytes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = http_server.add("/offline/other-digest.bin", payload)
    manager.cached_path(url)
    offline = DownloadManager(cache, offline=True, progress=False)
    with pytest.raises(OfflineError) as info:
        offline.cached_path(url, sha256=sha256(b"another version"))
    message = str(info.value)
    assert sha256(payload) in message and "no verified copy" not in message
    with pytest.raises(OfflineError, match="force=True"):
        offline.cached_path(url, force=True)


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("bytes 5-9/10", (5, 10)),
        ("bytes 5-9/*", (5, None)),
        ("bytes */10", (None, 10)),
        ("junk", (None, None)),
        ("bytes 9-5/10", (None, None)),  # a range that contradicts itself says nothing
        ("bytes 5-10/10", (None, None)),
        ("bytes 0-9/5", (None, None)),
    ],
)
def test_content_range_forms(value: str, parsed: tuple[Any, Any]) -> None:
    assert parse_content_range(value) == parsed


def test_a_resume_answered_with_a_range_that_contradicts_itself_is_never_placed(
    http_server: FaultServer, manager: DownloadManager, cache: Path, payload: bytes
) -> None:
    """A resume answered with the whole object as a 206 whose last byte is past its
    total (``bytes 0-N/N``): where those bytes belong is unknown, so they are never
    appended to what is here; asked again without a Range, the server says the same,
    and that is a clear error, with nothing published."""
    url = http_server.add(
        "/contradiction/resume.bin",
        payload,
        etag='"v1"',
        drop_after=300_000,
        drops=1,
        swap_at_get=2,
        then={"range_mode": "from_zero", "total_delta": -1},
    )
    with pytest.raises(DownloadError, match="contradicts itself"):
        manager.cached_path(url)
    ranges = http_server.route(url).ranges
    assert len(ranges) == 3 and ranges[0] == ranges[2] == "" and ranges[1].startswith("bytes=")
    assert not Entry(cache, url).final.exists()
    assert stray_files(cache) == []


@pytest.mark.timeout(20)
@pytest.mark.parametrize("etag", [None, '"v1"'])
def test_capped_answers_that_bring_nothing_new_are_failures(
    http_server: FaultServer, cache: Path, etag: Any
) -> None:
    """A server that answers every GET, Range or not, with its first 1,000 bytes as a
    206 (``bytes 0-999/5000``): a capped answer is followed by another without counting
    as a failure only while each goes further into the object, so this one ends after
    the retries instead of asking forever."""
    url = http_server.add(
        f"/capped-from-zero/{etag is not None}.bin",
        os.urandom(5000),
        etag=etag,
        range_mode="from_zero",
        range_cap=1000,
    )
    manager = DownloadManager(cache, connections=1, retries=3, backoff_factor=0.01, progress=False)
    with pytest.raises(NetworkError, match="1000 of 5000"):
        manager.cached_path(url)
    assert http_server.route(url).gets <= 4


def _one_answer(head: str, body: bytes) -> str:
    """A server on 127.0.0.1 that answers one request with exactly `head` (status line and
    headers) and `body`, then closes: headers no test server would send together."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        connection, _ = listener.accept()
        with connection, listener:
            connection.recv(65536)
            connection.sendall(head.replace("\n", "\r\n").encode() + b"\r\n" + body)

    threading.Thread(target=answer, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}/x.bin"


@pytest.mark.parametrize(
    ("head", "sent", "read"),
    [
        # A range without a Content-Length ends at its own length: what comes past it is not its.
        ("HTTP/1.1 206 Partial Content\nContent-Range: bytes 0-9/40\nConnection: close\n", 40, 10),
        ("HTTP/1.0 206 Partial Content\nContent-Range: bytes 0-9/40\n", 10, 10),
        ("HTTP/1.1 206 Partial Content\nContent-Range: bytes 0-9/40\nConnection: close\n", 6, None),
        # Only a 206's range counts: a stray Content-Range on a 200 is not the body's length.
        ("HTTP/1.1 200 OK\nContent-Range: bytes 0-39/40\nConnection: close\n", 20, 20),
    ],
    ids=["longer-than-its-range", "http-1.0", "cut-short", "200"],
)
def test_a_body_without_a_content_length_is_counted_against_its_range(
    head: str, sent: int, read: Any
) -> None:
    from framework_plugins.http import HttpBackend

    body = os.urandom(sent)
    backend = HttpBackend()
    stream = backend.open(_one_answer(head, body), 0, end=10)
    if read is None:
        with pytest.raises(NetworkError, match="6 of the range's 10 bytes"):
            b"".join(stream.chunks)
    else:
        assert b"".join(stream.chunks) == body[:read]
    stream.close()
    backend.close()


@pytest.mark.parametrize("content_range", ["bytes */40", "bytes 0-40/40", "bytes 0-9/40 junk", ""])
def test_a_206_whose_range_names_no_place_is_unplaced(content_range: str) -> None:
    from framework_plugins.http import HttpBackend

    from framework.download.backend import UNPLACED

    header = f"Content-Range: {content_range}\n" if content_range else ""
    backend = HttpBackend()
    url = _one_answer(f"HTTP/1.1 206 Partial Content\n{header}Content-Length: 10\n", bytes(10))
    stream = backend.open(url, 0, end=10)
    assert (stream.start, stream.size) == (UNPLACED, None)
    stream.close()
    backend.close()


def test_a_content_range_that_contradicts_the_length_says_nothing() -> None:
    assert parse_content_range("bytes 5-9/10", 5) == (5, 10)
    assert parse_content_range("bytes 5-9/10", 6) == (None, None)
    assert parse_content_range("bytes */10", 120) == (None, 10)  # a 416's body is its own


def test_s3_206_with_unknown_total_keeps_its_offset(s3_env: str) -> None:
    import io

    from botocore.response import StreamingBody
    from botocore.stub import Stubber
    from framework_plugins.s3 import S3Backend

    # moto always sends the total, so botocore's own stubber plays an S3-compatible
    # server that answers a range with an unknown total ("bytes 6-9/*").
    backend = S3Backend()
    answer = {
        "Body": StreamingBody(io.BytesIO(b"tail"), 4),
        "ContentLength": 4,
        "ContentRange": "bytes 6-9/*",
    }
    with Stubber(backend.client) as stub:
        stub.add_response("get_object", answer, {"Bucket": "b", "Key": "k", "Range": "bytes=6-"})
        stream = backend.open("s3://b/k", 6)
    assert (stream.start, stream.size) == (6, None)  # not "a whole object of 4 bytes"


# Dependency floors ----------------------------------------------------------------------


def _declared_floor(package: str) -> tuple[int, ...]:
    import configparser

    config = configparser.ConfigParser()
    config.read(Path(__file__).resolve().parents[2] / "setup.cfg")
    for line in config["options"]["install_requires"].split():
        name, _, floor = line.partition(">=")
        if name == package:
            return tuple(int(part) for part in floor.split("."))
    raise AssertionError(f"{package} is not in install_requires")


def test_declared_urllib3_floor_has_read1() -> None:
    # HttpBackend reads bodies with `raw.read1`, which urllib3 has only since 2.2.
    assert _declared_floor("urllib3") >= (2, 2)


# Content encodings ----------------------------------------------------------------------


@pytest.mark.parametrize("drop", [False, True])
def test_gzip_encoded_body_is_never_cached_or_spliced(
    http_server: FaultServer, manager: DownloadManager, payload: bytes, drop: bool
) -> None:
    # The server ignores "Accept-Encoding: identity" for whole answers; with `drop`, the
    # resume (a range) comes as identity bytes of the same Last-Modified version.
    url = http_server.add(
        f"/encoding/gzip-{drop}.bin",
        payload,
        etag=None,
        last_modified="Mon, 01 Jan 2024 00:00:00 GMT",
        gzip_whole=True,
        **({"drop_after": 200_000, "drops": 1} if drop else {}),
    )
    path = manager.cached_path(url)
    assert path.read_bytes() == payload
    assert json.loads(Path(f"{path}.json").read_text())["sha256"] == sha256(payload)


def test_gzip_encoded_range_is_not_appended(
    http_server: FaultServer, manager: DownloadManager, cache: Path
) -> None:
    import gzip

    from framework.download.backend import ByteStream

    data = os.urandom(300_000)
    url = http_server.add("/encoding/gzip-range.bin", data)
    _partial_name(cache, url, _tag(http_server.route(url).etag or "")).write_bytes(data[:1000])
    backend = manager.backend_for(url)
    real = backend.open

    def gzip_ranges(url: str, offset: int = 0, **kwargs: Any) -> ByteStream:
        stream = real(url, offset, **kwargs)
        if offset:  # a range of encoded bytes, as a server compressing on the fly sends
            body = gzip.compress(b"".join(stream.chunks))
            stream.chunks, stream.encoding = iter([body]), "gzip"
        return stream

    backend.open = gzip_ranges  # type: ignore[method-assign]
    assert manager.cached_path(url).read_bytes() == data
    assert http_server.route(url).ranges == ["bytes=1000-", ""]


def test_last_modified_no_older_than_the_answer_is_never_a_resume_validator(
    http_server: FaultServer, manager: DownloadManager, payload: bytes
) -> None:
    from email.utils import formatdate

    # Modified "after" the answer's Date (as one rewritten within the second it was
    # served looks): a weak validator (RFC 9110 8.8.2.2), so never sent in If-Range.
    v2 = os.urandom(len(payload))
    url = http_server.add(
        "/versions/weak-last-modified.bin",
        payload,
        etag=None,
        last_modified=formatdate(time.time() + 3600, usegmt=True),
        drop_after=300_000,
        drops=1,
        then={"data": v2},
    )
    assert manager.cached_path(url).read_bytes() == v2
    route = http_server.route(url)
    assert route.ranges == ["", ""] and route.if_ranges == ["", ""]


def test_last_modified_strength_follows_the_date() -> None:
    modified = "Mon, 01 Jan 2024 00:00:00 GMT"
    assert Validators(None, modified, "Mon, 01 Jan 2024 00:00:01 GMT").if_range == modified
    assert Validators(None, modified, modified).if_range is None
    assert Validators(None, modified, None).if_range is None
    assert Validators(None, modified, "not a date").if_range is None


# Extraction -----------------------------------------------------------------------------


def _zip(text: str) -> bytes:
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("model.py", text)
    return buffer.getvalue()


@pytest.mark.parametrize("planted", ["symlink", "folder"])
def test_planted_extracted_folder_is_never_served(
    http_server: FaultServer, manager: DownloadManager, cache: Path, tmp_path: Path, planted: str
) -> None:
    url = http_server.add(f"/extract/planted-{planted}.zip", _zip("real"))
    manager.cached_path(url)  # fetched, not extracted yet
    entry = Entry(cache, url)
    digest = json.loads(entry.sidecar.read_text())["sha256"]  # anyone can read it
    evil = tmp_path / "attacker"
    evil.mkdir()
    (evil / "model.py").write_text("evil")
    if planted == "symlink":
        entry.extracted.symlink_to(evil)
    else:  # a real folder renamed into place, with a marker naming another folder
        os.rename(evil, entry.extracted)
    folder = os.stat(entry.extracted)
    marker = entry.extracted.with_name(entry.extracted.name + ".json")
    marker.write_text(json.dumps({"sha256": digest, "folder": [folder.st_dev, folder.st_ino + 1]}))
    got = manager.cached_path(url, extract=True)
    assert stat.S_ISDIR(os.lstat(got).st_mode) and (got / "model.py").read_text() == "real"
    if planted == "symlink":
        assert (evil / "model.py").read_text() == "evil"  # followed by nothing
    assert not [n for n in os.listdir(cache) if n.endswith(".old")]


# Trust in a shared cache ------------------------------------------------------------------


def _as_another_user(monkeypatch: pytest.MonkeyPatch, *paths: Path) -> None:
    """Make `paths` belong to another user: chown as root, else pretend to be another uid."""
    if os.geteuid() == 0:
        for path in paths:
            os.chown(path, 12345, 12345, follow_symlinks=False)
    else:
        uid = os.geteuid() + 1
        monkeypatch.setattr(os, "geteuid", lambda: uid)


def test_another_users_file_and_sidecar_are_hashed_before_sha256_trusts_them(
    http_server: FaultServer, manager: DownloadManager, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from framework.download._cache import file_identity

    real = os.urandom(50_000)
    url = http_server.add("/trust/forged.bin", real)
    entry = Entry(cache, url)
    cache.mkdir()
    # A neighbour plants other bytes and a sidecar that names them and the real digest.
    entry.final.write_bytes(b"backdoored weights")
    inode, size, mtime_ns = file_identity(os.lstat(entry.final))
    forged = {"url": url, "etag": None, "last_modified": None, "size": size, "sha256": sha256(real)}
    entry.sidecar.write_text(json.dumps({**forged, "time": 0, "inode": inode, "mtime_ns": mtime_ns}))
    _as_another_user(monkeypatch, entry.final, entry.sidecar)
    assert manager.cached_path(url, sha256=sha256(real)).read_bytes() == real
    assert http_server.route(url).gets == 1


def test_another_users_verified_file_is_hashed_once(
    http_server: FaultServer, manager: DownloadManager, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hashlib as hashlib_module

    data = os.urandom(50_000)
    url = http_server.add("/trust/neighbours.bin", data)
    path = manager.cached_path(url)
    entry = Entry(cache, url)
    _as_another_user(monkeypatch, entry.final, entry.sidecar)
    reads = []
    real_digest = hashlib_module.file_digest

    def counted(*args: Any, **kwargs: Any) -> Any:
        reads.append(1)
        return real_digest(*args, **kwargs)

    monkeypatch.setattr(hashlib_module, "file_digest", counted)
    for _ in range(3):
        assert manager.cached_path(url, sha256=sha256(data)) == path
    assert len(reads) == 1 and http_server.route(url).gets == 1
    manager.cached_path(url)  # without sha256 the sidecar is trusted: nothing is read
    assert len(reads) == 1


def _extract_while_swapped(cache: str, url: str, evil: str, mode: str, results: Any) -> None:
    from framework.download import manager as manager_module

    real = Entry.cached

    def swap_after_the_check(entry: Entry) -> Any:
        meta = real(entry)
        caller, above = sys._getframe(1).f_code.co_name, sys._getframe(2).f_code.co_name
        # The neighbour's rename lands after the check (where extraction once took the digest).
        if caller == "_open_published" or (caller, above) == ("_digest", "cached_path"):
            temp = entry.final.with_name("swap.tmp")
            if mode == "fifo":
                os.mkfifo(temp)
            else:
                temp.symlink_to(evil)
            os.rename(temp, entry.final)
        return meta

    Entry.cached = swap_after_the_check  # type: ignore[method-assign]
    try:
        folder = manager_module.DownloadManager(cache, progress=False).cached_path(url, extract=True)
        results.put((folder / "model.py").read_text())
    except DownloadError as error:
        results.put(f"DownloadError: {error}")


@pytest.mark.parametrize("mode", ["fifo", "symlink"])
def test_extraction_reads_the_verified_file_never_what_replaced_it(
    http_server: FaultServer, manager: DownloadManager, cache: Path, tmp_path: Path, mode: str
) -> None:
    url = http_server.add(f"/extract/swapped-{mode}.zip", _zip("real"))
    manager.cached_path(url)
    evil = tmp_path / "evil.zip"
    evil.write_bytes(_zip("evil"))
    results = FORK.Queue()
    child = FORK.Process(target=_extract_while_swapped, args=(str(cache), url, str(evil), mode, results))
    child.start()
    try:
        outcome = results.get(timeout=30)
    except Exception:
        outcome = "hung"
    finally:
        child.kill()
        child.join(timeout=10)
    assert outcome.startswith("DownloadError: ") and "was replaced after it was verified" in outcome, outcome
    assert not Entry(cache, url).extracted.exists()


def test_hard_link_planted_at_the_lock_path_is_never_opened(
    http_server: FaultServer, manager: DownloadManager, cache: Path, tmp_path: Path
) -> None:
    url = http_server.add("/planted/hardlink-lock.bin", b"payload")
    cache.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    os.chmod(victim, 0o664)
    entry = Entry(cache, url)
    os.link(victim, entry.lock)  # a regular file, but another name of the victim
    with EntryLock(entry.lock, "filelock", 5, url) as lock:
        assert not lock.held  # skipped: the lock only saves work
    assert manager.cached_path(url).read_bytes() == b"payload"
    assert victim.read_bytes() == VICTIM and stat.S_IMODE(os.stat(victim).st_mode) == 0o664


def test_declared_filelock_floor_never_truncates_a_lock_file() -> None:
    # filelock before 4 opened an existing lock file with O_TRUNC; 4.3.1 is the version tested.
    assert _declared_floor("filelock") >= (4, 3, 1)


# Copied caches ------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["copied", "older release"])
def test_copied_or_older_cache_is_served_after_one_hash(
    http_server: FaultServer, cache: Path, tmp_path: Path, how: str
) -> None:
    import shutil

    data = os.urandom(100_000)
    url = http_server.add(f"/copied/{how.replace(' ', '-')}.bin", data)
    DownloadManager(cache, progress=False).cached_path(url)
    node = tmp_path / "node-local"
    if how == "copied":  # cp -a: same bytes, times and sidecar; new inodes
        shutil.copytree(cache, node, copy_function=shutil.copy2)
    else:  # the sidecar an older release wrote: no inode, no mtime
        node = cache
        meta = json.loads(Entry(cache, url).sidecar.read_text())
        del meta["inode"], meta["mtime_ns"]
        Entry(cache, url).sidecar.write_text(json.dumps(meta))
    served = DownloadManager(node, offline=True, progress=False).cached_path(url, sha256=sha256(data))
    assert served.read_bytes() == data
    assert DownloadManager(node, progress=False).cached_path(url) == served
    assert http_server.route(url).gets == 1  # never fetched again
    assert Entry(node, url).lookup(sha256(data)) is not None  # bound anew: no hash next time


def test_offline_copy_that_does_not_match_its_sidecar_is_reported_unbound(
    http_server: FaultServer, cache: Path
) -> None:
    data = os.urandom(100_000)
    url = http_server.add("/copied/damaged.bin", data)
    path = DownloadManager(cache, progress=False).cached_path(url)
    damaged = path.with_name("damaged.tmp")
    damaged.write_bytes(bytes(reversed(data)))  # same size, other bytes
    os.replace(damaged, path)
    with pytest.raises(OfflineError, match=r"a copy is present at .* but unbound"):
        DownloadManager(cache, offline=True, progress=False).cached_path(url)


def test_complete_partial_and_a_server_refusing_head_starts_over(
    http_server: FaultServer, manager: DownloadManager, cache: Path, payload: bytes
) -> None:
    # A process killed after the last byte left the whole object; the resume gets a 416
    # that names no version, and the server answers HEAD with 405.
    url = http_server.add("/resume/no-head.bin", payload, head_status=405)
    _partial_name(cache, url, _tag(http_server.route(url).etag or "")).write_bytes(payload)
    assert manager.cached_path(url, sha256=sha256(payload)).read_bytes() == payload
    assert http_server.route(url).ranges == [f"bytes={len(payload)}-", ""]
    assert stray_files(cache) == []


def _interrupted_while_adopting(cache: str, url: str, results: Any) -> None:
    from framework.download import _partial as _publish

    real = _publish.new_hasher

    class Interrupted:
        def update(self, data: bytes) -> None:
            raise KeyboardInterrupt  # Ctrl-C while the adopted file is hashed again

    _publish.new_hasher = Interrupted  # type: ignore[assignment]
    manager = DownloadManager(cache, progress=False, backoff_factor=0.01)
    try:
        manager.cached_path(url)
        results.put("not interrupted")
        return
    except KeyboardInterrupt:
        pass
    _publish.new_hasher = real
    path = manager.cached_path(url)  # the same process, a later call
    results.put(hashlib.sha256(path.read_bytes()).hexdigest())


def test_ctrl_c_while_adopting_a_partial_leaves_it_to_a_later_call(
    http_server: FaultServer, cache: Path, payload: bytes
) -> None:
    url = http_server.add("/coord/ctrl-c-adopting.bin", payload)
    _partial_name(cache, url, _tag(http_server.route(url).etag or "")).write_bytes(payload[:300_000])
    results = FORK.Queue()
    child = FORK.Process(target=_interrupted_while_adopting, args=(str(cache), url, results))
    child.start()
    try:
        assert results.get(timeout=30) == sha256(payload)
    finally:
        child.join(timeout=10)
    assert http_server.route(url).ranges == ["bytes=300000-"]  # resumed, not fetched again
    assert stray_files(cache) == []


def test_racers_with_force_fetch_once(
    http_server: FaultServer, manager: DownloadManager, payload: bytes
) -> None:
    url, route = _race_on_a_changed_object(http_server, manager, payload, "force.bin", 3, force=True)
    assert route.full_gets == 2  # the first fetch, then one for all three racers (see above)
    manager.cached_path(url, force=True)  # a later call: published before it began
    assert route.full_gets == 3


@pytest.mark.parametrize(
    ("kwargs", "fields"),
    [
        ({"extract": True}, {}),  # no sha256
        ({"revalidate": True}, {"sha256": "0" * 64, "etag": 5}),
        ({}, {"sha256": "0" * 64, "size": "12"}),
        ({"sha256": "0" * 64}, {"sha256": ["x"], "time": "yesterday"}),
    ],
)
def test_malformed_sidecar_is_a_miss_never_a_raw_error(
    http_server: FaultServer,
    manager: DownloadManager,
    cache: Path,
    kwargs: dict[str, Any],
    fields: dict[str, Any],
) -> None:
    from framework.download._cache import file_identity

    data = _zip("real")
    url = http_server.add(f"/sidecar/malformed-{len(http_server.routes)}.zip", data)
    manager.cached_path(url)
    entry = Entry(cache, url)
    inode, size, mtime_ns = file_identity(os.lstat(entry.final))
    entry.sidecar.write_text(json.dumps({"inode": inode, "size": size, "mtime_ns": mtime_ns, **fields}))
    if kwargs.get("sha256"):
        with pytest.raises(DownloadError):  # fetched again: the bytes are not 0000...
            manager.cached_path(url, **kwargs)
    else:
        manager.cached_path(url, **kwargs)  # fetched again, published with a good sidecar
        assert json.loads(entry.sidecar.read_text())["sha256"] == sha256(data)
    assert http_server.route(url).gets == 2


@pytest.mark.parametrize("source", ["argument", "environment"])
def test_offline_message_names_where_offline_mode_came_from(
    http_server: FaultServer, cache: Path, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    url = http_server.add("/offline/source.bin", b"x")
    monkeypatch.setenv("FRAMEWORK_OFFLINE", "1" if source == "environment" else "0")
    manager = DownloadManager(cache, offline=True if source == "argument" else None, progress=False)
    with pytest.raises(OfflineError) as info:
        manager.cached_path(url)
    message = str(info.value)
    if source == "argument":
        assert "offline=True" in message and "FRAMEWORK_OFFLINE" not in message
    else:
        assert "FRAMEWORK_OFFLINE=1" in message and "unset FRAMEWORK_OFFLINE" in message


def test_folder_planted_at_the_sidecar_path_is_named_in_the_error(
    http_server: FaultServer, manager: DownloadManager, cache: Path, payload: bytes
) -> None:
    url = http_server.add("/planted/folder-sidecar.bin", payload)
    entry = Entry(cache, url)
    (entry.sidecar / "inside").mkdir(parents=True)
    with pytest.raises(DownloadError) as info:
        manager.cached_path(url)
    assert f"a folder sits at {entry.sidecar} " in str(info.value)
    assert not entry.final.exists() and (entry.sidecar / "inside").is_dir()
    assert stray_files(cache) == []


def test_sweep_never_removes_another_users_leftovers(
    http_server: FaultServer, manager: DownloadManager, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = http_server.add("/planted/others-leftovers.bin", b"x" * 10)
    entry = Entry(cache, url)
    cache.mkdir()
    pid = _dead_pid()
    planted = cache / f"{entry.final.name}.json.{HOST}.{pid}.deadbeef.tmp"
    planted.write_text("someone else's file")
    folder = cache / f"{entry.extracted.name}.{HOST}.{pid}.deadbeef.tmp"
    (folder / "sub").mkdir(parents=True)
    _as_another_user(monkeypatch, planted, folder)
    assert manager.cached_path(url).read_bytes() == b"x" * 10
    assert planted.read_text() == "someone else's file" and (folder / "sub").is_dir()


def test_failed_fsync_never_leaves_the_hash_thread_blocked(
    http_server: FaultServer, manager: DownloadManager, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import threading

    url = http_server.add("/fsync/fails.bin", os.urandom(100_000))

    def hashing() -> bool:
        return any(thread.name == "framework-hash" for thread in threading.enumerate())

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(DownloadError):
        manager.cached_path(url)
    wait_for(lambda: not hashing(), timeout=5, what="the hash thread to end")
    assert not Entry(cache, url).final.exists() and stray_files(cache) == []


def test_revalidate_serves_the_pinned_cached_copy(
    http_server: FaultServer, manager: DownloadManager, payload: bytes
) -> None:
    url = http_server.add("/coord/revalidate-pinned.bin", payload)
    path = manager.cached_path(url, sha256=sha256(payload))
    route = http_server.route(url)
    route.data, route.etag = os.urandom(len(payload)), '"v2"'  # the server's object changed
    assert manager.cached_path(url, sha256=sha256(payload), revalidate=True) == path
    assert path.read_bytes() == payload and route.gets == 1
