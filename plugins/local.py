"""`LocalBackend`: plain paths and `file://` URLs.

A `file://` URL is percent-decoded exactly once; a plain path is never decoded
(the manager turns it into a `file://` URL with its `%` escaped). Only regular
files are read: a folder, FIFO or device is refused at once, never waited on.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from typing import BinaryIO, ClassVar, Final, Optional
from urllib.parse import urlsplit
from urllib.request import url2pathname

from framework.download.backend import ByteStream, DownloadBackend, RemoteInfo, range_unsupported
from framework.errors import DownloadError, InvalidArgumentError

__all__ = ["LocalBackend"]

_CHUNK: Final = 4 << 20


def _path(url: str) -> str:
    """The file a plain path or `file://` URL names; any other scheme is refused (read
    as a path, `local:///etc/x` would be the relative `local:/etc/x`)."""
    if "://" not in url:
        return url
    parts = urlsplit(url)
    if parts.scheme.lower() != "file":
        raise InvalidArgumentError(
            url, f"the local backend reads paths and file:// URLs, not {parts.scheme}://"
        )
    if parts.netloc not in ("", "localhost"):
        raise InvalidArgumentError(url, f"file:// URLs on another host ({parts.netloc}) are not supported")
    path = url2pathname(parts.path)  # which percent-decodes, once
    if "\x00" in path:
        raise InvalidArgumentError(url, "%00 (a NUL byte) in a file:// URL names no file")
    return path


def _chunks(file: BinaryIO) -> Iterator[bytes]:
    while chunk := file.read(_CHUNK):
        yield chunk


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a socket" if stat.S_ISSOCK(mode) else "not a regular file"


class LocalBackend(DownloadBackend):
    """Reads a local file (a plain path or a `file://` URL)."""

    schemes: ClassVar[tuple[str, ...]] = ("file",)
    supports_ranges: ClassVar[bool] = False  # one stream: a local read gains nothing from parts

    def check_url(self, url: str) -> None:
        _path(url)

    def _open_file(self, url: str) -> BinaryIO:
        path = _path(url)
        try:
            # Non-blocking, so that opening a FIFO with no writer returns at once.
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError as error:
            raise DownloadError(url, f"no such file: {path}") from error
        except OSError as error:
            raise DownloadError(url, f"cannot read {path}: {error.strerror}") from error
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise DownloadError(url, f"{path} is {_kind(mode)}, not a regular file; give the path of a file")
        os.set_blocking(fd, True)
        return open(fd, "rb")

    def open(
        self, url: str, offset: int = 0, *, end: Optional[int] = None, if_range: Optional[str] = None
    ) -> ByteStream:
        # A local file has no validator, so `if_range` never comes (accepted for the signature).
        if end is not None:
            raise range_unsupported(url, self, offset, end)
        file = self._open_file(url)
        size = os.fstat(file.fileno()).st_size
        if offset > size:  # the file shrank under a partial: reported, the manager starts over
            file.close()
            return ByteStream(iter(()), start=offset, size=size, status=416)
        file.seek(offset)
        return ByteStream(_chunks(file), start=offset, size=size, close_callback=file.close)

    def stat(self, url: str) -> RemoteInfo:
        with self._open_file(url) as file:
            return RemoteInfo(size=os.fstat(file.fileno()).st_size)
