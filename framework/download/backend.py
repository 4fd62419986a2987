"""`DownloadBackend`: the one small interface a storage scheme implements.

A backend knows how to open a byte stream at an offset and how to describe the
remote object (size, etag). Locking, publishing, verifying, resuming, extracting
and progress all live once, in `DownloadManager`.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import TracebackType
from typing import Callable, Optional

import attrs

from framework.registry import Registrable

__all__ = ["ByteStream", "DownloadBackend", "RemoteInfo"]


@attrs.frozen
class RemoteInfo:
    """What a backend knows about a remote object without reading it."""

    size: Optional[int] = None
    etag: Optional[str] = None


@attrs.define
class ByteStream:
    """An open body: `chunks` yields bytes starting at byte `start` of the object.

    `start` is the offset the body really begins at: the requested offset, or 0
    when the backend could not resume (an HTTP server answering 200 to a Range
    request). `size` is the object's total size when known. An offset exactly at
    the end of the object gives an empty `chunks` with ``start == offset``; an
    offset the backend cannot serve (HTTP 416) is answered from 0 instead.
    """

    chunks: Iterator[bytes]
    start: int = 0
    size: Optional[int] = None
    etag: Optional[str] = None
    close_callback: Optional[Callable[[], None]] = attrs.field(default=None, repr=False)

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


class DownloadBackend(Registrable):
    """Reads objects of one URL scheme; registered by name (``"http"``, ``"s3"``, ...).

    The manager maps a URL scheme to the backend registered under that name
    (``http``/``https`` -> ``"http"``, ``file`` and plain paths -> ``"local"``), so a
    plugin adds a scheme by registering a backend under the scheme's name.

    Subclasses implement `open` and may override `stat`. Failures are raised as
    `framework.errors.DownloadError` subclasses naming the URL: `HTTPStatusError`
    for a final refusal, `NetworkError` for a connection that failed or broke off
    (the manager resumes from the bytes it already has).
    """

    def __init__(self, *, retries: int = 5, backoff_factor: float = 0.5, timeout: float = 60.0) -> None:
        self.retries = retries
        self.backoff_factor = backoff_factor
        self.timeout = timeout

    def open(self, url: str, offset: int = 0) -> ByteStream:
        """Open `url` for reading from byte `offset` (see `ByteStream.start`)."""
        raise NotImplementedError

    def stat(self, url: str) -> RemoteInfo:
        """Size and etag of `url`; by default taken from a stream opened at 0."""
        with self.open(url, 0) as stream:
            return RemoteInfo(stream.size, stream.etag)

    def close(self) -> None:
        """Release pooled connections; the backend may be used again afterwards."""
