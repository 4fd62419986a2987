"""`FsspecBackend`: any scheme fsspec knows and no other backend claims
(``gs://``, ``az://``, ``hf://``, ``memory://``...); ``pip install 'framework[fsspec]'``.

It lists no scheme of its own: the manager turns to it (`accepts`) only for a scheme
that no registered backend declares, so ``http``, ``s3`` and ``file`` stay with their
own backends unless a manager is given ``backends={"http": FsspecBackend()}``. The
filesystem's own packages (gcsfs, adlfs, huggingface_hub...) are fsspec's business; a
missing one is a `MissingDependencyError` saying what to install.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO, Final, Optional

from framework.download.backend import ByteStream, DownloadBackend, RemoteInfo
from framework.errors import (
    DownloadError,
    HTTPStatusError,
    InvalidArgumentError,
    MissingDependencyError,
    NetworkError,
)

__all__ = ["FsspecBackend"]

CHUNK_SIZE: Final = 1 << 20
_NEEDS_FSSPEC: Final = "this scheme needs fsspec: pip install 'framework[fsspec]'"
# What filesystems call an object's version, and its change time, in `info()`.
_ETAG_KEYS: Final = ("ETag", "etag", "md5Hash", "version_id")
_MODIFIED_KEYS: Final = ("LastModified", "last_modified", "updated", "mtime", "created")


def _network_errors() -> tuple[type[BaseException], ...]:
    errors: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)
    try:
        import aiohttp
    except ImportError:
        return errors
    return (*errors, aiohttp.ClientError)


def _first(info: Mapping[str, Any], keys: tuple[str, ...]) -> Optional[str]:
    for key in keys:
        if info.get(key) is not None:
            return str(info[key])
    return None


def _translate(url: str, what: str, error: BaseException) -> DownloadError:
    # fsspec's HTTP `info` reports every failure as FileNotFoundError: the cause says more.
    cause = error.__cause__ if isinstance(error, FileNotFoundError) and error.__cause__ else error
    status = getattr(cause, "status", None)  # aiohttp's ClientResponseError
    if isinstance(status, int) and status >= 400:
        return HTTPStatusError(url, status, f"HTTP {status} ({what})")
    if isinstance(cause, FileNotFoundError):
        return HTTPStatusError(url, 404, f"no such object ({what})")
    if isinstance(cause, PermissionError):
        return HTTPStatusError(url, 403, f"permission denied ({what}): {cause}")
    if isinstance(cause, _network_errors()):
        return NetworkError(url, f"{what}: {type(cause).__name__}: {cause}")
    return DownloadError(url, f"{what}: {type(cause).__name__}: {cause}")  # an unusable URL or setting


class FsspecBackend(DownloadBackend):
    """Objects of any filesystem fsspec knows, read from an offset in 1 MiB chunks.

    Args:
        storage_options: passed to the filesystem (credentials, a project, an endpoint),
            as in ``fsspec.open(url, **storage_options)``.
        retries, backoff_factor, timeout: as in `DownloadManager` (fsspec's filesystems
            keep their own retry policies).
    """

    def __init__(
        self,
        *,
        storage_options: Optional[Mapping[str, Any]] = None,
        retries: int = 5,
        backoff_factor: float = 0.5,
        timeout: float = 60.0,
    ) -> None:
        super().__init__(retries=retries, backoff_factor=backoff_factor, timeout=timeout)
        self.storage_options = dict(storage_options or {})

    @classmethod
    def accepts(cls, scheme: str) -> bool:
        try:
            import fsspec
        except ImportError:
            return False
        return scheme in fsspec.available_protocols()

    def _call(self, url: str, what: str, function: Any, *args: Any) -> Any:
        """`function(*args)`, with fsspec's and the filesystems' errors as `DownloadError`s."""
        failures: tuple[type[BaseException], ...] = (OSError, ValueError, *_network_errors())
        try:
            return function(*args)
        except DownloadError:
            raise
        except ImportError as error:  # gcsfs, adlfs...: fsspec says which
            raise MissingDependencyError(url, str(error)) from error
        except failures as error:
            raise _translate(url, what, error) from error

    def _filesystem(self, url: str) -> tuple[Any, str]:
        try:
            from fsspec.core import url_to_fs
        except ImportError as error:
            raise MissingDependencyError(url, _NEEDS_FSSPEC) from error
        found: tuple[Any, str] = self._call(
            url, "opening the filesystem", lambda: url_to_fs(url, **self.storage_options)
        )
        return found

    def _describe(self, url: str, fs: Any, path: str) -> dict[str, Any]:
        info: dict[str, Any] = self._call(url, "reading its description", fs.info, path)
        if info.get("type", "file") != "file":
            raise InvalidArgumentError(url, f"{path} is a {info['type']}, not a file")
        return info

    def open(self, url: str, offset: int = 0, *, if_range: Optional[str] = None) -> ByteStream:
        # `if_range` is not sent: the validators read from `info` name the version, and
        # the manager compares them with the ones its partial file was made from.
        fs, path = self._filesystem(url)
        info = self._describe(url, fs, path)
        size, etag, modified = info.get("size"), _first(info, _ETAG_KEYS), _first(info, _MODIFIED_KEYS)
        if size is not None and offset > size:
            return ByteStream(
                iter(()), start=offset, size=size, etag=etag, last_modified=modified, status=416
            )
        file: BinaryIO = self._call(url, "opening it", fs.open, path, "rb")
        if offset:
            self._call(url, "seeking", file.seek, offset)
        return ByteStream(
            self._chunks(file, url),
            start=offset,
            size=size,
            etag=etag,
            last_modified=modified,
            status=206 if offset else 200,
            close_callback=file.close,
        )

    def _chunks(self, file: BinaryIO, url: str) -> Iterator[bytes]:
        while chunk := self._call(url, "reading", file.read, CHUNK_SIZE):
            yield chunk

    def stat(self, url: str) -> RemoteInfo:
        fs, path = self._filesystem(url)
        info = self._describe(url, fs, path)
        return RemoteInfo(info.get("size"), _first(info, _ETAG_KEYS), _first(info, _MODIFIED_KEYS))
