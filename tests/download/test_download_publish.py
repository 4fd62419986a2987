"""The fetch -> verify -> publish -> metadata path under a hostile cache folder: partial
files adopted only when they are ours, files planted in the cache, crash windows,
processes coordinating on one entry, trust in a shared cache, copied caches, and the
fsyncs before and after the rename."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from framework_plugins.http import HttpBackend

from framework.download import DownloadManager
from framework.download._cache import HOST, Entry, unique_token
from framework.download._lock import EntryLock
from framework.download._partial import PartialName, partial_bytes
from framework.download._validators import Validators
from framework.errors import (
    DownloadError,
    InvalidArgumentError,
    LockTimeoutError,
    OfflineError,
)
from tests.support.download import (
    FORK,
    FaultServer,
    Route,
    V,
    sha256,
    stray_files,
    unique_path,
    wait_for,
)
from tests.support.download import planted_partial as _planted_partial
from tests.support.download import single_manager as _single

# -- _ours: another user's partial is never adopted --------------------------------------


def test_another_users_partial_is_never_adopted(http_server: FaultServer, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    data = os.urandom(200_000)
    url = http_server.add(unique_path("foreign-partial"), data, etag='"v"')
    part = _planted_partial(tmp_path, url, V, data[:50_000])
    os.chown(part, 12345, 12345)
    path = _single(tmp_path, HttpBackend(backoff_factor=0.01)).cached_path(url)
    assert path.read_bytes() == data
    assert http_server.route(url).ranges == [""]  # fetched from byte 0, never resumed from their bytes
    assert part.exists() and part.stat().st_uid == 12345  # their file untouched, not renamed


# -- _Partial._take: fstat re-check after the rename -------------------------------------


def test_a_file_swapped_in_after_the_rename_is_not_adopted(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    data = os.urandom(200_000)
    url = http_server.add(unique_path("swap-after-rename"), data, etag='"v"')
    part = _planted_partial(tmp_path, url, V, data[:50_000])
    real_rename = os.rename

    def rename(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        real_rename(src, dst, *args, **kwargs)
        if str(src) == str(part):  # another user swaps their own file in, between rename and open
            os.unlink(dst)
            Path(dst).write_bytes(b"\0" * 50_000)
            os.chown(dst, 12345, 12345)

    monkeypatch.setattr(os, "rename", rename)
    path = _single(tmp_path, HttpBackend(backoff_factor=0.01)).cached_path(url)
    assert path.read_bytes() == data
    assert http_server.route(url).ranges == [""]


# -- fetch: the partial file is fsynced before it is published ---------------------------


def test_a_failed_fsync_of_the_partial_publishes_nothing(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = http_server.add(unique_path("fsync-part"), os.urandom(100_000), etag='"v"')
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".part"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(DownloadError):
        _single(tmp_path, HttpBackend(backoff_factor=0.01)).cached_path(url)
    assert not Entry(tmp_path, url).final.exists()


# -- publish_file: one fsync per miss, of the data, before the rename ----------------------


def test_a_miss_fsyncs_the_data_once_before_the_rename(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bytes are durable before they are published; nothing else is fsynced (the
    sidecar and the rename are not: a loss there is a miss, never other bytes)."""
    url = http_server.add(unique_path("fsync-once"), os.urandom(4096), etag='"v"')
    final = Entry(tmp_path, url).final
    real_fsync = os.fsync
    synced: list[tuple[bool, bool]] = []  # (a regular file, published already)

    def fsync(fd: int) -> None:
        synced.append((stat.S_ISREG(os.fstat(fd).st_mode), final.exists()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    path = _single(tmp_path, HttpBackend(backoff_factor=0.01)).cached_path(url)
    assert synced == [(True, False)]
    assert path.read_bytes() == http_server.route(url).data


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
    path = PartialName(final, tag, f"{host}.{pid or _dead_pid()}.{token}").path
    path.parent.mkdir(exist_ok=True)
    return path


def _tag(etag: str) -> str:
    return Validators(etag).tag


# -- files planted in the cache ----------------------------------------------------------


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


# -- crash windows -----------------------------------------------------------------------


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


# -- processes coordinating on one entry -------------------------------------------------


def _racer_child(url: str, cache: str, barrier: Any, results: Any, options: dict[str, Any]) -> None:
    try:
        manager = DownloadManager(cache, progress=False, backoff_factor=0.01)
        barrier.wait(timeout=20)
        path = manager.cached_path(url, **options)
        results.put(hashlib.sha256(path.read_bytes()).hexdigest())
    except BaseException as error:
        results.put(repr(error))


def _race_on_a_changed_object(
    http_server: FaultServer, manager: DownloadManager, payload: bytes, name: str, racers: int,
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
    _, route = _race_on_a_changed_object(
        http_server, manager, payload, "revalidate.bin", 2, revalidate=True
    )
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
        wait_for(owner.exists, what="the owner file")  # written once the lock is held a moment
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


def _declared_floor(package: str) -> tuple[int, ...]:
    import configparser

    config = configparser.ConfigParser()
    config.read(Path(__file__).resolve().parents[2] / "setup.cfg")
    for line in config["options"]["install_requires"].split():
        name, _, floor = line.partition(">=")
        if name == package:
            return tuple(int(part) for part in floor.split("."))
    raise AssertionError(f"{package} is not in install_requires")


def _zip(text: str) -> bytes:
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("model.py", text)
    return buffer.getvalue()


# -- trust in a shared cache -------------------------------------------------------------


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


# -- copied caches -----------------------------------------------------------------------


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
