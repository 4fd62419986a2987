"""Resuming a download and reading range answers: a partial file is continued only with
bytes of its own version from the right byte. Content-Range forms, unknown totals, 416
answers, capped and encoded ranges, outages that keep the partial file."""

from __future__ import annotations

import gzip
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from framework_plugins.http import HttpBackend

from framework.download import DownloadManager, _partial
from framework.download._cache import HOST, Entry, unique_token
from framework.download._partial import PartialName
from framework.download._validators import NO_VALIDATOR, Validators
from framework.download.backend import parse_content_range
from framework.errors import (
    ChecksumError,
    DownloadError,
    HTTPStatusError,
    NetworkError,
)
from tests.support.download import (
    FORK,
    PART,
    FaultServer,
    parts_manager,
    sha256,
    stray_files,
    unique_path,
)


def _dead_pid() -> int:
    child = FORK.Process(target=os._exit, args=(0,))
    child.start()
    child.join(10)
    assert child.pid is not None
    return child.pid


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
    planted = PartialName(final, Validators(etag).tag, f"{HOST}.{_dead_pid()}.deadbeef").path
    planted.parent.mkdir(exist_ok=True)
    planted.write_bytes(data)
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


from tests.support.download import OLD, Lying, NoIfRange  # noqa: E402
from tests.support.download import planted_partial as _planted_partial  # noqa: E402
from tests.support.download import single_manager as _single  # noqa: E402

# -- _place: start on a single-stream resume ---------------------------------------------


def test_resume_answered_from_the_wrong_byte_starts_over(http_server: FaultServer, tmp_path: Path) -> None:
    data = os.urandom(1 << 20)
    url = http_server.add(unique_path("resume-start"), data, etag='"v"', drop_after=300_000, drops=1)
    path = _single(tmp_path, Lying("start")).cached_path(url)
    assert path.read_bytes() == data


# -- _receive: more bytes than the declared size -----------------------------------------


def test_a_body_longer_than_its_size_is_a_checksum_error(http_server: FaultServer, tmp_path: Path) -> None:
    data = os.urandom(100_000)
    url = http_server.add(unique_path("oversize"), data, etag='"v"')
    with pytest.raises(ChecksumError):
        _single(tmp_path, Lying("oversize")).cached_path(url)
    assert not Entry(tmp_path, url).final.exists()


# -- _place: 416 must name the partial's version -----------------------------------------


def test_a_416_for_another_version_of_the_same_size_starts_over(
    http_server: FaultServer, tmp_path: Path
) -> None:
    old, new = os.urandom(200_000), os.urandom(200_000)
    url = http_server.add(unique_path("416-version"), new, etag='"new"')
    _planted_partial(tmp_path, url, OLD, old)
    path = _single(tmp_path, NoIfRange(backoff_factor=0.01)).cached_path(url)  # a proxy that drops If-Range
    assert path.read_bytes() == new


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


# -- resume across versions --------------------------------------------------------------


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
        f"/star/total-{capped}.bin", payload, etag='"v1"', star_total=True, drop_after=300_000, drops=1,
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
        f"/star/never-said-{chunked}.bin", payload, etag='"v1"', drop_after=300_000, drops=1,
        chunked=chunked, swap_at_get=2, then=resumes,
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
        "/size-unknown/object.bin", payload, etag='"v1"', chunked=True, drop_after=300_000, drops=1,
        swap_at_get=2, then={"star_total": True, "size_unknown": True, "head_status": 405},
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
        "/chunked/stalls.bin", payload, etag='"v1"', chunked=True, range_cap=100_000, last_chunk_wait=3.0,
        drop_after=50_000, drops=1,
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
        "/total/changes.bin", payload, etag='"v1"', drop_after=300_000, drops=1, swap_at_get=2,
        then={"total_delta": 1000},
    )
    assert manager.cached_path(url).read_bytes() == payload
    ranges = http_server.route(url).ranges
    assert len(ranges) == 3 and ranges[0] == ranges[2] == "" and ranges[1].startswith("bytes=")


# -- 416 answers never loop --------------------------------------------------------------


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
        f"/capped-from-zero/{etag is not None}.bin", os.urandom(5000), etag=etag, range_mode="from_zero",
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


# -- content encodings -------------------------------------------------------------------


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


# -- a partial file left by a crash of the machine ---------------------------------------


def _before_this_boot(path: Path) -> None:
    booted = _partial.boot_time()
    assert booted is not None, "this test needs Linux's /proc/stat"
    os.utime(path, (booted - 60, booted - 60))


@pytest.mark.parametrize("rebooted", [True, False])
def test_a_partial_of_a_writer_lost_in_a_reboot_is_not_resumed(
    http_server: FaultServer, tmp_path: Path, rebooted: bool
) -> None:
    """A power loss can keep a partial file's length but not its last bytes (zeros on
    disk): resumed without a sha256, they would be published. A partial file last
    written before this boot by a writer that never let it go (killed by the crash) is
    fetched again from byte 0; one written since this boot (a killed process: its bytes
    were in the page cache) is resumed."""
    data = os.urandom(4 * PART)
    url = http_server.add(unique_path("rebooted"), data, etag='"v1"')
    kept = bytes(2 * PART) if rebooted else data[: 2 * PART]  # what the disk holds after the crash
    planted = _planted_partial(tmp_path, url, '"v1"', kept)
    if rebooted:
        _before_this_boot(planted)
    assert parts_manager(tmp_path, connections=1).cached_path(url).read_bytes() == data
    route = http_server.route(url)
    assert route.full_gets == (1 if rebooted else 0), route.ranges
    assert stray_files(tmp_path) == []


@pytest.mark.timeout(30)
def test_a_kept_partial_is_fsynced_before_it_is_let_go_and_trusted_after_a_reboot(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partial file kept through an outage is fsynced before it is released (pid 0):
    its bytes are on disk, so it is resumed even when a reboot came in between."""
    data = os.urandom(8 * PART)
    url = http_server.add(
        unique_path("kept-synced"), data, drop_after=6 * PART, drops=1, drop_kind="short",
        then={"status": 503},
    )
    synced: set[int] = set()
    fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        fsync(fd)
        synced.add(os.fstat(fd).st_ino)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    with pytest.raises(HTTPStatusError):
        parts_manager(tmp_path, connections=1, retries=2).cached_path(url)
    [kept] = [tmp_path / name for name in stray_files(tmp_path) if name.endswith(".part")]
    assert ".0." in kept.name and os.stat(kept).st_ino in synced, (kept.name, synced)
    _before_this_boot(kept)
    route = http_server.route(url)
    route.status = None  # the outage is over
    full_before = route.full_gets
    assert parts_manager(tmp_path, connections=1).cached_path(url).read_bytes() == data
    assert route.full_gets == full_before, route.ranges  # only the rest was asked for
