"""`LocalBackend`: plain paths and ``file://`` URLs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import BinaryIO, Final
from urllib.parse import unquote, urlsplit
from urllib.request import url2pathname

from framework.download.backend import ByteStream, DownloadBackend, RemoteInfo
from framework.errors import DownloadError

__all__ = ["LocalBackend"]

_CHUNK: Final = 4 << 20


def _path(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme != "file":
        return url
    if parts.netloc not in ("", "localhost"):
        raise DownloadError(url, f"file:// URLs on another host ({parts.netloc}) are not supported")
    return url2pathname(unquote(parts.path))


def _chunks(file: BinaryIO) -> Iterator[bytes]:
    while chunk := file.read(_CHUNK):
        yield chunk


class LocalBackend(DownloadBackend):
    """Reads a local file (a plain path or a ``file://`` URL)."""

    def _open_file(self, url: str) -> BinaryIO:
        path = _path(url)
        try:
            return open(path, "rb")
        except FileNotFoundError as error:
            raise DownloadError(url, f"no such file: {path}") from error
        except IsADirectoryError as error:
            raise DownloadError(url, f"{path} is a directory, not a file") from error
        except OSError as error:
            raise DownloadError(url, f"cannot read {path}: {error.strerror}") from error

    def open(self, url: str, offset: int = 0) -> ByteStream:
        file = self._open_file(url)
        size = os.fstat(file.fileno()).st_size
        file.seek(min(offset, size))
        return ByteStream(_chunks(file), start=offset, size=size, close_callback=file.close)

    def stat(self, url: str) -> RemoteInfo:
        with self._open_file(url) as file:
            return RemoteInfo(size=os.fstat(file.fileno()).st_size)
