"""Parallel fetch: a large object comes as byte-range parts over several connections.

One partial file (preallocated, sparse) is written with `pwrite` at each part's
offset. The first answer decides everything: it is a request for the whole object as a
range (`bytes=0-` and a last byte past any end), and

- a 206 naming the total size and a strong validator, for an object larger than one
  part, makes the plan: that answer goes on as the first connection's stream, and the
  ramp (`Ramp`) decides whether more connections are worth it; every later request is
  conditioned on that validator (HTTP `If-Range`, S3 `IfMatch`);
- anything else (a 200 from a server that ignores Range, a small object, no strong
  validator) is streamed as the single-stream path does, so it costs one copy.

The ramp measures the one stream first: if it would bring the rest in under half a
second it stays alone, and the object is one request, as on the single-stream path.
Otherwise connections are added while throughput grows, up to the cap; each asks for
a run of parts at a time, lowest missing parts first, so the hashed prefix keeps
growing, and a run is a share of what is left, so the last requests are one part each.

A part answered whole (200), with another validator, another total size, or an
encoded body aborts the parallel attempt: what was written is dropped and the
single-stream path starts over from byte 0; two versions' bytes never mix.

Which parts are complete, and how far each begun part got, is recorded next to the
partial file (`<final>.P<tag>.<host>.<pid>.<random>.parts`, JSON written
atomically) every quarter second and when the fetch stops, only after those bytes are
fsynced; a later call, with any number of connections, adopts both (the same rules as
a single-stream partial: regular files of this user whose writer is gone) and asks
only for what is not recorded, each part from where it got to. Parallel partial files
carry a `P` tag, so the single-stream path never takes their holes for bytes. The
plan and its record are in `_parts`, the ramp in `_ramp`, the threads that hash and
record in `_followers`, the engine's threads in `_engine`.

The sha256 is computed by a thread that reads the file back as its contiguous
prefix of written bytes grows, overlapped with the download; memory is bounded by
one chunk per connection.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Final, Optional

from framework.download._partial import PARALLEL_TAG, TRANSIENT_STATUSES, Partial, resumable
from framework.download._pipeline import no_room
from framework.download._stream import EndedShort, open_stream, place, receive
from framework.download._validators import Validators
from framework.download.backend import ByteStream, DownloadBackend
from framework.download.parallel._engine import Engine
from framework.download.parallel._parts import (
    MOST_PARTS,
    Resumed,
    VersionChanged,
    _Plan,
    adopt_parts,
    discard_record,
)
from framework.errors import DownloadError, HTTPStatusError, InvalidArgumentError, NetworkError

__all__ = [
    "DEFAULT_CONNECTIONS",
    "DEFAULT_PART_SIZE",
    "MIN_PART_SIZE",
    "adopt_parts",
    "connections_chosen",
    "connections_from",
    "fetch_parts",
]

logger = logging.getLogger("framework.download")

# The cap; `Ramp` decides how many of them an object gets (often one).
DEFAULT_CONNECTIONS: Final = 16
DEFAULT_PART_SIZE: Final = 8 << 20  # as s3transfer: large enough that a request's latency is amortized
MIN_PART_SIZE: Final = 64 << 10  # smaller, and a fetch is its requests' round trips (2 MiB of 1 B: 12 s)
# A plan's parts (what is recorded, and hashed, as complete) are this size, or `part_size`
# if smaller; a request asks for a run of them, `part_size` at most (see `Engine`).
_PART: Final = 1 << 20
# Answers that say the object is missing or forbidden, whatever the Range.
_NOT_THERE: Final = frozenset({401, 403, 404, 407, 410})
# A range end past any object: a server reads it as "to the end" (RFC 9110, 14.1.2), so the
# first request is one stream for the whole object that still tells whether ranges are served.
_TO_THE_END: Final = 1 << 62


def connections_from(value: Optional[int]) -> int:
    """The connection cap: `value`, else `$FRAMEWORK_CONNECTIONS`, else the default; an
    `InvalidArgumentError` (a `ValueError`) for a setting that is not a whole number of at
    least 1."""
    if value is None:
        text = os.environ.get("FRAMEWORK_CONNECTIONS", "").strip()
        if not text:
            return DEFAULT_CONNECTIONS
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < 1:
            raise InvalidArgumentError(
                "FRAMEWORK_CONNECTIONS",
                f"FRAMEWORK_CONNECTIONS must be a whole number of connections of at least 1 (1 = one "
                f"stream), got {text!r}; set it to e.g. 8, or unset it for the default",
            )
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(
            "connections", f"connections must be a whole number of at least 1 (1 = one stream), got {value!r}"
        )
    return value


def connections_chosen(value: Optional[int]) -> bool:
    """Whether the count was chosen (`value`, or `$FRAMEWORK_CONNECTIONS`): then a fetch
    that is not one stream opens all of them, not as many as the ramp finds worth it."""
    return value is not None or bool(os.environ.get("FRAMEWORK_CONNECTIONS", "").strip())


def fetch_parts(
    backend: DownloadBackend,
    url: str,
    partial: Partial,
    resumed: Optional[Resumed],
    *,
    connections: int,
    part_size: int,
    attempts: int,
    backoff_factor: float,
    bar: Any,
    on_size: Optional[Callable[[int], None]],
    fixed: bool = False,
) -> tuple[Optional[Any], int]:
    """Fetch `url` into `partial` in parts, over up to `connections` (all of them if
    `fixed`, once one stream is not enough).

    Returns an object with `close()` and `abandon()`, as `_stream.download` does,
    once the partial file holds the whole object (`close` waits for its hash); or
    None when the single-stream path is to go on (with `partial` empty, or holding the
    bytes of a whole answer it resumes), with the attempts already spent (a first
    answer that broke off counts as one)."""
    first: Optional[ByteStream] = None
    first_wait: Optional[float] = None  # how long the first answer took: the server's first wait
    reached: dict[int, int] = {}
    if resumed is not None:
        plan, done, reached = resumed.plan, resumed.done, resumed.reached
        logger.info("resuming %s: %d of %d parts are here", url, len(done), plan.count)
    else:
        asked = time.monotonic()
        first = _first_answer(backend, url, partial)
        first_wait = time.monotonic() - asked
        if first is None:
            return None, 0
        try:
            planned = _plan_from(first, partial, part_size, url)
        except BaseException:
            first.close()
            raise
        if planned is None:
            return _whole(backend, url, first, partial, bar, on_size, attempts, backoff_factor)
        plan, done = planned, set()
    try:
        _report_size(plan.size, partial.offset, bar, on_size)
        run_parts = max(1, part_size // plan.part_size)  # the most parts one request asks for
        engine = Engine(
            backend, url, partial, plan, done, reached, attempts, backoff_factor, bar,
            run_parts=run_parts, first_wait=first_wait,
        )  # fmt: skip
    except BaseException:
        if first is not None:
            first.close()
        discard_record(partial)
        raise
    return _run(engine, url, partial, connections, first, fixed)


def _first_answer(backend: DownloadBackend, url: str, partial: Partial) -> Optional[ByteStream]:
    """The first request: the whole object as a range; None when the single-stream
    path is to go on without it (a single-stream partial file, or an answer that
    cannot start a plan)."""
    if partial.name.tag.startswith(PARALLEL_TAG):
        partial.empty()  # parts without their record: nothing says which bytes are real
    if partial.offset:
        return None  # a single-stream partial file: that path resumes it
    try:
        first = open_stream(backend, url, 0, end=_TO_THE_END)
    except HTTPStatusError as error:
        if error.status in _NOT_THERE or error.status in TRANSIENT_STATUSES:
            # The object, or an outage the backend's retries already waited out (5xx,
            # 408, 429), not the Range: one stream would fail alike, after as many again.
            raise
        # 416 (an empty object), or a server that refuses this Range (400, 501, ...):
        # the single-stream path asks without one.
        logger.info("%s refused a ranged request (%s); fetching it in one stream", url, error)
        return None
    if first.status == 206 and (first.size is None or first.encoding is not None):
        # A range of an object of unknown size (`bytes 0-n/*`, or a Content-Range
        # that contradicts itself) cannot say it is the whole object, nor can encoded
        # bytes (their range counts encoded bytes): the single-stream path asks for it
        # without a Range.
        first.close()
        return None
    return first


def _plan_from(first: ByteStream, partial: Partial, part_size: int, url: str) -> Optional[_Plan]:
    """The plan the first answer makes, with `partial` made ready for it (retagged and
    allocated); None when the answer is to be streamed whole (`_whole`)."""
    validators = Validators.of(first)
    size = first.size or 0
    unit = max(min(part_size, _PART), -(-size // MOST_PARTS))  # a huge object: fewer, larger parts
    if (
        first.status != 206
        or first.start != 0
        or size <= unit
        or first.encoding is not None
        or validators.if_range is None
    ):
        return None
    plan = _Plan(size, unit, validators)
    partial.restart(validators)
    partial.retag(PARALLEL_TAG + validators.tag)
    _allocate(partial, plan.size, url)
    # No record yet: the recorder writes the first one. A P file without one is never
    # resumed (its holes are not bytes), only swept once its writer is gone.
    return plan


def _report_size(size: int, offset: int, bar: Any, on_size: Optional[Callable[[int], None]]) -> None:
    if on_size is not None:
        on_size(size)
    if bar is not None:
        bar.total, bar.n = size, offset
        bar.refresh()


def _run(
    engine: Engine, url: str, partial: Partial, connections: int, first: Optional[ByteStream], fixed: bool
) -> tuple[Optional[Any], int]:
    """Run `engine` (what `fetch_parts` returns: see there)."""
    try:
        # The first stream is the engine's now: its worker closes it. Closing it here could
        # wait on that worker's blocked read (a buffered reader's close takes its lock).
        engine.run(connections, first, fixed=fixed)
    except VersionChanged as error:
        logger.info("%s changed while it was fetched in parts (%s); starting over", url, error)
        discard_record(partial)
        partial.empty()
        return None, 0
    except BaseException as error:
        if partial.offset == 0 or not resumable(error):
            discard_record(partial)  # the partial file is removed too: nothing to resume
        raise
    return engine, 0  # its `close` waits for the hash, as a pipeline's does, then drops the record


def _whole(
    backend: DownloadBackend,
    url: str,
    stream: ByteStream,
    partial: Partial,
    bar: Any,
    on_size: Optional[Callable[[int], None]],
    attempts: int,
    backoff_factor: float,
) -> tuple[Optional[Any], int]:
    """Stream the first answer as the single-stream path does (one copy of traffic);
    None when that path is to go on (a 416, or a body that broke off: it resumes,
    with one attempt fewer)."""
    with stream:
        if stream.status == 416 or not place(backend, url, stream, partial):
            return None, 0
        try:
            return receive(stream, partial, url, bar, on_size), 0
        except EndedShort:  # a server capping its ranges: the single-stream path asks for the rest
            return None, 0
        except NetworkError as error:  # bytes so far are kept: the single-stream path resumes
            if attempts <= 1:
                raise
            logger.warning("%s; resuming from byte %d", error, partial.offset)
    time.sleep(backoff_factor)
    return None, 1


def _allocate(partial: Partial, size: int, url: str) -> None:
    """Make `partial` `size` bytes long, sparse (blocks are allocated as parts arrive); a
    `DownloadError` naming the size if the filesystem refuses it (more than the largest
    file it holds, or a file size limit)."""
    try:
        os.ftruncate(partial.fd, size)
    except OSError as error:
        full = no_room(url, partial.name.path.parent, error)
        if full is not None:  # EFBIG too: the message says there is no room
            raise full from error
        raise DownloadError(
            url,
            f"the server says the object is {size} bytes; the filesystem holding "
            f"{partial.name.path.parent} refuses a file that large ({os.strerror(error.errno or 0)})",
        ) from error
