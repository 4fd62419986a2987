"""How many parts one request of a parallel fetch asks for: the run-sizing policy the
engine applies at each claim (see `Engine` for where runs come from)."""

from __future__ import annotations

import collections
import math
import statistics
from typing import Final, Optional

__all__ = ["PAYING_RUN", "Runs"]

# A request asks for at least this many times the bytes its connection receives while a
# request waits for its answer (the server's first-byte latency and the request's CPU on
# both ends): the wait is then at most a ninth of the request's time (see `paying_run`).
# Less, and the first round of requests to a server whose answers queue (each one read
# in turn, as moto does) splits small and leaves a second round, each request its work.
PAYING_RUN: Final = 8
_WAITS_KEPT: Final = 64


class Runs:
    """What the answers so far say about runs: how long each request waited for its
    answer, how fast each answer flowed once it came, and from those how many parts the
    next run holds. Windows of the latest answers: the median of a short list, taken at
    each claim, stays cheap however many requests there are. Not thread-safe: the
    engine calls it under its lock."""

    def __init__(self, run_parts: int, part_size: int, first_wait: Optional[float] = None) -> None:
        self.run_parts = run_parts  # the most parts one request asks for
        self.part_size = part_size
        # Seconds each recent request took to be answered.
        self.waits: collections.deque[float] = collections.deque(maxlen=_WAITS_KEPT)
        if first_wait is not None:  # the first answer's: the only one known as the first runs are claimed
            self.waits.append(first_wait)
        # Bytes/s each recent answer came at, from its first byte to its last.
        self.stream_rates: collections.deque[float] = collections.deque(maxlen=_WAITS_KEPT)

    @property
    def median_wait(self) -> float:
        """The median time a request waited for its answer so far (0 before one did)."""
        return statistics.median_low(self.waits) if self.waits else 0.0

    def answered(self, wait_s: float) -> None:
        """A request was answered after `wait_s`."""
        self.waits.append(wait_s)

    def flowed(self, count: int, seconds: float) -> None:
        """An answer's `count` bytes came over `seconds` from its first byte on."""
        if count > 0 and seconds > 0:
            self.stream_rates.append(count / seconds)

    def share(self, connections: int, todo: int, unwritten: int, pace: Optional[float], held: int = 1) -> int:
        """How many parts a run that holds `held` (1: a new claim) holds once claimed:
        the `todo` parts left unclaimed, divided among the `connections` there are or
        will soon be, at most `run_parts`. At least `paying_run`, unless that is more
        than an even share (rounded up) of the `unwritten` parts, claimed or not: the
        last runs still end together. A run that would leave behind no more parts than
        come in while a request waits (`wait_parts`) takes them, if it can hold them: the
        scrap flows in less time than a later request for it would wait, and costs the
        server no request of its own. Where a request of `run_parts` waits longer for
        its answer than its bytes take to come (a server that spends time on each
        request: its waits grow as requests queue), every run is that long: each smaller
        request adds a wait and the server's work, more than ending together saves.
        `pace`: see `paying_run`."""
        if self.waits_outlast_runs():
            return self.run_parts
        floor = min(self.paying_run(pace), max(1, -(-unwritten // connections)))
        share = min(self.run_parts, max(floor, todo // connections))
        left = todo - max(0, share - held)  # unclaimed once this run holds `share`
        if 0 < left <= self.wait_parts(pace) and held + todo <= self.run_parts:
            return held + todo  # the scrap flows in less than a request would wait for it
        return share

    def waits_outlast_runs(self) -> bool:
        """Whether answers take longer to come than a run of `run_parts` takes to flow
        once it comes (medians of the answers so far)."""
        if not self.waits or not self.stream_rates:
            return False
        flow_s = self.run_parts * self.part_size / statistics.median_low(self.stream_rates)
        return statistics.median_low(self.waits) >= flow_s

    def paying_run(self, pace: Optional[float]) -> int:
        """The fewest parts a request should ask for: `PAYING_RUN` times what a
        connection receives while a request waits for its answer (the median wait so
        far: one retried after a 503 and its Retry-After does not count as the server's
        latency), at the median rate answers came at once their bytes flowed, else at
        `pace` (bytes/s per connection: the first stream's alone, else each
        connection's so far, waits included; None before bytes have flowed for a
        while); one part before a wait is known. Smaller requests spend much of their
        time waiting: from a server far away or slow to answer, a tail of one-part
        requests leaves the link idle, and costs a request's CPU on both ends each time."""
        parts = self._parts_per_wait(pace)
        return 1 if parts is None else max(1, math.ceil(PAYING_RUN * parts))

    def wait_parts(self, pace: Optional[float]) -> int:
        """The whole parts a connection receives while a request waits for its answer
        (as `paying_run` measures it); 0 before a wait is known."""
        parts = self._parts_per_wait(pace)
        return 0 if parts is None else math.floor(parts)

    def _parts_per_wait(self, pace: Optional[float]) -> Optional[float]:
        """Parts a connection receives during the median wait; None before one is known."""
        if not self.waits or pace is None:
            return None
        per_connection = statistics.median_low(self.stream_rates) if self.stream_rates else pace
        return statistics.median_low(self.waits) * per_connection / self.part_size
