"""Parallel fetch: byte-range parts over several connections, against the real test HTTP
server and moto's S3 server, with real processes for kills and races."""

from __future__ import annotations

import errno
import hashlib
import itertools
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar, Optional

import pytest
from framework_plugins.http import HttpBackend

from framework.download import DownloadManager
from framework.download._cache import HOST, Entry
from framework.download._partial import PartialName
from framework.download._validators import Validators
from framework.download.backend import ReadPace
from framework.download.parallel._parts import _Plan, _save_record
from framework.errors import ChecksumError, HTTPStatusError, NetworkError
from tests.support.download import (
    FORK,
    PART,
    SLOW,
    FaultServer,
    PacedProxy,
    cache_files,
    end_child,
    parts_manager,
    sha256,
    stray_files,
    unique_path,
    wait_for,
)

pytestmark = pytest.mark.timeout(60)

# Half `SLOW`'s pace, for tests that kill a fetch mid-way: the recorder writes progress every
# `ProgressRecorder.EVERY_S`, so the fetch must last several of those.
SLOWER: dict[str, Any] = {"chunk": 16 * 1024, "delay": 0.016}
TO_THE_END = f"bytes=0-{(1 << 62) - 1}"  # the first request: one stream that may go on to the end


def _data(parts: float) -> bytes:
    return os.urandom(int(PART * parts))


def test_large_object_comes_over_several_connections(http_server: FaultServer, tmp_path: Path) -> None:
    data = _data(12.5)
    url = http_server.add(unique_path("large"), data, **SLOW)
    path = parts_manager(tmp_path).cached_path(url)
    route = http_server.route(url)
    assert path.read_bytes() == data
    # the ramp went up to the cap (the server counts a stream the client closed until its
    # next write fails, so one more may show)
    assert 4 <= route.max_in_flight <= 5
    assert route.ranges[0] == TO_THE_END
    # every later request asks for one part, with the first answer's version
    assert all(r.startswith("bytes=") and r != TO_THE_END for r in route.ranges[1:])
    etag = route.etag or ""
    assert route.if_ranges[1:] == [etag] * (route.gets - 1)
    assert route.gets <= 13  # one request per part at most (the first stream covers several)
    # about one copy: the first stream stops where the others' parts begin, wasting at most
    # what the server had sent ahead (a chunk)
    assert len(data) <= route.body_bytes <= len(data) + 2 * SLOW["chunk"]
    assert stray_files(tmp_path) == []
    assert not [n for n in cache_files(tmp_path) if n.endswith(".parts")]


def test_a_link_one_stream_fills_keeps_one_stream(http_server: FaultServer, tmp_path: Path) -> None:
    """Adaptive: an object one stream brings in quickly is one request, however high the cap."""
    data = _data(12.5)
    url = http_server.add(unique_path("fast"), data)
    assert parts_manager(tmp_path, connections=16).cached_path(url).read_bytes() == data
    route = http_server.route(url)
    assert (route.gets, route.ranges, route.body_bytes) == (1, [TO_THE_END], len(data))


def test_the_ramp_grows_while_throughput_grows(http_server: FaultServer, tmp_path: Path) -> None:
    """A server that paces each connection: every step pays, so the count climbs past the
    first step to the cap (16)."""
    data = _data(40)
    url = http_server.add(unique_path("ramp"), data, **SLOW)
    assert parts_manager(tmp_path, connections=16).cached_path(url).read_bytes() == data
    assert http_server.route(url).max_in_flight > 8


@pytest.mark.parametrize(
    ("rates", "wanted"),
    [
        # one stream would bring the rest (1 MB) in 0.1 s (< ALONE_S): it stays alone
        ([1e7], [1]),
        # 10 s alone: 20 connections would each still have ALONE_S of work; capped at 16
        ([1e5, 1.6e6], [16, 16]),
        # more connections do not help at all, in two windows: back to one
        ([1e5, 1.1e5, 1.1e5], [16, 16, 1]),
        # 1.5 s alone: 3 connections; each step pays, so it doubles up to the cap
        ([6.7e5, 2e6, 4e6, 7.9e6, 9.5e6], [3, 6, 12, 16, 16]),
        # the link is full at 3: the step to 6 is undone after a second window
        ([6.7e5, 2e6, 2.1e6, 2.1e6], [3, 6, 6, 3]),
        # from 12 to 16 can bring at most a third more: a sixth more keeps it, less undoes
        # it, to 12 and a quarter more (those wait for answers part of their time)
        ([6.7e5, 2e6, 4e6, 7.9e6, 8.8e6, 8.8e6], [3, 6, 12, 16, 16, 15]),
        # the link is full at 8: the step to 16 is undone to 10
        ([2.5e5, 2e6, 2.1e6, 2.1e6], [8, 16, 16, 10]),
        # 14 is within a quarter of the cap: the cap at once; the step is still judged
        ([1.43e5, 1.5e6], [16, 16]),
        # 10 and a quarter more is less than the cap: 10, then 16
        ([2e5, 1.5e6, 3e6], [10, 16, 16]),
    ],
)
def test_ramp_decisions(rates: list[float], wanted: list[int]) -> None:
    """Each rate (bytes/s) is what one measurement window saw, with 1 MB still to come."""
    from framework.download.parallel._ramp import Ramp

    ramp, now, received, seen = Ramp(cap=16), 0.0, 0, []
    for rate in rates:
        ramp.update(now, now, received, 10**6, ready=True)  # a measurement begins
        assert ramp.update(now + 0.1, now, received, 10**6, ready=True) == ramp.target  # no write since
        now += 0.06
        received += int(rate * 0.06)
        seen.append(ramp.update(now, now, received, 10**6, ready=True))
    assert seen == wanted
    assert ramp.settled


def _windows(ramp: Any, rates: list[float], wait_s: float = 0.0, window_s: float = 0.06) -> list[int]:
    """The counts `ramp` wants after windows of `window_s` at each of `rates` (bytes/s)."""
    now, received, seen = 0.0, 0, []
    for rate in rates:
        ramp.update(now, now, received, 10**6, ready=True, wait_s=wait_s)  # a measurement begins
        now += window_s
        received += int(rate * window_s)
        seen.append(ramp.update(now, now, received, 10**6, ready=True, wait_s=wait_s))
    return seen


def test_one_slow_window_undoes_no_step() -> None:
    """A window in which the step from 6 to 12 did not pay (a busy CPU, connections
    between requests) is followed by another; judged by the better one, it paid."""
    from framework.download.parallel._ramp import Ramp

    ramp = Ramp(cap=16)
    assert _windows(ramp, [6.7e5, 2e6, 1e6, 4e6]) == [3, 6, 6, 12]
    assert not ramp.settled


def test_a_step_is_measured_over_several_request_waits() -> None:
    """Requests wait 0.1 s for their answers: a step is measured over 0.4 s, not 0.05 s
    (in which the connections between two requests would count as a slower link)."""
    from framework.download.parallel._ramp import Ramp

    ramp = Ramp(cap=16)
    assert _windows(ramp, [6.7e5], wait_s=0.1) == [3]  # the probe is not a step: not longer
    assert _windows(ramp, [1e6], wait_s=0.1) == [3]  # 0.06 s: not over yet
    ramp = Ramp(cap=16)
    assert _windows(ramp, [6.7e5, 2e6], wait_s=0.1, window_s=0.41) == [3, 6]


def test_a_chosen_count_opens_all_of_it_at_once() -> None:
    """`fixed` (connections=10 given): a stream not fast enough to stay alone is joined by
    all ten at once, and the count is never undone; a fast one still stays alone."""
    from framework.download.parallel._ramp import Ramp

    ramp = Ramp(cap=10, fixed=True)
    assert _windows(ramp, [6.7e5]) == [10]  # 1.5 s alone: 3 for the ramp, 10 chosen
    assert ramp.settled
    fast = Ramp(cap=10, fixed=True)
    assert _windows(fast, [1e7]) == [1] and fast.settled


def test_a_stream_left_alone_on_a_burst_is_probed_again_when_it_overruns() -> None:
    """A probe that read a burst (the socket's buffer after the reader lost the CPU) says
    the rest comes in 0.04 s: alone. Still running `ALONE_S` later, it is probed again,
    and at its true rate (0.6 s alone for what is left) the chosen count opens; one that
    ends in time is never probed again, nor is the adaptive ramp's lone stream."""
    from framework.download.parallel._ramp import Ramp

    ramp = Ramp(cap=10, fixed=True)
    assert _windows(ramp, [1e7]) == [1] and ramp.settled
    left = 10**6 - int(1e7 * 0.06)
    assert ramp.update(0.06 + Ramp.ALONE_S / 2, 0.5, 10**6 - left, left, ready=True) == 1 and ramp.settled
    later = 0.06 + Ramp.ALONE_S  # the probe's verdict overran: measured again, from here
    assert ramp.update(later, later, 10**6 - left, left, ready=True) == 1 and not ramp.settled
    assert ramp.update(later + 0.06, later + 0.06, 10**6 - left + int(6.7e5 * 0.06), left, ready=True) == 10
    done = Ramp(cap=10, fixed=True)
    assert _windows(done, [1e7]) == [1]
    assert done.update(10.0, 0.06, 10**6, 0, ready=True) == 1 and done.settled  # nothing left
    adaptive = Ramp(cap=10)  # its verdict stands: a busy CPU gains nothing from more connections
    assert _windows(adaptive, [1e7]) == [1]
    assert adaptive.update(10.0, 10.0, 10**6 - left, left, ready=True) == 1 and adaptive.settled


def test_a_refusal_pauses_the_ramp_and_a_second_one_keeps_the_count() -> None:
    """A refusal as the step to 3 opens, with 2 running: 2, and nothing added however
    the windows pay while a refused connection waits; once the refused are answered,
    the 2 are a step measured as any other, and the ramp doubles on. Refused again
    after that (a server that caps its connections), the count is kept for good."""
    from framework.download.parallel._ramp import Ramp

    ramp = Ramp(cap=16)
    assert _windows(ramp, [6.7e5]) == [3]
    ramp.refused(2)
    assert _windows(ramp, [2e6, 4e6]) == [2, 2] and ramp.paused and not ramp.settled
    ramp.served()
    assert _windows(ramp, [1.4e6, 2.8e6]) == [4, 8]
    ramp.refused(6)
    assert ramp.settled and not ramp.paused and ramp.target == 6
    assert _windows(ramp, [8e6]) == [6]
    ramp.served()
    assert _windows(ramp, [8e6]) == [6]


def test_a_connection_that_gives_up_keeps_the_count_for_good() -> None:
    from framework.download.parallel._ramp import Ramp

    ramp = Ramp(cap=16)
    assert _windows(ramp, [6.7e5]) == [3]
    ramp.keep_to(2)
    assert ramp.settled and _windows(ramp, [4e6]) == [2]


def test_the_probe_does_not_count_the_bytes_that_came_with_the_answer() -> None:
    """The first chunk (100 kB, there as the answer came) took no time to come: the rate
    is measured from it, 200 kB more in 20 ms (10 MB/s: 30 MB alone would take 3 s, so
    6 connections), not 300 kB in 20 ms (which would make it 4). 3 s is near enough
    the line to be measured for all of PROBE_S."""
    from framework.download.parallel._ramp import Ramp

    ramp = Ramp(cap=64)
    assert ramp.update(0.0, 0.0, 10**5, 3 * 10**7, ready=True) == 1  # the first chunk: a measurement begins
    assert ramp.update(0.01, 0.01, 2 * 10**5, 3 * 10**7, ready=True) == 1  # not PROBE_S yet
    assert ramp.update(0.02, 0.02, 3 * 10**5, 3 * 10**7, ready=True) == 6


def _replay(ramp: Any, writes: list[tuple[float, float, int]], remaining: int) -> list[int]:
    """Ask `ramp` at each (now, at, received), in milliseconds and bytes."""
    return [ramp.update(now / 1000, at / 1000, got, remaining, ready=True) for now, at, got in writes]


def _steady(start_ms: float, first: int, stop_ms: float, rate: float) -> list[tuple[float, float, int]]:
    """A write every millisecond after `start_ms` at `rate` bytes/s, asked right after each."""
    return [
        (start_ms + tick + 0.1, start_ms + tick, first + int(rate * tick / 1000))
        for tick in range(1, int(stop_ms - start_ms) + 1)
    ]


def test_the_first_chunks_second_write_begins_the_probe() -> None:
    """The packet that brought the answer can reach the file as two writes a fraction of
    a millisecond apart: the second one's 56 kB took no time to come either. Counted,
    10 MB/s would look like 20 MB/s, and 100 MB would get 10 connections, not 20."""
    from framework.download.parallel._ramp import Ramp

    writes = [(0.05, 0.0, 7000), (0.5, 0.2, 63000), *_steady(0.2, 63000, 5.2, 1e7)]
    assert _replay(Ramp(cap=64), writes, 10**8) == [1] * 6 + [20]


def test_a_clearly_slow_stream_ends_the_probe_early() -> None:
    """A stream that would take 10 s alone (20 times ALONE_S), its writes coming steadily,
    is known once they span PROBE_MIN_S: the first step comes 15 ms sooner than PROBE_S
    would have it."""
    from framework.download.parallel._ramp import Ramp

    ramp = Ramp(cap=64)
    writes = [(0.05, 0.0, 10**5), *_steady(0.0, 10**5, 5.0, 1e7)]
    assert _replay(ramp, writes, 10**8) == [1] * 5 + [20]  # not at 4 ms: not PROBE_MIN_S yet
    assert ramp.poll_s == 0.005  # a step is measured next: the loop need not ask every millisecond


def test_a_fast_stream_that_lost_the_cpu_is_not_taken_for_a_slow_one() -> None:
    """Writes recorded with 4 busy loops on 2 cores: a loopback server's first 8 kB,
    then a whole 1 MiB read 0.86 ms later (not the rest of a packet: a stream that
    fast), then the reader had no CPU for 7.7 ms and wrote 8 kB. Over that one gap the
    rate looks 2,000 times too slow, and 16 connections would open at 8.7 ms for a
    stream that fills the link alone. One long gap is not a steady trickle: the probe
    goes on."""
    from framework.download.parallel._ramp import Ramp

    ramp = Ramp(cap=16)
    writes = [(0.058, 0.0, 7968), (1.163, 0.857, 1048576), (4.394, 0.857, 1048576), (8.686, 8.565, 1056544)]
    assert _replay(ramp, writes, 134209760) == [1, 1, 1, 1]
    # the stream goes on at 1 GB/s: it stays alone at the end of the probe
    assert ramp.update(0.0206, 0.0205, 1056544 + 12 * 10**6, 120 * 10**6, ready=True) == 1
    assert ramp.settled
    # Recorded on S3 the same way: 4 MiB in with the probe's first write, then 13 ms with
    # no CPU and one 64 KiB read (5 MB/s over that gap, 25 s alone)
    s3 = Ramp(cap=16)
    writes = [(0.05, 0.0, 4 << 20), (6.0, 0.0, 4 << 20), (13.1, 13.0, (4 << 20) + 65536)]
    assert _replay(s3, writes, 124 << 20) == [1, 1, 1]


def test_the_probe_does_not_decide_from_writes_that_span_a_moment() -> None:
    """Recorded: the first 64 KiB came as 7971 B, 57512 B 0.11 ms later (the rest of the
    packet) and 53 B at 1.36 ms; then the server stalled. At PROBE_S, 53 bytes over
    1.25 ms said 42 kB/s: 16 connections. Writes that span less than half the probe say
    too little: it waits for more."""
    from framework.download.parallel._ramp import Ramp

    ramp = Ramp(cap=16)
    writes = [(0.05, 0.0, 7971), (1.16, 0.11, 65483), (2.25, 1.36, 65536), (20.79, 1.36, 65536)]
    assert _replay(ramp, writes, 16711680) == [1, 1, 1, 1]
    assert not ramp.settled
    # the server comes back at 10 MB/s: 1.7 s alone, measured over the stall too
    assert ramp.update(0.0301, 0.03, 65536 + 290000, 16 * 10**6, ready=True) == 4


@pytest.mark.parametrize(
    ("writes", "remaining", "wanted"),
    [
        # 5 s alone (10 times ALONE_S, over CLEARLY_SLOW's 8), writes every millisecond
        ([(0.05, 0.0, 10**5), *_steady(0.0, 10**5, 5.0, 2e7)], 10**8, [1] * 5 + [10]),
        # two gaps, the longer 3 of the 5 ms (under two thirds): steady enough
        ([(0.05, 0.0, 10**5), (3.1, 3.0, 130000), (5.1, 5.0, 150000)], 10**8, [1, 1, 20]),
        # the longer 4 of the 5 ms: one gap is most of the span, the probe goes on
        ([(0.05, 0.0, 10**5), (4.1, 4.0, 140000), (5.1, 5.0, 150000)], 10**8, [1, 1, 1]),
        # a second write of 100 kB within a millisecond is not the rest of a packet: counted,
        # the rate (28 MB/s, 3.5 s alone) is not clearly slow, and the probe goes on
        ([(0.05, 0.0, 7000), (0.4, 0.3, 107000), *_steady(0.3, 107000, 5.3, 1e7)], 10**8, [1] * 7),
        # writes spanning 6 ms by the end of the probe (less than half of it) say too little
        ([(0.05, 0.0, 10**5), (6.1, 6.0, 220000), (20.5, 6.0, 220000)], 4 * 10**7, [1, 1, 1]),
    ],
)
def test_when_the_probe_may_end(
    writes: list[tuple[float, float, int]], remaining: int, wanted: list[int]
) -> None:
    from framework.download.parallel._ramp import Ramp

    assert _replay(Ramp(cap=64), writes, remaining) == wanted


def test_a_stream_near_the_line_is_measured_for_all_of_the_probe() -> None:
    """2.5 s alone (5 times ALONE_S, under CLEARLY_SLOW): a short measurement could be
    wrong by that much, so the probe runs its PROBE_S, polled every millisecond."""
    from framework.download.parallel._ramp import Ramp

    ramp = Ramp(cap=64)
    assert ramp.poll_s == 0.005  # before the first byte: nothing is measured yet
    assert ramp.update(0.0, 0.0, 10**5, 10**8, ready=True) == 1
    assert ramp.poll_s == 0.001
    assert _replay(ramp, _steady(0.0, 10**5, 19.0, 4e7), 10**8) == [1] * 19
    assert ramp.update(0.02, 0.02, 10**5 + int(4e7 * 0.02), 10**8, ready=True) == 5
    # a stream that stalls in the probe (no write since its first) is polled less often past it
    stalled = Ramp(cap=64)
    stalled.update(0.0, 0.0, 10**5, 10**8, ready=True)
    assert stalled.update(0.01, 0.0, 10**5, 10**8, ready=True) == 1 and stalled.poll_s == 0.001
    assert stalled.update(0.5, 0.0, 10**5, 10**8, ready=True) == 1 and stalled.poll_s == 0.005
    # and a fast one (0.25 s alone) stays alone, settled: the loop then asks rarely
    fast = Ramp(cap=64)
    fast.update(0.0, 0.0, 10**5, 10**8, ready=True)
    assert fast.update(0.02, 0.02, 10**5 + 8 * 10**6, 10**8, ready=True) == 1
    assert fast.settled and fast.poll_s == 0.1


def test_requests_ask_for_a_shrinking_share_of_what_is_left(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parts of 64 KiB and requests of at most 1 MiB (16 parts), 2 connections: the
    first requests ask for runs of several parts, the last ones for one part each, so
    both connections finish together and little is left to hash at the end."""
    from framework.download.parallel import _fetch as _parallel

    monkeypatch.setattr(_parallel, "_PART", 64 * 1024)
    data = os.urandom(4 << 20)
    url = http_server.add(unique_path("runs"), data, **SLOW)
    manager = DownloadManager(tmp_path, connections=2, part_size=1 << 20, backoff_factor=0.01, progress=False)
    assert manager.cached_path(url).read_bytes() == data
    route = http_server.route(url)
    later = [tuple(int(n) for n in r[len("bytes=") :].split("-")) for r in route.ranges[1:]]
    parts = [(last + 1 - first) // (64 * 1024) for first, last in later]
    assert all(first % (64 * 1024) == 0 and (last + 1) % (64 * 1024) == 0 for first, last in later)
    assert max(parts) > 1 and all(count <= 16 for count in parts)  # runs, never more than part_size
    assert parts[-1] == 1  # the last request is one part
    assert route.gets < 64 // 2  # far fewer requests than parts
    assert len(data) <= route.body_bytes <= len(data) + 2 * SLOW["chunk"]


def test_a_server_slow_to_answer_gets_fewer_larger_requests(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same object from a server that answers at once and from one that waits 0.2 s
    before each answer (a server far away): from the far one, the requests do not
    shrink down to one part each, as a request that small would spend most of its time
    waiting, and no run leaves such a scrap behind for a last request."""
    from framework.download.parallel import _fetch as _parallel

    monkeypatch.setattr(_parallel, "_PART", 64 * 1024)
    data = os.urandom(4 << 20)
    sizes: dict[float, list[int]] = {}
    for wait in (0.0, 0.2):
        url = http_server.add(unique_path(f"wait{wait}"), data, answer_wait=wait, **SLOW)
        manager = DownloadManager(
            tmp_path / str(wait), connections=2, part_size=1 << 20, backoff_factor=0.01, progress=False
        )
        assert manager.cached_path(url).read_bytes() == data
        route = http_server.route(url)
        later = [tuple(int(n) for n in r[len("bytes=") :].split("-")) for r in route.ranges[1:]]
        sizes[wait] = [(last + 1 - first) // (64 * 1024) for first, last in later]
        assert len(data) <= route.body_bytes <= len(data) + 2 * SLOW["chunk"]
    near, far = sizes[0.0], sizes[0.2]
    assert min(near) <= 2, near  # guided self-scheduling, down to a part or two
    # 8 x 0.2 s at ~2 MiB/s is ~48 parts: more than a request's 16, so every request
    # holds at least an even share of what was unwritten, and the last one too.
    assert len(far) < len(near), (near, far)
    assert min(far) >= 2, far


def test_a_far_servers_requests_cover_the_object_once_in_runs(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """50 parts of 64 KiB from a server that waits 0.2 s before each answer, 2
    connections, runs of at most 16: the bytes are exact, the ranges after the first
    answer never overlap, and none asks for more than a run."""
    from framework.download.parallel import _fetch as _parallel

    monkeypatch.setattr(_parallel, "_PART", 64 * 1024)
    data = os.urandom(50 * 64 * 1024)
    url = http_server.add(unique_path("far"), data, answer_wait=0.2, **SLOW)
    manager = DownloadManager(tmp_path, connections=2, part_size=1 << 20, backoff_factor=0.01, progress=False)
    assert manager.cached_path(url).read_bytes() == data
    later = sorted(_bounds(r) for r in http_server.route(url).ranges[1:])
    assert later and all((last + 1 - first) <= 16 * 64 * 1024 for first, last in later), later
    assert all(a[1] < b[0] for a, b in itertools.pairwise(later)), later


def test_a_round_of_runs_holds_every_part_and_leaves_no_scrap_behind() -> None:
    """8 connections, runs of at most 8 parts, answers that wait 0.15 s at 16 MiB/s (a
    paying run of 20 parts; 2 whole parts come in while a request waits): the first
    round's runs are even shares rounded up, so together they hold every part, and a
    run that would leave no more than a wait's parts behind takes them, when it can
    hold them, rather than leave a request of a part to pay a whole wait. A larger
    remainder is left for another connection: one run taking it would end long after
    the others."""
    from framework.download.parallel._runs import Runs

    runs = Runs(run_parts=8, part_size=1 << 20, first_wait=0.15)
    pace = 16 << 20
    assert (runs.paying_run(pace), runs.wait_parts(pace)) == (20, 2)
    # 62 parts unclaimed and unwritten over 8 connections: 8 each (7 would leave 6 for a second round).
    assert runs.share(8, todo=62, unwritten=62, pace=pace) == 8
    # The last claim of the round: its part and 7 unclaimed, 55 unwritten: it takes all 8.
    assert runs.share(8, todo=7, unwritten=55, pace=pace) == 8
    # A part over `run_parts` is left, not taken, and the run is not grown to the cap for it.
    assert runs.share(8, todo=8, unwritten=60, pace=pace) == 8
    assert runs.share(8, todo=7, unwritten=30, pace=pace) == 4  # an even share; 4 left
    # 6 parts would be left: more than a wait's, so the run keeps to its share.
    assert runs.share(2, todo=12, unwritten=13, pace=pace) == 7
    # A near server (a paying run of one part): shares shrink to a part at the end.
    near = Runs(run_parts=8, part_size=1 << 20, first_wait=0.001)
    assert near.wait_parts(pace) == 0
    assert near.share(8, todo=3, unwritten=10, pace=pace) == 1
    assert near.share(8, todo=1, unwritten=3, pace=pace) == 1


def test_a_request_retried_after_a_refusal_does_not_count_as_the_servers_wait() -> None:
    """A request that waited out a 503's Retry-After inside the HTTP client took a second
    to be answered; the server's wait is still the median of the answers', so the runs
    of a near server stay small. A far server's waits make them larger."""
    from framework.download.parallel._runs import Runs

    def paying_run(waits: list[float]) -> int:
        runs = Runs(run_parts=8, part_size=1 << 20)  # 1 MiB parts
        for wait in waits:
            runs.answered(wait)
        return runs.paying_run(pace=4 << 20)  # 8 MiB/s over 2 connections

    assert paying_run([]) == 1  # nothing measured yet
    assert paying_run([0.002] * 10 + [1.0]) == 1  # 8 x 2 ms x 4 MiB/s: a part
    assert paying_run([0.002, 1.0]) == 1
    assert paying_run([0.2] * 5 + [0.002]) == 7  # 8 x 0.2 s x 4 MiB/s = 6.4 MiB: 7 parts


def test_a_server_whose_answers_outlast_a_run_gets_runs_of_part_size() -> None:
    """Answers that take longer to come than a run of `part_size` takes to flow (a
    server whose requests queue for its CPU): every run is that long, as long as the
    answers measured say so; a near server's, or none measured yet, keep to shares."""
    from framework.download.parallel._runs import Runs

    def outlast(waits: list[float], rates: list[float]) -> bool:
        runs = Runs(run_parts=8, part_size=1 << 20)  # runs of 8 parts of 1 MiB: 1 s at 8 MiB/s
        for wait in waits:
            runs.answered(wait)
        for rate in rates:
            runs.flowed(rate, 1.0)
        return runs.waits_outlast_runs()

    assert outlast([1.5, 1.2, 2.0], [8 << 20] * 3)
    assert not outlast([0.2, 0.3, 0.25], [8 << 20] * 3)  # answers come sooner than runs flow
    assert not outlast([1.5], [])  # no answer has flowed yet: the first runs are shares
    assert not outlast([1.5, 0.1, 0.1], [8 << 20])  # the median wait, not one slow answer


def test_ramp_waits_for_the_new_connections_first_bytes() -> None:
    from framework.download.parallel._ramp import Ramp

    ramp = Ramp(cap=16)
    ramp.update(0.0, 0.0, 0, 10**9, ready=True)
    assert ramp.update(0.1, 0.1, 100, 10**9, ready=True) == 16
    assert ramp.update(0.2, 0.2, 200, 10**9, ready=False) == 16  # not measured while any waits
    assert ramp.update(5.0, 5.0, 10**6, 10**9, ready=False) == 16
    assert not ramp.settled


def test_a_part_that_breaks_off_resumes_at_its_byte(http_server: FaultServer, tmp_path: Path) -> None:
    """A connection that drops mid-part asks again from the byte it reached, with the
    plan's validator: nothing is fetched twice."""
    data = _data(12.5)
    url = http_server.add(unique_path("broken"), data, drop_after=100_000, drops=1, drop_kind="short", **SLOW)
    assert parts_manager(tmp_path).cached_path(url).read_bytes() == data
    route = http_server.route(url)
    resumed = [i for i, r in enumerate(route.ranges) if r.startswith("bytes=100000-")]
    assert len(resumed) == 1 and route.if_ranges[resumed[0]] == route.etag
    # the server counts whole chunks only, so the bytes before the fault are not all counted
    assert len(data) - SLOW["chunk"] <= route.body_bytes <= len(data) + 2 * SLOW["chunk"]
    assert route.full_gets == 1  # the first request only: the object never started over
    assert stray_files(tmp_path) == []


def test_an_object_of_few_default_parts_is_cut_finer(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4 MiB with the default part size (8 MiB) and 4 connections: 1 MiB parts, so that
    every connection the ramp adds has one. The plan is checked, not how many
    connections ran at once: that is the ramp's choice, which a busy CPU changes."""
    from framework.download.parallel import _fetch

    plans: list[Any] = []
    real = _fetch._Plan

    def recorded(*args: Any) -> Any:
        plans.append(real(*args))
        return plans[-1]

    monkeypatch.setattr(_fetch, "_Plan", recorded)
    data = os.urandom(4 << 20)
    url = http_server.add(unique_path("finer"), data, **SLOW)
    manager = DownloadManager(tmp_path, connections=4, backoff_factor=0.01, progress=False)
    assert manager.cached_path(url).read_bytes() == data
    assert [(plan.size, plan.part_size, plan.count) for plan in plans] == [(4 << 20, 1 << 20, 4)]
    route = http_server.route(url)  # each request the ramp added asks for whole 1 MiB parts
    later = [tuple(int(n) for n in r[len("bytes=") :].split("-")) for r in route.ranges[1:]]
    assert all(first % (1 << 20) == 0 and last - first < 1 << 20 for first, last in later)


@pytest.mark.parametrize(
    ("size", "cap"), [(5 << 20, 1 << 20), (900 << 10, 64 << 10)], ids=["parts", "one-part"]
)
@pytest.mark.parametrize("star_total", [True, False])
def test_a_server_that_caps_its_ranges_still_gives_the_whole_object(
    http_server: FaultServer, tmp_path: Path, star_total: bool, size: int, cap: int
) -> None:
    """Ranged answers of at most `cap`: with an unknown total (``bytes 0-1048575/*``) the
    first answer cannot say it is the whole object, so the object is asked for again
    without a Range; with the total, each short answer is followed by another, and
    none of them counts as a failure, for an object of several parts or of one (that
    one goes on as the single-stream path, which must not count them either)."""
    data = os.urandom(size)
    url = http_server.add(unique_path("capped"), data, range_cap=cap, star_total=star_total)
    manager = DownloadManager(tmp_path, connections=4, retries=2, backoff_factor=0.01, progress=False)
    assert manager.cached_path(url).read_bytes() == data
    route = http_server.route(url)
    if star_total:
        assert route.ranges == [TO_THE_END, ""]
    else:
        assert route.gets == -(-size // cap) and route.body_bytes == len(data)
    assert stray_files(tmp_path) == []


def test_a_cut_range_without_a_content_length_is_a_failure_not_a_cap(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """Answers without a Content-Length (the body ends when the connection closes), each
    cut after 50 kB: the cut looks like the body's end, but the range says how long it
    is, so each is a network failure, retried up to `retries` times per part with
    backoff, not a server's cap that is followed by another request at once. (Cut
    after 100 kB, a part of 256 KiB taken by a second connection completed within its
    retries, and the fetch rightly succeeded.)"""
    url = http_server.add(
        unique_path("close-delimited"),
        _data(6),
        etag='"cd"',
        close_delimited=True,
        drop_after=50_000,
        drops=1000,
        drop_kind="short",
    )
    with pytest.raises(NetworkError, match="of the range's"):
        parts_manager(tmp_path, retries=3).cached_path(url)
    assert http_server.route(url).gets <= 4 * 3 + 1


@pytest.mark.parametrize(
    "lie",
    [{"gzip_all": True}, {"total_delta": -1000}, {"total_delta": 1000}],
    ids=["encoded-ranges", "total-too-small", "total-too-large"],
)
def test_a_first_answer_that_cannot_name_the_object_is_asked_again_whole(
    http_server: FaultServer, tmp_path: Path, lie: dict[str, Any]
) -> None:
    """A first 206 whose range counts encoded bytes (a ``.gz`` served with
    ``Content-Encoding: gzip``), or whose Content-Range contradicts itself (its last
    byte at or past its total), cannot say what the object is: it is asked for again
    without a Range, never published truncated or as a size mismatch. A total that is
    only too large (no contradiction) is taken at its word until a part past the real
    end is refused (416), and the object then comes in one stream, whole."""
    data = _data(8)
    url = http_server.add(unique_path("lie"), data, **lie)
    assert parts_manager(tmp_path).cached_path(url).read_bytes() == data
    ranges = http_server.route(url).ranges
    if lie.get("total_delta", 0) > 0:
        assert ranges[0] == TO_THE_END and ranges[-1] == ""
    else:
        assert ranges == [TO_THE_END, ""]
    assert stray_files(tmp_path) == []


def test_small_object_takes_one_request(http_server: FaultServer, tmp_path: Path) -> None:
    data = _data(0.7)
    url = http_server.add(unique_path("small"), data)
    assert parts_manager(tmp_path).cached_path(url).read_bytes() == data
    assert http_server.route(url).gets == 1


def test_one_connection_is_one_stream(http_server: FaultServer, tmp_path: Path) -> None:
    data = _data(6)
    url = http_server.add(unique_path("single"), data)
    assert parts_manager(tmp_path, connections=1).cached_path(url).read_bytes() == data
    route = http_server.route(url)
    assert (route.gets, route.ranges) == (1, [""])  # today's path: no Range at all


def test_connections_from_the_environment(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _data(12)
    url = http_server.add(unique_path("env"), data, **SLOW)
    monkeypatch.delenv("FRAMEWORK_CONNECTIONS", raising=False)
    manager = parts_manager(tmp_path, connections=None)
    assert manager.connections == 16  # the default cap; the ramp decides how many are used
    monkeypatch.setenv("FRAMEWORK_CONNECTIONS", "3")
    assert manager.connections == 3
    assert manager.cached_path(url).read_bytes() == data
    assert 2 <= http_server.route(url).max_in_flight <= 4  # 3, and a closed stream the server still counts
    monkeypatch.setenv("FRAMEWORK_CONNECTIONS", "many")
    with pytest.raises(ValueError, match=r"FRAMEWORK_CONNECTIONS must be a whole number.*'many'"):
        _ = manager.connections
    with pytest.raises(
        ValueError, match=r"connections must be a whole number of at least 1 \(1 = one stream\), got 0"
    ):
        DownloadManager(tmp_path, connections=0)


@pytest.mark.parametrize("part_size", [0, 1, (64 << 10) - 1, True, 1.5])
def test_a_part_size_too_small_to_pay_for_its_request_is_refused(tmp_path: Path, part_size: Any) -> None:
    with pytest.raises(ValueError, match=r"part_size must be a whole number of bytes of at least 65536"):
        DownloadManager(tmp_path, part_size=part_size)
    assert DownloadManager(tmp_path, part_size=64 << 10).part_size == 64 << 10


def test_range_ignoring_server_costs_one_copy(http_server: FaultServer, tmp_path: Path) -> None:
    data = _data(10)
    url = http_server.add(unique_path("ignore"), data, range_mode="ignore")
    assert parts_manager(tmp_path).cached_path(url).read_bytes() == data
    route = http_server.route(url)
    assert route.gets == 1
    assert route.body_bytes == len(data)


@pytest.mark.parametrize("status", ["400", "501"])
def test_a_server_refusing_ranges_gets_one_plain_request(
    http_server: FaultServer, tmp_path: Path, status: str
) -> None:
    """The default's first request carries a Range; a server that answers it with an
    error (not one that says the object is missing) is asked again without one."""
    data = _data(6)
    url = http_server.add(unique_path("no-ranges"), data, range_mode=status)
    assert parts_manager(tmp_path, connections=None, retries=1).cached_path(url).read_bytes() == data
    assert http_server.route(url).ranges == [TO_THE_END, ""]


def test_object_without_strong_validator_is_one_stream(http_server: FaultServer, tmp_path: Path) -> None:
    data = _data(6)
    url = http_server.add(unique_path("weak"), data, etag='W/"weak"')
    assert parts_manager(tmp_path).cached_path(url).read_bytes() == data
    route = http_server.route(url)
    assert route.max_in_flight == 1  # parts of a version nothing vouches for are never combined
    assert route.if_ranges.count('W/"weak"') == 0


@pytest.mark.parametrize("validator", ["etag", "last_modified", "weak_etag_kept_date"])
def test_swap_mid_fetch_never_publishes_a_mix(
    http_server: FaultServer, tmp_path: Path, validator: str
) -> None:
    """Another version mid-fetch, told by its ETag, by its Last-Modified, or by a weak
    ETag beside a Last-Modified that stayed (a copy that kept the file's mtime: the
    server honours ``If-Range: <date>`` with the new bytes)."""
    old, new = _data(16), _data(16)
    if validator == "etag":
        options: dict[str, Any] = {"etag": '"old"', "then": {"data": new, "etag": '"new"'}}
    elif validator == "weak_etag_kept_date":
        options = {
            "etag": 'W/"old"',
            "last_modified": "Mon, 02 Jan 2023 00:00:00 GMT",
            "then": {"data": new, "etag": 'W/"new"'},
        }
    else:
        options = {
            "etag": None,
            "last_modified": "Mon, 02 Jan 2023 00:00:00 GMT",
            "then": {"data": new, "last_modified": "Tue, 03 Jan 2023 00:00:00 GMT"},
        }
    # The second request (the first part another connection asks for) finds the new
    # version, while the first stream has written old bytes.
    url = http_server.add(unique_path("swap"), old, swap_at_get=2, **SLOW, **options)
    path = parts_manager(tmp_path).cached_path(url)
    assert sha256(path.read_bytes()) == sha256(new)  # the new version, whole; never a mix
    assert stray_files(tmp_path) == []


def test_wrong_sha256_publishes_nothing(http_server: FaultServer, tmp_path: Path) -> None:
    data = _data(6)
    url = http_server.add(unique_path("sha"), data)
    with pytest.raises(ChecksumError):
        parts_manager(tmp_path).cached_path(url, sha256="0" * 64)
    assert stray_files(tmp_path) == []
    assert not [n for n in cache_files(tmp_path) if n.endswith((".parts", ".bin"))]
    assert parts_manager(tmp_path).cached_path(url, sha256=sha256(data)).read_bytes() == data


def _fetch_child(url: str, cache: str) -> None:
    parts_manager(Path(cache)).cached_path(url)


def _record(cache: Path) -> dict[str, Any]:
    """The parallel fetch's record of progress in `cache` ({} if none can be read)."""
    import json

    for name in cache_files(cache):
        if name.endswith(".parts"):
            try:
                return dict(json.loads((cache / name).read_text()))
            except (OSError, ValueError):
                return {}
    return {}


def _done(record: dict[str, Any]) -> set[int]:
    """The complete parts of a record (kept as runs ``[first, last]``)."""
    return {index for first, last in record.get("done", []) for index in range(first, last + 1)}


def _parts_done(cache: Path) -> int:
    return len(_done(_record(cache)))


def _still_to_come(cache: Path, size: int) -> int:
    """Bytes a resume has to fetch by the record: the parts not done, from where each got to."""
    record = _record(cache)
    reached = {int(index): position for index, position in record["reached"].items()}
    return sum(
        min(size, (index + 1) * PART) - reached.get(index, index * PART)
        for index in range(-(-size // PART))
        if index not in _done(record)
    )


def _kill_once_recorded(
    http_server: FaultServer, url: str, cache: Path, parts: int, complete: Optional[int] = None
) -> Any:
    """SIGKILL a child fetching `url` (with 4 connections) once `parts` parts are
    recorded; the route, once the server has stopped sending to the dead child. The
    server holds its answers once `complete` (default `parts`) + 3.5 parts are sent (then
    at least `complete` are complete, as each connection has at most one under way, and
    some part has bytes but is not complete), so a record slowed by a busy disk cannot let
    the fetch end before the kill."""
    route = http_server.route(url)
    route.hold_after = ((complete or parts) + 4) * PART - PART // 2
    assert route.hold_after < len(route.data), "the fetch must be held before its end"
    child = FORK.Process(target=_fetch_child, args=(url, str(cache)))
    child.start()
    try:
        wait_for(lambda: _parts_done(cache) >= parts, what=f"{parts} parts recorded")
        os.kill(child.pid or 0, signal.SIGKILL)
    finally:
        end_child(child)
        route.hold_after = None
        route.released.set()
    wait_for(lambda: route.in_flight == 0, what="the killed child's answers to end")
    return route


def test_kill_half_way_then_resume_fetches_the_other_half(http_server: FaultServer, tmp_path: Path) -> None:
    data = _data(16)
    url = http_server.add(unique_path("kill"), data, **SLOWER)
    route = _kill_once_recorded(http_server, url, tmp_path, 8)
    done = _parts_done(tmp_path)
    assert 8 <= done < 16
    # A fast link, which one stream fills (16 KiB writes would starve on the GIL this
    # process shares with the server: 1 MB/s, which the ramp rightly splits)
    route.body_bytes, route.delay, route.chunk, route.gets = 0, 0.0, 1 << 20, 0
    still_to_come = _still_to_come(tmp_path, len(data))
    assert still_to_come < (16 - done) * PART  # parts under way at the kill kept what was durable
    vouched = _vouched(tmp_path, len(data))
    asked_before = len(route.ranges)
    path = parts_manager(tmp_path).cached_path(url)
    assert path.read_bytes() == data
    # Only what the record did not vouch for is asked for again, each part from where it
    # got to, as one stream per run of missing parts (a link one stream fills). (The
    # server's byte count is not the measure: a stream the fetch stops at its run's end
    # may already have had a 1 MiB write pushed into its socket.)
    asked = [_bounds(header) for header in route.ranges[asked_before:]]
    assert [(first, last) for first, last in asked if _overlaps(first, last, vouched)] == []
    assert route.body_bytes >= still_to_come
    assert route.gets <= 16 - done
    assert stray_files(tmp_path) == []


def _vouched(cache: Path, size: int) -> list[tuple[int, int]]:
    """The byte ranges [start, end) a parallel fetch's record vouches for in `cache`."""
    record = _record(cache)
    spans = [(index * PART, min(size, (index + 1) * PART)) for index in _done(record)]
    return spans + [(int(index) * PART, position) for index, position in record["reached"].items()]


def _bounds(header: str) -> tuple[int, int]:
    """(first, last) of a `bytes=first-last` Range header (last: the end if open)."""
    first, _, last = header[len("bytes=") :].partition("-")
    return int(first), int(last) if last else 1 << 62


def _overlaps(first: int, last: int, spans: list[tuple[int, int]]) -> bool:
    return any(first < end and start <= last for start, end in spans)


def test_progress_is_recorded_every_few_parts_on_a_fast_link(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parts of `EVERY_BYTES` completed since the last record bring the next one forward
    (here every 2 parts, with `EVERY_S` a minute): the publishing fsync has little left
    to write, and a kill loses little. The child inherits the settings (forked)."""
    from framework.download.parallel._followers import ProgressRecorder

    monkeypatch.setattr(ProgressRecorder, "EVERY_S", 60.0)
    monkeypatch.setattr(ProgressRecorder, "EVERY_BYTES", 2 * PART)
    data = _data(16)
    url = http_server.add(unique_path("every"), data, **SLOWER)
    # 5 complete: a record that took 3 parts at once leaves the 4th and 5th to bring the next
    route = _kill_once_recorded(http_server, url, tmp_path, 4, complete=5)  # well under a minute
    assert 4 <= _parts_done(tmp_path) < 16
    route.body_bytes, route.delay, route.chunk = 0, 0.0, 1 << 20  # a fast link: one stream fills it
    still_to_come = _still_to_come(tmp_path, len(data))
    assert parts_manager(tmp_path).cached_path(url).read_bytes() == data
    assert route.body_bytes == still_to_come


def _interrupted_child(url: str, cache: str, results: Any) -> None:
    import threading
    import time

    start = time.monotonic()
    try:
        parts_manager(Path(cache), connections=None).cached_path(url)
        results.put(("finished", 0.0, []))
    except KeyboardInterrupt:
        took = time.monotonic() - start
        helpers = [t.name for t in threading.enumerate() if t.name.startswith("framework-parallel-")]
        results.put(("interrupted", took, helpers))


def test_ctrl_c_with_a_stalled_connection_returns_and_keeps_the_bytes(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """Ctrl-C while the one stream is stuck in a read: the call returns at once (not after
    the read timeout), the hash and record threads are gone, and the bytes that arrived
    are recorded, so the next call asks only for the rest."""
    data = _data(12)
    reached = PART + PART // 2  # part 0 complete, part 1 half-way
    url = http_server.add(unique_path("stall"), data, stall_after=reached, stall_s=30.0)
    results = FORK.Queue()
    child = FORK.Process(target=_interrupted_child, args=(url, str(tmp_path), results))
    child.start()
    try:
        wait_for(lambda: _record(tmp_path).get("reached", {}).get("1", 0) >= reached, what="progress")
        sent = time.monotonic()
        os.kill(child.pid or 0, signal.SIGINT)
        outcome, _took, helpers = results.get(timeout=20)
        returned_after = time.monotonic() - sent
    finally:
        end_child(child)
    assert outcome == "interrupted"
    assert returned_after < 15  # the stalled read would have held it 30 s
    assert not [name for name in helpers if name.endswith(("hash", "record"))]
    route = http_server.route(url)
    route.body_bytes = 0
    assert parts_manager(tmp_path).cached_path(url).read_bytes() == data
    assert route.ranges[-1].startswith(f"bytes={reached}-")  # the rest, in one stream
    assert route.body_bytes == len(data) - reached
    assert stray_files(tmp_path) == []


def _slowly_hashed_child(url: str, cache: str, results: Any, slow_fsync: bool = False) -> None:
    """Fetch 8 parts with the hash done in one pass at the end, slowly (4 s, longer than
    the 2 s this waits for helper threads to end) and only once the record lists every
    part (an fdatasync slowed by a busy disk must not let the hash end first), and report
    how many of its 8 updates the hash had done when a Ctrl-C came back (8: it waited for
    the hash) and the helper threads left after it. With
    `slow_fsync`, the publishing fsync of the partial file takes 30 s (a file
    ``fsyncing`` says it began)."""
    import threading
    import time

    from framework.download.parallel import _followers

    class SlowHash:
        updates = 0

        def __init__(self) -> None:
            self.real = hashlib.sha256()

        def update(self, data: bytes) -> None:
            wait_for(lambda: _parts_done(Path(cache)) == 8, timeout=60, what="every part recorded")
            time.sleep(0.5)
            self.real.update(data)
            SlowHash.updates += 1

        def hexdigest(self) -> str:
            return self.real.hexdigest()

    _followers.HASH_AS_PARTS_COMPLETE = False
    _followers.new_hasher = SlowHash  # type: ignore[assignment]
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if slow_fsync and os.readlink(f"/proc/self/fd/{fd}").endswith(".part"):
            Path(cache, "fsyncing").touch()
            time.sleep(30)
        real_fsync(fd)

    os.fsync = fsync
    try:
        parts_manager(Path(cache)).cached_path(url)
        results.put(("finished", []))
    except KeyboardInterrupt:
        results.put(("returned", SlowHash.updates))
        deadline = time.monotonic() + 2  # a thread that has ended is listed for a moment more
        while True:
            helpers = [t.name for t in threading.enumerate() if t.name.endswith(("-hash", "-record"))]
            if not helpers or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        results.put(("interrupted", helpers))


def test_ctrl_c_during_the_final_hash_then_a_new_version(http_server: FaultServer, tmp_path: Path) -> None:
    """Ctrl-C once every part is in, while the hash runs: no hash or record thread is
    left, and a resume with every part recorded still asks the server which version it
    has, so the object that changed meanwhile comes whole, not the recorded old one."""
    old, new = _data(8), _data(8)
    url = http_server.add(unique_path("hash-then-swap"), old, etag='"v1"', **SLOW)
    results = FORK.Queue()
    child = FORK.Process(target=_slowly_hashed_child, args=(url, str(tmp_path), results))
    child.start()
    try:
        wait_for(lambda: _parts_done(tmp_path) == 8, what="every part recorded")
        os.kill(child.pid or 0, signal.SIGINT)
        assert results.get(timeout=20)[0] == "returned"
        outcome, helpers = results.get(timeout=20)
    finally:
        end_child(child)
    assert outcome == "interrupted"
    assert not [name for name in helpers if name.endswith(("hash", "record"))]  # the hash stopped
    route = http_server.route(url)
    route.data, route.etag, route.delay, route.gets = new, '"v2"', 0.0, 0
    assert sha256(parts_manager(tmp_path).cached_path(url).read_bytes()) == sha256(new)
    assert route.gets >= 2  # asked, found another version, fetched it whole
    assert stray_files(tmp_path) == []


def test_ctrl_c_during_the_publishing_fsync_keeps_the_parts(http_server: FaultServer, tmp_path: Path) -> None:
    """Every part is in and the file is being fsynced, the hash far behind: Ctrl-C comes
    back at once, without waiting for the hash, and leaves the record, so the next call
    fetches nothing again."""
    data = _data(8)
    url = http_server.add(unique_path("fsync-ctrl-c"), data, **SLOW)
    results = FORK.Queue()
    child = FORK.Process(target=_slowly_hashed_child, args=(url, str(tmp_path), results, True))
    child.start()
    try:
        wait_for(lambda: (tmp_path / "fsyncing").exists(), what="the publishing fsync")
        os.kill(child.pid or 0, signal.SIGINT)
        outcome, hashed = results.get(timeout=20)
        assert (outcome, results.get(timeout=20)[0]) == ("returned", "interrupted")
    finally:
        end_child(child)
    assert hashed < 8  # it came back without waiting for the hash (8 updates, 4 s)
    assert _parts_done(tmp_path) == 8
    route = http_server.route(url)
    route.delay, route.body_bytes = 0.0, 0
    (tmp_path / "fsyncing").unlink()
    assert parts_manager(tmp_path).cached_path(url).read_bytes() == data
    assert route.body_bytes <= SLOW["chunk"]  # the last byte, asked with the recorded version
    assert stray_files(tmp_path) == []


def test_a_failing_connection_ends_the_fetch_without_waiting_for_a_stalled_one(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One connection fails (no room) while another is stuck in a read that would last
    longer than the test may run: the call raises while that read is still stuck. (The
    stall is armed by the second request: a lone stream stalled would be waited for.)"""
    from framework.download.parallel import _engine
    from framework.errors import DownloadError

    data = _data(16)
    stall = {"stall_after": PART // 2, "stall_s": 600.0}
    url = http_server.add(unique_path("fail-while-stalled"), data, swap_at_get=2, then=stall, **SLOW)
    route = http_server.route(url)
    real = _engine._pwrite

    def full_past_part_4(fd: int, view: Any, offset: int) -> int:
        if offset >= 4 * PART:
            raise OSError(28, "No space left on device")
        return real(fd, view, offset)

    monkeypatch.setattr(_engine, "_pwrite", full_past_part_4)
    try:
        with pytest.raises(DownloadError, match="no room on the device"):
            parts_manager(tmp_path, timeout=600).cached_path(url)
        assert route.stalling  # it did not wait for the stalled read
    finally:
        route.released.set()


def test_an_object_larger_than_a_file_can_be_is_a_clear_error(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that says its object is 16 TiB, on a filesystem whose files cannot be
    that large (EFBIG when the partial file is sized): an error that says there is no
    room, not that the cache folder is not writable, and nothing left behind."""
    from framework.errors import DownloadError

    data = _data(4)
    url = http_server.add(unique_path("huge"), data, total_delta=(1 << 44) - len(data))
    real = os.ftruncate

    def small_files(fd: int, length: int) -> None:
        if length > 1 << 40:
            raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))
        real(fd, length)

    monkeypatch.setattr(os, "ftruncate", small_files)
    with pytest.raises(DownloadError, match="no room on the device") as info:
        parts_manager(tmp_path).cached_path(url)
    assert "writable" not in str(info.value)
    assert stray_files(tmp_path) == []


def test_an_engine_that_cannot_start_leaves_no_descriptor(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from framework.download.parallel import _followers

    def broken() -> Any:
        raise RuntimeError("no hasher today")

    data = _data(8)
    url = http_server.add(unique_path("no-engine"), data, **SLOW)
    monkeypatch.setattr(_followers, "new_hasher", broken)

    def partial_fds() -> list[str]:
        found = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.startswith(str(tmp_path)) and ".part" in target:
                found.append(target)
        return found

    for _ in range(3):
        with pytest.raises(RuntimeError, match="no hasher today"):
            parts_manager(tmp_path).cached_path(url)
    assert partial_fds() == []
    assert stray_files(tmp_path) == []


def test_a_failed_sync_stops_the_fetch_at_once(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recorder's fdatasync fails (the disk is full): the fetch fails then, with the
    space hint, not after every byte has come."""
    from framework.download.parallel import _followers
    from framework.errors import DownloadError

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_followers, "_datasync", full)
    data = _data(64)  # 16 MiB at 2 MiB/s per connection: seconds
    url = http_server.add(unique_path("sync-fails"), data, **SLOW)
    with pytest.raises(DownloadError, match="no room on the device"):
        parts_manager(tmp_path).cached_path(url)
    assert http_server.route(url).body_bytes < len(data) // 2
    assert stray_files(tmp_path) == []


def test_a_failing_close_of_the_recorders_descriptor_is_an_error_not_a_hang(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading as real_threading
    import types

    from framework.download.parallel import _followers
    from framework.errors import DownloadError

    def close(fd: int) -> None:
        os.close(fd)
        if real_threading.current_thread().name.endswith("-record"):
            raise OSError(5, "Input/output error")  # as NFS reports a write-back error

    fake_os = types.SimpleNamespace(**{n: getattr(os, n) for n in dir(os) if not n.startswith("__")})
    fake_os.close = close
    monkeypatch.setattr(_followers, "os", fake_os)
    data = _data(8)
    url = http_server.add(unique_path("close-fails"), data, **SLOW)
    with pytest.raises(DownloadError, match="Input/output error"):
        parts_manager(tmp_path).cached_path(url)


def test_a_thread_that_cannot_start_means_fewer_connections(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        if (
            thread.name.startswith("framework-parallel-")
            and thread.name[-1].isdigit()
            and thread.name != ("framework-parallel-1")
        ):
            raise RuntimeError("can't start new thread")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    data = _data(8)
    url = http_server.add(unique_path("no-threads"), data, **SLOW)
    assert parts_manager(tmp_path).cached_path(url).read_bytes() == data
    assert http_server.route(url).max_in_flight == 1
    leftover = [
        target
        for fd in os.listdir("/proc/self/fd")
        if (target := os.path.realpath(f"/proc/self/fd/{fd}")).startswith(str(tmp_path))
    ]
    assert leftover == []


def test_ctrl_c_while_starting_connections_leaves_no_thread_waiting(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C between two starts of a ramp step: the connections already started end
    (and the last closes the descriptor)."""
    import threading

    from framework.download.parallel._ramp import Ramp

    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        if thread.name == "framework-parallel-3":
            raise KeyboardInterrupt
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    # One stream would take 2 s, 40 times ALONE_S: the first step opens the cap's 4 at once.
    monkeypatch.setattr(Ramp, "ALONE_S", 0.05)
    data = _data(8)
    url = http_server.add(unique_path("ctrl-c-start"), data, **SLOWER)
    earlier = set(threading.enumerate())  # other tests' threads (one blocked in a read ends late)
    with pytest.raises(KeyboardInterrupt):
        parts_manager(tmp_path).cached_path(url)

    def ours() -> list[str]:
        new = set(threading.enumerate()) - earlier
        return [thread.name for thread in new if thread.name.startswith("framework-parallel")]

    wait_for(lambda: ours() == [], what="the parallel fetch's threads to end")
    leftover = [
        target
        for fd in os.listdir("/proc/self/fd")
        if (target := os.path.realpath(f"/proc/self/fd/{fd}")).startswith(str(tmp_path))
    ]
    assert leftover == []


def test_the_settled_steering_loop_does_not_wake_for_every_write(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from framework.download.parallel import _engine

    counts = {"steer": 0, "write": 0}
    real_steer, real_pwrite = _engine.Engine._steer, _engine._pwrite

    def steer(self: Any, *args: Any) -> bool:
        counts["steer"] += 1
        return bool(real_steer(self, *args))

    def pwrite(fd: int, view: Any, offset: int) -> int:
        counts["write"] += 1
        return real_pwrite(fd, view, offset)

    monkeypatch.setattr(_engine.Engine, "_steer", steer)
    monkeypatch.setattr(_engine, "_pwrite", pwrite)
    monkeypatch.setattr(ReadPace, "MOST", 16 << 10)  # a write per chunk the server sends, steady too
    data = _data(16)
    url = http_server.add(unique_path("steer"), data, **SLOW)
    assert parts_manager(tmp_path).cached_path(url).read_bytes() == data
    assert counts["write"] >= 100, counts  # 16 KiB chunks
    assert counts["steer"] < counts["write"] / 2, counts  # it woke on every write before


def test_once_a_partial_is_adopted_other_dead_writers_partials_go(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """Two processes without a lock fetch the same object and are killed: the next call
    resumes one writer's file and removes the other's, with its record."""
    data = _data(16)
    url = http_server.add(unique_path("two-dead"), data, **SLOWER)
    results = FORK.Queue()
    children = [
        FORK.Process(target=_race_child, args=(url, str(tmp_path), results, "none")) for _ in range(2)
    ]
    for child in children:
        child.start()
    try:
        wait_for(
            lambda: len([n for n in cache_files(tmp_path) if n.endswith(".parts")]) == 2, what="two records"
        )
    finally:
        for child in children:
            os.kill(child.pid or 0, signal.SIGKILL)
            end_child(child)
    assert parts_manager(tmp_path).cached_path(url).read_bytes() == data
    assert stray_files(tmp_path) == []
    assert not [n for n in cache_files(tmp_path) if n.endswith(".parts")]


def test_a_record_of_a_huge_object_stays_small_and_reads_back(tmp_path: Path) -> None:
    """Parts complete lowest first, so the record keeps runs: 1.27 TiB in 8 MiB parts,
    all but ten done, is a few hundred bytes (a list of indices was over 1 MiB and was
    refused on resume)."""
    from framework.download._partial import PartialName
    from framework.download._validators import Validators
    from framework.download.parallel._parts import _load_record, _Plan, _record_path, _save_record

    plan = _Plan(166_400 * (8 << 20), 8 << 20, Validators('"big"', None, None))
    done = set(range(166_390)) | {166_395}
    name = PartialName(tmp_path / "object.bin", "P" + plan.validators.tag)
    name.path.parent.mkdir()
    _save_record(name, plan, done, {166_391: 166_391 * (8 << 20) + 5})
    assert _record_path(name).stat().st_size < 1024
    assert _load_record(_record_path(name)) == (plan, done, {166_391: 166_391 * (8 << 20) + 5})


def _dead_writer(final: str, size: int, done: list[int], reached: dict[int, int], record: bool) -> None:
    """In a child (whose pid is dead afterwards): leave a parallel partial file of `final`,
    with a record of `done` and `reached` parts of PART bytes (or no record)."""
    from framework.download._partial import PartialName
    from framework.download._validators import Validators
    from framework.download.parallel._parts import _Plan, _save_record

    plan = _Plan(size, PART, Validators('"v1"', None, None))
    name = PartialName(Path(final), "P" + plan.validators.tag)
    name.path.parent.mkdir(exist_ok=True)
    with open(name.path, "wb") as out:
        out.truncate(size)
    if record:
        _save_record(name, plan, set(done), reached)


def test_the_orphan_with_the_most_progress_is_adopted_and_the_others_go(tmp_path: Path) -> None:
    from framework.download.parallel._parts import adopt_parts

    final = tmp_path / "object.bin"
    size = 8 * PART
    for done, reached, record in [
        ([0], {}, True),
        ([0, 1, 2, 3, 5, 6, 7], {4: 4 * PART + 10}, True),
        ([], {}, False),  # killed before its first record
        ([0, 1], {}, True),
    ]:
        child = FORK.Process(target=_dead_writer, args=(str(final), size, done, reached, record))
        child.start()
        end_child(child)
    resumed = adopt_parts(final)
    assert resumed is not None
    try:
        assert resumed.done == {0, 1, 2, 3, 5, 6, 7} and resumed.reached == {4: 4 * PART + 10}
        mine = resumed.partial.name.path.name
        left = sorted(n.rsplit("/", 1)[-1] for n in cache_files(tmp_path) if n.endswith((".part", ".parts")))
        assert left == sorted([mine, mine[: -len(".part")] + ".parts"])
    finally:
        resumed.partial.close(False)


@pytest.mark.parametrize(
    "text",
    [
        "[" * 200_000,  # nesting: json raises RecursionError
        '{"size": 1125899906842624, "part_size": 1, "done": [[0, 1125899906842622]], "etag": "\\"v1\\""}',
        '{"size": 1024, "part_size": 256, "done": 7}',
    ],
    ids=["deep", "huge-plan", "done-not-runs"],
)
def test_a_planted_or_broken_record_is_a_miss(tmp_path: Path, text: str) -> None:
    from framework.download.parallel._parts import _load_record

    path = tmp_path / "x.parts"
    path.write_text(text)
    assert _load_record(path) is None


def test_a_reached_entry_that_makes_no_sense_is_dropped_not_the_record(tmp_path: Path) -> None:
    """A part whose reached byte is its end (a record taken as it completed) is fetched
    again whole; the rest of the record still counts."""
    import json

    from framework.download.parallel._parts import _load_record

    path = tmp_path / "x.parts"
    record = {"size": 4 * PART, "part_size": PART, "etag": '"v1"', "last_modified": None, "date": None}
    record |= {"done": [[0, 1]], "reached": {"2": 3 * PART, "3": 3 * PART + 5}}
    path.write_text(json.dumps(record))
    loaded = _load_record(path)
    assert loaded is not None and loaded[1:] == ({0, 1}, {3: 3 * PART + 5})


def test_a_planted_deeply_nested_sidecar_is_a_miss(http_server: FaultServer, tmp_path: Path) -> None:
    from framework.download._cache import Entry

    data = _data(2)
    url = http_server.add(unique_path("sidecar"), data)
    manager = parts_manager(tmp_path)
    assert manager.cached_path(url).read_bytes() == data
    Entry(tmp_path, url).sidecar.write_text("[" * 5000)
    assert manager.cached_path(url).read_bytes() == data  # fetched again, not a RecursionError


def test_a_server_refusing_more_connections_is_served_with_fewer(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """503 beyond two bodies at once: the refused connections hand their part back and
    stop; the fetch completes over the two the server serves."""
    data = _data(16)
    url = http_server.add(unique_path("busy"), data, busy_over=2, **SLOW)
    manager = parts_manager(tmp_path, connections=8, retries=1)
    assert manager.cached_path(url).read_bytes() == data
    route = http_server.route(url)
    assert route.refused >= 1  # the ramp did ask for more than the server serves
    assert route.body_bytes <= len(data) + 4 * SLOW["chunk"]  # about one copy
    assert stray_files(tmp_path) == []


def test_a_one_stream_call_resumes_a_parallel_partial_and_leaves_no_record(
    http_server: FaultServer, tmp_path: Path
) -> None:
    data = _data(16)
    url = http_server.add(unique_path("kill-then-one"), data, **SLOWER)
    route = _kill_once_recorded(http_server, url, tmp_path, 4)
    route.body_bytes, route.delay, route.chunk = 0, 0.0, 1 << 20  # a fast link: one stream fills it
    still_to_come = _still_to_come(tmp_path, len(data))
    assert parts_manager(tmp_path, connections=1).cached_path(url).read_bytes() == data
    assert route.body_bytes == still_to_come < len(data)
    assert stray_files(tmp_path) == []
    assert not [n for n in cache_files(tmp_path) if n.endswith(".parts")]


def test_resume_of_another_version_starts_over(http_server: FaultServer, tmp_path: Path) -> None:
    old, new = _data(8), _data(8)
    url = http_server.add(unique_path("resume-swap"), old, etag='"v1"', **SLOWER)
    route = _kill_once_recorded(http_server, url, tmp_path, 3)
    assert 3 <= _parts_done(tmp_path) < 8  # killed before it was complete
    route.data, route.etag, route.delay = new, '"v2"', 0.0
    assert parts_manager(tmp_path).cached_path(url).read_bytes() == new
    assert stray_files(tmp_path) == []


def _race_child(url: str, cache: str, results: Any, lock: str = "filelock") -> None:
    try:
        path = parts_manager(Path(cache), lock=lock).cached_path(url)
        results.put(hashlib.sha256(path.read_bytes()).hexdigest())
    except BaseException as error:
        results.put(repr(error))


def test_racing_processes_fetch_one_copy(http_server: FaultServer, tmp_path: Path) -> None:
    data = _data(12)
    url = http_server.add(unique_path("race"), data, delay=0.001)
    results = FORK.Queue()
    procs = [FORK.Process(target=_race_child, args=(url, str(tmp_path), results)) for _ in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(40)
    assert [results.get(timeout=5) for _ in procs] == [sha256(data)] * 4
    route = http_server.route(url)
    assert route.ranges.count(TO_THE_END) == 1  # one process fetched; the others waited
    # One copy: the fetcher's first stream, cut where another connection's run begins,
    # wastes only what was in flight (this fast server may be well ahead of a loaded
    # client, so no tighter bound than a second copy holds).
    assert len(data) <= route.body_bytes < 2 * len(data)


def test_racing_processes_without_a_lock_each_publish_whole_bytes(
    http_server: FaultServer, tmp_path: Path
) -> None:
    data = _data(12)
    url = http_server.add(unique_path("race-nolock"), data, delay=0.001)
    results = FORK.Queue()
    procs = [FORK.Process(target=_race_child, args=(url, str(tmp_path), results, "none")) for _ in range(3)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(40)
    assert [results.get(timeout=5) for _ in procs] == [sha256(data)] * 3
    assert stray_files(tmp_path) == []


# --- S3 through moto's server ---------------------------------------------------------


@pytest.fixture
def bucket(s3_env: str) -> str:
    import boto3

    name = f"parallel-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_env).create_bucket(Bucket=name)
    return name


def _slowly(chunks: Any) -> Any:
    """`chunks` at the pace of `SLOW` (moto serves at loopback speed)."""
    import time

    for chunk in chunks:
        for offset in range(0, len(chunk), SLOW["chunk"]):
            time.sleep(SLOW["delay"])
            yield chunk[offset : offset + SLOW["chunk"]]


def _s3_backend(on_open: Any = None) -> Any:
    from framework_plugins.s3 import S3Backend

    class Counting(S3Backend):
        supports_ranges: ClassVar[bool] = True  # its `open` passes `end` on
        ends: list[Optional[int]] = []

        def open(
            self, url: str, offset: int = 0, *, if_range: Optional[str] = None, end: Optional[int] = None
        ) -> Any:
            self.ends.append(end)
            if on_open is not None:
                on_open(len(self.ends))
            stream = super().open(url, offset, if_range=if_range, end=end)
            stream.chunks = _slowly(stream.chunks)
            return stream

    return Counting(retries=2, backoff_factor=0.01)


def test_s3_parts_over_several_connections(bucket: str, s3_env: str, tmp_path: Path) -> None:
    import boto3

    data = _data(6.5)
    boto3.client("s3", endpoint_url=s3_env).put_object(Bucket=bucket, Key="big.bin", Body=data)
    backend = _s3_backend()
    path = parts_manager(tmp_path, backends={"s3": backend}).cached_path(f"s3://{bucket}/big.bin")
    assert path.read_bytes() == data
    assert backend.ends[0] == 1 << 62  # the first request: one stream that may go on to the end
    # then one ranged get per part, for the parts the first stream did not reach
    assert 3 <= len(backend.ends) <= 7 and None not in backend.ends


def test_s3_fast_object_is_one_request(bucket: str, s3_env: str, tmp_path: Path) -> None:
    import boto3
    from framework_plugins.s3 import S3Backend

    data = _data(6.5)
    boto3.client("s3", endpoint_url=s3_env).put_object(Bucket=bucket, Key="fast.bin", Body=data)
    ends: list[Optional[int]] = []

    class Counting(S3Backend):
        supports_ranges: ClassVar[bool] = True  # its `open` passes `end` on

        def open(
            self, url: str, offset: int = 0, *, if_range: Optional[str] = None, end: Optional[int] = None
        ) -> Any:
            ends.append(end)
            return super().open(url, offset, if_range=if_range, end=end)

    manager = parts_manager(tmp_path, connections=16, backends={"s3": Counting()})
    assert manager.cached_path(f"s3://{bucket}/fast.bin").read_bytes() == data
    assert ends == [1 << 62]


def test_s3_swap_mid_fetch_is_refused_by_if_match(bucket: str, s3_env: str, tmp_path: Path) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=s3_env)
    old, new = _data(6), _data(6)
    client.put_object(Bucket=bucket, Key="swap.bin", Body=old)

    def swap(opens: int) -> None:
        if opens == 3:
            client.put_object(Bucket=bucket, Key="swap.bin", Body=new)

    backend = _s3_backend(swap)
    path = parts_manager(tmp_path, connections=2, backends={"s3": backend}).cached_path(
        f"s3://{bucket}/swap.bin"
    )
    assert sha256(path.read_bytes()) == sha256(new)
    assert stray_files(tmp_path) == []


def test_s3_stream_hands_over_bytes_as_they_arrive(bucket: str, s3_env: str) -> None:
    """Through a link that brings 64 KiB every 8 ms, the first chunk is what has arrived,
    not a whole MiB (which took 0.13 s more): the ramp measures the first answer at
    once, and a break keeps what came before it. The bytes are all there, in order."""
    import boto3
    from framework_plugins.s3 import S3Backend

    data = _data(6)
    boto3.client("s3", endpoint_url=s3_env).put_object(Bucket=bucket, Key="paced.bin", Body=data)
    with PacedProxy(int(s3_env.rsplit(":", 1)[1]), chunk=64 * 1024, delay=0.008) as proxy:
        backend = S3Backend(endpoint_url=proxy.url, retries=0)
        # A part's request (a range of the whole object comes with a checksum, checked
        # by botocore's body as it reads 64 KiB at a time: the other way, tested below)
        with backend.open(f"s3://{bucket}/paced.bin", 0, end=len(data) - 1) as stream:
            chunks = list(stream.chunks)
        backend.close()
    assert b"".join(chunks) == data[:-1]
    assert len(chunks[0]) < 1 << 20 and max(map(len, chunks)) <= 1 << 20


def test_s3_stream_cut_short_is_a_network_error(bucket: str, s3_env: str) -> None:
    """Reading what has arrived keeps the length check: a body cut short raises, after
    handing over the bytes that came, and is never taken for the whole object."""
    import boto3
    from framework_plugins.s3 import S3Backend

    from framework.errors import NetworkError

    data = _data(4)
    boto3.client("s3", endpoint_url=s3_env).put_object(Bucket=bucket, Key="cut.bin", Body=data)
    with PacedProxy(int(s3_env.rsplit(":", 1)[1]), chunk=64 * 1024, delay=0.0, cut_after=600_000) as proxy:
        backend = S3Backend(endpoint_url=proxy.url, retries=0)
        got = bytearray()
        with pytest.raises(NetworkError, match="broke off"):
            with backend.open(f"s3://{bucket}/cut.bin", 0, end=len(data) - 1) as stream:
                for chunk in stream.chunks:
                    got += chunk
        backend.close()
    assert 0 < len(got) < len(data) and data.startswith(bytes(got))


@pytest.mark.parametrize("connections", [1, 4])
def test_s3_checksum_of_a_whole_object_is_still_checked(
    bucket: str, s3_env: str, tmp_path: Path, connections: int
) -> None:
    """An answer with the whole object comes with S3's checksum, which botocore's body
    checks as it is read: one stream (no Range; or the first stream of the default, which
    a fast server leaves alone to the end) reads through that body, so a byte flipped on
    the way fails the fetch instead of being published (no sha256 was given to catch
    it), and is not kept to resume after."""
    import boto3
    from framework_plugins.s3 import S3Backend

    data = _data(4)
    boto3.client("s3", endpoint_url=s3_env).put_object(Bucket=bucket, Key="flip.bin", Body=data)
    with PacedProxy(int(s3_env.rsplit(":", 1)[1]), chunk=64 * 1024, delay=0.0, flip_at=500_000) as proxy:
        backend = S3Backend(endpoint_url=proxy.url, retries=1, backoff_factor=0.01)
        manager = parts_manager(tmp_path, connections=connections, backends={"s3": backend})
        with pytest.raises(ChecksumError, match="S3 checksum mismatch"):
            manager.cached_path(f"s3://{bucket}/flip.bin")
        manager.close()
    assert [p for p in tmp_path.rglob("*") if p.is_file() and p.stat().st_size == len(data)] == []


def test_waiters_see_the_parts_arrive(http_server: FaultServer, tmp_path: Path) -> None:
    """The partial file is preallocated sparse: a waiter's view counts bytes written, not
    the file's length (which is the whole object from the start)."""
    from framework.download._cache import Entry
    from framework.download._partial import partial_bytes

    data = _data(16)
    url = http_server.add(unique_path("progress"), data, delay=0.01)
    child = FORK.Process(target=_fetch_child, args=(url, str(tmp_path)))
    child.start()
    final = Entry(tmp_path, url).final
    seen: list[int] = []
    try:
        wait_for(lambda: seen.append(partial_bytes(final)) or 0 < seen[-1], what="bytes of the holder")
        wait_for(lambda: final.exists(), what="the published file")
    finally:
        child.join(20)
    assert 0 < seen[-1] < len(data)


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
    name.path.parent.mkdir(exist_ok=True)
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


def _parallel(cache: Path, backend: HttpBackend) -> DownloadManager:
    return parts_manager(cache, backends={"http": backend})


from tests.support.download import Lying, NoIfRange  # noqa: E402

# -- _engine._check: tag -----------------------------------------------------------------


def test_parts_of_another_version_are_refused_without_if_range(
    http_server: FaultServer, tmp_path: Path
) -> None:
    old, new = os.urandom(PART * 16), os.urandom(PART * 16)
    url = http_server.add(
        unique_path("swap-noifr"),
        old,
        swap_at_get=2,
        etag='"old"',
        then={"data": new, "etag": '"new"'},
        **SLOW,
    )
    path = _parallel(tmp_path, NoIfRange(backoff_factor=0.01)).cached_path(url)
    assert sha256(path.read_bytes()) == sha256(new)


# -- _engine._check: size ----------------------------------------------------------------


def test_parts_with_another_total_size_are_refused(http_server: FaultServer, tmp_path: Path) -> None:
    old, new = os.urandom(PART * 16), os.urandom(PART * 20)  # same ETag (a server bug), another length
    url = http_server.add(
        unique_path("swap-size"), old, swap_at_get=2, etag='"same"', then={"data": new}, **SLOW
    )
    path = _parallel(tmp_path, HttpBackend(backoff_factor=0.01)).cached_path(url)
    assert sha256(path.read_bytes()) == sha256(new)


# -- _engine._check: start, encoding -----------------------------------------------------


@pytest.mark.parametrize("how", ["start", "encoding"])
def test_parts_from_the_wrong_byte_or_encoded_are_refused(
    http_server: FaultServer, tmp_path: Path, how: str
) -> None:
    data = os.urandom(PART * 16)
    url = http_server.add(unique_path("lie-" + how), data, etag='"v"', **SLOW)
    path = _parallel(tmp_path, Lying(how)).cached_path(url)
    assert path.read_bytes() == data


# -- S3: a part is asked for with IfMatch ------------------------------------------------


def test_s3_part_of_another_version_is_refused_with_412(s3_env: str) -> None:
    import boto3
    from framework_plugins.s3 import S3Backend

    bucket = f"b-{uuid.uuid4().hex[:8]}"
    client = boto3.client("s3", endpoint_url=s3_env)
    client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key="k", Body=os.urandom(1000))
    backend = S3Backend()
    with pytest.raises(HTTPStatusError) as caught:
        backend.open(f"s3://{bucket}/k", 10, if_range='"not-this-version"', end=20)
    assert caught.value.status == 412
    backend.close()
