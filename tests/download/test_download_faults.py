"""The download manager's single-node paths under faults: odd answers and settings,
outages, refused connections, silent writers that wake and adopters that are killed.

Real servers on 127.0.0.1 (`FaultServer`, or a small one of the test's own)."""

from __future__ import annotations

import json
import os
import resource
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, Optional

import pytest
from framework_plugins.http import HttpBackend

from framework.download import DownloadManager
from framework.download.backend import ByteStream
from framework.errors import DownloadError, HTTPStatusError, InvalidArgumentError, NetworkError
from tests.support.download import (
    FORK,
    PART,
    SLOW,
    FaultServer,
    cache_files,
    end_child,
    parts_manager,
    stray_files,
    unique_path,
)

# A 416 to a request without a Range ----------------------------------------------------


@pytest.mark.parametrize("connections", [1, 4])
def test_a_416_to_a_request_without_a_range_is_a_final_http_status(
    http_server: FaultServer, tmp_path: Path, connections: int
) -> None:
    url = http_server.add(unique_path("416-whole"), b"x" * 1000, status=416)
    manager = parts_manager(tmp_path, connections=connections)
    with pytest.raises(HTTPStatusError) as info:
        manager.cached_path(url)
    assert info.value.status == 416 and info.value.url == url
    assert http_server.route(url).ranges[-1] == ""  # the last request had no Range
    assert stray_files(tmp_path) == []


# FRAMEWORK_CONNECTIONS ------------------------------------------------------------------


@pytest.mark.parametrize("setting", ["0", "abc", "-3", "1.5"])
def test_an_invalid_connections_setting_is_refused_when_the_manager_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str
) -> None:
    monkeypatch.setenv("FRAMEWORK_CONNECTIONS", setting)
    with pytest.raises(InvalidArgumentError, match=f"FRAMEWORK_CONNECTIONS.*{setting!r}"):
        DownloadManager(tmp_path)
    monkeypatch.setenv("FRAMEWORK_CONNECTIONS", "2")
    manager = DownloadManager(tmp_path)
    monkeypatch.setenv("FRAMEWORK_CONNECTIONS", setting)  # set wrong after: the next miss says so
    with pytest.raises(InvalidArgumentError, match="FRAMEWORK_CONNECTIONS"):
        manager.cached_path("http://127.0.0.1:9/never-asked.bin")
    with pytest.raises(InvalidArgumentError, match="connections must be a whole number"):
        DownloadManager(tmp_path, connections=0)


# A part record's progress entries -------------------------------------------------------


@pytest.mark.parametrize(
    "odd",
    [
        {"reached": {"abc": 5}},
        {"reached": {"2.5": 5}},
        {"reached": {"-1": 5}},
        {"reached": {"3": "x"}},
        {"reached": {"3": True}},
        {"reached": {"3": None}},
        {"done_extra": [[7]]},
        {"done_extra": ["x"]},
        {"done_extra": [[0, 99]]},
        {"done_extra": [[True, 1]]},
        {"done_extra": [[3, 2]]},
    ],
)
def test_one_odd_progress_entry_is_dropped_not_the_record(tmp_path: Path, odd: dict[str, Any]) -> None:
    """The security page: a progress entry that makes no sense is dropped (its part is
    fetched whole); the record's other entries still count."""
    from framework.download.parallel._parts import _load_record

    part = 1000
    record: dict[str, Any] = {"size": 4 * part, "part_size": part, "etag": '"v1"', "last_modified": None}
    record |= {"date": None, "done": [[0, 1]], "reached": {"2": 2 * part + 7}}
    if "reached" in odd:
        record["reached"] = {**record["reached"], **odd["reached"]}
    if "done_extra" in odd:
        record["done"] = record["done"] + odd["done_extra"]
    path = tmp_path / "x.parts"
    path.write_text(json.dumps(record))
    loaded = _load_record(path)
    assert loaded is not None
    assert loaded[1] == {0, 1}
    assert loaded[2] == {2: 2 * part + 7}


# The first answer when the plan cannot be made -------------------------------------------


class _Recording(HttpBackend):
    """An HTTP backend that remembers every stream it opened."""

    supports_ranges: ClassVar[bool] = True  # its `open` passes `end` on

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.streams: list[ByteStream] = []

    def open(
        self, url: str, offset: int = 0, *, if_range: Optional[str] = None, end: Optional[int] = None
    ) -> ByteStream:
        stream = super().open(url, offset, if_range=if_range, end=end)
        self.streams.append(stream)
        return stream


@contextmanager
def _file_size_limit(limit: int) -> Iterator[None]:
    """Files of this process may be at most `limit` bytes (a filesystem's own largest
    file, portably): a larger ftruncate fails with EFBIG instead of killing us."""
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, old_handler)


def test_the_first_answer_is_closed_when_the_filesystem_refuses_the_claimed_size(
    http_server: FaultServer, tmp_path: Path
) -> None:
    data = os.urandom(4 * PART)
    # The 206's Content-Range claims 2 GiB more than there is; this process may not make
    # a file over 1 GiB.
    url = http_server.add(unique_path("huge-claim"), data, total_delta=2 << 30)
    backend = _Recording(retries=1, backoff_factor=0.01)
    manager = parts_manager(tmp_path, backends={"http": backend})
    with _file_size_limit(1 << 30), pytest.raises(DownloadError, match="no room on the device") as info:
        manager.cached_path(url)
    assert not isinstance(info.value, NetworkError)  # not resumed: nothing to resume
    assert backend.streams and all(stream.close_callback is None for stream in backend.streams)
    assert stray_files(tmp_path) == []


# An outage (5xx after retries) keeps the partial file --------------------------------------


@pytest.mark.parametrize("status", [502, 503])
@pytest.mark.parametrize("connections", [1, 4])
def test_an_outage_keeps_the_partial_and_its_record_and_the_next_call_resumes(
    http_server: FaultServer, tmp_path: Path, status: int, connections: int
) -> None:
    """A connection reset at 60%, then the server answers `status` to everything (after
    the backend's retries): the bytes so far, and a parallel fetch's record, stay; the
    next call asks only for the rest."""
    data = os.urandom(16 * PART)
    cut = 10 * PART + 123
    url = http_server.add(
        unique_path(f"outage-{status}"),
        data,
        drop_after=cut,
        drops=1,
        drop_kind="short",
        then={"status": status},
    )
    manager = parts_manager(tmp_path, connections=connections, retries=2)
    with pytest.raises(HTTPStatusError) as info:
        manager.cached_path(url)
    assert info.value.status == status
    left = stray_files(tmp_path)
    assert [name for name in left if name.endswith(".part")], left
    route = http_server.route(url)
    asked_before = len(route.ranges)
    route.status = None  # the outage is over
    assert manager.cached_path(url).read_bytes() == data
    assert route.full_gets == 1  # never from byte 0 again
    asked = sum(_range_length(text, len(data)) for text in route.ranges[asked_before:])
    assert 0 < asked <= len(data) - cut + PART  # only the rest (a begun part at most again)
    assert stray_files(tmp_path) == []


def _range_length(header: str, size: int) -> int:
    """How many bytes a Range header asks for (`size` for none)."""
    if not header:
        return size
    first, _, last = header.split("=", 1)[1].partition("-")
    return min(size, int(last) + 1 if last else size) - int(first)


# 429 with Retry-After beyond the connections a server allows -----------------------------


@pytest.mark.timeout(45)
def test_a_refused_connection_hands_its_parts_back_at_once_and_never_sleeps_on_them(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """A server that serves two bodies at once and answers 429 with ``Retry-After: 3600``
    beyond them: a refused connection hands its run back at once and waits holding no
    part (never in the backend's retries with its parts claimed: the backend honours up
    to 60 s, past this test's timeout); the two that are served fetch everything, and
    the fetch ends then, not when the refused ones would ask again."""
    data = os.urandom(16 * PART)
    url = http_server.add(
        unique_path("too-many"), data, busy_over=2, busy_status=429, retry_after="3600", **SLOW
    )
    manager = parts_manager(tmp_path, connections=8)
    assert manager.cached_path(url).read_bytes() == data
    route = http_server.route(url)
    seen = (route.gets, route.refused, route.body_bytes, route.ranges)
    assert route.refused >= 1, seen  # the ramp did ask for more than the server serves
    assert route.refused <= 8, seen  # a refused connection stops: at most one each
    assert route.gets - route.refused <= 16 + 2, seen  # one request per run at most (and a break)
    # About one copy: what a stream cut at its run's end had in flight is counted too
    # (a part at most, on a loaded machine).
    assert route.body_bytes <= len(data) + PART, seen
    assert stray_files(tmp_path) == []


# A writer that was only silent wakes after its partial file was adopted ----------------------


def _stale_foreign_partial(
    final: Path, tag: str, content: bytes, size: Optional[int] = None
) -> tuple[Any, int]:
    """A partial file of `final` written by a process on another host (or in another PID
    namespace), silent for longer than `STALE_AFTER_S`, that still holds it open: its
    name and its descriptor (the writer, paused)."""
    from framework.download._partial import STALE_AFTER_S, PartialName

    final.parent.mkdir(parents=True, exist_ok=True)
    name = PartialName(final, tag, token="elsewhere-ns7.4242.0badcafe")
    name.path.parent.mkdir(exist_ok=True)
    fd = os.open(name.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    if size is not None:
        os.ftruncate(fd, size)
    os.pwrite(fd, content, 0)
    old = time.time() - STALE_AFTER_S - 60
    os.utime(name.path, (old, old))
    return name, fd


def _wake(fd: int, size: int) -> None:
    """The paused writer wakes and goes on through its descriptor: it starts over (a new
    version), writes other bytes, then grows the file."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, b"\0" * 1000, 0)
    os.pwrite(fd, b"v2" * (size // 2), 0)
    os.ftruncate(fd, size + 7)
    os.close(fd)


def test_a_silent_writer_that_wakes_never_changes_the_published_file(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """Single stream: the stale partial's bytes are resumed (only the rest is asked
    for), and what the writer then does through its descriptor never reaches the
    published file."""
    from framework.download._cache import Entry
    from framework.download._validators import Validators

    data = os.urandom(4 * PART)
    url = http_server.add(unique_path("paused-writer"), data)
    route = http_server.route(url)
    final = Entry(tmp_path, url).final
    _name, writer = _stale_foreign_partial(final, Validators(route.etag).tag, data[: 3 * PART])
    published = parts_manager(tmp_path, connections=1).cached_path(url)
    assert published.read_bytes() == data
    assert route.ranges == [f"bytes={3 * PART}-"]  # its bytes were resumed
    _wake(writer, len(data))
    assert published.read_bytes() == data
    assert os.stat(published).st_size == len(data)
    assert parts_manager(tmp_path, connections=1).cached_path(url).read_bytes() == data
    assert route.gets == 1  # still a hit
    assert stray_files(tmp_path) == []


def test_a_silent_parallel_writer_that_wakes_never_changes_the_published_file(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """In parts: the stale partial's recorded parts are resumed (only the others are
    asked for), and what the writer then does through its descriptor never reaches the
    published file."""
    from framework.download._cache import Entry
    from framework.download._partial import PARALLEL_TAG
    from framework.download._validators import Validators
    from framework.download.parallel._parts import _Plan, _save_record

    data = os.urandom(8 * PART)
    url = http_server.add(unique_path("paused-parallel-writer"), data)
    route = http_server.route(url)
    final = Entry(tmp_path, url).final
    plan = _Plan(len(data), PART, Validators(route.etag))
    name, writer = _stale_foreign_partial(
        final, PARALLEL_TAG + plan.validators.tag, data[: 5 * PART], size=len(data)
    )
    _save_record(name, plan, {0, 1, 2, 3}, {4: 4 * PART + 100})
    published = parts_manager(tmp_path, connections=4).cached_path(url)
    assert published.read_bytes() == data
    assert route.full_gets == 0  # the recorded parts were resumed
    asked = sum(_range_length(text, len(data)) for text in route.ranges)
    assert asked <= len(data) - 4 * PART - 100
    _wake(writer, len(data))
    assert published.read_bytes() == data
    assert os.stat(published).st_size == len(data)
    assert stray_files(tmp_path) == []


def test_a_writer_whose_partial_was_taken_over_publishes_nothing(tmp_path: Path) -> None:
    """The silent writer wakes at its very end: its partial file was renamed away (and
    copied) by another process; it neither publishes nor writes the entry's sidecar."""
    from framework.download._cache import Entry
    from framework.download._partial import Partial, publish_fetched

    entry = Entry(tmp_path, "http://127.0.0.1:9/taken.bin")
    tmp_path.mkdir(exist_ok=True)
    partial = Partial.create(entry.final)
    os.write(partial.fd, b"old bytes")
    partial.offset = 9
    partial.hasher.update(b"old bytes")
    fetched = partial.verified(entry.url, None)
    partial.close(keep=True)
    os.rename(fetched.temp, tmp_path / "taken-over.part")  # what an adopter does first
    with pytest.raises(DownloadError, match="taken over by another process"):
        publish_fetched(entry, fetched)
    assert not entry.final.exists() and not entry.sidecar.exists()


def _adopt_then_die(final: str) -> None:
    """An adopter killed between taking a stale partial file (its rename) and copying it."""
    from framework.download import _partial as _publish

    def killed(*args: Any) -> None:
        os._exit(9)

    _publish.Partial._copy = killed  # type: ignore[method-assign]
    _publish.Partial.adopt(Path(final))
    os._exit(0)  # not reached: the copy "kills" it


def test_an_adopter_killed_before_its_copy_leaves_the_file_foreign(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """Found by the property suite: an adopter killed after renaming a stale foreign
    partial file to its own name, before copying it, left a file a later call took by
    rename (its owner, on this host, is dead): the silent writer's inode was published
    after all, and changed when the writer woke."""
    from framework.download._cache import Entry
    from framework.download._validators import Validators

    data = os.urandom(4 * PART)
    url = http_server.add(unique_path("killed-adopter"), data)
    route = http_server.route(url)
    final = Entry(tmp_path, url).final
    _name, writer = _stale_foreign_partial(final, Validators(route.etag).tag, data[: 3 * PART])
    child = FORK.Process(target=_adopt_then_die, args=(str(final),))
    child.start()
    end_child(child)
    assert child.exitcode == 9
    published = parts_manager(tmp_path, connections=1).cached_path(url)
    assert published.read_bytes() == data
    assert route.ranges == [f"bytes={3 * PART}-"]  # the stale bytes were still resumed
    _wake(writer, len(data))
    assert published.read_bytes() == data


class _TakenOverWhileSilent(HttpBackend):
    """Before each resumed request, another process takes this one's partial file over
    (renames it away), as an adopter does once the writer is silent for long enough."""

    supports_ranges: ClassVar[bool] = True  # its `open` passes `end` on

    def open(
        self, url: str, offset: int = 0, *, if_range: Optional[str] = None, end: Optional[int] = None
    ) -> ByteStream:
        if offset:
            for name in cache_files(self.folder):
                path = self.folder / name
                if path.name.endswith(".part") and not path.name.startswith("taken"):
                    os.rename(path, path.with_name(f"taken-{path.name}"))
        return super().open(url, offset, if_range=if_range, end=end)

    folder: Path


def test_a_writer_whose_partial_was_taken_over_mid_fetch_raises_a_download_error(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """The writer wakes, its partial file gone (renamed by an adopter), and the object
    changed: starting over renames its file, which is not there. A `DownloadError` that
    says so, never a raw `FileNotFoundError`."""
    data, new = os.urandom(4 * PART), os.urandom(4 * PART)
    url = http_server.add(
        unique_path("taken-mid-fetch"),
        data,
        drop_after=PART,
        drops=1,
        drop_kind="short",
        then={"data": new, "etag": '"new"'},
    )
    backend = _TakenOverWhileSilent(retries=1, backoff_factor=0.01)
    backend.folder = tmp_path
    manager = parts_manager(tmp_path, connections=1, backends={"http": backend})
    with pytest.raises(DownloadError, match="taken over by another process"):
        manager.cached_path(url)
