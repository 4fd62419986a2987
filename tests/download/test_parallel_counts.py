"""How many connections a parallel fetch opens and how it meets a refusal: counted at a
real server on 127.0.0.1, never timed."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest
from framework_plugins.http import HttpBackend

from framework.download import DownloadManager
from framework.errors import HTTPStatusError
from tests.support.download import PART, SLOW, FaultServer, parts_manager, unique_path

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_a_chosen_count_is_opened_whole(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """connections=8 (or FRAMEWORK_CONNECTIONS=8) on a link one stream fills (where the
    ramp would keep to a few): a stream too slow to stay alone is joined by all eight,
    at a server that serves them."""
    data = os.urandom(12 * PART)
    url = http_server.add(unique_path(f"eight-{how}"), data, shared_link=True, **SLOW)
    if how == "environment":
        monkeypatch.setenv("FRAMEWORK_CONNECTIONS", "8")
        manager = parts_manager(tmp_path, connections=None)
    else:
        monkeypatch.delenv("FRAMEWORK_CONNECTIONS", raising=False)
        manager = parts_manager(tmp_path, connections=8)
    assert manager.cached_path(url).read_bytes() == data
    # a stream the client closed counts at the server until its next write fails
    assert 8 <= http_server.route(url).max_in_flight <= 9


def test_the_default_ramp_grows_at_a_server_that_works_on_each_request(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """50 ms of work per request, one request at a time (requests queue at the server):
    connections spend part of their time between requests, which a short measuring
    window took for a link already full. The default ramp still opens many."""
    monkeypatch.delenv("FRAMEWORK_CONNECTIONS", raising=False)
    data = os.urandom(96 * PART)
    url = http_server.add(unique_path("worked"), data, serial_work=0.05, **SLOW)
    manager = DownloadManager(tmp_path, part_size=4 * PART, backoff_factor=0.01, progress=False)
    assert manager.cached_path(url).read_bytes() == data
    assert http_server.route(url).max_in_flight >= 8


class _Recording(HttpBackend):
    """Which thread asked for which byte, and what came of it, in `log`: (thread, byte,
    "served" | "refused <Retry-After>"), with (thread, part, "complete") entries added
    by the test."""

    supports_ranges: ClassVar[bool] = True  # its `open` passes `end` on

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.log: list[tuple[int, int, str]] = []
        self.lock = threading.Lock()

    def record(self, at: int, what: str) -> None:
        with self.lock:
            self.log.append((threading.get_ident(), at, what))

    def open(self, url: str, offset: int = 0, **options: Any) -> Any:
        try:
            stream = super().open(url, offset, **options)
        except HTTPStatusError as error:
            self.record(offset, f"refused {error.retry_after}")
            raise
        self.record(offset, "served")
        return stream


def test_retry_after_is_waited_out_holding_no_part(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """429 with Retry-After: 1 beyond two bodies at once, four connections: each refused
    part is completed by another connection before the refused one asks again, and each
    refusal is one wait of the server's second."""
    from framework.download.parallel import _engine

    backend = _Recording(retries=10, backoff_factor=0.01)
    rests: list[float] = []
    waited, complete = _engine._rest, _engine.Engine._complete

    def rest(lock: threading.Condition, over: Any, seconds: float) -> None:
        rests.append(seconds)
        waited(lock, over, seconds)

    def completed(engine: Any, index: int) -> None:
        backend.record(index, "complete")
        complete(engine, index)

    monkeypatch.setattr(_engine, "_rest", rest)
    monkeypatch.setattr(_engine.Engine, "_complete", completed)
    data = os.urandom(16 * PART)
    url = http_server.add(
        unique_path("retry-after"), data, busy_over=2, busy_status=429, retry_after="1", **SLOW
    )
    manager = parts_manager(tmp_path, connections=4, retries=10, backends={"http": backend})
    assert manager.cached_path(url).read_bytes() == data
    log = backend.log
    refused = [
        (at, thread, offset) for at, (thread, offset, what) in enumerate(log) if what.startswith("refused")
    ]
    assert refused and http_server.route(url).refused == len(refused)
    assert all(log[at][2] == "refused 1.0" for at, _, _ in refused)
    for at, thread, offset in refused:
        later = log[at + 1 :]
        done = next(
            i for i, (_, part, what) in enumerate(later) if what == "complete" and part == offset // PART
        )
        assert later[done][0] != thread  # another connection completed the part...
        # ...before the refused one asked for anything again
        assert not [entry for entry in later[:done] if entry[0] == thread and entry[2] != "complete"]
    assert rests == [1.0] * len(refused)  # one wait per refusal, as long as the server asked
