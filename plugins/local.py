"""`LocalBackend`: plain paths and `file://` URLs.

A `file://` URL is percent-decoded exactly once; a plain path is never decoded
(the manager turns it into a `file://` URL with its `%` escaped). Only regular
files are read: a folder, FIFO or device is refused at once, never waited on.
"""

from __future__ import annotations

import builtins
import os
import stat
from collections.abc import Iterator
from typing import BinaryIO, ClassVar, Final, Optional
from urllib.parse import quote, urlsplit
from urllib.request import url2pathname

from framework.download.backend import (
    ByteStream,
    DownloadBackend,
    ListedObject,
    RemoteInfo,
    range_unsupported,
)
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


def _files_under(prefix: str, recursive: bool) -> Iterator[tuple[str, int]]:
    """(path, size) of each regular file whose path starts with `prefix`, walking only
    the folders that can hold one (symbolic links to folders are not followed)."""
    top = os.path.dirname(prefix)
    pending = [top]
    while pending:
        folder = pending.pop()
        try:
            entries = list(os.scandir(folder or "."))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            path = os.path.join(folder, entry.name) if folder else entry.name
            if entry.is_dir(follow_symlinks=False):
                # A folder is walked if it can still hold a match: it extends the prefix,
                # or the prefix goes on inside it.
                inside = path + os.sep
                if recursive and (inside.startswith(prefix) or prefix.startswith(inside)):
                    pending.append(path)
            elif path.startswith(prefix) and entry.is_file():
                yield path, entry.stat().st_size


class LocalBackend(DownloadBackend):
    """Reads a local file (a plain path or a `file://` URL)."""

    schemes: ClassVar[tuple[str, ...]] = ("file",)
    supports_ranges: ClassVar[bool] = False  # one stream: a local read gains nothing from parts
    supports_listing: ClassVar[bool] = True

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

    def list(self, prefix: str, *, recursive: bool = True) -> builtins.list[ListedObject]:
        """The regular files whose path starts with `prefix` (a plain path, or a
        `file://` URL: then the rest of each name is percent-encoded)."""
        path = _path(prefix)
        # A file:// prefix ends percent-encoded where the path ends decoded: the rest of
        # each name is encoded again after the prefix as given.
        rest_of = (lambda rest: rest) if "://" not in prefix else (lambda rest: quote(rest, safe="/"))
        found = [
            ListedObject(prefix + rest_of(file[len(path) :]), size=size)
            for file, size in _files_under(path, recursive)
            if recursive or os.sep not in file[len(path) :]
        ]
        return sorted(found, key=lambda listed: listed.url)

    def stat(self, url: str) -> RemoteInfo:
        with self._open_file(url) as file:
            return RemoteInfo(size=os.fstat(file.fileno()).st_size)
