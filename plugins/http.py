"""`HttpBackend`: `http://` and `https://` through one pooled `requests` session.

Retries (connection errors, 5xx, 408, 429, with exponential backoff and
`Retry-After`) are urllib3's `Retry`; other 4xx answers are final. Redirects to
another scheme, or from https down to http, are refused. Configured headers and
auth go only to the URL's host: a redirect to another host drops them, with every
header the auth object set and the hooks it registered (HTTPDigestAuth answers a 401
challenge from a hook), since the auth is applied per request, not as the session's.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, Final, Optional, Union
from urllib.parse import urljoin, urlsplit

import requests
import urllib3.exceptions
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from framework.download import RedactingFilter
from framework.download.backend import (
    POOL_SIZE,
    ByteStream,
    DownloadBackend,
    ReadPace,
    RemoteInfo,
    parse_content_range,
    range_body_length,
    range_place,
    refusals_wanted_at_once,
)
from framework.errors import DownloadError, HTTPStatusError, InvalidArgumentError, NetworkError

__all__ = ["MAX_RETRY_AFTER_S", "HttpBackend", "retry_after_seconds"]

# How long a chunked range whose bytes are all here waits for its terminating chunk (which
# comes with the last bytes from any server that does not stall) before its connection is closed.
_LAST_CHUNK_WAIT_S: Final = 0.1
RETRY_STATUSES: Final = frozenset({408, 429, *range(500, 600)} - {501})  # 501: asking again cannot help


# urllib3 logs requests and retries with their path and query (connectionpool, and
# util.retry at DEBUG): keep tokens out of the logs. A logger's filter sees only records
# logged on it, not its children's, so every urllib3 logger gets one.
_REDACTING: Final = RedactingFilter()
for _name in [name for name in logging.root.manager.loggerDict if name.split(".")[0] == "urllib3"]:
    logging.getLogger(_name).addFilter(_REDACTING)

# A server's Retry-After is honoured up to this many seconds, so a 429 cannot park us for hours.
MAX_RETRY_AFTER_S: Final = 60.0


class _RedirectRefused(requests.exceptions.RequestException):
    pass


_INVALID: Final = (
    requests.exceptions.InvalidURL,
    requests.exceptions.InvalidHeader,
    urllib3.exceptions.LocationParseError,
)


# Set on a thread while it asks for a part of a parallel fetch: a refusal (429, 503) is
# handed back at once, not retried here, so the part goes to a connection that is served.
_REFUSALS_AT_ONCE = threading.local()
_REFUSALS: Final = frozenset({429, 503})


class _Retry(Retry):
    def get_retry_after(self, response: Any) -> Optional[float]:
        try:
            value = super().get_retry_after(response)
        except (urllib3.exceptions.InvalidHeader, ValueError, OverflowError):
            return None  # "-5", "1.5", "soon", a date past year 9999: waited out with the backoff
        return None if value is None else min(value, MAX_RETRY_AFTER_S)

    def is_retry(self, method: str, status_code: int, has_retry_after: bool = False) -> bool:
        if status_code in _REFUSALS and getattr(_REFUSALS_AT_ONCE, "on", False):
            return False
        return bool(super().is_retry(method, status_code, has_retry_after))


class _RecordingAuth(requests.auth.AuthBase):
    """Applies `auth` and remembers the names of the headers it set, so that a redirect to
    another host can drop them (requests drops only `Authorization`)."""

    def __init__(self, auth: requests.auth.AuthBase) -> None:
        self.auth = auth
        self.header_names: set[str] = set()

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        before = dict(request.headers)
        request = self.auth(request)
        self.header_names |= {name for name, value in request.headers.items() if before.get(name) != value}
        return request


class _Session(requests.Session):
    """A session that refuses redirects to other schemes and https -> http downgrades,
    and on a redirect to another host drops the backend's own headers, the headers its
    auth set and the hooks its auth registered."""

    own_headers: frozenset[str] = frozenset()
    recording_auth: Optional[_RecordingAuth] = None

    def rebuild_auth(self, prepared_request: requests.PreparedRequest, response: requests.Response) -> None:
        super().rebuild_auth(prepared_request, response)  # type: ignore[no-untyped-call]  # drops Authorization
        old, new = response.request.url or "", prepared_request.url or ""
        if self.should_strip_auth(old, new):  # type: ignore[no-untyped-call]
            auth_headers = self.recording_auth.header_names if self.recording_auth else set()
            for name in self.own_headers | auth_headers:
                prepared_request.headers.pop(name, None)
            prepared_request.hooks = requests.hooks.default_hooks()  # type: ignore[no-untyped-call]

    def get_redirect_target(self, resp: requests.Response) -> Optional[str]:
        location = super().get_redirect_target(resp)
        if location:
            source = urlsplit(resp.url).scheme.lower()
            target = urlsplit(urljoin(resp.url, location)).scheme.lower()
            if target not in ("http", "https") or (source == "https" and target == "http"):
                raise _RedirectRefused(f"refusing a redirect from {resp.url} to {location}")
        return location


def _network_errors() -> tuple[type[BaseException], ...]:
    return (
        requests.exceptions.ConnectionError,
        requests.exceptions.ChunkedEncodingError,
        requests.exceptions.Timeout,
        urllib3.exceptions.HTTPError,
        OSError,
    )


class HttpBackend(DownloadBackend):
    """HTTP(S) with connection pooling, urllib3 retries and 1 MiB streamed chunks.

    Args:
        headers: sent with every request, e.g. `{"Authorization": "Bearer ..."}`.
        auth: a `(user, password)` pair or a `requests.auth.AuthBase`.
        retries, backoff_factor, timeout: as in `DownloadManager`.

    Headers and auth go to the URL's host only; a redirect elsewhere does not get them.
    HTTP has no listing (`supports_listing` is False): shards on a web server are named
    by a brace range or a manifest, not a glob.
    """

    schemes: ClassVar[tuple[str, ...]] = ("http", "https")
    supports_ranges: ClassVar[bool] = True

    def __init__(
        self,
        *,
        headers: Optional[Mapping[str, str]] = None,
        auth: Union[tuple[str, str], requests.auth.AuthBase, None] = None,
        retries: int = 5,
        backoff_factor: float = 0.5,
        timeout: float = 60.0,
    ) -> None:
        super().__init__(retries=retries, backoff_factor=backoff_factor, timeout=timeout)
        retry = _Retry(
            total=retries,
            connect=retries,
            read=retries,
            status=retries,
            other=0,
            redirect=10,
            allowed_methods=frozenset({"GET", "HEAD"}),
            status_forcelist=RETRY_STATUSES,
            backoff_factor=backoff_factor,
            respect_retry_after_header=True,
            raise_on_status=False,  # hand back the last answer: its status goes in the error
        )
        self.session = _Session()
        self.session.headers.update(headers or {})
        self.session.own_headers = frozenset(headers or ())
        # Given per request (not as session.auth, which requests re-applies after redirects).
        if isinstance(auth, tuple):
            auth = requests.auth.HTTPBasicAuth(*auth)
        self.session.recording_auth = _RecordingAuth(auth) if auth is not None else None
        adapter = HTTPAdapter(max_retries=retry, pool_connections=4, pool_maxsize=POOL_SIZE)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)

    def _request(
        self, method: str, url: str, headers: dict[str, str], refusals_at_once: bool = False
    ) -> requests.Response:
        _REFUSALS_AT_ONCE.on = refusals_at_once or refusals_wanted_at_once()
        try:
            response = self.session.request(
                method,
                url,
                headers=headers,
                auth=self.session.recording_auth,
                stream=True,
                timeout=(self.timeout, self.timeout),
            )
        except _RedirectRefused as error:
            raise DownloadError(url, str(error)) from error
        except _INVALID as error:  # no host, a bad port, a bad header value: retrying cannot help
            raise InvalidArgumentError(url, f"not a usable HTTP request: {error}") from error
        except requests.exceptions.RetryError as error:
            raise NetworkError(url, f"still failing after {self.retries} retries: {error}") from error
        except _network_errors() as error:
            raise NetworkError(url, f"{type(error).__name__}: {error}") from error
        finally:
            _REFUSALS_AT_ONCE.on = False
        # A 416 to a request with a Range is reported as a stream (the manager decides);
        # to one without, it is final, as any other 4xx.
        if response.status_code >= 400 and (response.status_code != 416 or "Range" not in headers):
            _close_keeping_the_connection(response)
            where = f" (redirected to {response.url})" if response.url != url else ""
            raise HTTPStatusError(
                url,
                response.status_code,
                f"HTTP {response.status_code} {response.reason}{where}",
                retry_after=_retry_after(response),
            )
        return response

    def open(
        self,
        url: str,
        offset: int = 0,
        *,
        end: Optional[int] = None,
        if_range: Optional[str] = None,
        refusals_at_once: bool = False,
    ) -> ByteStream:
        """See `DownloadBackend.open`; `refusals_at_once` (also inside
        `framework.download.backend.refusals_at_once`): a 429 or 503 is raised at once
        (with the server's `Retry-After`), not retried: a parallel fetch hands the part
        to a connection the server serves."""
        # Byte offsets must count stored bytes, so ask for no content encoding.
        headers = {"Accept-Encoding": "identity"}
        if offset or end is not None:  # `end` (exclusive) bounds a part of a parallel fetch
            headers["Range"] = f"bytes={offset}-{'' if end is None else end - 1}"
            if if_range:  # another version comes whole (200), never as a spliced range
                headers["If-Range"] = if_range
        response = self._request("GET", url, headers, refusals_at_once)
        found = response.headers
        etag, modified, date = found.get("ETag"), found.get("Last-Modified"), found.get("Date")
        start, size = 0, _int(found.get("Content-Length"))
        close_delimited = size is None
        if response.status_code == 416:  # reported as is; the manager decides
            response.close()
            return ByteStream(
                iter(()),
                start=offset,
                size=parse_content_range(found.get("Content-Range"))[1],
                etag=etag,
                last_modified=modified,
                status=416,
                date=date,
            )
        length = None
        if response.status_code == 206:
            start, size = range_place(found.get("Content-Range"), size)
            # urllib3 counts a body against its Content-Length; without one, a cut connection
            # looks like the body's end, so a range is counted against its own length here.
            if close_delimited and start >= 0:
                length = range_body_length(found.get("Content-Range"))
        # A server that ignores "identity" anyway: its encoded bytes are not the object's,
        # so they are decoded; the stream says so, and the manager never resumes it.
        encoding = found.get("Content-Encoding", "").strip().lower() or None
        if encoding == "identity":
            encoding = None
        if encoding is not None and response.status_code == 200:
            size = None  # Content-Length counts encoded bytes
        pace = ReadPace()
        return ByteStream(
            self._chunks(response, url, decode=encoding is not None, length=length, pace=pace),
            start=start,
            size=size,
            etag=etag,
            last_modified=modified,
            status=response.status_code,
            close_callback=response.close,
            date=date,
            encoding=encoding,
            pace=pace,
        )

    def _chunks(
        self, response: requests.Response, url: str, decode: bool, length: Optional[int], pace: ReadPace
    ) -> Iterator[bytes]:
        # Reads as `pace` says (up to 1 MiB): what has arrived, or a window of bytes at
        # the rate seen; a connection that breaks keeps what came before the read under way.
        # A range without a Content-Length (`length`) ends at its length, as urllib3 ends a
        # body at its Content-Length: what a server sends past it is not the range's.
        raw, received = response.raw, 0
        limit = None if decode else length

        def read1(size: int) -> bytes:
            return raw.read1(size, decode_content=decode)

        def read(size: int) -> bytes:
            return raw.read(size, decode_content=decode)

        try:
            while chunk := pace.read(read1, read, None if limit is None else limit - received):
                if limit is not None:
                    chunk = chunk[: limit - received]
                received += len(chunk)
                if chunk:
                    yield chunk
                if received == limit:
                    if getattr(raw, "chunked", False):
                        _read_the_last_chunk(raw)
                    return
        except _network_errors() as error:
            raise NetworkError(url, f"connection broke off: {type(error).__name__}") from error
        if limit is not None and received < limit:
            raise NetworkError(url, f"connection closed after {received} of the range's {limit} bytes")

    def stat(self, url: str) -> RemoteInfo:
        response = self._request("HEAD", url, {"Accept-Encoding": "identity"})
        response.close()
        size, headers = _int(response.headers.get("Content-Length")), response.headers
        return RemoteInfo(size, headers.get("ETag"), headers.get("Last-Modified"), headers.get("Date"))

    def close(self) -> None:
        self.session.close()


def _read_the_last_chunk(raw: Any) -> None:
    """Read the terminating chunk of a chunked range whose bytes are all here, so that its
    connection goes back to the pool; if it does not come at once (a server that stalls
    before it), or more comes (bytes past the range, dropped), the connection is closed
    instead. urllib3 sets the socket's timeout again for the connection's next request."""
    sock = getattr(getattr(raw, "connection", None), "sock", None)
    with contextlib.suppress(*_network_errors()):
        if sock is not None:
            sock.settimeout(_LAST_CHUNK_WAIT_S)
        raw.read1(1, decode_content=False)


def _retry_after(response: requests.Response) -> Optional[float]:
    """The seconds an answer's `Retry-After` asks to wait (at most `MAX_RETRY_AFTER_S`)."""
    return retry_after_seconds(response.headers.get("Retry-After"))


def retry_after_seconds(value: Optional[str]) -> Optional[float]:
    """The seconds a `Retry-After` value asks to wait, delay-seconds or an HTTP-date (a
    past one is 0), at most `MAX_RETRY_AFTER_S`; None for none or one that is neither
    (`-5`, `1.5`). The S3 backend reads its refusals with it too."""
    if value is None:
        return None
    try:
        return min(max(0.0, float(Retry().parse_retry_after(value))), MAX_RETRY_AFTER_S)
    except (urllib3.exceptions.InvalidHeader, ValueError, TypeError, OverflowError):
        return None


_SMALL_BODY: Final = 64 << 10


def _close_keeping_the_connection(response: Any) -> None:
    """Close an answer that is not a body we keep (a refusal, an error): a short body is
    read first, so its connection goes back to the pool instead of being dropped (a
    server refusing connections beyond its limit would otherwise see a new one for each
    retry)."""
    length = _int(response.headers.get("Content-Length"))
    if length is not None and length <= _SMALL_BODY:
        try:
            response.content  # noqa: B018 (read: releases the connection to the pool)
        except Exception:  # a broken body: the connection is dropped below, as before
            pass
    response.close()


def _int(value: Any) -> Optional[int]:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
