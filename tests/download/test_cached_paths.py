"""`DownloadManager.cached_paths`: many files at once, each with `cached_path`'s
guarantees, against the real HTTP test server (GETs and concurrent bodies counted)."""

from __future__ import annotations

import io
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

import pytest

from framework.download import DownloadManager, _bulk
from framework.download._cache import Entry
from framework.download.backend import ByteStream, DownloadBackend
from framework.errors import BulkDownloadError, ChecksumError, HTTPStatusError, InvalidArgumentError
from tests.support.download import FaultServer, one_member_tar, sha256, stray_files, unique_path, wait_for

pytestmark = pytest.mark.timeout(60)


def _manager(cache: Path) -> DownloadManager:
    return DownloadManager(cache, progress=False, connections=1, backoff_factor=0.01, retries=2)


def test_paths_come_in_input_order_and_duplicates_are_fetched_once(
    http_server: FaultServer, cache: Path
) -> None:
    bodies = {name: os.urandom(4096 + index) for index, name in enumerate("abcd")}
    urls = {name: http_server.add(unique_path(f"bulk-{name}"), data) for name, data in bodies.items()}
    asked = ["c", "a", "c", "d", "b", "a", "c"]
    paths = _manager(cache).cached_paths([urls[name] for name in asked], max_workers=3)
    assert paths == [Entry(cache, urls[name]).final for name in asked]
    assert [path.read_bytes() for path in paths] == [bodies[name] for name in asked]
    assert {name: http_server.route(url).gets for name, url in urls.items()} == dict.fromkeys(bodies, 1)
    assert stray_files(cache) == []


def test_files_are_fetched_concurrently_up_to_max_workers(http_server: FaultServer, cache: Path) -> None:
    """Every answer waits at a barrier for four GETs in flight at once: four workers pass
    it (twice), one at a time would break it (and fail)."""
    barrier = threading.Barrier(4, timeout=20)
    bodies = [os.urandom(4096) for _ in range(8)]
    urls = [
        http_server.add(unique_path(f"together-{i}"), data, barrier=barrier) for i, data in enumerate(bodies)
    ]
    http_server.max_in_flight = 0
    paths = _manager(cache).cached_paths(urls, max_workers=4)
    assert [path.read_bytes() for path in paths] == bodies
    assert not barrier.broken
    assert http_server.max_in_flight == 4  # never more than max_workers


def test_a_failing_url_is_named_and_the_others_are_published(http_server: FaultServer, cache: Path) -> None:
    bodies = [os.urandom(5000) for _ in range(5)]
    urls = [http_server.add(unique_path(f"mixed-{i}"), data) for i, data in enumerate(bodies)]
    missing = http_server.add(unique_path("mixed-missing"), b"", status=404)
    wrong = urls[3]
    with pytest.raises(BulkDownloadError) as info:
        _manager(cache).cached_paths(
            [urls[0], missing, *urls[1:]], sha256={wrong: "0" * 64, urls[1]: sha256(bodies[1])}, max_workers=3
        )
    error = info.value
    assert list(error.failures) == [missing, wrong] and error.url == missing and error.total == 6
    assert isinstance(error.failures[missing], HTTPStatusError) and error.failures[missing].status == 404
    assert isinstance(error.failures[wrong], ChecksumError)
    assert missing in str(error) and wrong in str(error) and "2 of 6 files failed" in str(error)
    for url, data in zip(urls, bodies):
        entry = Entry(cache, url)
        if url == wrong:
            assert not entry.final.exists()
        else:
            assert entry.final.read_bytes() == data and entry.lookup(sha256(data)) is not None
    assert not Entry(cache, missing).final.exists()
    assert stray_files(cache) == []


def test_digests_as_a_list_are_checked_per_file(http_server: FaultServer, cache: Path) -> None:
    bodies = [os.urandom(3000) for _ in range(3)]
    urls = [http_server.add(unique_path(f"listed-{i}"), data) for i, data in enumerate(bodies)]
    digests = [sha256(bodies[0]), None, sha256(bodies[2])]
    assert [p.read_bytes() for p in _manager(cache).cached_paths(urls, sha256=digests)] == bodies
    with pytest.raises(BulkDownloadError) as info:
        _manager(cache).cached_paths(urls, sha256=[None, sha256(b"other"), None], force=True)
    assert list(info.value.failures) == [urls[1]]


@pytest.mark.parametrize(
    ("sha256_arg", "match"),
    [
        (["0" * 64], "one digest"),
        ({"http://example.org/other.bin": "0" * 64}, "not among the URLs"),
        (["xyz", None], "64 hexadecimal digits"),
        ((d for d in ["0" * 64, "1" * 64]), "got generator"),  # no length: a list is asked for
    ],
)
def test_bad_digests_are_refused_before_any_request(
    http_server: FaultServer, cache: Path, sha256_arg: object, match: str
) -> None:
    urls = [http_server.add(unique_path(f"refused-{i}"), b"x") for i in range(2)]
    with pytest.raises(InvalidArgumentError, match=match):
        _manager(cache).cached_paths(urls, sha256=sha256_arg)  # type: ignore[arg-type]
    assert [http_server.route(url).gets for url in urls] == [0, 0]


def test_bad_calls_are_clear_errors(http_server: FaultServer, cache: Path) -> None:
    url = http_server.add(unique_path("one"), b"x")
    with pytest.raises(TypeError, match="call cached_path"):
        _manager(cache).cached_paths(url)
    with pytest.raises(InvalidArgumentError, match="max_workers"):
        _manager(cache).cached_paths([url], max_workers=0)
    with pytest.raises(InvalidArgumentError, match="two sha256"):
        _manager(cache).cached_paths([url, url], sha256=["0" * 64, "1" * 64])
    assert _manager(cache).cached_paths([]) == []


class _Buggy(DownloadBackend):
    """A plugin backend with a bug: its `open` raises a `KeyError`, not a `DownloadError`."""

    def open(
        self, url: str, offset: int = 0, *, end: Optional[int] = None, if_range: Optional[str] = None
    ) -> ByteStream:
        raise KeyError("etag")


def test_an_unexpected_error_is_wrapped_and_hides_no_other_failure(
    http_server: FaultServer, cache: Path
) -> None:
    good = http_server.add(unique_path("beside-a-bug"), b"good")
    missing = http_server.add(unique_path("missing-beside-a-bug"), b"", status=404)
    manager = DownloadManager(cache, progress=False, connections=1, retries=1, backends={"buggy": _Buggy()})
    with pytest.raises(BulkDownloadError) as info:
        manager.cached_paths([good, "buggy://x", missing])
    failures = info.value.failures
    assert list(failures) == ["buggy://x", missing]
    assert isinstance(failures["buggy://x"].__cause__, KeyError) and "KeyError" in str(failures["buggy://x"])
    assert isinstance(failures[missing], HTTPStatusError)
    assert Entry(cache, good).final.read_bytes() == b"good"


def test_failures_are_keyed_by_the_first_spelling_given(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BulkDownloadError) as info:
        _manager(cache).cached_paths([tmp_path / "gone.bin", "gone.bin", "./gone.bin"])
    assert list(info.value.failures) == [str(tmp_path / "gone.bin")] and info.value.total == 1


def test_an_unknown_scheme_in_the_list_is_refused_before_any_request(
    http_server: FaultServer, cache: Path
) -> None:
    good = http_server.add(unique_path("before-gopher"), b"x")
    with pytest.raises(InvalidArgumentError, match="no download backend") as info:
        _manager(cache).cached_paths([good, "gopher://host/x"])
    assert info.value.url == "gopher://host/x" and http_server.route(good).gets == 0


def test_the_bar_counts_failed_files_apart_not_as_done(
    http_server: FaultServer, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal = io.StringIO()
    terminal.isatty = lambda: True  # type: ignore[method-assign]
    monkeypatch.setattr("sys.stderr", terminal)
    good = http_server.add(unique_path("bar-good"), os.urandom(3000))
    missing = http_server.add(unique_path("bar-missing"), b"", status=404)
    manager = DownloadManager(cache, progress=True, connections=1, retries=1)
    with pytest.raises(BulkDownloadError):
        manager.cached_paths([good, missing], max_workers=1)
    last = terminal.getvalue().rstrip().rsplit("\r", 1)[-1]
    assert "1/2" in last and "1 failed" in last and "2.93kB" in last, last


def test_cached_paths_refuses_two_digests_for_one_file_in_a_mapping(tmp_path: Path) -> None:
    """A mapping naming one file twice (two spellings) with two digests is a mistake:
    refused, as a list with two digests for one URL is, never one silently dropped."""
    local = tmp_path / "data.bin"
    local.write_bytes(b"payload")
    right, wrong = sha256(b"payload"), sha256(b"other")
    manager = DownloadManager(tmp_path / "cache", progress=False)
    with pytest.raises(InvalidArgumentError):
        manager.cached_paths([local], sha256={str(local): wrong, f"{tmp_path}/./data.bin": right})
    same = {str(local): right.upper(), f"{tmp_path}/./data.bin": right}  # one digest, two cases
    assert manager.cached_paths([local], sha256=same)[0].read_bytes() == b"payload"


def test_two_processes_with_overlapping_lists_fetch_each_file_once(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """Two processes ask for overlapping lists at once (and one names a file twice):
    every file is fetched once in all, and both get every file whole."""
    cache = tmp_path / "cache"
    blobs = {name: os.urandom(200_000) for name in "abcdef"}
    urls = {
        name: http_server.add(unique_path(name), data, chunk=16_384, delay=0.01)
        for name, data in blobs.items()
    }
    lists = [[urls[n] for n in "abcd"], [urls[n] for n in "fedcc"]]
    children = []
    for chosen in lists:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                paths = DownloadManager(cache, progress=False).cached_paths(chosen, max_workers=4)
                wanted = [blobs[url.rsplit("/", 1)[-1].split("-")[0]] for url in chosen]
                code = 0 if [path.read_bytes() for path in paths] == wanted else 2
            finally:
                os._exit(code)
        children.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
    assert codes == [0, 0]
    assert {name: http_server.route(url).gets for name, url in urls.items()} == dict.fromkeys(blobs, 1)


def test_ctrl_c_in_cached_paths_cancels_what_has_not_begun(http_server: FaultServer, tmp_path: Path) -> None:
    """Ctrl-C while three files are under way and one has failed: the call raises
    KeyboardInterrupt once those three finished (published), and no file not yet begun
    is ever asked for."""
    cache = tmp_path / "cache"
    held = [
        http_server.add(unique_path(f"held{i}"), os.urandom(200_000), hold_after=50_000) for i in range(2)
    ]
    failing = http_server.add(unique_path("failing"), b"", status=404)
    later = [http_server.add(unique_path(f"later{i}"), os.urandom(1000), hold_after=0) for i in range(10)]
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            DownloadManager(cache, progress=False).cached_paths([*held, failing, *later], max_workers=3)
        except KeyboardInterrupt:
            code = 0
        finally:
            os._exit(code)
    try:
        # The failed file's worker took the next file, held too: three under way.
        wait_for(lambda: all(http_server.route(url).gets for url in [*held, failing, later[0]]))
        os.kill(pid, signal.SIGINT)
        time.sleep(0.5)
        assert os.waitpid(pid, os.WNOHANG) == (0, 0), "the files under way must finish first"
    finally:
        for url in [*held, *later]:
            http_server.route(url).released.set()
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert all(Entry(cache, url).lookup(None) is not None for url in [*held, later[0]])
    assert [http_server.route(url).gets for url in later[1:]] == [0] * 9


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
