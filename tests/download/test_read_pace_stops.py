"""A stopped parallel fetch on a slow, live link, and breaks on steady connections:
what the connections still fetch once the fetch is over, and where a break resumes."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from framework.download.backend import ReadPace
from framework.download.parallel import _engine
from tests.support.download import PART, FaultServer, parts_manager, unique_path, wait_for

pytestmark = pytest.mark.timeout(60)

KIB = 1 << 10
# 16 KiB pieces 1 ms apart (about 14 MiB/s a connection): fast enough for steady reads.
BRISK: dict[str, Any] = {"chunk": 16 * KIB, "delay": 0.001}


# docs/concepts/download.md, "Ctrl-C": "a connection still blocked is left to its read
# timeout on a daemon thread ... a lower `timeout=` shortens it". On a link that trickles
# (1 KiB every 40 ms, well inside the 0.5 s read timeout) a read that waited for 64 KiB
# kept each connection of an interrupted fetch fetching for 1.6 s (a minute at 1 KiB/s),
# whatever the timeout: a link too slow for a window of LEAST is read as it arrives.
def test_an_interrupted_fetch_on_a_trickling_link_stops_its_connections_soon(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(8 * PART)
    piece, delay, timeout, connections = 1 * KIB, 0.04, 0.5, 4
    url = http_server.add(unique_path("trickle-ctrl-c"), data, chunk=piece, delay=delay)
    route = http_server.route(url)
    sent_at_interrupt: list[int] = []
    steer = _engine.Engine._steer

    def interrupted(engine: Any, workers: Any, remaining: int) -> bool:
        # Ctrl-C once every connection is steady (a chosen count is settled at once).
        if engine.received >= 128 * KIB and engine.live == connections:
            sent_at_interrupt.append(route.body_bytes)
            raise KeyboardInterrupt
        return steer(engine, workers, remaining)

    monkeypatch.setattr(_engine.Engine, "_steer", interrupted)
    earlier = set(threading.enumerate())
    with pytest.raises(KeyboardInterrupt):
        parts_manager(tmp_path, connections=connections, timeout=timeout).cached_path(url)

    def ours() -> list[threading.Thread]:
        return [t for t in set(threading.enumerate()) - earlier if t.name.startswith("framework-parallel")]

    wait_for(
        lambda: ours() == [] and route.in_flight == 0, what="the interrupted fetch's connections to close"
    )
    after = route.body_bytes - sent_at_interrupt[0]
    # Within a read timeout of the Ctrl-C each connection is closed: at most that many pieces each.
    assert after <= connections * (int(timeout / delay) + 2) * piece, after


# Breaks (resets, clean closes) on connections that read steadily resume where the
# bytes stopped (a reset loses at most the read under way, bounded by the part's end),
# and the file is the object's bytes.
@pytest.mark.parametrize("kind", ["reset", "short"])
def test_breaks_on_steady_parallel_connections_resume_within_a_read(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    steady_reads: list[int] = []
    read = ReadPace.read

    def counted(pace: ReadPace, *args: Any) -> bytes:
        chunk = read(pace, *args)
        if pace.steady:
            steady_reads.append(len(chunk))
        return chunk

    monkeypatch.setattr(ReadPace, "read", counted)
    data = os.urandom(int(PART * 64.5))  # too much for one stream to stay alone
    cut = 100 * KIB + 123
    url = http_server.add(
        unique_path(f"steady-parts-{kind}"),
        data,
        **BRISK,
        swap_at_get=6,  # the later parts' answers: their connections read steadily
        then={"drop_after": cut, "drops": 3, "drop_kind": kind},
    )
    route = http_server.route(url)
    assert parts_manager(tmp_path, connections=4).cached_path(url).read_bytes() == data
    assert max(steady_reads) > BRISK["chunk"]  # the steady reads were windows, not arrivals
    resumed = [r for r in route.ranges[1:] if int(r.split("=")[1].split("-")[0]) % PART]
    assert len(resumed) == 3, route.ranges
    for asked in resumed:
        start = int(asked.split("=")[1].split("-")[0])
        lost = start // PART * PART + cut - start  # a part asked from its start broke at `cut`
        assert 0 <= lost <= (ReadPace.LEAST if kind == "reset" else 0), (asked, route.ranges)
    assert route.body_bytes <= len(data) + 3 * ReadPace.LEAST + 2 * BRISK["chunk"]
