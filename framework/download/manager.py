"""`DownloadManager` and `cached_path`: fetch once, verify, publish atomically.

A cache hit costs a `stat` and a sidecar read. A miss takes the entry's lock,
looks again (another process may have just published it), streams the bytes into
a private temporary file with the backend chosen by the URL's scheme, verifies
and publishes them with `os.replace`, then writes the sidecar.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Callable, Optional

from framework._redact import RedactingFilter
from framework.download._bulk import Digests, check_workers, digests_for, fetch_all
from framework.download._cache import Entry, Metadata, binds
from framework.download._call import PathOrUrl, cache_writes, check_sha256, extracted, normalize
from framework.download._extract import (
    DEFAULT_MAX_MEMBERS,
    DEFAULT_MAX_RATIO,
    DEFAULT_MAX_SIZE,
    ExtractLimits,
    extract_archive,
)
from framework.download._fetch import fetch
from framework.download._lock import EntryLock, LockKind
from framework.download._partial import partial_bytes, publish_fetched
from framework.download._schemes import backend_name_for, describe_schemes, url_scheme
from framework.download._validators import Validators
from framework.download.backend import DownloadBackend, RemoteInfo
from framework.download.parallel import DEFAULT_PART_SIZE, MIN_PART_SIZE, connections_chosen, connections_from
from framework.errors import DownloadError, InvalidArgumentError, OfflineError

__all__ = ["DownloadManager", "backend_name_for", "cached_path", "default_cache_dir"]

logger = logging.getLogger("framework.download")
logger.addFilter(RedactingFilter())  # no URL's password or token reaches a log


def default_cache_dir() -> Path:
    """`$FRAMEWORK_CACHE`, else `~/.cache/framework`."""
    value = os.environ.get("FRAMEWORK_CACHE")
    return Path(value).expanduser() if value else Path.home() / ".cache" / "framework"


def _env_offline() -> bool:
    return os.environ.get("FRAMEWORK_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _check_backends(backends: Optional[Mapping[str, DownloadBackend]]) -> dict[str, DownloadBackend]:
    """`backends` keyed by lower-case scheme, or a `TypeError` naming the bad entry."""
    checked: dict[str, DownloadBackend] = {}
    for scheme, backend in (backends or {}).items():
        if not isinstance(scheme, str) or not scheme or "://" in scheme:
            raise TypeError(f"backends: keys are URL schemes such as 's3' or 'https', got {scheme!r}")
        if not isinstance(backend, DownloadBackend):
            what = f"the class {backend.__name__}" if isinstance(backend, type) else repr(backend)
            raise TypeError(
                f"backends[{scheme!r}] must be a DownloadBackend instance, got {what}; "
                "pass a configured one, e.g. {'s3': S3Backend(profile='research')}"
            )
        checked[scheme.lower()] = backend
    return checked


class DownloadManager:
    """The settings for fetching into a cache, and the method that does it.

    Args:
        cache_dir: where entries live; `None` reads `$FRAMEWORK_CACHE` at each call.
        lock: `"filelock"` (flock), `"softfilelock"` (a marker file, for filesystems
            without working `flock`), or `"none"`. Correctness never depends on it.
        lock_timeout: seconds a waiter tolerates without the holder making progress.
        retries: attempts per download (connection errors, 5xx, 408, 429, broken bodies).
        backoff_factor: exponential backoff base between attempts, in seconds.
        timeout: seconds a connection may stay silent.
        offline: serve only the cache; `None` reads `FRAMEWORK_OFFLINE` at each call.
        progress: show tqdm bars (only when stderr is a terminal).
        max_extract_size, max_extract_ratio, max_extract_members: caps on what an
            archive may expand to (bytes, bytes per archive byte, members).
        backends: configured backends by URL scheme, as httpx takes transports:
            `{"s3": S3Backend(profile="lab"), "https": HttpBackend(headers={...})}`.
            They are used as given (their own retries and timeouts); other schemes get
            the registered backend, made with this manager's settings.
        connections: how many connections fetch one object, in byte ranges, from a
            server that serves them (HTTP, S3); 1 = one stream. One stream that would
            bring the object in under half a second stays alone; otherwise a count
            given here (or in `FRAMEWORK_CONNECTIONS`) is opened at once, and without
            one connections are added while throughput grows, up to 16. `None` reads
            `FRAMEWORK_CONNECTIONS` at each call.
        part_size: the most bytes one ranged request of a parallel fetch asks for
            (an object with fewer such parts than `connections` is cut finer, down
            to 1 MiB parts; one of more than a million such parts is cut into a
            million larger ones, one a request); at least 64 KiB.

    The manager is a context manager; `close` (or leaving the `with` block) closes
    every backend it holds, the ones given to it included. A closed backend opens new
    connections when used again, so the manager, and a backend shared with another
    manager, stay usable.
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
        backends: Optional[Mapping[str, DownloadBackend]] = None,
        connections: Optional[int] = None,
        part_size: int = DEFAULT_PART_SIZE,
    ) -> None:
        connections_from(connections)  # a bad value or setting fails here, not at the first miss
        if isinstance(part_size, bool) or not isinstance(part_size, int) or part_size < MIN_PART_SIZE:
            raise ValueError(
                f"part_size must be a whole number of bytes of at least {MIN_PART_SIZE} (64 KiB: each "
                f"request costs a round trip), got {part_size!r}; the default is {DEFAULT_PART_SIZE}"
            )
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
        self._given = _check_backends(backends)
        self._made: dict[str, DownloadBackend] = {}  # by registered name: http and https share one
        self._backends_pid = os.getpid()
        self._backends_lock = threading.Lock()  # `cached_paths` asks from several threads
        self._connections = connections
        self.part_size = part_size

    @property
    def cache_dir(self) -> Path:
        """The cache folder this manager uses when a call does not name one."""
        return self._cache_dir if self._cache_dir is not None else default_cache_dir()

    @property
    def connections(self) -> int:
        """The cap on connections per object (`connections`, else `FRAMEWORK_CONNECTIONS`)."""
        return connections_from(self._connections)

    @property
    def offline(self) -> bool:
        """Whether only cached files are served (no network at all)."""
        return self._offline if self._offline is not None else _env_offline()

    def backend_for(self, url: str) -> DownloadBackend:
        """The backend for `url`'s scheme: the one given for it, else one instance per
        registered name (connections are pooled)."""
        if self._backends_pid != os.getpid():  # never share pooled sockets across fork
            self._backends_lock = threading.Lock()  # a thread holding it was not forked
            self.close()
            self._backends_pid = os.getpid()
        given = self._given.get(url_scheme(url))
        if given is not None:
            return given
        name = backend_name_for(url)
        with self._backends_lock:
            backend = self._made.get(name)
            if backend is None:
                if name not in DownloadBackend.registry_entries():
                    raise InvalidArgumentError(url, _no_backend(url_scheme(url)))
                cls = DownloadBackend.by_name(name)
                backend = cls(retries=self.retries, backoff_factor=self.backoff_factor, timeout=self.timeout)
                self._made[name] = backend
        return backend

    def close(self) -> None:
        """Close every backend this manager holds, given or made; they reopen on use."""
        held = {id(b): b for b in (*self._given.values(), *self._made.values())}
        self._made = {}
        for backend in held.values():
            backend.close()

    def __enter__(self) -> DownloadManager:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

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
        distributed: bool = False,
    ) -> Path:
        """The local path of `url_or_path`'s verified bytes inside the cache folder.

        Args:
            url_or_path: `http(s)://`, `s3://`, `file://`, a plain path, or any
                scheme a plugin registered a backend for.
            cache_dir: overrides the manager's cache folder for this call.
            sha256: expected hex digest; a cached copy with another digest is refetched,
                a download that does not match raises `ChecksumError`.
            extract: unpack the tar/zip archive and return the extracted folder.
            force: fetch (and extract) again even when cached. Processes racing with
                `force=True` fetch once: a copy another one published after this call
                began counts as fetched again.
            progress: overrides the manager's setting for this call.
            revalidate: ask the server whether a cached copy is still current (one
                `stat`, e.g. an HTTP HEAD); refetch when its etag or size changed.
                A cached copy with the `sha256` asked for is served without asking:
                those bytes are what the caller pinned.
            distributed: a collective over torch.distributed's default group (every
                rank calls it with the same arguments): one rank fetches from the origin,
                ranks with their own cache folder get the bytes over the process group
                (see `docs/howto/torchrun.md`). A plain call when torch.distributed is
                not initialized.

        Raises:
            DownloadError: or a subclass (`HTTPStatusError`, `NetworkError`,
                `ChecksumError`, `UnsafeArchiveError`, `OfflineError`,
                `LockTimeoutError`); nothing is published when one is raised.
        """
        if distributed:
            # The one deferred import of the download package: `_cluster` imports torch,
            # which a plain call never pays for.
            from framework.download._cluster import cluster_cached_path

            return cluster_cached_path(
                self,
                url_or_path,
                cache_dir=cache_dir,
                sha256=sha256,
                extract=extract,
                force=force,
                progress=progress,
                revalidate=revalidate,
            )
        url = normalize(url_or_path)
        sha256 = check_sha256(url, sha256)
        root = Path(cache_dir).expanduser() if cache_dir is not None else self.cache_dir
        show = self.progress if progress is None else progress  # and stderr a terminal: asked on a miss
        return self._cached(
            Entry(root, url), root, sha256, extract=extract, force=force, show=show, revalidate=revalidate
        )

    def cached_paths(
        self,
        urls: Iterable[PathOrUrl],
        *,
        max_workers: int = 8,
        cache_dir: Optional[PathOrUrl] = None,
        sha256: Digests = None,
        extract: bool = False,
        force: bool = False,
        progress: Optional[bool] = None,
        revalidate: bool = False,
    ) -> list[Path]:
        """`cached_path` for many files at once, on up to `max_workers` threads: the
        local paths, in the order of `urls`.

        Each file gets `cached_path`'s guarantees (its lock, verification, atomic
        publish); a URL given twice is fetched once. One progress bar counts the files
        done and the bytes published (an archive's, with `extract`); failed files are
        counted apart.

        Args:
            urls: URLs or paths, as `cached_path` takes them.
            max_workers: files fetched at the same time (each may use several
                connections, see `connections`).
            sha256: the expected digests: a list with one per URL (None: not checked),
                or a mapping from URL to digest (URLs it does not name are not checked).
            cache_dir, extract, force, progress, revalidate: as `cached_path`, for
                every file.

        Raises:
            BulkDownloadError: once every other file is fetched (and published), naming
                each URL that failed, as given (`os.fspath` of a path; the first spelling
                of a file given twice), and why (`failures`); an error that is not a
                `DownloadError` is wrapped in one, its cause. Nothing of those is published.
            InvalidArgumentError: a bad argument, URL or digest, before any request.
            KeyboardInterrupt: the files not begun, or only waiting for another
                process's lock, are not fetched; those under way finish.
        """
        if isinstance(urls, (str, bytes, os.PathLike)):
            raise TypeError("cached_paths takes a list of URLs or paths; for one, call cached_path")
        given = [os.fspath(url) for url in urls]
        normalized = [normalize(url) for url in given]
        workers = check_workers(max_workers, given[0] if given else "")
        digests = digests_for(normalized, sha256)
        if not self.offline:  # offline, a cached file is served whatever its backend
            self._check_urls(normalized)
        root = Path(cache_dir).expanduser() if cache_dir is not None else self.cache_dir
        show = self.progress if progress is None else progress

        def fetch_one(url: str, digest: Optional[str], cancelled: threading.Event) -> tuple[Path, int]:
            entry = Entry(root, url)
            path = self._cached(
                entry,
                root,
                digest,
                extract=extract,
                force=force,
                show=False,
                revalidate=revalidate,
                cancelled=cancelled,
            )
            try:
                return path, os.stat(entry.final).st_size
            except OSError:  # removed meanwhile (by another user of the cache): counts nothing
                return path, 0

        return fetch_all(normalized, given, digests, fetch_one, max_workers=workers, show=show)

    def _check_urls(self, urls: Iterable[str]) -> None:
        """An `InvalidArgumentError` for the first URL whose scheme no backend serves, or
        that its backend's `check_url` refuses: before any request."""
        backends: dict[str, DownloadBackend] = {}
        for url in urls:
            scheme = url_scheme(url)
            backend = backends.get(scheme)
            if backend is None:
                backend = backends[scheme] = self.backend_for(url)
            backend.check_url(url)

    def _cached(
        self,
        entry: Entry,
        root: Path,
        sha256: Optional[str],
        *,
        extract: bool,
        force: bool,
        show: bool,
        revalidate: bool,
        cancelled: Optional[threading.Event] = None,
    ) -> Path:
        """`cached_path` for the entry of `root` a plain (not distributed) call asks for;
        waiting for another process's lock ends in `WaitCancelled` once `cancelled` is set."""
        url = entry.url
        # The server's current version when it differs from the cached copy: whoever
        # gets the lock first fetches it, the others find it published.
        newer = self._stale(entry, sha256) if revalidate and not force and not self.offline else None

        def current() -> bool:
            meta = entry.lookup(sha256)
            return meta is not None and (newer is None or _same_version(meta, newer))

        def rebound() -> bool:  # a copied cache, or one an older release wrote: hashed once
            meta = entry.rebind(sha256)
            return meta is not None and (newer is None or _same_version(meta, newer))

        # force=True asks for a copy fetched after this call began: one that another racer
        # published meanwhile (another file than the one here now) satisfies it.
        started = _published_identity(entry) if force else None  # a hit stays one lstat

        def refetch() -> bool:
            return force and not (current() and _published_identity(entry) != started)

        if not force and (current() or (self.offline and rebound())):
            if not extract:
                return entry.final
            if extracted(entry):
                return entry.extracted
        if self.offline and (force or not (current() or rebound())):  # extracting a cached copy is fine
            raise OfflineError(url, _offline_reason(entry, sha256, force, root, self._offline is None))
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise DownloadError(
                url,
                f"cannot create the cache folder {root}: {error.strerror}; "
                "set FRAMEWORK_CACHE (or cache_dir) to a writable folder",
            ) from error

        def done() -> bool:  # another process published what we need: stop waiting
            if refetch() or not current():
                return False
            return not extract or extracted(entry)

        show = show and sys.stderr.isatty()
        with cache_writes(url, root), self._lock(entry, show, done, cancelled) as lock, lock.working():
            fetched = refetch()
            if fetched or not (current() or rebound()):
                self._fetch(entry, sha256, show, lock)
                fetched = True
            if not extract:
                return entry.final
            if fetched or not extracted(entry):
                logger.info("extracting %s to %s", entry.final, entry.extracted)
                with _open_published(entry) as (archive, digest):
                    extract_archive(
                        archive, entry.extracted, url, self.limits, replace=True, digest=digest, in_cache=True
                    )
            return entry.extracted

    def _stale(self, entry: Entry, sha256: Optional[str]) -> Optional[RemoteInfo]:
        """The server's description of the object if it differs from the cached copy."""
        meta = entry.lookup(sha256)
        if meta is None or sha256 is not None:
            return None  # nothing cached (a fetch follows anyway), or the bytes are pinned
        info = self.backend_for(entry.url).stat(entry.url)
        if _same_version(meta, info):
            return None
        logger.info("%s changed on the server; fetching it again", entry.url)
        return info

    def _lock(
        self, entry: Entry, show: bool, done: Callable[[], bool], cancelled: Optional[threading.Event]
    ) -> EntryLock:
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
            cancelled=cancelled,
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
            on_size=lambda size: lock.note(size=size),
            connections=self.connections,
            part_size=self.part_size,
            fixed_connections=connections_chosen(self._connections),
        )
        publish_fetched(entry, result)
        logger.info("published %s (%d bytes, sha256 %s)", entry.final, result.size, result.sha256)


def _same_version(meta: Metadata, info: RemoteInfo) -> bool:
    """Whether the cached copy `meta` describes is the version the server describes
    (by strong validator when both sides have one, else by size)."""
    cached = Validators(meta.get("etag"), meta.get("last_modified")).version
    remote = Validators.of(info).version
    if cached is not None and remote is not None:
        return cached == remote
    return info.size is None or info.size == meta.get("size")


def _offline_reason(entry: Entry, sha256: Optional[str], force: bool, root: Path, from_env: bool) -> str:
    """Why offline mode cannot serve `entry`, saying what the cache does hold and where
    offline mode came from (the environment, or the manager's `offline` argument)."""
    if from_env:
        what, fix = "offline mode (FRAMEWORK_OFFLINE=1)", "run once online, or unset FRAMEWORK_OFFLINE"
    else:
        what, fix = "offline mode (DownloadManager(offline=True))", "run once online, or pass offline=False"
    cached = entry.cached()
    if cached is None and os.path.lexists(entry.final):
        return (
            f"{what}: a copy is present at {entry.final} but unbound: its sidecar "
            f"{entry.sidecar.name} is missing, damaged, or vouches for other bytes (or another "
            f"sha256 than {sha256}); {fix}"
        )
    if cached is None:
        return f"{what} and no verified copy in {root}; {fix}"
    if force:
        return f"{what} cannot fetch again (force=True); the cached copy is {entry.final}"
    return (
        f"{what}: the cached copy {entry.final} has sha256 {cached.get('sha256')}, not the "
        f"requested {sha256}; {fix}, or ask for the cached digest"
    )


def _published_identity(entry: Entry) -> Optional[tuple[int, int, int, int]]:
    """Which file is published now (device, inode, size, mtime), None when none is."""
    try:
        info = os.lstat(entry.final)
    except OSError:
        return None
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


@contextmanager
def _open_published(entry: Entry) -> Iterator[tuple[BinaryIO, str]]:
    """The published file, opened once and checked with `fstat` to be the very file its
    sidecar names, and its sha256: what is extracted is what was verified, never a link
    or a file renamed over it since (by another user), and never a FIFO waited on."""
    meta = entry.cached()
    try:
        file: Optional[BinaryIO] = open(os.open(entry.final, _READ_PUBLISHED), "rb")
    except OSError:
        file = None
    try:
        if meta is None or file is None or not binds(meta, os.fstat(file.fileno())):
            raise DownloadError(
                entry.url,
                f"{entry.final} was replaced after it was verified (by another user of the "
                "cache?); nothing was extracted. Call again to fetch it anew",
            )
        yield file, meta["sha256"]
    finally:
        if file is not None:
            file.close()


_READ_PUBLISHED = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _no_backend(scheme: str) -> str:
    schemes, fallbacks = describe_schemes()
    message = f"no download backend for the scheme {scheme!r}; known schemes: {', '.join(schemes)}"
    if fallbacks:
        message += f" (and any scheme the {' or '.join(map(repr, fallbacks))} backend accepts)"
    return (
        message + ". Pass one in DownloadManager(backends={...}), or add one in a plugin: "
        "a DownloadBackend listing the scheme in `schemes`, or registered under its name"
    )


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
    distributed: bool = False,
) -> Path:
    """`DownloadManager.cached_path` on a default manager (settings from the environment);
    `distributed=True` makes it a collective with one fetch per job (see there)."""
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
        distributed=distributed,
    )
