"""The power-loss rule for partial files: a partial file kept through an outage, or
left by a writer the machine's reboot ended, is resumed only when its bytes reached the
disk, and is otherwise fetched again from byte 0. Real signals and processes at the fault
server on 127.0.0.1."""

from __future__ import annotations

import os
import secrets
import signal
from pathlib import Path
from typing import Any

import pytest

from framework.download import _partial
from framework.download._cache import HOST, RELEASED_PID, Entry
from framework.download._partial import PartialName
from framework.download._validators import _etag_tag
from tests.support.download import (
    PART,
    FaultServer,
    parts_manager,
    stray_files,
    unique_path,
    wait_for,
)

pytestmark = pytest.mark.timeout(60)


def _plant(cache: Path, url: str, etag: str, data: bytes, host: str = HOST, pid: int = RELEASED_PID) -> Path:
    """A partial file of `url` at version `etag` holding `data`, named for `host` and `pid`
    (by default: released, as `Partial.close` leaves a file it fsynced and let go of)."""
    final = Entry(cache, url).final
    path = PartialName(final, _etag_tag(etag), f"{host}.{pid}.{secrets.token_hex(4)}").path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _before_this_boot(path: Path, seconds: float = 600.0) -> None:
    booted = _partial.boot_time()
    assert booted is not None, "this test needs Linux's /proc/stat"
    os.utime(path, (booted - seconds, booted - seconds))


class _InterruptedHash:
    """A sha256 whose first update is a Ctrl-C: the user interrupts the hashing of an
    adopted partial file (a large one takes minutes to read back)."""

    fired = False

    def __init__(self) -> None:
        import hashlib

        self.inner = hashlib.sha256()

    def update(self, data: bytes) -> None:
        if not _InterruptedHash.fired:
            _InterruptedHash.fired = True
            raise KeyboardInterrupt
        self.inner.update(data)

    def hexdigest(self) -> str:
        return self.inner.hexdigest()

    def copy(self) -> Any:
        return self.inner.copy()


def test_ctrl_c_while_an_adopted_kept_partial_is_hashed_does_not_lose_it_after_a_reboot(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partial file kept through an outage was fsynced and let go of (pid 0) before a
    reboot: "released, it is trusted after a reboot too". The first call after the
    reboot adopts it and is interrupted while it reads it back (`_take`: "Ctrl-C while
    hashing: a later call (of ours too) adopts it"); that later call must still resume
    it, not fetch the object again from byte 0: not one of its bytes was written since."""
    data = os.urandom(4 * PART)
    url = http_server.add(unique_path("rehash"), data, etag='"v1"')
    kept = _plant(tmp_path, url, '"v1"', data[: 3 * PART])
    _before_this_boot(kept)
    manager = parts_manager(tmp_path, connections=1)
    _InterruptedHash.fired = False
    monkeypatch.setattr(_partial, "new_hasher", _InterruptedHash)
    with pytest.raises(KeyboardInterrupt):
        manager.cached_path(url)
    monkeypatch.undo()
    route = http_server.route(url)
    assert route.gets == 0  # interrupted before any request
    assert manager.cached_path(url).read_bytes() == data
    assert route.full_gets == 0, route.ranges  # only the rest is asked for


def test_an_adopter_killed_before_writing_does_not_lose_a_kept_partial_after_a_reboot(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """The same, with the adopter killed (preempted, OOM) while its first request waits
    for the server: it wrote nothing, so the bytes are still the fsynced ones "trusted
    after a reboot too", and the next process resumes them."""
    data = os.urandom(4 * PART)
    url = http_server.add(unique_path("killed-adopter"), data, etag='"v1"', hold_after=0)
    route = http_server.route(url)
    kept = _plant(tmp_path, url, '"v1"', data[: 3 * PART])
    _before_this_boot(kept)
    pid = os.fork()
    if pid == 0:  # the adopter: no pytest past this point
        try:
            parts_manager(tmp_path, connections=1).cached_path(url)
        finally:
            os._exit(1)
    try:
        wait_for(lambda: route.gets == 1, what="the adopter's request")
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    finally:
        route.hold_after = None
        route.released.set()
    assert parts_manager(tmp_path, connections=1).cached_path(url).read_bytes() == data
    assert route.full_gets == 0, route.ranges  # only the rest is asked for, twice


def test_a_containers_partial_from_before_a_power_loss_is_not_resumed(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """In a container, the partial file this same machine wrote before a power loss (same
    hostname; the PID namespace of the container's previous run) kept its length but
    not its last bytes (zeros). "A partial file whose writer on this host never let go
    of it and that was last written before the machine booted ... is not resumed": it
    must be fetched again, not resumed after the zeros and published (no sha256 given)."""
    data = os.urandom(4 * PART)
    url = http_server.add(unique_path("container"), data, etag='"v1"')
    hostname = HOST.rsplit("-", 1)[0] if "-" in HOST else HOST
    before = f"{hostname}-4026532999"  # the container's PID namespace before the reboot
    assert before != HOST
    kept = _plant(tmp_path, url, '"v1"', data[:PART] + bytes(PART), host=before, pid=4242)
    _before_this_boot(kept)
    path = parts_manager(tmp_path, connections=1).cached_path(url)
    assert path.read_bytes() == data


def test_a_partial_lost_in_a_reboot_goes_even_when_its_pid_runs_again(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """A partial file last written before this boot by a writer of this host is "fetched
    again from byte 0"; its writer died with the machine, whatever process has its pid
    now (here pid 1), so the file is swept, not kept in the work folder, which "holds
    only what is being written or was kept to be resumed"."""
    data = os.urandom(2 * PART)
    url = http_server.add(unique_path("reused-pid"), data, etag='"v1"')
    lost = _plant(tmp_path, url, '"v1"', data[:PART] + bytes(PART // 2), pid=1)
    _before_this_boot(lost)
    assert parts_manager(tmp_path, connections=1).cached_path(url).read_bytes() == data
    assert not lost.exists(), stray_files(tmp_path)


def test_ctrl_c_during_the_fsync_of_a_kept_partial_still_lets_this_process_resume_it(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An outage keeps 6 of 8 parts; the fsync that makes them durable before they are let
    go takes a while for a large file, and the user presses Ctrl-C (again) meanwhile. The
    docs: "The next attempt, in ... a later call of the same process ..., continues it"."""
    data = os.urandom(8 * PART)
    url = http_server.add(
        unique_path("fsync-ctrl-c"),
        data,
        drop_after=6 * PART,
        drops=1,
        drop_kind="short",
        then={"status": 503},
    )
    fsync = os.fsync
    interrupted: list[int] = []

    def interrupted_fsync(fd: int) -> None:
        if not interrupted and os.readlink(f"/proc/self/fd/{fd}").endswith(".part"):
            interrupted.append(fd)
            raise KeyboardInterrupt
        fsync(fd)

    monkeypatch.setattr(os, "fsync", interrupted_fsync)
    manager = parts_manager(tmp_path, connections=1, retries=2)
    with pytest.raises(KeyboardInterrupt):
        manager.cached_path(url)
    monkeypatch.undo()
    assert interrupted  # the Ctrl-C came during the fsync of the kept partial file
    route = http_server.route(url)
    route.status = None  # the outage is over
    full_before = route.full_gets
    assert manager.cached_path(url).read_bytes() == data
    assert route.full_gets == full_before, route.ranges  # only the rest is asked for
