"""The single-stream path: one request at a time, resumed where a body broke off.

Range answers are decided here, once, for every backend (`place`): a body is
appended to a partial file only when it starts at the partial's offset and carries
the same version tag (ETag, else Last-Modified); without a validator a partial is
never resumed, since two versions' bytes must never mix.

Every request of a fetch goes through `open_stream`: the one call shape of
`DownloadBackend.open`.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Optional

from framework.download._partial import Partial, resumable
from framework.download._pipeline import Pipeline
from framework.download._validators import NO_VALIDATOR, Validators
from framework.download.backend import (
    UNPLACED,
    ByteStream,
    DownloadBackend,
    RemoteInfo,
    contract_refused,
    range_unsupported,
)
from framework.errors import ChecksumError, DownloadError, HTTPStatusError, NetworkError

__all__ = ["EndedShort", "download", "open_stream", "place", "receive"]

logger = logging.getLogger("framework.download")


def open_stream(
    backend: DownloadBackend,
    url: str,
    offset: int = 0,
    *,
    end: Optional[int] = None,
    if_range: Optional[str] = None,
) -> ByteStream:
    """`backend.open(url, offset, end=end, if_range=if_range)`: the one shape every
    call takes. A backend is never asked for a bounded range unless it declares
    `DownloadBackend.supports_ranges`."""
    if end is not None and not backend.supports_ranges:
        raise range_unsupported(url, backend, offset, end)
    try:
        return backend.open(url, offset, end=end, if_range=if_range)
    except TypeError as error:
        refusal = contract_refused(url, backend, error)
        if refusal is None:
            raise
        raise refusal from error


def place(backend: DownloadBackend, url: str, stream: ByteStream, partial: Partial) -> bool:
    """Make `partial` ready for `stream`'s body: True if the body goes on at the
    partial's offset, False to ask again from byte 0.

    The one place where range answers are decided for every backend: 416, a 200
    for a Range request (or If-Range finding another version), and a body of
    another version are all told apart here. Asking again from 0 sends no Range,
    so it happens at most once per attempt.
    """
    offset = partial.offset
    if stream.status == 416:
        if offset == 0:  # no Range was sent: a final status, as any other 4xx
            raise HTTPStatusError(
                url, 416, "HTTP 416 (range not satisfiable) answered to a request without a Range"
            )
        got, size = Validators.of(stream), stream.size
        # A 416 naming this version at the byte where a range of it of unknown total ended
        # says the object ends there: what a server that never says its size can tell.
        ended_here = offset == partial.open_end and got.if_range is not None and got.tag == partial.name.tag
        if got.if_range is None or size is None:  # a 416 need not name the version: ask
            try:
                info = backend.stat(url)
            except DownloadError as error:  # no HEAD (405), a presigned GET-only URL (403)
                if resumable(error):  # a broken connection or an outage: the bytes are kept
                    raise
                if not ended_here:
                    logger.info("cannot ask %s which version it has (%s); starting over", url, error)
                    partial.restart(Validators())
                    return False
                info = RemoteInfo()
            if info.size is not None or not ended_here:  # a size from HEAD wins
                got, size = Validators.of(info), info.size
            else:
                size = offset
        if size == offset and got.tag == partial.name.tag != NO_VALIDATOR:
            partial.validators = got
            return True  # the partial file is the whole object
        logger.info("cannot resume %s at byte %d (416); starting over", url, offset)
        partial.restart(got)
        return False
    got = Validators.of(stream)
    if stream.start == 0:  # the whole object: the first request, or a Range not honoured
        if offset:
            logger.info("%s came whole instead of from byte %d; starting over", url, offset)
        partial.restart(got)
        return True
    if offset == 0:
        if stream.start == UNPLACED:
            raise DownloadError(
                url,
                "asked for the whole object, the server sent a range whose Content-Range cannot be read "
                "or contradicts itself or its Content-Length",
            )
        raise DownloadError(url, f"asked for the whole object, the server sent bytes from {stream.start} on")
    same = got.tag == partial.name.tag != NO_VALIDATOR
    # An encoded range counts encoded bytes: it cannot go after the object's bytes we have.
    if (
        stream.encoding is None
        and stream.start == offset
        and same
        and (stream.size is None or offset <= stream.size)
        and (stream.size is None or partial.size is None or stream.size == partial.size)
    ):
        partial.validators = got
        return True
    logger.info("cannot resume %s at byte %d (another version); starting over", url, offset)
    partial.restart(got)
    return False


class EndedShort(NetworkError):
    """A ranged answer (206) that brought bytes and ended whole by its own account
    (backends count a body against its Content-Length, or against its range's length
    without one) before the object's end: a server that caps its ranged answers. What
    is left is asked for, and, as in a parallel fetch, that is not a failure as long as
    each such answer goes further into the object than any before it."""


def receive(
    stream: ByteStream,
    partial: Partial,
    url: str,
    bar: Any,
    on_size: Optional[Callable[[int], None]],
) -> Pipeline:
    """Write `stream`'s body after the partial's bytes, hashing on the side. Returns
    the pipeline, whose hash thread may still be working through its backlog."""
    if stream.size is not None:
        partial.size = stream.size
        if on_size is not None:
            on_size(stream.size)
        if bar is not None:
            bar.total, bar.n = stream.size, partial.offset
            bar.refresh()
    size = partial.size
    os.lseek(partial.fd, partial.offset, os.SEEK_SET)
    began = partial.offset
    pipeline = Pipeline(partial.fd, partial.hasher, partial.offset, url, partial.name.path)
    stream.steady()  # nothing here times an arrival
    try:
        for chunk in stream.chunks:
            pipeline.put(chunk)
            partial.offset += len(chunk)
            if bar is not None:
                bar.update(len(chunk))
        pipeline.flush()
        # A range of an unknown total (`bytes a-b/*`), of a version no answer gave the
        # size of, may end before the object does: the next request says (a 416 at the
        # end, whose size or a HEAD confirms it).
        unknown_end = size is None and stream.status == 206
        if unknown_end and stream.encoding is None:  # a decoded body's end is no byte of its range
            partial.open_end = partial.offset
        if unknown_end or (size is not None and partial.offset != size):
            pipeline.finish()  # file, offset and digest agree before a retry resumes
            if size is not None and partial.offset > size:
                raise ChecksumError(url, str(size), str(partial.offset), what="size")
            capped = stream.status == 206 and partial.offset > began and partial.name.tag != NO_VALIDATOR
            ended = EndedShort if capped else NetworkError
            of = "an unknown number of" if size is None else size
            raise ended(url, f"connection closed after {partial.offset} of {of} bytes")
    except BaseException as error:
        # Keep what arrived before a network failure (the retry resumes after it),
        # and wait for the hash: file, offset and digest agree.
        pipeline.finish(flush=isinstance(error, NetworkError))
        raise
    return pipeline


def download(
    backend: DownloadBackend,
    url: str,
    partial: Partial,
    attempts: int,
    backoff_factor: float,
    bar: Any,
    on_size: Optional[Callable[[int], None]],
) -> Pipeline:
    """The retry loop: a body that breaks off is resumed, up to `attempts` times."""
    failures, furthest = 0, partial.offset
    while True:
        if partial.offset and partial.name.tag == NO_VALIDATOR:
            partial.restart(Validators())  # no validator can vouch for the bytes we have
        if_range = partial.validators.if_range if partial.offset and partial.validators else None
        # A NetworkError from open is final: the backend already retried opening.
        with open_stream(backend, url, partial.offset, if_range=if_range) as stream:
            if not place(backend, url, stream, partial):
                continue
            try:
                return receive(stream, partial, url, bar, on_size)
            except NetworkError as error:
                if isinstance(error, EndedShort) and partial.offset > furthest:
                    furthest = partial.offset
                    logger.info("%s; asking for the rest", error)
                    continue
                failures += 1
                if failures >= attempts:
                    raise
                broken = error
        delay = backoff_factor * (2 ** (failures - 1))
        logger.warning(
            "%s; resuming from byte %d in %.1fs (attempt %d of %d)",
            broken,
            partial.offset,
            delay,
            failures + 1,
            attempts,
        )
        time.sleep(delay)
