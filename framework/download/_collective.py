"""The step plumbing of `cached_path(distributed=True)`: a base class whose `_step` runs
a rank's local work in a thread while answering a heartbeat `all_gather` every `POLL_S`
seconds (giving up on every rank alike when one rank's work makes no progress for the
process group's timeout) and gathers every rank's outcome, and the encoding of a failure as plain values
(rebuilt from `framework.errors` on every rank)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any, Callable, Final, NoReturn, Optional, Union

import torch.distributed as dist

from framework.distributed import EncodedError, decode_error, encode_error
from framework.errors import DownloadError, StepTimeoutError

__all__ = ["POLL_S", "Outcome", "Rounds", "group_timeout"]

POLL_S: Final = 0.5  # the longest gap between heartbeats while a rank works

# One rank's outcome of a step: (True, value) or (False, (error class name, state, args)).
Outcome = tuple[bool, Any]


class _Collective:
    """A collective call's steps over the default process group (`url` names the call)."""

    url: str

    # Steps: every rank runs its part, then all outcomes are gathered ----------------

    def _step(
        self,
        work: Optional[Callable[[], Any]],
        expect: Union[type, tuple[type, ...]],
        what: str = "in a step of cached_path(distributed=True)",
        progress: Optional[Callable[[], object]] = None,
        rounds: Optional[Rounds] = None,
    ) -> list[Any]:
        """Run `work` here (None: nothing) while answering heartbeats; the values of all
        ranks (each an `expect`), or the first failure (by rank) raised on every rank.

        A rank whose `work` shows no progress (its thread's reads and writes, and
        `progress()` when given) for longer than the process group's timeout says so in
        its heartbeat, and every rank raises the same `StepTimeoutError` in that round:
        a hung disk never keeps the others waiting longer than the timeout. `what` names
        the step in that error. With `rounds`, every heartbeat also carries what the
        ranks move meanwhile (a transfer), and the step ends once that is done too."""
        box: list[Outcome] = []
        mine: list[BaseException] = []  # this rank's own failure, chained to what it raises
        thread: Optional[threading.Thread] = None
        if work is None:
            box.append((True, None))
        else:

            def run() -> None:
                try:
                    box.append((True, work()))
                except BaseException as error:  # reported to every rank, raised there
                    mine.append(error)
                    box.append((False, _encode(error, self.url, dist.get_rank())))

            thread = threading.Thread(target=run, name="framework-cluster-step", daemon=True)
            thread.start()
        watch = _Watch(thread, progress, group_timeout())
        wait = 0.002
        while True:
            if thread is not None and rounds is not None:
                rounds.wait(thread, POLL_S)
            elif thread is not None:
                thread.join(wait)
                wait = min(2 * wait, POLL_S)
            overdue = None if box else watch.overdue()
            mine_now = box[0] if box else None
            offer = rounds.offer() if rounds is not None else None
            beats: list[Any] = self._gather((mine_now, overdue, offer))
            outcomes: list[Optional[Outcome]] = []
            for other, beat in enumerate(beats):
                if not _is_beat(beat):
                    self._out_of_step(other, beat)
                outcomes.append(beat[0])
            failed = any(outcome is not None and not outcome[0] for outcome in outcomes)
            more = rounds is not None and not failed and rounds.exchange([beat[2] for beat in beats])
            if all(outcome is not None for outcome in outcomes) and not more:
                break
            for other, beat in enumerate(beats):
                if beat[0] is None and beat[1] is not None:  # the same decision on every rank
                    raise StepTimeoutError(self.url, other, what, beat[1]) from (mine[0] if mine else None)
        values = []
        for outcome in outcomes:
            assert outcome is not None
            ok, value = outcome
            if not ok:
                raise _decode(*value) from (mine[0] if mine else None)
            values.append(value)
        for other, value in enumerate(values):
            if not isinstance(value, expect):
                self._out_of_step(other, value)
        return values

    def _out_of_step(self, rank: int, got: Any) -> NoReturn:
        raise DownloadError(
            self.url,
            f"rank {rank} sent a {type(got).__name__} where this step of "
            "cached_path(distributed=True) expected another answer: the ranks' collectives are "
            "out of step. Every rank must make the call, and no other collective may run on "
            "the default group meanwhile (another thread, another call)",
        )

    def _gather(self, obj: Any) -> list[Any]:
        gathered: list[Any] = [None] * dist.get_world_size()
        try:
            dist.all_gather_object(gathered, obj)
        except RuntimeError as error:  # DistBackendError, a timeout, a closed connection
            raise DownloadError(self.url, _group_failed(error)) from error
        return gathered


class Rounds:
    """What the ranks move between them while a step runs, one piece per heartbeat:
    each rank's `offer` rides on the heartbeat, and every rank gets all of them in
    `exchange`, which moves the piece and says whether more rounds are needed."""

    def wait(self, thread: threading.Thread, timeout: float) -> None:
        """Before a heartbeat, while this rank's work runs: until it has something to
        offer, its work ended, or `timeout`."""
        thread.join(timeout)

    def offer(self) -> Any:
        return None

    def exchange(self, offers: list[Any]) -> bool:
        return False


# Threads that read a file for a step's thread (a download's hasher): their reads count
# as the step's progress. A lock's heartbeat thread writes whatever the step does: it
# does not count.
_HASHING_THREADS: Final = frozenset({"framework-hash", "framework-parallel-hash"})


class _Watch:
    """When a step's thread last made progress: its own reads and writes (Linux's
    per-thread I/O counters, sockets included), its hashing threads', and what
    `progress` returns (a parallel fetch's parts, another process holding the lock)."""

    def __init__(
        self, thread: Optional[threading.Thread], progress: Optional[Callable[[], object]], timeout: float
    ) -> None:
        self.thread = thread
        self.progress = progress
        self.timeout = timeout
        self.last: object = None
        self.since = time.monotonic()
        self.probed = -POLL_S  # when progress was last looked for

    def overdue(self) -> Optional[float]:
        """The timeout, once no progress was seen for longer than it; else None."""
        if self.thread is None:
            return None
        now = time.monotonic()
        if now - self.probed < POLL_S / 2:  # rounds of a transfer come every few ms
            return self.timeout if now - self.since > self.timeout else None
        self.probed = now
        seen: object
        try:
            threads = [self.thread, *(t for t in threading.enumerate() if t.name in _HASHING_THREADS)]
            io = tuple(_thread_io(thread) for thread in threads)
            seen = (io, self.progress() if self.progress is not None else None)
        except Exception:  # a progress probe that fails says nothing
            seen = self.last
        if seen != self.last:
            self.last, self.since = seen, now
        return self.timeout if now - self.since > self.timeout else None


def _thread_io(thread: threading.Thread) -> Optional[str]:
    """The I/O counters of `thread` (bytes and calls read and written); None where the
    system does not say (the step is then bounded by `progress` alone)."""
    try:
        with open(f"/proc/self/task/{thread.native_id}/io", "rb") as file:
            return file.read().decode("ascii", "replace")
    except OSError:
        return None


def group_timeout() -> float:
    """The default process group's timeout in seconds (its largest over its backends)."""
    group: Any = dist.distributed_c10d._get_default_group()
    seconds = []
    for device in getattr(group, "_device_types", []):
        try:
            options = getattr(group._get_backend(device), "options", None)
        except (RuntimeError, ValueError):
            continue
        timeout = getattr(options, "_timeout", None)
        if isinstance(timeout, timedelta):
            seconds.append(timeout.total_seconds())
    return max(seconds) if seconds else dist.distributed_c10d.default_pg_timeout.total_seconds()


def _is_beat(value: Any) -> bool:
    return (
        isinstance(value, tuple)
        and len(value) == 3
        and (value[0] is None or _is_outcome(value[0]))
        and (value[1] is None or isinstance(value[1], float))
    )


def _is_outcome(value: Any) -> bool:
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], bool)):
        return False
    ok, value = value
    return ok or (
        isinstance(value, tuple)
        and len(value) == 3
        and isinstance(value[0], str)
        and isinstance(value[1], dict)
        and isinstance(value[2], tuple)
    )


def _encode(error: BaseException, url: str, rank: int) -> EncodedError:
    """`error` as plain values (`encode_error`); anything but a `DownloadError` becomes
    one that names it and the rank."""
    if not isinstance(error, DownloadError):
        what = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        error = DownloadError(url, f"rank {rank} failed: {what}")
    return encode_error(error)


def _decode(name: str, state: dict[str, Any], args: tuple[Any, ...]) -> DownloadError:
    return decode_error((name, state, args), DownloadError)


def _group_failed(error: BaseException) -> str:
    return (
        f"the process group failed during cached_path(distributed=True): {error}. A rank died, "
        "left the call, or did not answer within the process group's timeout "
        "(init_process_group(timeout=...))"
    )
