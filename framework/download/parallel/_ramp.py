"""How many connections fetch one object: the adaptive ramp of a parallel fetch."""

from __future__ import annotations

import math
from typing import Final, Optional

__all__ = ["Ramp"]


class Ramp:
    """How many connections fetch an object: grow while throughput grows, up to the cap.

    **The probe.** One stream first, its rate measured from its first chunk (the bytes
    that came with the answer took no time to come: counted, they would inflate it; a
    second write of at most `BURST_BYTES` within `BURST_S` of the first is the rest of
    that packet, and the probe begins after it). A stream that would bring the rest in
    under `ALONE_S` stays alone: one stream fills that link, and more would only compete
    for the CPU. The probe lasts `PROBE_S`, and its writes must span half of it (a rate
    taken from a few bytes before a stall says little). A stream clearly too slow to stay
    alone (it would take `CLEARLY_SLOW` times `ALONE_S` or more) is known sooner, once
    its writes span `PROBE_MIN_S` and came steadily (no gap between two of them longer
    than two thirds of that span): while the probe lasts, a link of 8 streams carries
    one, so each 5 ms of it costs about 4 ms of the fetch. A steady trickle is what a
    slow link looks like; a fast stream whose reader or server lost the CPU for a few
    milliseconds shows one long gap instead, and is measured for all of `PROBE_S`.

    **A fixed count.** With `fixed` (the user chose the count), a stream that is not to
    stay alone is joined by all of the cap at once: the steps below are skipped. A
    stream it left alone is probed again (from its next write) if it is still running
    `ALONE_S` later, when the probe said it would be done: a probe taken while the reader lost the CPU reads
    what the socket buffered meanwhile as one fast burst, and one wrong verdict must not
    override the count the user chose for the whole object. (The adaptive ramp keeps its
    verdict: a fetch slowed by a busy CPU gains nothing from more connections.)

    **The steps.** The first step opens as many connections as would each still have
    `ALONE_S` of work at the probe's rate, then the count doubles, up to the cap (the
    cap at once where it is less than `GAIN` times the count: a step that small could
    not show as a gain). Each
    step's rate is measured once its new connections have their first bytes, over
    `WINDOW_S` or `WAITS_PER_WINDOW` request waits (the median time a request waited for
    its answer), whichever is longer: a window shorter than a request's wait measures
    which connections happened to be waiting, not the link. A step that did not pay
    (less than `GAIN` more, or half the gain the added connections could bring if that
    is less) in one window is measured over a second one and judged by the better of
    the two (one window slowed by a busy CPU undoes nothing); if neither paid, it is
    undone: the extra connections finish the run they hold, then stop, and the count
    stays where it was and `SPARE` more (a quarter: each connection spends part of its
    time waiting for answers, more in the last, smaller requests, so the count that
    just fills the link leaves it short while some wait: on S3 through moto, a fetch
    whose first step of 10 was undone from 16 took 1.18-1.20 s against 1.11 s for one
    that kept 16).

    **A refusal.** A server that refuses a connection (429, 503) while the ramp grows
    stops it where it is: the count keeps to the connections running then and none is
    added while any refused one waits to ask again (`refused`). Once every refused
    connection has been answered (`served`: a moment's overload, not a cap), the step
    that count makes is measured as any step is, and the ramp goes on from there. Refused
    again after that, or by a connection that gives up, the count is kept for good
    (`keep_to`): a server that caps its connections is not asked for more each time it
    serves the ones it allows.
    """

    PROBE_S: Final = 0.02
    PROBE_MIN_S: Final = 0.005
    BURST_S: Final = 0.001
    BURST_BYTES: Final = 64 << 10
    CLEARLY_SLOW: Final = 8
    ALONE_S: Final = 0.5
    WINDOW_S: Final = 0.05
    WAITS_PER_WINDOW: Final = 4
    GAIN: Final = 1.25
    SPARE: Final = 0.25

    def __init__(self, cap: int, *, fixed: bool = False) -> None:
        self.cap = cap
        self.fixed = fixed
        self.target = 1
        self.settled = cap == 1
        self._before = 1  # the count before the step being measured
        self._rate = 0.0  # the rate measured before that step (bytes/s)
        self._since: Optional[tuple[float, int]] = None  # when and at which byte count this measurement began
        self._moved = False  # the probe's beginning moved past the rest of the first packet
        self._last_at = 0.0  # the last write this measurement saw
        self._gap = 0.0  # the longest time between two writes it saw
        self._now = 0.0  # when `update` was last called
        self._doubted: Optional[float] = None  # the rate of a first window in which the step did not pay
        self._window_s = self.WINDOW_S  # how long a step is measured
        self.alone_rate = 0.0  # what the probe measured one stream at (bytes/s; 0 before)
        self.paused = False  # a refused connection waits to ask again: nothing is added
        self._served_after_refusal = False  # the ramp went on once after a refusal
        self._recheck_at: Optional[float] = None  # when a stream left alone is probed again
        self._fresh_after = 0.0  # a measurement begins at a write after this (a re-probe's start)

    @property
    def measuring(self) -> bool:
        """Whether writes may still be timed: the count is not settled, is paused, or a
        lone stream is to be probed again."""
        return not self.settled or self.paused or self._recheck_at is not None

    @property
    def poll_s(self) -> float:
        """How soon the steering loop asks again: soon while the probe measures (its end
        is near, and each of its milliseconds costs the link), less often while a step
        is measured, rarely once settled."""
        if self.settled or self.paused:
            return 0.1
        probing = self.target == 1 and self._since is not None and self._now - self._since[0] < self.PROBE_S
        return 0.001 if probing else 0.005  # a stream stalled past the probe is not polled so

    def refused(self, live: int) -> None:
        """The server refused a connection while `live` ran: keep to those and add none
        until `served`; for good if it had already served after a refusal."""
        self.target, self._recheck_at = max(1, min(live, self.target)), None
        if self._served_after_refusal:
            self.settled = True
        self.paused = not self.settled

    def served(self) -> None:
        """Every refused connection has been answered since: measure the count they
        make, as a step, and go on from there."""
        if self.paused:
            self.paused, self._served_after_refusal = False, True
            self._since, self._doubted = None, None

    def keep_to(self, live: int) -> None:
        """A connection stopped for good (refused too often, or no thread for it): keep
        to the `live` others."""
        self.target, self.settled, self.paused = max(1, min(live, self.target)), True, False
        self._recheck_at = None

    def update(
        self, now: float, at: float, received: int, remaining: int, ready: bool, wait_s: float = 0.0
    ) -> int:
        """The count wanted `now`. `received`: bytes so far, the last of them written at
        `at` (rates are measured between writes: a backend that hands over 1 MiB chunks
        is not idle between them); `remaining`: bytes still to come; `ready`: every
        running connection has had its first byte; `wait_s`: the median time a request
        waited for its answer so far (0 before one did)."""
        self._now = now
        if self._recheck_at is not None and now >= self._recheck_at and remaining > 0:
            self.settled, self._since, self._recheck_at = False, None, None  # left alone wrongly
            self._fresh_after = now  # not from a write before: a pause would read as the rate
        if self.settled or self.paused or not ready:
            return self.target
        self._window_s = max(self.WINDOW_S, self.WAITS_PER_WINDOW * wait_s)
        if self._since is None and at < self._fresh_after:
            return self.target
        if self._since is None or self._rest_of_the_first_packet(at, received):
            self._begin(at, received)
            return self.target
        began, before = self._since
        if at <= began:
            return self.target
        if at > self._last_at:
            self._gap, self._last_at = max(self._gap, at - self._last_at), at
        rate = (received - before) / (at - began)
        alone_s = remaining / rate if rate > 0 else 0.0
        if not self._measured(now - began, at - began, alone_s):
            return self.target
        if self.target == 1:
            self.alone_rate = rate
            if alone_s < self.ALONE_S:
                self.settled = True
                self._recheck_at = now + self.ALONE_S if self.fixed else None
                return self.target
            wanted = self.cap if self.fixed else math.ceil(alone_s / self.ALONE_S)
        else:
            wanted = self._after_step(rate)
            if wanted <= self.target:
                return self.target
        if self.target >= self.cap:
            self.settled = True
            return self.target
        self._before, self._rate, self._since, self._doubted = self.target, rate, None, None
        self.target = min(self.cap, max(2, wanted))
        if self.cap < self.target * self.GAIN:  # what is left to add could not show as a gain
            self.target = self.cap
        self.settled = self.fixed
        return self.target

    def _after_step(self, rate: float) -> int:
        """The count wanted once a step's window measured `rate`: twice as many if the
        step paid; the same while a second window is measured; fewer if neither did."""
        added = self.target / self._before - 1
        rate = max(rate, self._doubted or 0.0)
        if rate >= self._rate * min(self.GAIN, 1 + added / 2):
            return 2 * self.target
        if self._doubted is None:  # one window proves little: measure another
            self._doubted, self._since = rate, None
            return self.target
        spared = self._before + int(self._before * self.SPARE)  # neither paid: undo the step
        self.target, self.settled = min(self.target, spared), True
        return self.target

    def _begin(self, at: float, received: int) -> None:
        """A measurement begins at the write at `at`."""
        self._moved = self._since is not None
        self._since, self._last_at, self._gap = (at, received), at, 0.0

    def _rest_of_the_first_packet(self, at: float, received: int) -> bool:
        """Whether the probe's first write was followed by the rest of its packet (once)."""
        assert self._since is not None
        began, before = self._since
        return (
            self.target == 1
            and not self._moved
            and began < at < began + self.BURST_S
            and received - before <= self.BURST_BYTES
        )

    def _measured(self, elapsed_s: float, span_s: float, alone_s: float) -> bool:
        """Whether this measurement is over, `elapsed_s` into it, its writes spanning `span_s`."""
        if self.target > 1:
            return elapsed_s >= self._window_s
        if elapsed_s >= self.PROBE_S and span_s >= self.PROBE_S / 2:
            return True
        steady = self._gap <= span_s * 2 / 3  # two writes at least, neither gap most of the span
        return span_s >= self.PROBE_MIN_S and steady and alone_s >= self.CLEARLY_SLOW * self.ALONE_S
