"""Hostile review of what issue 26 promised: `cached_paths`, the power-loss rule for
partial files, the per-user work folder and "no listing of the cache folder", and the
S3 client kept per settings. Each test is a sentence of the docs attacked at real
parts (the fault server on 127.0.0.1, real signals and processes); an `xfail` is a
break that still stands."""

from __future__ import annotations

import io
import os
import secrets
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from framework.download import DownloadManager, _bulk, _partial
from framework.download._cache import HOST, RELEASED_PID, Entry, work_folder
from framework.download._partial import PartialName
from framework.download._validators import _etag_tag
from framework.errors import BulkDownloadError, InvalidArgumentError
from tests.support.download import (
    PART,
    FaultServer,
    Listings,
    counted_listings,
    one_member_tar,
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


# -- the power-loss rule -----------------------------------------------------------------


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


# -- the work folder and "the cache folder itself is never listed" ----------------------


@pytest.fixture
def listings() -> Iterator[Listings]:
    with counted_listings() as seen:
        yield seen


def test_an_extraction_with_a_refused_work_folder_lists_no_cache_folder(
    http_server: FaultServer, tmp_path: Path, listings: Listings
) -> None:
    """Something planted at the work folder's name (here a symlink) makes the fetch
    write next to the entry; "The cache folder itself is never listed" still holds for
    a fetch, and must for the extraction too."""
    cache = tmp_path / "cache"
    cache.mkdir()
    for index in range(50):
        (cache / f"{index:020x}-unrelated.bin").touch()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    url = http_server.add(unique_path("refused.tar"), one_member_tar("a.txt", b"a"))
    work_folder(Entry(cache, url).final).symlink_to(elsewhere)
    listings.folders.clear()
    folder = DownloadManager(cache, progress=False).cached_path(url, extract=True)
    assert (folder / "a.txt").read_bytes() == b"a"
    assert listings.of(cache) == 0, listings.folders


def test_a_killed_writers_partial_next_to_the_entry_does_not_stay_forever(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """The security page: "a crashed process leaves temporary files and folders | they are
    swept". With a link planted at the work folder's name, a process killed mid-fetch
    (preempted, OOM) leaves its partial file in the cache folder itself; the next fetch
    of that entry publishes it and leaves no partial file of a dead writer behind."""
    cache = tmp_path / "cache"
    cache.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    data = os.urandom(300_000)
    url = http_server.add(unique_path("killed-next-to"), data, hold_after=100_000, chunk=16_384)
    route = http_server.route(url)
    work_folder(Entry(cache, url).final).symlink_to(elsewhere)
    pid = os.fork()
    if pid == 0:  # the writer: no pytest past this point
        try:
            DownloadManager(cache, progress=False, connections=1).cached_path(url)
        finally:
            os._exit(1)
    try:
        wait_for(lambda: route.body_bytes >= 80_000, what="the writer to be held")
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    finally:
        route.hold_after = None
        route.released.set()
    assert DownloadManager(cache, progress=False, connections=1).cached_path(url).read_bytes() == data
    assert [name for name in os.listdir(cache) if name.endswith((".part", ".parts", ".tmp"))] == []


# -- cached_paths -------------------------------------------------------------------------


def test_ctrl_c_while_files_are_being_submitted_cancels_those_not_begun(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The docs: "Ctrl-C cancels the files not yet begun". A real SIGINT lands while the call is
    still handing its files to the pool (10,000 of them take a while): one file is under
    way (held by the server), one is queued; the queued one must never be asked for."""
    held = http_server.add(unique_path("held"), os.urandom(1000), hold_after=0)
    queued = [http_server.add(unique_path(f"queued{i}"), os.urandom(1000)) for i in range(3)]
    submitted: list[int] = []

    class Pool(ThreadPoolExecutor):
        def submit(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            submitted.append(1)
            if len(submitted) == 3:
                signal.raise_signal(signal.SIGINT)  # Ctrl-C, delivered to this (main) thread
            return super().submit(*args, **kwargs)

    monkeypatch.setattr(_bulk, "ThreadPoolExecutor", Pool)
    release = threading.Timer(1.0, http_server.route(held).released.set)
    release.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            DownloadManager(tmp_path, progress=False, connections=1).cached_paths(
                [held, *queued], max_workers=1
            )
    finally:
        release.cancel()
        http_server.route(held).released.set()
    assert [http_server.route(url).gets for url in queued] == [0, 0, 0]


def test_bulk_failures_are_keyed_by_the_url_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`BulkDownloadError`: "`failures`: each failed URL (as given) and its error". A
    caller passing relative paths looks its failures up by what it passed."""
    monkeypatch.chdir(tmp_path)
    Path("present.bin").write_bytes(b"here")
    with pytest.raises(BulkDownloadError) as caught:
        DownloadManager(tmp_path / "cache", progress=False).cached_paths(["present.bin", "missing.bin"])
    assert list(caught.value.failures) == ["missing.bin"]
    assert stray_files(tmp_path / "cache") == []


# -- the S3 client kept per settings ------------------------------------------------------


@pytest.fixture
def fresh_s3_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    """No boto3 client kept from another test, and no AWS setting of the machine."""
    pytest.importorskip("boto3")
    from framework_plugins import s3

    monkeypatch.setattr(s3, "_CLIENTS", {})
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)


def _access_key_sent(headers: dict[str, str]) -> str:
    authorization = headers.get("Authorization", "")
    return authorization.split("Credential=", 1)[1].split("/", 1)[0] if "Credential=" in authorization else ""


def test_s3_keys_rotated_in_the_credentials_file_are_the_ones_sent(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_s3_clients: None
) -> None:
    """The docs: "honours ... the usual credential chain": tools such as `aws configure`,
    saml2aws or a Vault agent rewrite `~/.aws/credentials` with new (short-lived) keys;
    the next call signs with them, as a fresh boto3 client would, not with the keys the
    process-wide client read at its first call (expired by then)."""
    from framework_plugins.s3 import S3Backend

    credentials = tmp_path / "credentials"
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    data = os.urandom(1000)
    http_server.add("/bucket/rotated-file.bin", data)
    route = http_server.routes["/bucket/rotated-file.bin"]
    sent = []
    for key in ("FIRSTKEY", "SECONDKEY"):
        credentials.write_text(
            f"[default]\naws_access_key_id = {key}\naws_secret_access_key = {key.lower()}\n"
        )
        backend = S3Backend(endpoint_url=http_server.base, retries=1)
        with backend.open("s3://bucket/rotated-file.bin") as stream:
            assert b"".join(stream.chunks) == data
        sent.append(_access_key_sent(route.headers[-1]))
    assert sent == ["FIRSTKEY", "SECONDKEY"]


# -- cached_paths: the arguments the docs name ------------------------------------------


def test_a_bad_url_in_the_list_is_refused_before_any_request(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """`cached_paths`: "Raises: ... InvalidArgumentError: a bad URL or digest, before any
    request". An S3 URL without a key (which the S3 backend refuses as
    `InvalidArgumentError` without any request) is the third of three."""
    good = [http_server.add(unique_path(f"good{i}"), os.urandom(100)) for i in range(2)]
    manager = DownloadManager(tmp_path, progress=False, connections=1)
    with pytest.raises(InvalidArgumentError):
        manager.cached_paths([*good, "s3://bucket-without-a-key"])
    assert [http_server.route(url).gets for url in good] == [0, 0]


def test_a_bad_max_workers_is_an_invalid_argument_error(tmp_path: Path) -> None:
    """The docs: "All are `DownloadError`s ...: `InvalidArgumentError` (a bad argument or URL,
    refused before any request)", as `connections=0` is: code that catches
    `DownloadError` around a bulk call catches `max_workers=0` too."""
    local = tmp_path / "one.bin"
    local.write_bytes(b"x")
    with pytest.raises(InvalidArgumentError, match="max_workers"):
        DownloadManager(tmp_path / "cache", progress=False).cached_paths([local], max_workers=0)


def test_cached_paths_takes_its_urls_by_the_documented_name(tmp_path: Path) -> None:
    """The docs' signature: `DownloadManager.cached_paths(urls, *, max_workers=8, ...)`."""
    local = tmp_path / "one.bin"
    local.write_bytes(b"x")
    manager = DownloadManager(tmp_path / "cache", progress=False)
    assert manager.cached_paths(urls=[local])[0].read_bytes() == b"x"  # type: ignore[call-arg]


def test_the_bulk_bar_counts_the_bytes_of_extracted_archives(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The docs: "one progress bar for the whole set (files done, bytes published)". Two
    archives of about 20 KiB each are published (and extracted): the bar must not end
    at 0 bytes."""
    terminal = io.StringIO()
    terminal.isatty = lambda: True  # type: ignore[method-assign]
    monkeypatch.setattr("sys.stderr", terminal)
    urls = [
        http_server.add(unique_path(f"bar{i}.tar"), one_member_tar("m.bin", os.urandom(20_000)))
        for i in range(2)
    ]
    folders = DownloadManager(tmp_path, progress=True).cached_paths(urls, extract=True)
    assert [(folder / "m.bin").stat().st_size for folder in folders] == [20_000, 20_000]
    last = terminal.getvalue().rstrip().rsplit("\r", 1)[-1]
    assert "2/2" in last and not last.rstrip("]").endswith(" 0.00B"), last


def test_a_url_that_cannot_be_encoded_is_an_invalid_argument_error(tmp_path: Path) -> None:
    """The docs: "All are `DownloadError`s ...: `InvalidArgumentError` (a bad argument or
    URL, refused before any request)". A URL built from a file name `os.listdir` gave
    with an undecodable byte holds a lone surrogate."""
    with pytest.raises(InvalidArgumentError):
        DownloadManager(tmp_path, progress=False).cached_path("http://127.0.0.1:9/\udcff.bin")


def test_one_files_unexpected_error_does_not_hide_the_other_failures(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """The docs: "every file is fetched, or has failed, before the call raises one
    `BulkDownloadError` ... naming each failed URL and why". One URL of three cannot be
    encoded (a raw error today), one is missing (404): the 404 must still be named."""
    good = http_server.add(unique_path("good"), os.urandom(100))
    missing = http_server.add(unique_path("missing"), b"", status=404)
    with pytest.raises(Exception) as caught:
        DownloadManager(tmp_path, progress=False, connections=1).cached_paths(
            [good, "http://127.0.0.1:9/\udcff.bin", missing]
        )
    error = caught.value
    assert isinstance(error, InvalidArgumentError) or (
        isinstance(error, BulkDownloadError) and missing in error.failures
    ), repr(error)


def test_ctrl_c_while_a_file_waits_for_another_process_returns_without_fetching_it(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """A single `cached_path` waiting for another process's fetch returns at Ctrl-C. In a
    bulk call, "Every file gets `cached_path`'s guarantees" and "Ctrl-C cancels the files
    not yet begun": a file only waiting for another process's lock has not begun here, so
    the call must not wait for that process (an hour-long fetch) nor fetch it after."""
    import filelock

    url = http_server.add(unique_path("waited"), os.urandom(1000))
    other_process = filelock.FileLock(str(Entry(tmp_path, url).lock), thread_local=False)
    other_process.acquire()
    main = threading.main_thread().ident
    assert main is not None
    ctrl_c = threading.Timer(0.5, signal.pthread_kill, (main, signal.SIGINT))
    let_go = threading.Timer(2.0, other_process.release)
    ctrl_c.start()
    let_go.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            DownloadManager(tmp_path, progress=False, connections=1).cached_paths([url])
        held_at_return = other_process.is_locked
    finally:
        let_go.join()
    assert held_at_return and http_server.route(url).gets == 0


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


def test_an_s3_setting_changed_in_the_environment_is_the_one_used(
    http_server: FaultServer, monkeypatch: pytest.MonkeyPatch, fresh_s3_clients: None
) -> None:
    """`S3Backend.client`: one client "while the environment boto3's chain reads stays the
    same". A MinIO or Ceph user told to set `AWS_RESPONSE_CHECKSUM_VALIDATION=when_required`
    sets it in the notebook and calls again: that call must not ask for checksums."""
    from framework_plugins.s3 import S3Backend

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    data = os.urandom(1000)
    http_server.add("/bucket/checksum-mode.bin", data)
    route = http_server.routes["/bucket/checksum-mode.bin"]
    asked = []
    for validation in ("when_supported", "when_required"):
        monkeypatch.setenv("AWS_RESPONSE_CHECKSUM_VALIDATION", validation)
        with S3Backend(endpoint_url=http_server.base, retries=1).open(
            "s3://bucket/checksum-mode.bin"
        ) as stream:
            assert b"".join(stream.chunks) == data
        asked.append(
            {name.lower(): value for name, value in route.headers[-1].items()}.get("x-amz-checksum-mode")
        )
    assert asked == ["ENABLED", None]
