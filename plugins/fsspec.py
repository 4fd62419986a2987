"""`FsspecBackend`: any scheme fsspec knows and no other backend claims
(`gs://`, `az://`, `hf://`, `memory://`...); `pip install 'framework[fsspec]'`.

It lists no scheme of its own: the manager turns to it (`accepts`) only for a scheme
that no registered backend declares, so `http`, `s3` and `file` stay with their
own backends unless a manager is given `backends={"http": FsspecBackend()}`. The
filesystem's own packages (gcsfs, adlfs, huggingface_hub...) are fsspec's business; a
missing one is a `MissingDependencyError` saying what to install.

A filesystem may read one object as several requests (fsspec's HTTP file asks for 5 MiB
ranges, none conditional), so a body could mix two versions: after the last chunk the
object is described again, and a change of its validators or size is a `NetworkError`,
on which the manager starts over from the new version. Chained URLs (`zip://x::...`)
are refused. For `http`/`https`, storage options carrying headers or auth are refused:
fsspec would send them to any host a redirect names (use `HttpBackend`). The
filesystems are made for this backend alone (not fsspec's shared instances), so `close`
closes their sessions.
"""

from __future__ import annotations

import builtins
import posixpath
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO, ClassVar, Final, Optional

from framework.download.backend import (
    ByteStream,
    DownloadBackend,
    ListedObject,
    RemoteInfo,
    range_unsupported,
)
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
_MODIFIED_KEYS: Final = ("LastModified", "Last-Modified", "last_modified", "updated", "mtime", "created")
# Storage options that carry credentials fsspec's HTTP filesystem would hand to a redirect.
_HTTP_CREDENTIALS: Final = ("headers", "auth", "client_kwargs")


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


def _validators(info: Mapping[str, Any]) -> tuple[Any, Optional[str], Optional[str]]:
    return info.get("size"), _first(info, _ETAG_KEYS), _first(info, _MODIFIED_KEYS)


def _close_filesystem(fs: Any) -> None:
    """Close the client session an fsspec filesystem holds (aiohttp for HTTP, gcsfs; s3fs's
    client), the way the filesystem's own finalizer would."""
    for attribute in ("_session", "_s3"):
        session = getattr(fs, attribute, None)
        closer = getattr(fs, "close_session", None)
        if session is not None and callable(closer):
            closer(getattr(fs, "loop", None), session)
            setattr(fs, attribute, None)


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
            as in `fsspec.open(url, **storage_options)`.
        retries, backoff_factor, timeout: as in `DownloadManager` (fsspec's filesystems
            keep their own retry policies).
    """

    supports_listing: ClassVar[bool] = True  # through the filesystem's `find`

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
        self._filesystems: dict[str, Any] = {}  # by fsspec token: ours to close

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
        except Exception as error:  # odd filesystems (reference://, dir://...) raise anything
            raise DownloadError(url, f"{what}: {type(error).__name__}: {error}") from error

    def _filesystem(self, url: str) -> tuple[Any, str]:
        try:
            from fsspec.core import url_to_fs
        except ImportError as error:
            raise MissingDependencyError(url, _NEEDS_FSSPEC) from error
        if "::" in url:
            raise InvalidArgumentError(
                url,
                "chained fsspec URLs (a::b) are not supported; "
                "download the outer object and open it yourself",
            )
        scheme = url.split("://", 1)[0].lower()
        carried = [key for key in _HTTP_CREDENTIALS if key in self.storage_options]
        if scheme in ("http", "https") and carried:
            raise InvalidArgumentError(
                url,
                f"FsspecBackend(storage_options={{{', '.join(map(repr, carried))}: ...}}) for HTTP: fsspec "
                "sends them to any host a redirect names; use HttpBackend(headers=..., auth=...), "
                "which keeps them to the URL's host",
            )
        fs, path = self._call(
            url,
            "opening the filesystem",
            lambda: url_to_fs(url, skip_instance_cache=True, **self.storage_options),
        )
        # One filesystem (one session) per distinct setting, reused until `close`.
        fs = self._filesystems.setdefault(str(getattr(fs, "_fs_token", id(fs))), fs)
        return fs, path

    def _describe(self, url: str, fs: Any, path: str) -> dict[str, Any]:
        info: dict[str, Any] = self._call(url, "reading its description", fs.info, path)
        if info.get("type", "file") != "file":
            raise InvalidArgumentError(url, f"{path} is a {info['type']}, not a file")
        return info

    def open(
        self, url: str, offset: int = 0, *, end: Optional[int] = None, if_range: Optional[str] = None
    ) -> ByteStream:
        # `if_range` is not sent: the validators read from `info` name the version, and
        # the manager compares them with the ones its partial file was made from.
        if end is not None:
            raise range_unsupported(url, self, offset, end)
        fs, path = self._filesystem(url)
        info = self._describe(url, fs, path)
        size, etag, modified = version = _validators(info)
        if size is not None and offset > size:
            return ByteStream(
                iter(()), start=offset, size=size, etag=etag, last_modified=modified, status=416
            )
        file: BinaryIO = self._call(url, "opening it", fs.open, path, "rb")
        if offset:
            self._call(url, "seeking", file.seek, offset)
        return ByteStream(
            self._chunks(file, url, fs, path, version),
            start=offset,
            size=size,
            etag=etag,
            last_modified=modified,
            status=206 if offset else 200,
            close_callback=file.close,
        )

    def _chunks(
        self, file: BinaryIO, url: str, fs: Any, path: str, version: tuple[Any, ...]
    ) -> Iterator[bytes]:
        while chunk := self._call(url, "reading", file.read, CHUNK_SIZE):
            yield chunk
        # The body may have come as several unconditional requests: still one version?
        self._forget_description(fs, path)
        now = _validators(self._describe(url, fs, path))
        if now != version:
            before, after = ", ".join(map(str, version)), ", ".join(map(str, now))
            why = f"the object changed while it was read (size, etag, modified: {before} -> {after})"
            raise NetworkError(url, f"{why}; reading it again")

    @staticmethod
    def _forget_description(fs: Any, path: str) -> None:
        """Drop what the filesystem remembers of `path`, so `info` asks again."""
        invalidate = getattr(fs, "invalidate_cache", None)
        if callable(invalidate):
            invalidate(path)

    def close(self) -> None:
        filesystems, self._filesystems = self._filesystems, {}
        for fs in filesystems.values():
            _close_filesystem(fs)

    def list(self, prefix: str, *, recursive: bool = True) -> builtins.list[ListedObject]:
        """The files whose path starts with the prefix's, found by the filesystem's `find`
        in the folder the prefix ends in (one level down with `recursive=False`)."""
        fs, path = self._filesystem(prefix)
        if prefix.endswith("/") and not path.endswith("/"):
            path += "/"  # fsspec strips it: the folder itself, not the names starting with its name
        folder = path.rstrip("/") if path.endswith("/") else posixpath.dirname(path)
        depth = None if recursive else 1
        try:
            found = self._call(prefix, "listing", lambda: fs.find(folder, maxdepth=depth, detail=True))
        except HTTPStatusError as error:
            if error.status == 404:  # no such folder: nothing under the prefix
                return []
            raise
        listed = []
        for name, info in found.items():
            rest = name[len(path) :]
            if (
                name.startswith(path)
                and info.get("type", "file") == "file"
                and (recursive or "/" not in rest)
            ):
                size, etag, modified = _validators(info)
                listed.append(ListedObject(prefix + rest, size=size, etag=etag, last_modified=modified))
        return sorted(listed, key=lambda item: item.url)

    def stat(self, url: str) -> RemoteInfo:
        fs, path = self._filesystem(url)
        info = self._describe(url, fs, path)
        return RemoteInfo(info.get("size"), _first(info, _ETAG_KEYS), _first(info, _MODIFIED_KEYS))
