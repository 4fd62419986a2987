"""`DownloadManager` and `cached_path`: fetch once, verify, publish atomically.

A cache hit costs a ``stat`` and a sidecar read. A miss takes the entry's lock,
looks again (another process may have just published it), streams the bytes into
a private temporary file with the backend chosen by the URL's scheme, verifies
and publishes them with ``os.replace``, then writes the sidecar.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Union
from urllib.parse import urlsplit

from framework.download._cache import Entry
from framework.download._extract import (
    DEFAULT_MAX_MEMBERS,
    DEFAULT_MAX_RATIO,
    DEFAULT_MAX_SIZE,
    ExtractLimits,
    extract_archive,
)
from framework.download._lock import EntryLock, LockKind
from framework.download._publish import fetch, partial_bytes, publish_file
from framework.download.backend import DownloadBackend
from framework.errors import DownloadError, OfflineError

__all__ = ["DownloadManager", "backend_name_for", "cached_path", "default_cache_dir"]

logger = logging.getLogger("framework.download")

PathOrUrl = Union[str, os.PathLike[str]]

_FIXED_SCHEMES = {"http": "http", "https": "http", "s3": "s3", "file": "local", "": "local"}


def default_cache_dir() -> Path:
    """``$FRAMEWORK_CACHE``, else ``~/.cache/framework``."""
    value = os.environ.get("FRAMEWORK_CACHE")
    return Path(value).expanduser() if value else Path.home() / ".cache" / "framework"


def _env_offline() -> bool:
    return os.environ.get("FRAMEWORK_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _normalize(url_or_path: PathOrUrl) -> str:
    """A URL for the cache key; plain paths become absolute ``file://`` URLs."""
    text = os.fspath(url_or_path)
    scheme = urlsplit(text).scheme
    if "://" in text and len(scheme) > 1:
        return text
    return Path(text).expanduser().resolve().as_uri()


def backend_name_for(url: str) -> str:
    """The backend name for `url`'s scheme (an unregistered scheme maps to itself)."""
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    return _FIXED_SCHEMES.get(scheme, scheme)


def _known_schemes() -> list[str]:
    names = set(DownloadBackend.list_available())
    schemes = {s for s, n in _FIXED_SCHEMES.items() if s and n in names}
    return sorted(schemes | (names - set(_FIXED_SCHEMES.values())))


class DownloadManager:
    """The settings for fetching into a cache, and the method that does it.

    Args:
        cache_dir: where entries live; `None` reads ``$FRAMEWORK_CACHE`` at each call.
        lock: ``"filelock"`` (flock), ``"softfilelock"`` (a marker file, for filesystems
            without working ``flock``), or ``"none"``. Correctness never depends on it.
        lock_timeout: seconds a waiter tolerates without the holder making progress.
        retries: attempts per download (connection errors, 5xx, 408, 429, broken bodies).
        backoff_factor: exponential backoff base between attempts, in seconds.
        timeout: seconds a connection may stay silent.
        offline: serve only the cache; `None` reads ``FRAMEWORK_OFFLINE`` at each call.
        progress: show tqdm bars (only when stderr is a terminal).
        max_extract_size, max_extract_ratio, max_extract_members: caps on what an
            archive may expand to (bytes, bytes per archive byte, members).
    """

    def __init__(
        self,
        cache_dir: Optional[PathOrUrl] = None,
        *,
        lock: LockKind = "filelock",
        lock_timeout: float = 600.0,
        retries: int = 5,
        backoff_factor: float = 0.5,
        timeout: float = 60.0,
        offline: Optional[bool] = None,
        progress: bool = True,
        max_extract_size: int = DEFAULT_MAX_SIZE,
        max_extract_ratio: float = DEFAULT_MAX_RATIO,
        max_extract_members: int = DEFAULT_MAX_MEMBERS,
    ) -> None:
        if lock not in ("filelock", "softfilelock", "none"):
            raise ValueError(f"lock must be 'filelock', 'softfilelock' or 'none', got {lock!r}")
        self._cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else None
        self.lock = lock
        self.lock_timeout = lock_timeout
        self.retries = max(1, retries)
        self.backoff_factor = backoff_factor
        self.timeout = timeout
        self._offline = offline
        self.progress = progress
        self.limits = ExtractLimits(max_extract_size, max_extract_ratio, max_extract_members)
        self._backends: dict[str, DownloadBackend] = {}
        self._backends_pid = os.getpid()

    @property
    def cache_dir(self) -> Path:
        """The cache folder this manager uses when a call does not name one."""
        return self._cache_dir if self._cache_dir is not None else default_cache_dir()

    @property
    def offline(self) -> bool:
        """Whether only cached files are served (no network at all)."""
        return self._offline if self._offline is not None else _env_offline()

    def backend_for(self, url: str) -> DownloadBackend:
        """The backend for `url`'s scheme, one instance per name (connections are pooled)."""
        if self._backends_pid != os.getpid():  # never share pooled sockets across fork
            self._backends, self._backends_pid = {}, os.getpid()
        name = backend_name_for(url)
        backend = self._backends.get(name)
        if backend is None:
            if name not in DownloadBackend.list_available():
                raise DownloadError(
                    url,
                    f"no download backend for the scheme {name!r}; known schemes: "
                    f"{', '.join(_known_schemes())}. A plugin adds one by registering a "
                    f"DownloadBackend under the scheme's name",
                )
            cls = DownloadBackend.by_name(name)
            backend = cls(retries=self.retries, backoff_factor=self.backoff_factor, timeout=self.timeout)
            self._backends[name] = backend
        return backend

    def cached_path(
        self,
        url_or_path: PathOrUrl,
        *,
        cache_dir: Optional[PathOrUrl] = None,
        sha256: Optional[str] = None,
        extract: bool = False,
        force: bool = False,
        progress: Optional[bool] = None,
        revalidate: bool = False,
    ) -> Path:
        """The local path of `url_or_path`'s verified bytes inside the cache folder.

        Args:
            url_or_path: ``http(s)://``, ``s3://``, ``file://``, a plain path, or any
                scheme a plugin registered a backend for.
            cache_dir: overrides the manager's cache folder for this call.
            sha256: expected hex digest; a cached copy with another digest is refetched,
                a download that does not match raises `ChecksumError`.
            extract: unpack the tar/zip archive and return the extracted folder.
            force: fetch (and extract) again even when cached.
            progress: overrides the manager's setting for this call.
            revalidate: ask the server whether a cached copy is still current (one
                ``stat``, e.g. an HTTP HEAD); refetch when its etag or size changed.

        Raises:
            DownloadError: or a subclass (`HTTPStatusError`, `NetworkError`,
                `ChecksumError`, `UnsafeArchiveError`, `OfflineError`,
                `LockTimeoutError`); nothing is published when one is raised.
        """
        url = _normalize(url_or_path)
        root = Path(cache_dir).expanduser() if cache_dir is not None else self.cache_dir
        entry = Entry(root, url)
        if revalidate and not force and not self.offline:
            force = self._stale(entry, sha256)
        if not force and entry.lookup(sha256) is not None:
            if not extract:
                return entry.final
            if os.path.isdir(entry.extracted):
                return entry.extracted
        offline = self.offline
        if offline and (force or entry.lookup(sha256) is None):
            raise OfflineError(
                url,
                f"offline mode (FRAMEWORK_OFFLINE=1) and no verified copy in {root}; "
                "run once online, or unset FRAMEWORK_OFFLINE",
            )
        show = (self.progress if progress is None else progress) and sys.stderr.isatty()
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise DownloadError(
                url,
                f"cannot create the cache folder {root}: {error.strerror}; "
                "set FRAMEWORK_CACHE (or cache_dir) to a writable folder",
            ) from error

        def done() -> bool:  # another process published what we need: stop waiting
            if force or entry.lookup(sha256) is None:
                return False
            return not extract or os.path.isdir(entry.extracted)

        with self._lock(entry, show, done) as lock:
            fetched = False
            if force or entry.lookup(sha256) is None:
                self._fetch(entry, sha256, show, lock)
                fetched = True
            if not extract:
                return entry.final
            if fetched or force or not os.path.isdir(entry.extracted):
                logger.info("extracting %s to %s", entry.final, entry.extracted)
                extract_archive(entry.final, entry.extracted, url, self.limits, replace=True)
            return entry.extracted

    def _stale(self, entry: Entry, sha256: Optional[str]) -> bool:
        """Whether the server's object differs from the cached copy (by etag, else size)."""
        meta = entry.lookup(sha256)
        if meta is None:
            return False  # nothing cached: an ordinary fetch follows anyway
        info = self.backend_for(entry.url).stat(entry.url)
        if info.etag is not None and meta.get("etag") is not None:
            changed = info.etag != meta.get("etag")
        else:
            changed = info.size is not None and info.size != meta.get("size")
        if changed:
            logger.info("%s changed on the server; fetching it again", entry.url)
        return changed

    def _lock(self, entry: Entry, show: bool, done: Callable[[], bool]) -> EntryLock:
        on_wait: Optional[Callable[[int, Optional[int]], None]] = None
        if show:
            on_wait = _WaitBar(entry.final.name)
        return EntryLock(
            entry.lock,
            self.lock,
            self.lock_timeout,
            entry.url,
            progress=lambda: partial_bytes(entry.final),
            on_wait=on_wait,
            done=done,
        )

    def _fetch(self, entry: Entry, sha256: Optional[str], show: bool, lock: EntryLock) -> None:
        backend = self.backend_for(entry.url)
        logger.info("downloading %s to %s", entry.url, entry.final)
        result = fetch(
            backend,
            entry.url,
            entry.final,
            sha256=sha256,
            attempts=self.retries,
            backoff_factor=self.backoff_factor,
            progress=show,
            on_size=lambda size: lock.record(size=size),
        )
        publish_file(result.temp, entry.final)
        entry.publish_metadata(result.etag, result.size, result.sha256)
        logger.info("published %s (%d bytes, sha256 %s)", entry.final, result.size, result.sha256)


class _WaitBar:
    """A waiter's view of the holder's progress, drawn from the partial file's size."""

    def __init__(self, desc: str) -> None:
        self.desc = desc
        self.bar: Any = None

    def __call__(self, seen: int, total: Optional[int]) -> None:
        if self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=total,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=f"waiting: {self.desc}",
            )
        if total is not None:
            self.bar.total = total
        self.bar.n = seen
        self.bar.refresh()

    def __del__(self) -> None:
        if self.bar is not None:
            self.bar.close()


_default_manager: Optional[DownloadManager] = None


def cached_path(
    url_or_path: PathOrUrl,
    *,
    cache_dir: Optional[PathOrUrl] = None,
    sha256: Optional[str] = None,
    extract: bool = False,
    force: bool = False,
    progress: bool = True,
) -> Path:
    """`DownloadManager.cached_path` on a default manager (settings from the environment)."""
    global _default_manager
    if _default_manager is None:
        _default_manager = DownloadManager()
    return _default_manager.cached_path(
        url_or_path,
        cache_dir=cache_dir,
        sha256=sha256,
        extract=extract,
        force=force,
        progress=progress,
    )
