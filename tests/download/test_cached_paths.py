"""`DownloadManager.cached_paths`: many files at once, each with `cached_path`'s
guarantees, against the real HTTP test server (GETs and concurrent bodies counted)."""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path
from typing import Optional

import pytest

from framework.download import DownloadManager
from framework.download._cache import Entry
from framework.download.backend import ByteStream, DownloadBackend
from framework.errors import BulkDownloadError, ChecksumError, HTTPStatusError, InvalidArgumentError
from tests.support.download import FaultServer, sha256, stray_files, unique_path

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
