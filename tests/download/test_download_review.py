"""A hostile review of the single-node download manager: each test is a promise of
docs/concepts/download.md or security.md that a reproducer broke (fixed since)."""

from __future__ import annotations

import gzip
import os
import tarfile
import tracemalloc
from pathlib import Path

import pytest
from dl_helpers import FORK, PART, FaultServer, parts_manager, stray_files, unique_path
from framework_plugins.http import HttpBackend

from framework.download._cache import HOST, Entry
from framework.download._extract import ExtractLimits, extract_archive
from framework.download._partial import PartialName
from framework.download._validators import Validators
from framework.download.parallel._parts import _Plan, _save_record
from framework.errors import DownloadError, HTTPStatusError, UnsafeArchiveError


def _dead_pid() -> int:
    child = FORK.Process(target=os._exit, args=(0,))
    child.start()
    child.join(10)
    assert child.pid is not None
    return child.pid


def _complete_parallel_partial(root: Path, url: str, data: bytes, etag: str) -> Path:
    """A parallel partial file whose record says every part is in, left by a dead writer
    of this host (a Ctrl-C during the final hash leaves this)."""
    root.mkdir(parents=True, exist_ok=True)
    final = Entry(root, url).final
    validators = Validators(etag)
    name = PartialName(final, "P" + validators.tag, f"{HOST}.{_dead_pid()}.deadbeef")
    name.path.write_bytes(data)
    plan = _Plan(len(data), PART, validators)
    _save_record(name, plan, set(range(plan.count)), {})
    return name.path


@pytest.mark.timeout(30)
@pytest.mark.parametrize("status", [503, 429])
def test_a_refusal_of_the_confirming_request_is_retried(
    http_server: FaultServer, tmp_path: Path, status: int
) -> None:
    """A resume whose record says every part is in asks for the last byte to confirm the
    version. A single 503/429 to that request is an outage the retries are for, as for
    any other request; it was raised at once (the request is sent with refusals handed
    back to the caller, and only a part's loop retried them)."""
    data = os.urandom(4 * PART)
    url = http_server.add(unique_path(f"confirm-{status}"), data, fail_statuses=[status])
    etag = http_server.route(url).etag
    assert etag is not None
    partial = _complete_parallel_partial(tmp_path, url, data, etag)
    manager = parts_manager(tmp_path, connections=4, retries=3)
    assert manager.cached_path(url).read_bytes() == data
    route = http_server.route(url)
    assert route.full_gets == 0, route.ranges  # the bytes were never asked for again
    assert not partial.exists()
    assert stray_files(tmp_path) == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize("status", [429, 408])
def test_a_transient_status_to_the_first_ranged_request_costs_the_retries_once(
    http_server: FaultServer, tmp_path: Path, status: int
) -> None:
    """A server answering 429 (or 408) to everything: a parallel fetch's first request
    (ranged) gets the backend's retries, then the status is final, as on the
    single-stream path. It was taken for a refusal of the Range and the whole retry
    budget (Retry-After waits included, up to 60 s each) was spent again without one."""
    url = http_server.add(unique_path(f"always-{status}"), os.urandom(4 * PART), status=status)
    with pytest.raises(HTTPStatusError) as info:
        parts_manager(tmp_path / "one", connections=1, retries=2).cached_path(url)
    assert info.value.status == status
    one_stream = http_server.route(url).gets
    http_server.route(url).gets = 0
    with pytest.raises(HTTPStatusError) as info:
        parts_manager(tmp_path / "parts", connections=4, retries=2).cached_path(url)
    assert info.value.status == status
    assert http_server.route(url).gets == one_stream == 3


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "value",
    [
        "-5",
        "1.5",
        "soon",
        "Wed, 21 Oct 2015 07:28:00 GMT",  # in the past: at once
        "Fri, 31 Dec 99999 23:59:59 GMT",  # ValueError in urllib3
        "Fri, 31 Dec 9999999999999 23:59:59 GMT",  # OverflowError in urllib3
    ],
)
def test_an_unreadable_retry_after_is_waited_out_with_the_backoff(
    http_server: FaultServer, tmp_path: Path, value: str
) -> None:
    """A 503 whose Retry-After is no delay-seconds nor an HTTP-date (negative, a fraction,
    a word; common in the wild) is retried with the backoff, as one without the header.
    urllib3 raised InvalidHeader from its retry sleep, which the backend turned into an
    InvalidArgumentError ("not a usable HTTP request"): no retry, the URL blamed, and a
    partial file removed as for a final error."""
    data = os.urandom(1000)
    url = http_server.add(unique_path("retry-after"), data, fail_statuses=[503, 503], retry_after=value)
    manager = parts_manager(tmp_path, connections=1, retries=3)
    assert manager.cached_path(url).read_bytes() == data
    assert http_server.route(url).gets == 3


@pytest.mark.timeout(30)
def test_a_record_naming_a_part_by_thousands_of_digits_is_nonsense_progress(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """A `reached` entry whose part number has more digits than `int()` reads from text
    (4300 by default) is nonsense progress: dropped alone, as any other. It raised a raw
    ValueError out of `cached_path` at every call until the record was removed by hand."""
    data = os.urandom(4 * PART)
    url = http_server.add(unique_path("digits"), data)
    etag = http_server.route(url).etag
    assert etag is not None
    partial = _complete_parallel_partial(tmp_path, url, data, etag)
    record = partial.with_name(partial.name[: -len(".part")] + ".parts")
    text = record.read_text()
    record.write_text(text.replace('"reached": {}', '"reached": {"' + "9" * 5000 + '": 5}'))
    assert "9" * 5000 in record.read_text()
    assert parts_manager(tmp_path, connections=4).cached_path(url).read_bytes() == data
    assert http_server.route(url).full_gets == 0  # the other parts still counted


@pytest.mark.timeout(30)
def test_an_outage_of_the_version_query_keeps_the_finished_partial(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """A finished partial file is answered 416 without a validator; the HEAD that asks
    which version the server has meets an outage (503 after the retries), and so does
    everything after. The outage keeps the bytes, as any other: the next call resumes
    (here it finds them all). It was taken for a server without HEAD: the partial file
    was started over (truncated), the GET from byte 0 failed, and the bytes were gone."""
    data = os.urandom(4 * PART)
    url = http_server.add(
        unique_path("head-outage"), data, head_status=503, swap_at_get=2, then={"status": 503}
    )
    etag = http_server.route(url).etag
    assert etag is not None
    tmp_path.mkdir(parents=True, exist_ok=True)
    final = Entry(tmp_path, url).final
    PartialName(final, Validators(etag).tag, f"{HOST}.{_dead_pid()}.deadbeef").path.write_bytes(data)
    manager = parts_manager(tmp_path, connections=1, retries=1)
    with pytest.raises(HTTPStatusError) as info:
        manager.cached_path(url)
    assert info.value.status == 503
    kept = [name for name in stray_files(tmp_path) if name.endswith(".part")]
    assert kept and (tmp_path / kept[0]).read_bytes() == data, kept
    route = http_server.route(url)
    route.status, route.head_status, route.swap_at_get = None, None, None  # the outage is over
    gets = route.gets
    assert manager.cached_path(url).read_bytes() == data
    assert route.full_gets == 0 and route.gets - gets == 1, route.ranges  # the 416 alone


@pytest.mark.parametrize(
    "value", ["soon", "Fri, 31 Dec 99999 23:59:59 GMT", "Fri, 31 Dec 9999999999999 23:59:59 GMT"]
)
def test_a_refused_part_with_an_unreadable_retry_after_is_an_http_status(
    http_server: FaultServer, value: str
) -> None:
    """A part request (refusals handed back at once) answered 503 with a Retry-After
    that cannot be read is an `HTTPStatusError` without a delay (the backoff applies),
    never a raw OverflowError from reading the header."""
    url = http_server.add(
        unique_path("part-retry-after"), os.urandom(1000), fail_statuses=[503], retry_after=value
    )
    with HttpBackend(retries=2, backoff_factor=0.01) as backend, pytest.raises(HTTPStatusError) as info:
        backend.open(url, 0, end=10, refusals_at_once=True)
    assert info.value.status == 503 and info.value.retry_after is None


def _pax_bomb(path: Path, size: int) -> Path:
    """A tar.gz whose first block is a pax extended header declaring `size` bytes (of
    zeros, so it compresses about 1000:1): no member, no declared member size."""
    header = tarfile.TarInfo("././@PaxHeader")
    header.type, header.size = tarfile.XHDTYPE, size
    with gzip.GzipFile(path, "wb", compresslevel=1, mtime=0) as archive:
        archive.write(header.tobuf(format=tarfile.USTAR_FORMAT))
        for _ in range(size >> 20):
            archive.write(bytes(1 << 20))
        archive.write(bytes(1024))
    return path


def test_a_pax_header_bomb_is_refused_at_the_cap_not_read_into_memory(tmp_path: Path) -> None:
    """The caps (total size, ratio) bound what an archive expands to. A pax extended
    header is read by tarfile in one `read()` of its declared size before the first
    member is seen: a 0.3 MB tar.gz took 64 MiB of memory (a 45 MB one, 10 GiB) and
    was then only called damaged. It is refused before it is read."""
    archive = _pax_bomb(tmp_path / "bomb.tar.gz", 64 << 20)
    assert archive.stat().st_size < 400_000
    tracemalloc.start()
    try:
        with pytest.raises(DownloadError) as info:
            extract_archive(
                archive,
                tmp_path / "out",
                "https://x/bomb.tar.gz",
                ExtractLimits(1 << 20, 50.0, 100),
                replace=True,
            )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not (tmp_path / "out").exists()
    assert peak < 16 << 20, f"{peak} bytes of memory for a {archive.stat().st_size}-byte archive"
    assert isinstance(info.value, UnsafeArchiveError), info.value


def _fetch_in_child(cache: Path, url: str) -> None:
    try:
        parts_manager(cache, connections=1, retries=2).cached_path(url)
    except BaseException:
        os._exit(1)
    os._exit(0)


@pytest.mark.timeout(30)
def test_another_process_resumes_what_a_live_process_kept_through_an_outage(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """download.md: an interrupted download's partial file is continued by "a later call
    of the same process or another process". After an outage (or a broken connection)
    in a process that goes on living (a notebook kernel, a server), the kept partial
    file carried that live process's pid: another process on the host never adopted it
    (its writer is alive), fetched the whole object again, and the kept bytes stayed in
    the cache for as long as the first process lived. The failing call now lets go of
    the file (a name with pid 0, which no live process owns)."""
    data = os.urandom(8 * PART)
    url = http_server.add(
        unique_path("kept-live"), data, drop_after=6 * PART, drops=1, drop_kind="short", then={"status": 503}
    )
    with pytest.raises(HTTPStatusError):
        parts_manager(tmp_path, connections=1, retries=2).cached_path(url)
    assert [name for name in stray_files(tmp_path) if name.endswith(".part")]
    route = http_server.route(url)
    route.status = None  # the outage is over; this process lives on, another one calls
    full_before = route.full_gets
    child = FORK.Process(target=_fetch_in_child, args=(tmp_path, url))
    child.start()
    child.join(20)
    assert child.exitcode == 0
    assert route.full_gets == full_before, route.ranges  # only the rest was asked for
    assert stray_files(tmp_path) == []  # nothing of it left behind
