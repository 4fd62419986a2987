"""How many connections fetch one object: the adaptive ramp of a parallel fetch."""

from __future__ import annotations

import math
from typing import Final, Optional

__all__ = ["Ramp"]


class Ramp:
    """How many connections fetch an object: grow while throughput grows, up to the cap.

    One stream first, its rate measured over `PROBE_S` from its first chunk (the bytes
    that came with the answer took no time to come: counted, they would inflate it; a
    write within `BURST_S` of the first is the rest of that chunk). A stream that would
    bring the rest in under `ALONE_S` stays alone: one stream fills that link, and more
    would only compete for the CPU. A stream clearly too slow for that (it would take
    `CLEARLY_SLOW` times `ALONE_S` or more) is known sooner: the probe ends once its
    writes span `PROBE_MIN_S` (while it lasts, a link of 8 streams carries one: each
    5 ms of it costs about 4 ms of the fetch); a rate near the line is measured for all
    of `PROBE_S`. Otherwise the first step opens
    as many connections as would each still have `ALONE_S` of work at that rate, then
    the count doubles, up to the cap. Each step's rate is measured over `WINDOW_S` once
    its new connections have their first bytes; a step that did not pay (less than
    `GAIN` more, or half the gain the added connections could bring if that is less) is
    undone: the extra connections finish the run they hold, then stop, and the count
    stays where it was and `SPARE` more (a quarter: a request asks for at least 4 times
    what comes while it waits for its answer, so each connection waits up to a fifth
    of its time, and the count that just fills the link leaves it short while some
    wait: on S3 through moto, a fetch whose first step of 10 was undone from 16 took
    1.18-1.20 s against 1.11 s for one that kept 16, and caps of 10, 12 and 16 took
    1.19, 1.16 and 1.13 s).
    """

    PROBE_S: Final = 0.02
    PROBE_MIN_S: Final = 0.005
    BURST_S: Final = 0.001
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
        self._moved = False  # the probe's beginning moved past the first chunk's second write
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

    def _clearly_slow(self, measured_s: float, alone_s: float) -> bool:
        """Whether the probe can end now, `measured_s` into it: the stream would take
        long enough alone that a short measurement cannot be that wrong."""
        early = self.target == 1 and measured_s >= self.PROBE_MIN_S
        return early and alone_s >= self.CLEARLY_SLOW * self.ALONE_S

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
        if self._since is None:
            self._since, self._moved = (at, received), False
            return self.target
        began, before = self._since
        if self.target == 1 and not self._moved and began < at < began + self.BURST_S:
            # The first chunk's bytes can come as two writes (the rest of the packet that
            # brought the answer): the probe begins at the second.
            self._since, self._moved = (at, received), True
            return self.target
        if at <= began:
            return self.target
        rate = (received - before) / (at - began)
        alone_s = remaining / rate if rate > 0 else 0.0
        if now - began < (self.PROBE_S if self.target == 1 else self.WINDOW_S) and not self._clearly_slow(
            at - began, alone_s
        ):
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
