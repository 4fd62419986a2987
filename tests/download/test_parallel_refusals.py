"""How a parallel fetch meets a server that refuses connections (429, 503, Retry-After):
each test is a promise of docs/concepts/download.md, checked at the fault server on
127.0.0.1 and counted (connections, requests, bytes), never timed."""

from __future__ import annotations

import _thread
import hashlib
import os
import threading
from pathlib import Path
from typing import Any, Optional

import pytest

from framework.errors import HTTPStatusError
from tests.support.download import (
    PART,
    SLOW,
    FaultServer,
    cache_files,
    parts_manager,
    refusal_before_the_second_start,
    unique_path,
    wait_for,
)

pytestmark = pytest.mark.timeout(30)


class _Every(list):  # type: ignore[type-arg]
    """`Route.fail_statuses` that never runs out: GET number n (counted from the first
    GET the route sees) is refused with `status` when `refuse(n)`, else served."""

    def __init__(self, refuse: Any, status: int = 503) -> None:
        super().__init__([status])
        self.refuse, self.status, self.gets = refuse, status, 0

    def pop(self, index: Any = -1) -> Optional[int]:  # type: ignore[override]
        self.gets += 1
        return self.status if self.refuse(self.gets) else None


def _instrument(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, bool, bool]]:
    """Log (event, live connections, ramp paused, ramp settled) at each connection
    started and each refusal, in order."""
    from framework.download.parallel import _engine

    log: list[tuple[str, int, bool, bool]] = []
    start, refused = _engine.Engine._start, _engine.Engine._refused

    def started(engine: Any, first: Any) -> Any:
        worker = start(engine, first)
        with engine.lock:
            log.append(("start", engine.live, engine.ramp.paused, engine.ramp.settled))
        return worker

    def refusal(engine: Any, connection: Any, error: Any) -> None:
        with engine.lock:
            log.append(("refused", engine.live, engine.ramp.paused, engine.ramp.settled))
        refused(engine, connection, error)

    monkeypatch.setattr(_engine.Engine, "_start", started)
    monkeypatch.setattr(_engine.Engine, "_refused", refusal)
    return log


def _parallel_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("framework-parallel")]


def test_ctrl_c_while_a_refused_connection_waits_keeps_the_partial_and_leaves_no_thread(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "Ctrl-C returns within a second ... the progress is recorded and the partial file
    kept": a Ctrl-C that comes while a refused connection waits out `Retry-After: 3600`
    (60 s at most) wakes it, no worker thread is left, the record stays, and the next
    call asks only for what is missing: each byte comes once over the two calls."""
    from framework.download.parallel import _engine

    waited = _engine._rest
    rests: list[float] = []

    def rest(lock: threading.Condition, over: Any, seconds: float) -> None:
        rests.append(seconds)
        if len(rests) == 1:
            _thread.interrupt_main()  # Ctrl-C, as the connection begins its wait
        waited(lock, over, seconds)

    monkeypatch.setattr(_engine, "_rest", rest)
    data = os.urandom(32 * PART)
    url = http_server.add(unique_path("ctrl-c-refused"), data, retry_after="3600", **SLOW)
    route = http_server.route(url)
    route.fail_statuses = _Every(lambda n: n == 2)  # the second connection's first request
    with pytest.raises(KeyboardInterrupt):
        parts_manager(tmp_path, connections=4).cached_path(url)
    for thread in _parallel_threads():
        thread.join(5)
    assert _parallel_threads() == []
    assert rests and rests[0] == 60.0  # Retry-After: 3600 honoured up to the stated cap
    assert [name for name in cache_files(tmp_path) if name.endswith(".parts")]
    before = route.body_bytes
    assert before < len(data)
    monkeypatch.setattr(_engine, "_rest", waited)
    path = parts_manager(tmp_path, connections=4).cached_path(url)
    assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(data).digest()
    # what the first call wrote is kept (a part cut mid-flight is resumed at its byte)
    # (what was in flight as the call stopped counts at the server: a part at most)
    assert route.body_bytes - before <= len(data) - before + PART
    assert route.full_gets == 1


def test_every_new_connection_refused_at_once_still_gives_each_byte_once(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """Every connection the first step opens is refused at once (503, Retry-After: 0),
    then the server serves them: the refused runs are handed back, each part is
    written once (one copy of traffic) and the object is whole."""
    data = os.urandom(32 * PART)
    url = http_server.add(unique_path("all-refused"), data, retry_after="0", **SLOW)
    route = http_server.route(url)
    route.fail_statuses = _Every(lambda n: 2 <= n <= 4)
    path = parts_manager(tmp_path, connections=4).cached_path(url)
    assert path.read_bytes() == data
    assert route.body_bytes <= len(data) + PART  # a stream cut at its run's end: a part at most
    assert route.full_gets == 1


def test_a_server_refusing_every_part_request_is_asked_a_bounded_number_of_times(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """ "After `retries` refusals in a row a connection stops ...; the last one left
    raises the refusal": a server that refuses every request after the first (503, no
    Retry-After) is asked at most `retries` times per connection, the refusal is
    raised, and the partial file and its record are kept (a 5xx that outlasted the
    retries): the next call, once the server serves, fetches only the rest."""
    data = os.urandom(32 * PART)
    # the first stream breaks after 8 parts: it must ask again too
    url = http_server.add(unique_path("refuses-all"), data, drop_after=8 * PART, drops=1, **SLOW)
    route = http_server.route(url)
    route.fail_statuses = _Every(lambda n: n >= 2)
    with pytest.raises(HTTPStatusError) as caught:
        parts_manager(tmp_path, connections=4, retries=3).cached_path(url)
    assert caught.value.status == 503
    assert route.refused == 0 and 1 <= route.gets - 1 <= 4 * 3
    assert [name for name in cache_files(tmp_path) if name.endswith(".parts")]
    before = route.body_bytes
    route.fail_statuses = []
    path = parts_manager(tmp_path, connections=4).cached_path(url)
    assert path.read_bytes() == data
    assert route.body_bytes - before <= len(data) - before + PART


def test_a_refusal_of_the_first_request_is_waited_and_the_fetch_goes_parallel(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """A 503 (Retry-After: 0) to the very first request is an outage the retries wait
    out; the ranged request is asked again and the plan made from it: more than one
    connection, one copy of traffic."""
    data = os.urandom(32 * PART)
    url = http_server.add(unique_path("first-refused"), data, retry_after="0", fail_statuses=[503], **SLOW)
    route = http_server.route(url)
    assert parts_manager(tmp_path, connections=4).cached_path(url).read_bytes() == data
    assert route.ranges[:2] == ["bytes=0-" + route.ranges[0].split("-", 1)[1]] * 2
    assert route.max_in_flight >= 2
    assert route.body_bytes <= len(data) + PART  # a stream cut at its run's end: a part at most


def test_a_failure_while_a_refused_connection_waits_wakes_it(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """A connection refused with `Retry-After: 3600` (60 s at most) waits holding no
    part; another connection then finds the object changed (the fetch starts over from
    byte 0 in one stream): the waiting one leaves at once, no thread is left behind, and
    the new version is what is published."""
    data, new = os.urandom(16 * PART), os.urandom(16 * PART)
    url = http_server.add(unique_path("changed-while-refused"), data, retry_after="3600", **SLOW)
    route = http_server.route(url)
    route.fail_statuses = _Every(lambda n: n == 2)
    route.swap_at_get = 4
    route.then = {"data": new, "etag": '"' + hashlib.sha256(new).hexdigest()[:16] + '"'}
    assert parts_manager(tmp_path, connections=4).cached_path(url).read_bytes() == new
    for thread in _parallel_threads():
        thread.join(5)
    assert _parallel_threads() == []


def test_a_refusal_does_not_cost_the_server_a_new_connection(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """ "Connections are pooled per host by each backend": a server that serves two
    bodies at once and refuses more (503) is refused-at by up to eight connections;
    each refusal is a short answer with a Content-Length, so the connection can be
    asked again. The TCP connections the server accepts stay near the eight threads',
    not one more per refusal (measured: 46 TCP connections for 43 refusals)."""
    data = os.urandom(32 * PART)
    opened = http_server.connections
    url = http_server.add(unique_path("capped-tcp"), data, busy_over=2, chunk=64 * 1024, delay=0.008)
    assert parts_manager(tmp_path, connections=8).cached_path(url).read_bytes() == data
    route = http_server.route(url)
    assert route.refused >= 8  # the cap was met, often
    assert http_server.connections - opened <= 8 + 4, (http_server.connections - opened, route.refused)


def test_a_chosen_count_keeps_its_connections_when_one_gives_up_while_they_open(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "A chosen count keeps its connections (those opened as another was refused go
    on)" and opens N "fewer only if the server refuses them". With `retries=1` one
    refusal (503) stops the first new connection of `connections=8`, before the other
    six are started: the server refused one connection, so seven should fetch; the
    fetch keeps to the one that ran at that moment instead."""
    monkeypatch.delenv("FRAMEWORK_CONNECTIONS", raising=False)
    refused = refusal_before_the_second_start(monkeypatch)
    data = os.urandom(16 * PART)
    url = http_server.add(unique_path("gives-up-while-opening"), data, retry_after="0", **SLOW)
    route = http_server.route(url)
    route.fail_statuses = _Every(lambda n: n == 2)
    assert parts_manager(tmp_path, connections=8, retries=1).cached_path(url).read_bytes() == data
    assert refused.is_set()
    assert route.max_in_flight >= 7, route.max_in_flight


def test_refusals_alternating_with_answers_grow_the_ramp_once_then_keep_the_count(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "No connection is added while the server refuses ... refused again after that,
    it keeps the count for good": a server that refuses every other request (503,
    Retry-After: 0). No start raises the count past the connections live at the first
    refusal while the ramp is paused, nor past those live at the first refusal after
    it was served; the object comes whole, once."""
    monkeypatch.delenv("FRAMEWORK_CONNECTIONS", raising=False)
    log = _instrument(monkeypatch)
    data = os.urandom(64 * PART)
    url = http_server.add(unique_path("alternating"), data, retry_after="0", **SLOW)
    route = http_server.route(url)
    route.fail_statuses = _Every(lambda n: n > 1 and n % 2 == 0)
    assert parts_manager(tmp_path, connections=None).cached_path(url).read_bytes() == data
    assert route.body_bytes <= len(data) + PART
    refusals = [at for at, event in enumerate(log) if event[0] == "refused"]
    assert refusals
    first = refusals[0]
    for event, live, paused, _ in log[first:]:
        if event == "start" and paused:
            assert live <= log[first][1]
    kept = [at for at in refusals if log[at][3]]  # refusals once the count was kept
    for at in kept[:1]:
        assert all(live <= log[at][1] for event, live, _, _ in log[at:] if event == "start")


def _one_refusal_while_opening(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, connections: Optional[int]
) -> int:
    """Fetch 32 parts at a paced server that refuses one request once (503, Retry-After:
    0): the first new connection's, before the others of its step are started. The
    most bodies in flight at once."""
    monkeypatch.delenv("FRAMEWORK_CONNECTIONS", raising=False)
    refused = refusal_before_the_second_start(monkeypatch)
    data = os.urandom(32 * PART)
    url = http_server.add(
        unique_path("blip"), data, swap_at_get=2, then={"fail_statuses": [503]}, retry_after="0", **SLOW
    )
    assert parts_manager(tmp_path, connections=connections).cached_path(url).read_bytes() == data
    route = http_server.route(url)
    assert refused.is_set() and route.gets == 32 + 1  # every part once, and the one refusal
    return route.max_in_flight


def test_a_chosen_count_is_kept_after_one_refusal_while_it_opens(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """connections=8: "opens N connections ... and keeps them (fewer only if the server
    refuses them)". One request is refused once while the eight are being opened, and
    nothing after: the count stays eight, not the few that were open at that moment
    (the ones started after it were never refused)."""
    assert _one_refusal_while_opening(http_server, tmp_path, monkeypatch, 8) >= 8


def test_the_ramp_keeps_a_step_after_one_refusal_while_it_opens(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default ramp: "No connection is added while the server refuses". A step of
    the ramp (16 for this paced object) opening as one request is refused once, and
    nothing after: once the refused connection is answered the ramp grows again, not
    kept to the two that ran at the refusal."""
    assert _one_refusal_while_opening(http_server, tmp_path, monkeypatch, None) >= 8


def test_a_lone_stream_that_paused_is_probed_again_at_its_rate_after_the_pause(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/concepts/download.md, "A chosen count": N connections open "as soon as the
    first stream shows it would take more than half a second alone"; a stream left
    alone that still runs half a second later "is measured again". A fast link (the
    probe leaves the stream alone) pauses once, from the verdict until it is ALONE_S old
    (the server holds its next chunk, then sends on at its pace): the stream still runs
    then and is measured again. Measured over its writes after the pause, the rest takes
    a few milliseconds alone: the fetch stays one request (as it did before the re-probe)."""
    from framework.download.parallel._ramp import Ramp

    monkeypatch.delenv("FRAMEWORK_CONNECTIONS", raising=False)
    data = os.urandom(32 * PART)  # 8 MiB, at most about 100 MB/s: well under ALONE_S alone
    url = http_server.add(unique_path("paused-lone"), data, chunk=64 * 1024, delay=0.0005)
    route = http_server.route(url)
    verdicts: list[float] = []  # when the probe left the stream alone
    rates: list[float] = []  # what each probe measured the lone stream at (bytes/s)
    real_update = Ramp.update

    def update(ramp: Ramp, now: float, *args: Any, **kwargs: Any) -> int:
        was_settled = ramp.settled
        wanted = real_update(ramp, now, *args, **kwargs)
        if not verdicts and not was_settled and ramp.settled and ramp.target == 1:
            verdicts.append(now)
            route.hold_after = route.body_bytes  # the server pauses from here ...
        if ramp.alone_rate and (not rates or rates[-1] != ramp.alone_rate):
            rates.append(ramp.alone_rate)
        if verdicts and now >= verdicts[0] + Ramp.ALONE_S:
            route.released.set()  # ... until the verdict is ALONE_S old (the recheck)
        return wanted

    monkeypatch.setattr(Ramp, "update", update)
    path = parts_manager(tmp_path, connections=4).cached_path(url)
    assert path.read_bytes() == data
    assert verdicts, "the first probe did not leave the stream alone"
    assert route.gets == 1, f"{route.gets} requests for a rest one stream brings at once (rates {rates})"


class _RefuseThenBreak(list):  # type: ignore[type-arg]
    """`Route.fail_statuses` that, for each range start after the first GET, refuses the
    odd requests (503) and lets the even ones through (which the route then breaks off
    before a byte of body): a server that never serves a byte past the first answer."""

    def __init__(self, route: Any) -> None:
        super().__init__([503])
        self.route, self.seen, self.gets = route, {}, 0

    def pop(self, index: Any = -1) -> Any:  # type: ignore[override]
        self.gets += 1
        if self.gets == 1:
            return None  # the first answer: served
        start = self.route.ranges[-1]  # this GET's Range (appended under the same lock)
        start = start.split("=", 1)[1].split("-", 1)[0] if start else "0"
        self.seen[start] = self.seen.get(start, 0) + 1
        return 503 if self.seen[start] % 2 else None


@pytest.mark.slow
def test_a_server_that_alternates_refusals_and_empty_breaks_is_asked_a_bounded_number_of_times(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/concepts/download.md: "A part that breaks off is resumed at the byte it
    reached, up to `retries` times"; "After `retries` refusals in a row a connection
    stops ...; the last one left raises". Past the first answer (broken off after 8
    parts) the server serves no byte: each request for a range is refused, then
    answered and broken off before its body, in turn. With retries=3 and 4 connections
    the fetch must give up: counted, the GETs before it does (800 is beyond any bound
    the docs allow: 32 parts x 4 connections x (3 refusals + 3 breaks) is 768)."""
    monkeypatch.delenv("FRAMEWORK_CONNECTIONS", raising=False)
    data = os.urandom(32 * PART)
    url = http_server.add(
        unique_path("refuse-then-break"),
        data,
        swap_at_get=2,
        then={"drop_after": 0, "drops": 10**9, "drop_kind": "short"},
        chunk=16 * 1024,
        delay=0.008,
    )
    route = http_server.route(url)
    route.fail_statuses = _RefuseThenBreak(route)
    outcome: list[BaseException] = []

    def fetch() -> None:
        try:
            parts_manager(tmp_path, connections=4, retries=3).cached_path(url)
        except BaseException as error:  # the refusal or the break, raised: bounded
            outcome.append(error)

    thread = threading.Thread(target=fetch, daemon=True)
    thread.start()
    try:
        wait_for(lambda: route.gets > 800 or not thread.is_alive(), timeout=40, what="800 GETs or the end")
        asked = route.gets
    finally:
        route.status = 404  # ends a fetch still asking (a 404 is raised at once)
        route.fail_statuses = []
        thread.join(20)
    assert not thread.is_alive()
    assert asked <= 800, f"still asking after {asked} GETs for parts no request ever got a byte of"
