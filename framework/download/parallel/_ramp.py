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

    **The steps.** The first step opens as many connections as would each still have
    `ALONE_S` of work at the probe's rate, then the count doubles, up to the cap. Each
    step's rate is measured over `WINDOW_S` once its new connections have their first
    bytes; a step that did not pay (less than `GAIN` more, or half the gain the added
    connections could bring if that is less) is undone: the extra connections finish
    the run they hold, then stop, and the count stays where it was and `SPARE` more (a
    quarter: a request asks for at least 4 times what comes while it waits for its
    answer, so each connection waits up to a fifth of its time, and the count that just
    fills the link leaves it short while some wait: on S3 through moto, a fetch whose
    first step of 10 was undone from 16 took 1.18-1.20 s against 1.11 s for one that
    kept 16).
    """

    PROBE_S: Final = 0.02
    PROBE_MIN_S: Final = 0.005
    BURST_S: Final = 0.001
    BURST_BYTES: Final = 64 << 10
    CLEARLY_SLOW: Final = 8
    ALONE_S: Final = 0.5
    WINDOW_S: Final = 0.05
    GAIN: Final = 1.25
    SPARE: Final = 0.25

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.target = 1
        self.settled = cap == 1
        self._before = 1  # the count before the step being measured
        self._rate = 0.0  # the rate measured before that step (bytes/s)
        self._since: Optional[tuple[float, int]] = None  # when and at which byte count this measurement began
        self._moved = False  # the probe's beginning moved past the rest of the first packet
        self._last_at = 0.0  # the last write this measurement saw
        self._gap = 0.0  # the longest time between two writes it saw
        self._now = 0.0  # when `update` was last called

    @property
    def poll_s(self) -> float:
        """How soon the steering loop asks again: soon while the probe measures (its end
        is near, and each of its milliseconds costs the link), less often while a step
        is measured, rarely once settled."""
        if self.settled:
            return 0.1
        probing = self.target == 1 and self._since is not None and self._now - self._since[0] < self.PROBE_S
        return 0.001 if probing else 0.005  # a stream stalled past the probe is not polled so

    def refused(self, live: int) -> None:
        """The server refused a connection: keep to the `live` ones that it serves."""
        self.target, self.settled = max(1, live), True

    def update(self, now: float, at: float, received: int, remaining: int, ready: bool) -> int:
        """The count wanted `now`. `received`: bytes so far, the last of them written at
        `at` (rates are measured between writes: a backend that hands over 1 MiB chunks
        is not idle between them); `remaining`: bytes still to come; `ready`: every
        running connection has had its first byte."""
        self._now = now
        if self.settled or not ready:
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
            if alone_s < self.ALONE_S:
                self.settled = True
                return self.target
            wanted = math.ceil(alone_s / self.ALONE_S)
        else:
            added = self.target / self._before - 1
            if rate < self._rate * min(self.GAIN, 1 + added / 2):  # the last step did not pay: undo it
                spared = self._before + int(self._before * self.SPARE)
                self.target, self.settled = min(self.target, spared), True
                return self.target
            wanted = 2 * self.target
        if self.target >= self.cap:
            self.settled = True
            return self.target
        self._before, self._rate, self._since = self.target, rate, None
        self.target = min(self.cap, max(2, wanted))
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
            return elapsed_s >= self.WINDOW_S
        if elapsed_s >= self.PROBE_S and span_s >= self.PROBE_S / 2:
            return True
        steady = self._gap <= span_s * 2 / 3  # two writes at least, neither gap most of the span
        return span_s >= self.PROBE_MIN_S and steady and alone_s >= self.CLEARLY_SLOW * self.ALONE_S
