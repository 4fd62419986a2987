"""A download backend for a new URL scheme: ``numbers://COUNT``.

It serves the integers ``0 .. COUNT-1``, one a line, generated on the fly. The
download manager does everything else (lock, temporary file, verification, atomic
publish, cache), exactly as for HTTP.
"""

from __future__ import annotations

import hashlib
from typing import ClassVar, Optional
from urllib.parse import urlsplit

from framework.download.backend import ByteStream, DownloadBackend
from framework.errors import DownloadError


def _body(url: str) -> bytes:
    count_text = urlsplit(url).netloc
    if not count_text.isdigit():
        raise DownloadError(url, "expected numbers://COUNT with COUNT a non-negative integer")
    return "".join(f"{n}\n" for n in range(int(count_text))).encode("ascii")


class NumbersBackend(DownloadBackend):
    """Serves ``numbers://COUNT``: the integers below COUNT, one a line."""

    supports_ranges: ClassVar[bool] = True  # `open` honours `end`

    def open(
        self, url: str, offset: int = 0, *, end: Optional[int] = None, if_range: Optional[str] = None
    ) -> ByteStream:
        # The body is made from the URL alone, so `if_range` always names this version.
        body = _body(url)
        etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
        if offset > len(body):  # past the end: reported, as HTTP's 416; the manager decides
            return ByteStream(iter(()), start=offset, size=len(body), etag=etag, status=416)
        rest = body[offset:end]
        chunks = (rest[i : i + 65536] for i in range(0, len(rest), 65536))
        status = 206 if offset or end is not None else 200  # a range is a 206, as in HTTP
        return ByteStream(chunks, start=offset, size=len(body), etag=etag, status=status)
