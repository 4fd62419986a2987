"""`DownloadBackend`: the one small interface a storage scheme implements.

A backend knows how to open a byte stream at an offset and how to describe the
remote object (size, etag). Locking, publishing, verifying, resuming, extracting
and progress all live once, in `DownloadManager`.
"""

from __future__ import annotations

import builtins
import inspect
import re
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Callable, ClassVar, Final, Optional

import attrs

from framework.config import ConfigChecks
from framework.errors import DownloadError, InvalidArgumentError, ListingUnsupportedError
from framework.registry import Registrable

__all__ = [
    "POOL_SIZE",
    "UNPLACED",
    "ByteStream",
    "DownloadBackend",
    "ListedObject",
    "ReadPace",
    "RemoteInfo",
    "contract_refused",
    "listing_unsupported",
    "parse_content_range",
    "range_body_length",
    "range_place",
    "range_unsupported",
    "refusals_at_once",
    "refusals_wanted_at_once",
]

# Connections a backend keeps open per host: room for two objects fetched at once at the
# default cap (16 connections each), so a parallel fetch does not throw connections away.
POOL_SIZE: Final = 32

# `ByteStream.start` of a 206 whose Content-Range cannot be read or contradicts itself:
# where its bytes belong is unknown, so the manager never places them.
UNPLACED: Final = -1

_CONTENT_RANGE = re.compile(r"bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)\s*$", re.IGNORECASE)  # RFC 9110 14.1


def parse_content_range(
    value: Optional[str], length: Optional[int] = None
) -> tuple[Optional[int], Optional[int]]:
    """(first byte, total size) of a `Content-Range` value; None where it says `*`
    or cannot be read (`bytes 5-9/10`, `bytes 5-9/*`, `bytes */10`). A range that
    contradicts itself (its last byte before its first, or at or past the total), or
    the answer's `length` (Content-Length), says nothing: (None, None), so it is never
    taken for the object's bytes or size."""
    parsed = _parse_range(value)
    if parsed is None:
        return None, None
    first, last, total = parsed
    if first is None or last is None:
        return None, total
    past_the_end = total is not None and last >= total
    if last < first or past_the_end or (length is not None and length != last - first + 1):
        return None, None
    return first, total


def range_place(value: Optional[str], length: Optional[int] = None) -> tuple[int, Optional[int]]:
    """(start, total size) of a 206's body from its `Content-Range` (and `length`, its
    Content-Length): `(UNPLACED, None)` where the range names no first byte (`bytes
    */N`, missing, unreadable, or contradicting itself or `length`)."""
    first, total = parse_content_range(value, length)
    return (UNPLACED, None) if first is None else (first, total)


def range_body_length(value: Optional[str]) -> Optional[int]:
    """How many bytes a `Content-Range` (`bytes 5-9/10`: 5) says its body holds; None
    where it names no range. What a body without a Content-Length is counted against:
    one that ends before is cut off, not a server's cap."""
    parsed = _parse_range(value)
    if parsed is None or parsed[0] is None or parsed[1] is None:
        return None
    return parsed[1] - parsed[0] + 1


def _parse_range(value: Optional[str]) -> Optional[tuple[Optional[int], Optional[int], Optional[int]]]:
    """(first, last, total) as a `Content-Range` writes them, None for each `*`; None
    if it cannot be read."""
    match = _CONTENT_RANGE.match(value or "")
    if match is None:
        return None
    first, last, total = (None if text in (None, "*") else int(text) for text in match.groups())
    return first, last, total


@attrs.frozen
class RemoteInfo:
    """What a backend knows about a remote object without reading it."""

    size: Optional[int] = None
    etag: Optional[str] = None
    last_modified: Optional[str] = None
    date: Optional[str] = None  # the answer's Date: says whether Last-Modified is a strong validator


@attrs.frozen
class ListedObject:
    """One object a backend's `list` found: its URL (the prefix asked for, then the rest
    of the object's name), and what the listing says of it without another request."""

    url: str
    size: Optional[int] = None
    etag: Optional[str] = None
    last_modified: Optional[str] = None


class ReadPace:
    """How much a backend asks of a body at each read, as its reader wants it.

    Until the reader says it is `steady`, a read hands over what has arrived (one read
    per arrival: a parallel fetch's ramp times each write as it comes). Once steady, on
    a link fast enough to bring at least `LEAST` in `WINDOW_S`, a read waits for about
    `WINDOW_S` of bytes, at most `MOST`; the rate it sizes them by is the lower of the
    body's so far and its last read's, so that a link slowing down is read in smaller
    reads at once, and it is taken only once the body has come for `SETTLE_WINDOWS`
    windows (earlier, a burst the socket held reads as a fast link). On a slower link a
    read still hands over what has arrived: a read never waits much longer than
    `WINDOW_S`, so a fetch that stops has its connections stop soon, within their read
    timeout.

    On a link that brings a connection's bytes in small pieces (64 KiB at 16 MiB/s a
    connection), one stream read a piece at a time cost 1.43 times the CPU per MiB of a
    plain streamed `requests` download, and 1.33 times read this way (on S3, 0.95 and
    0.83 times boto3's `download_file`); gathering the pieces of a window instead saved
    little, each piece's way through urllib3 being most of the cost. The price: a break
    or a read timeout loses the read under way, about `WINDOW_S` of traffic and at most
    `MOST` bytes, as a plain `requests` download of 1 MiB chunks loses one chunk; those
    bytes are asked for again.
    """

    WINDOW_S: Final = 0.025
    SETTLE_WINDOWS: Final = 4
    LEAST: Final = 64 << 10
    MOST: Final = 1 << 20

    def __init__(self) -> None:
        self.steady = False
        self.wanted: Optional[int] = None  # bytes the reader takes before it decides to read on
        self._first_at: Optional[float] = None  # when the first chunk came
        self._since_first = 0  # bytes after it
        self._last: Optional[tuple[float, int]] = None  # the last read's seconds and bytes
        self._ended = 0.0  # when the last read returned

    def read(self, read1: Callable[[int], bytes], read: Callable[[int], bytes], left: Optional[int]) -> bytes:
        """The next chunk: `read1(n)` (what has arrived, up to n) or `read(n)` (n bytes,
        fewer only at the body's end); `left`: bytes the body still has, if known."""
        most = max(1, min([self.MOST] + [bound for bound in (left, self.wanted) if bound is not None]))
        size = self._window(time.monotonic()) if self.steady else 0
        chunk = read(min(most, size)) if size >= self.LEAST else read1(most)
        ended = time.monotonic()
        if self._first_at is None:
            self._first_at = ended if chunk else None
        else:
            self._since_first += len(chunk)
            self._last = (ended - self._ended, len(chunk))
        self._ended = ended
        return chunk

    def _window(self, now: float) -> int:
        """Bytes that come in `WINDOW_S` at the lower of the body's rate so far and the
        last read's (from the read before it on); 0 until the body has come for
        `SETTLE_WINDOWS` windows (a burst the socket held would read as a fast link)."""
        if (
            self._first_at is None
            or self._last is None
            or now - self._first_at < self.SETTLE_WINDOWS * self.WINDOW_S
        ):
            return 0
        rate = self._since_first / (now - self._first_at)
        seconds, count = self._last
        if seconds > 0:
            rate = min(rate, count / seconds)
        return int(rate * self.WINDOW_S)


@attrs.define
class ByteStream:
    """An open body: `chunks` yields bytes starting at byte `start` of the object.

    `start` is the offset the body really begins at: the requested offset, or 0
    when the backend could not resume (an HTTP server answering 200 to a Range
    request), or `UNPLACED` for a 206 whose Content-Range cannot be read or
    contradicts itself. `size` is the object's total size when known. `etag` and
    `last_modified` identify the version the body belongs to; `date` is the answer's
    `Date` (a Last-Modified is a strong validator only when Date is at least one
    second later). `encoding` is the HTTP `Content-Encoding` the server applied
    (None for identity): a whole body (200) is then handed over decoded, the object's
    own bytes; a range (206) of encoded bytes is never appended to them. An offset the
    backend cannot serve is reported, not handled: an empty `chunks` with
    `status=416` (and `size` when the answer says it). The manager decides what
    to do about ranges, once, for every backend. `pace`, where the backend reads
    through one, lets the reader ask for larger reads once it no longer times each
    arrival (`ReadPace`).
    """

    chunks: Iterator[bytes]
    start: int = 0
    size: Optional[int] = None
    etag: Optional[str] = None
    last_modified: Optional[str] = None
    status: Optional[int] = None
    close_callback: Optional[Callable[[], None]] = attrs.field(default=None, repr=False)
    date: Optional[str] = None
    encoding: Optional[str] = None
    pace: Optional[ReadPace] = attrs.field(default=None, repr=False)

    def want(self, count: int) -> None:
        """The reader takes `count` more bytes before it decides whether to read on: no
        read asks past them (bytes read and then not taken were fetched for nothing)."""
        if self.pace is not None:
            self.pace.wanted = count

    def steady(self) -> None:
        """The reader no longer times each arrival: larger reads suit it (see `ReadPace`)."""
        if self.pace is not None:
            self.pace.steady = True

    def close(self) -> None:
        if self.close_callback is not None:
            self.close_callback()
            self.close_callback = None

    def __enter__(self) -> ByteStream:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()


def _backend_problems(arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The rules every backend's retry settings keep (see `DownloadBackend.config_checks`)."""

    def number(key: str) -> Optional[float]:
        value = arguments.get(key)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    problems = []
    retries, backoff, timeout = number("retries"), number("backoff_factor"), number("timeout")
    if retries is not None and retries < 0:
        problems.append(("retries", f"retries must be >= 0 (0: no retry), got {retries}"))
    if backoff is not None and backoff < 0:
        problems.append(("backoff_factor", f"backoff_factor must be >= 0 seconds, got {backoff}"))
    if timeout is not None and not timeout > 0:
        problems.append(("timeout", f"timeout must be > 0 seconds, got {timeout}"))
    return problems


_HINTS = threading.local()


@contextmanager
def refusals_at_once() -> Iterator[None]:
    """Within the block, this thread's `DownloadBackend.open` calls are asked to raise a
    refusal (429, 503) at once, with its Retry-After, not wait it out in retries: a
    parallel fetch then hands the part to a connection the server serves. A hint that a
    backend reads with `refusals_wanted_at_once`, or ignores."""
    _HINTS.at_once = True
    try:
        yield
    finally:
        _HINTS.at_once = False


def refusals_wanted_at_once() -> bool:
    """Whether this thread is inside `refusals_at_once`."""
    return bool(getattr(_HINTS, "at_once", False))


def range_unsupported(url: str, backend: DownloadBackend, offset: int, end: int) -> DownloadError:
    """The error for a bounded range asked of a backend that does not serve one
    (`DownloadBackend.supports_ranges` is False)."""
    return DownloadError(
        url,
        f"{type(backend).__name__} does not serve bounded byte ranges (its supports_ranges is "
        f"False), asked for bytes {offset}-{end - 1}; open it without `end` for one stream",
    )


def contract_refused(url: str, backend: DownloadBackend, error: TypeError) -> Optional[InvalidArgumentError]:
    """The error for an `open` that cannot take the contract's one call shape (a backend
    written for another signature), or None when the TypeError came from inside it.
    The signature is read only here, to say what is wrong; calls never depend on it."""
    try:
        inspect.signature(backend.open).bind("url", 0, end=None, if_range=None)
    except TypeError:
        return InvalidArgumentError(
            url,
            f"{type(backend).__name__}.open cannot be called as the DownloadBackend contract "
            f"calls it, open(url, offset, end=..., if_range=...) ({error}); give it the "
            "signature open(self, url, offset=0, *, end=None, if_range=None): a backend "
            "without ranges keeps supports_ranges False and is never given an end",
        )
    return None


def listing_unsupported(url: str, backend: DownloadBackend) -> ListingUnsupportedError:
    """The error for a listing asked of a backend that cannot list
    (`DownloadBackend.supports_listing` is False)."""
    scheme = url.partition("://")[0].lower() if "://" in url else "file"
    return ListingUnsupportedError(url, scheme, type(backend).__name__)


class DownloadBackend(Registrable):
    """Reads objects of the URL schemes in `schemes`; registered by name (`"http"`, ...).

    The manager serves a URL's scheme with, in this order: the instance given for it
    in `DownloadManager(backends={scheme: instance})`; the backend registered under
    the scheme's own name; the registered backend whose class lists the scheme in
    `schemes` (`HttpBackend.schemes == ("http", "https")`); a registered backend
    whose `accepts` takes any scheme nobody claims (the fsspec backend). So a plugin
    adds a scheme by listing it in `schemes`, or by registering under its name.

    What a plugin author implements:

    - `open(url, offset=0, *, end=None, if_range=None)`: a `ByteStream` of the object
      from byte `offset` (see `open` for each argument and what an answer reports);
    - `supports_ranges = True` if `open` honours `end` (a bounded range): the manager
      may then fetch a large object in parts over several connections. Left False, the
      manager never passes an `end` (it passes `end=None`), and fetches over one
      stream, resumed from `offset`. A class attribute: a subclass inherits it;
    - `supports_listing = True` with `list(prefix, *, recursive=True)` if the scheme
      can list the objects under a prefix (S3, a local folder, most fsspec
      filesystems): a glob over its URLs then names many shards. Left False (HTTP),
      `list` raises `ListingUnsupportedError` and a glob is refused;
    - optionally `stat` (size and validators without reading; by default from a
      stream opened at 0), `check_url` (refuse a URL that can never be served, without
      a request), `close` (release connections) and `schemes`/`accepts`; a
      backend with retries of its own may raise a refusal at once when
      `refusals_wanted_at_once()` says a parallel fetch asks for that.

    Failures are raised as `framework.errors.DownloadError` subclasses naming the URL:
    `HTTPStatusError` for a final refusal, `NetworkError` for a connection that failed
    or broke off (the manager resumes from the bytes it already has). A backend is a
    context manager whose exit closes it. `framework.testing.check_backend` checks a
    backend against this contract.
    """

    schemes: ClassVar[tuple[str, ...]] = ()
    # Whether `open` honours `end`: the manager asks for bounded ranges only then.
    supports_ranges: ClassVar[bool] = False
    # Whether `list` finds the objects under a prefix: a glob is resolved only then.
    supports_listing: ClassVar[bool] = False

    # A retry count below 0 or a timeout of 0 would fail at the first request instead:
    # refused by the constructor and by `framework config validate` alike.
    config_checks: ClassVar[ConfigChecks] = ConfigChecks(
        _backend_problems,
        {
            "properties": {
                "retries": {"minimum": 0},
                "backoff_factor": {"minimum": 0},
                "timeout": {"exclusiveMinimum": 0},
            }
        },
    )

    def __init__(self, *, retries: int = 5, backoff_factor: float = 0.5, timeout: float = 60.0) -> None:
        self.config_checks.enforce({"retries": retries, "backoff_factor": backoff_factor, "timeout": timeout})
        self.retries = retries
        self.backoff_factor = backoff_factor
        self.timeout = timeout

    def open(
        self, url: str, offset: int = 0, *, end: Optional[int] = None, if_range: Optional[str] = None
    ) -> ByteStream:
        """Open `url` for reading from byte `offset` (see `ByteStream.start`).

        `end` (exclusive), only ever given when `supports_ranges` is True, bounds the
        range: the stream ends there, or at the object's end if that comes first; the
        answer to a range says `status=206` (a parallel fetch needs a first answer
        that is a range of known `size` with a validator). A backend that does not
        serve ranges leaves `supports_ranges` False and never sees one (raise
        `range_unsupported` if it is given one anyway).

        `if_range` (an ETag or a Last-Modified date) asks for the range only if the
        object is still that version, else for the whole object (HTTP `If-Range`);
        a backend without such a condition may ignore it: the manager also compares
        the stream's validators with the ones its partial file was made from.

        An offset past the object's end is reported, not raised: an empty
        stream with `status=416` (and `size` when known).
        """
        raise NotImplementedError

    def check_url(self, url: str) -> None:
        """Raise `InvalidArgumentError` if `url` can never be served (an S3 URL without
        a key, say), without any request; by default nothing is checked. A bulk call
        asks it of every URL before its first request, so that one bad URL among
        thousands is refused at once; `open` refuses such a URL too."""

    def list(self, prefix: str, *, recursive: bool = True) -> builtins.list[ListedObject]:
        """The objects whose URL starts with `prefix`, sorted by URL, each URL written as
        `prefix` followed by the rest of the object's name (`list("s3://b/train/p")`
        finds `s3://b/train/part-0.gz`). `recursive=False` keeps only the objects whose
        rest holds no `/` (one folder level, where the scheme has folders). A prefix
        matching nothing gives an empty list; folders themselves are not objects.

        Only called when `supports_listing` is True; by default it raises
        `ListingUnsupportedError` (HTTP has no listing)."""
        raise listing_unsupported(prefix, self)

    def stat(self, url: str) -> RemoteInfo:
        """Size and validators of `url`; by default taken from a stream opened at 0."""
        with self.open(url, 0) as stream:
            return RemoteInfo(stream.size, stream.etag, stream.last_modified)

    @classmethod
    def accepts(cls, scheme: str) -> bool:
        """Whether to serve `scheme` when no backend lists it in `schemes` (a fallback)."""
        return False

    def close(self) -> None:
        """Release pooled connections; the backend may be used again afterwards."""

    def __enter__(self) -> DownloadBackend:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()
