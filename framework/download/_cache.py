"""Cache entries: where a URL's file, sidecar, lock and extracted folder live.

An entry is named by a stable hash of the URL plus a readable suffix taken from
the file name, so `ls` in the cache folder still tells entries apart. The
sidecar JSON (url, validators, size, sha256, time) is what makes a cache hit cheap: a
`stat` of the file and one small read, never a re-hash. The sidecar names the
file's inode, size and mtime, so it vouches only for the very file it was written
for: it is written before that file is renamed into place, and a crash (or a reader)
between the two sees a sidecar that matches nothing, never old metadata on new bytes.

Anything in the cache folder may have been planted by another user of a shared
cache: small files are read with `O_NOFOLLOW | O_NONBLOCK` (a symlink is refused,
a FIFO never blocks) and written through fresh `O_EXCL` names.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import logging
import os
import re
import secrets
import socket
import stat
import time
from pathlib import Path
from typing import Any, Final, Optional, TypedDict
from urllib.parse import unquote, urlsplit

import attrs

from framework._redact import redact_url

__all__ = [
    "HOST",
    "NEW_FILE_FLAGS",
    "RELEASED_PID",
    "USE_RESOLUTION_S",
    "WORK_FALLBACKS",
    "WORK_PREFIX",
    "Entry",
    "Metadata",
    "WorkFolder",
    "binds",
    "dead_leftovers",
    "digest_of",
    "enter_work_folder",
    "file_identity",
    "find_work_folder",
    "is_alive_local",
    "lock_of",
    "parse_json",
    "parse_owner",
    "private_folder",
    "read_metadata",
    "read_small_file",
    "sidecar_of",
    "unique_token",
    "use_of",
    "work_folder",
    "write_json_atomic",
]

_logger = logging.getLogger("framework.download")
_SUFFIX_CHARS: Final = re.compile(r"[^A-Za-z0-9._-]+")


def sidecar_of(final: Path) -> Path:
    """The metadata sidecar beside an entry's published file."""
    return final.with_name(f"{final.name}.json")


def lock_of(final: Path) -> Path:
    """The lock file of an entry's published file."""
    return final.with_name(f"{final.name}.lock")


def use_of(final: Path) -> Path:
    """The file whose shared locks say an entry is being read (`framework.download._lock.UseLock`)."""
    return final.with_name(f"{final.name}.use")


def _pid_namespace() -> str:
    """This process's PID namespace (the inode of /proc/self/ns/pid), '' when unknown.

    Two containers can share a hostname (and a cache folder) while their pids mean
    different processes, so a pid is only checked inside its own namespace."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


# This host and PID namespace, as they appear in temporary file names (no dots: names
# are split on them). Another container with the same hostname is another "host".
HOST: Final = "-".join(
    part
    for part in (re.sub(r"[^A-Za-z0-9-]+", "-", socket.gethostname()) or "host", _pid_namespace())
    if part
)
# Open flags for reading a small file that anyone may have planted.
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# A hit records its use (the file's access time) when the last one recorded is older:
# at most one write per entry and minute, none on most hits.
USE_RESOLUTION_S: Final = 60.0
# Open flags for a new file under a fresh name: never an existing file or a symlink.
NEW_FILE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_SMALL_FILE: Final = 1 << 16
_SHA256: Final = re.compile(r"[0-9a-f]{64}")


class Metadata(TypedDict):
    """The sidecar of a published file."""

    url: str
    etag: Optional[str]
    last_modified: Optional[str]
    size: int
    sha256: str
    time: float
    inode: int  # -1 in a sidecar an older release wrote: it binds no file
    mtime_ns: int


# The pid a partial file is named with once its writer, alive, has let it go for any
# process to resume (no process has it: kill(0, 0) would signal our own group).
RELEASED_PID: Final = 0


def unique_token() -> str:
    """`host.pid.random`: names temporary files so that each process owns its own."""
    return f"{HOST}.{os.getpid()}.{secrets.token_hex(4)}"


def parse_owner(name: str) -> Optional[tuple[str, int]]:
    """The (host, pid) in a name made with `unique_token`, followed by one more suffix."""
    parts = name.split(".")
    if len(parts) < 5:
        return None
    try:
        return parts[-4], int(parts[-3])
    except ValueError:
        return None


def is_alive_local(host: str, pid: int) -> bool:
    """Whether `pid` still runs; True (unknown, so assume alive) for another host or
    PID namespace."""
    if host != HOST:
        return True
    if pid == RELEASED_PID:  # a file its writer let go of (see `_partial.Partial.close`)
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def dead_leftovers(target: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """Temporary siblings of `target` (`target.<token>.<suffix>`) of this user whose
    owner process, on this host, is dead: safe to remove. Another user's files are never
    swept, whatever their name says (a pid of ours may have been theirs)."""
    prefix = target.name + "."
    try:
        names = os.listdir(target.parent)
    except OSError:
        return []
    return [
        target.parent / name
        for name in names
        if name.startswith(prefix)
        and name.endswith(suffixes)
        and (owner := parse_owner(name)) is not None
        and not is_alive_local(*owner)
        and _owned(target.parent / name)
    ]


def work_folder(final: Path, fallback: int = 0) -> Path:
    """The folder of this user's temporary files (partial files, their records, sidecar
    and extraction temporaries) in `final`'s cache folder: made once, kept. It holds only
    what is being written or was kept to be resumed, never the entries, so looking in it
    costs the same in an empty cache and in one of 150,000 entries. Per user: only a
    user's own partial files are ever resumed. `fallback` > 0 names the folders used
    instead when something was planted at the first name (see `enter_work_folder`)."""
    suffix = f"-{fallback}" if fallback else ""
    return final.parent / f"{WORK_PREFIX}{os.geteuid()}{suffix}"


WORK_PREFIX: Final = ".framework-partial-"
# Names tried after the first one when something is planted there: `<name>-1`, `-2`, `-3`.
WORK_FALLBACKS: Final = 3


@attrs.frozen
class WorkFolder:
    """Where a fetch of `final` writes: `path`, and whether this call made it (`fresh`:
    empty, so there is nothing to resume or sweep)."""

    path: Path
    fresh: bool


def find_work_folder(final: Path) -> Optional[Path]:
    """The work folder that `enter_work_folder` uses for `final`, if it exists: the first
    of its names that is a private folder of this user, skipping planted ones; None when
    the first name not planted is free (nothing was written there). Never lists anything;
    costs one `lstat` when nothing is planted."""
    for fallback in range(WORK_FALLBACKS + 1):
        folder = work_folder(final, fallback)
        try:
            info = os.lstat(folder)
        except OSError:
            return None
        if _private(info):
            return folder
    return None


def enter_work_folder(final: Path) -> WorkFolder:
    """Make sure the work folder of `final`'s cache folder exists. Something else at its
    name (a symlink, a file, a folder of another user or writable by others: planted) is
    never used, listed or written through: the next name is used instead
    (`work_folder(final, 1)`, ...), where later calls look too (`find_work_folder`).
    Raises `FileExistsError` when every name is taken so."""
    for fallback in range(WORK_FALLBACKS + 1):
        found = _enter(work_folder(final, fallback))
        if found is not None:
            return found
    first, last = work_folder(final), work_folder(final, WORK_FALLBACKS)
    raise FileExistsError(
        errno.EEXIST,
        f"{first} and {last.name} (-1 to -{WORK_FALLBACKS}) are all taken by something that is not a "
        "private folder of this user (planted?); remove them, or use another cache folder",
    )


def _enter(folder: Path) -> Optional[WorkFolder]:
    """`folder` made now, or found a private folder of this user; None when planted."""
    for _attempt in range(3):  # someone may remove it between mkdir and lstat
        try:
            os.mkdir(folder, 0o700)
            return WorkFolder(folder, fresh=True)
        except FileExistsError:
            pass
        try:
            info = os.lstat(folder)
        except FileNotFoundError:
            continue
        if _private(info):
            return WorkFolder(folder, fresh=False)
        break
    _logger.warning("%s is not a private folder of this user (planted?); not using it", folder)
    return None


def private_folder(folder: Path) -> bool:
    """Whether `folder` is a real folder (not a link to one) of this user that nobody
    else may write: the only kind of work folder listed, swept or written in."""
    try:
        info = os.lstat(folder)
    except OSError:
        return False
    return _private(info)


def _private(info: os.stat_result) -> bool:
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022


def _owned(path: Path) -> bool:
    try:
        return os.lstat(path).st_uid == os.geteuid()
    except OSError:
        return False


def _readable_suffix(url: str) -> str:
    """A hint for people listing the cache (the digest is the identity). File names are
    readable by every user of a shared cache and appear in logs and progress bars: a
    URL's `;params` (`;jsessionid=`) are dropped, and what `redact_url` would hide
    stays hidden."""
    path = unquote(urlsplit(url).path) if "://" in url else url
    name = path.rstrip("/").rsplit("/", 1)[-1]
    if "://" in url:
        name = name.split(";", 1)[0]
    name = _SUFFIX_CHARS.sub("_", redact_url(name)).strip("._")
    return name[-64:] or "download"


@functools.lru_cache(maxsize=4096)
def _entry_name(url: str) -> str:
    """The name of `url`'s entry (remembered: a hit costs a few microseconds less)."""
    digest = hashlib.sha256(url.encode("utf-8")).hexdigest()[:20]
    return f"{digest}-{_readable_suffix(url)}"


class Entry:
    """The paths of one URL's cache entry inside `cache_dir`."""

    __slots__ = ("final", "url")

    def __init__(self, cache_dir: Path, url: str) -> None:
        self.url = url
        self.final = cache_dir / _entry_name(url)

    @property
    def sidecar(self) -> Path:
        return sidecar_of(self.final)

    @property
    def lock(self) -> Path:
        return lock_of(self.final)

    @property
    def extracted(self) -> Path:
        return self.final.with_name(f"{self.final.name}-extracted")

    def lookup(self, sha256: Optional[str]) -> Optional[Metadata]:
        """The sidecar if the published file is a regular file and is the very file
        the sidecar was written for (inode, size, mtime), and `sha256` matches.

        Costs one `lstat` and one small read; the file itself is never read, unless
        `sha256` is given and the file or its sidecar belongs to another user: anyone
        who can write the cache folder could have put both there, so the file is then
        hashed (once per process and file version, see `digest_of`) before it is trusted.
        A hit records its use when the last one recorded is `USE_RESOLUTION_S` old
        (`_note_use`: an open and a time set, at most once a minute per entry).
        """
        found = self._bound()
        if found is None:
            return None
        meta, info, foreign = found
        if sha256 is not None:
            sha256 = sha256.lower()
            if meta.get("sha256") != sha256 or (foreign and digest_of(self.final, info) != sha256):
                return None
        if time.time() - info.st_atime >= USE_RESOLUTION_S:
            _note_use(self.final, info)
        return meta

    def cached(self) -> Optional[Metadata]:
        """The sidecar of the published file, whatever its sha256 (see `lookup`)."""
        found = self._bound()
        return found[0] if found is not None else None

    def rebind(self, sha256: Optional[str]) -> Optional[Metadata]:
        """The sidecar, bound anew to the published file, when it names another file of
        the same size: a cache copied with `cp -a`, rsync or a restore (new inodes), or
        written by an older release (no inode). The file is hashed (once per process and
        file version); only when its digest is the sidecar's, and `sha256` when given, is
        the sidecar rewritten for it (if the folder is writable) and returned."""
        try:
            info = os.lstat(self.final)
        except OSError:
            return None
        meta = read_metadata(self.sidecar)
        if meta is None or not stat.S_ISREG(info.st_mode) or meta.get("size") != info.st_size:
            return None
        digest = digest_of(self.final, info)
        if digest is None or digest != meta.get("sha256") or sha256 not in (None, digest):
            return None
        bound: Metadata = {**meta, "inode": info.st_ino, "mtime_ns": info.st_mtime_ns}
        try:
            write_json_atomic(self.sidecar, dict(bound))
        except OSError:  # a read-only copy: served all the same, hashed again by another process
            pass
        return bound

    def _bound(self) -> Optional[tuple[Metadata, os.stat_result, bool]]:
        """The sidecar bound to the published file, the file's `lstat`, and whether
        either belongs to another user."""
        try:
            info = os.lstat(self.final)
        except OSError:
            return None
        found = _read_small(self.sidecar)
        meta = _parse_metadata(found[0]) if found is not None else None
        if found is None or meta is None or not stat.S_ISREG(info.st_mode):
            return None
        if not binds(meta, info):
            return None
        me = os.geteuid()
        return meta, info, info.st_uid != me or found[1].st_uid != me

    def publish_metadata(
        self,
        etag: Optional[str],
        last_modified: Optional[str],
        sha256: str,
        info: os.stat_result,
        fetched: Optional[float] = None,
        temp_folder: Optional[Path] = None,
    ) -> None:
        """Write the sidecar for the file `info` describes (not yet renamed into place);
        `fetched` dates its version (a copy of another cache's: that one's fetch), else now.
        Its temporary file goes to `temp_folder` (the entry's work folder), if given.

        Not fsynced: a sidecar lost in a crash is a miss (the file is hashed or fetched
        again), and one that survives without its file binds nothing (see `binds`)."""
        inode, size, mtime_ns = file_identity(info)
        meta: Metadata = {
            "url": redact_url(self.url),  # a shared cache is read by others: no tokens
            "etag": etag,
            "last_modified": last_modified,
            "size": size,
            "sha256": sha256,
            "time": time.time() if fetched is None else fetched,
            "inode": inode,
            "mtime_ns": mtime_ns,
        }
        write_json_atomic(self.sidecar, dict(meta), durable=False, temp_folder=temp_folder)


def _note_use(path: Path, info: os.stat_result) -> None:
    """Set the access time of the published file `info` describes to now: a hit is a
    use, whatever the filesystem's `noatime` or `relatime` (`framework cache prune`
    removes the least recently used first). Its mtime stays (it binds the sidecar); on
    another user's file (not permitted) or a read-only cache, nothing is recorded."""
    key = (info.st_dev, info.st_ino)
    if os.utime not in os.supports_fd or key in _UNNOTED:
        return
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError:
        return
    try:
        now = os.fstat(fd)
        if (now.st_dev, *file_identity(now)) == (info.st_dev, *file_identity(info)):
            os.utime(fd, ns=(time.time_ns(), now.st_mtime_ns))
    except OSError:  # tried once per process: a read-only cache's hits stay one lstat and one read
        if len(_UNNOTED) >= 65536:
            _UNNOTED.clear()
        _UNNOTED.add(key)
    finally:
        os.close(fd)


# Files (device, inode) whose use this process could not record.
_UNNOTED: set[tuple[int, int]] = set()


def binds(meta: Metadata, info: os.stat_result) -> bool:
    """Whether the sidecar `meta` was written for the regular file `info` describes."""
    identity = (meta.get("inode"), meta.get("size"), meta.get("mtime_ns"))
    return stat.S_ISREG(info.st_mode) and identity == file_identity(info)


def file_identity(info: os.stat_result) -> tuple[int, int, int]:
    """What binds a sidecar to one file: inode, size and mtime survive a rename, and a
    new file, or a file written again, differs in at least one of them."""
    return info.st_ino, info.st_size, info.st_mtime_ns


# Digests of files this process hashed, by (device, inode, size, mtime_ns): a file is
# read once per version, however often it is looked up.
_DIGESTS: dict[tuple[int, int, int, int], str] = {}


def digest_of(path: Path, info: os.stat_result) -> Optional[str]:
    """The sha256 of the regular file at `path` that `info` describes; None if it is
    no longer that file (or cannot be read). Opened with `O_NOFOLLOW | O_NONBLOCK` and
    checked with `fstat`, so a link or FIFO swapped in is never followed or waited on."""
    key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    digest = _DIGESTS.get(key)
    if digest is not None:
        return digest
    try:
        with open(os.open(path, _READ_FLAGS), "rb") as file:
            now = os.fstat(file.fileno())
            if not stat.S_ISREG(now.st_mode) or (now.st_dev, *file_identity(now)) != key:
                return None
            digest = hashlib.file_digest(file, "sha256").hexdigest()
    except OSError:
        return None
    _DIGESTS[key] = digest
    return digest


def _read_small(path: Path) -> Optional[tuple[bytes, os.stat_result]]:
    """The bytes and `fstat` of a small regular file; None for anything else (missing,
    a symlink, a FIFO, a folder, too large), without ever blocking."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        data = os.read(fd, _MAX_SMALL_FILE + 1)
    except OSError:  # a folder (EISDIR), a FIFO with nobody writing (EAGAIN)
        return None
    finally:
        os.close(fd)
    return (data, info) if len(data) <= _MAX_SMALL_FILE else None


def parse_json(raw: Optional[bytes]) -> Any:
    """`raw` decoded as JSON; None when there is nothing, or nothing this library wrote
    (any file in a shared cache may be planted: deep nesting raises RecursionError)."""
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def read_small_file(path: Path) -> Optional[bytes]:
    """The bytes of a small regular file (see `_read_small`)."""
    found = _read_small(path)
    return found[0] if found is not None else None


def read_metadata(path: Path) -> Optional[Metadata]:
    return _parse_metadata(read_small_file(path))


def _parse_metadata(raw: Optional[bytes]) -> Optional[Metadata]:
    data = parse_json(raw)
    if not isinstance(data, dict):
        return None
    # Anyone may have written it (a neighbour, another tool, an older release): a field of
    # the wrong type makes it no sidecar at all (a miss), never an error later on.
    # Inode and mtime may be missing (an older release): such a sidecar binds no file (-1).
    size, digest = data.get("size"), data.get("sha256")
    if type(size) is not int or size < 0 or not isinstance(digest, str) or not _SHA256.fullmatch(digest):
        return None
    optional = {"url": str, "etag": str, "last_modified": str, "inode": int, "mtime_ns": int}
    for name, kind in optional.items():
        value = data.get(name)
        if value is not None and type(value) is not kind:
            return None
    written = data.get("time", 0.0)
    if type(written) not in (int, float):
        return None
    meta: Metadata = {
        "url": data.get("url") or "",
        "etag": data.get("etag"),
        "last_modified": data.get("last_modified"),
        "size": size,
        "sha256": digest,
        "time": written,
        "inode": -1 if data.get("inode") is None else data["inode"],
        "mtime_ns": -1 if data.get("mtime_ns") is None else data["mtime_ns"],
    }
    return meta


def write_json_atomic(
    path: Path, data: dict[str, Any], durable: bool = True, temp_folder: Optional[Path] = None
) -> None:
    """Write JSON to a unique temporary name (in `temp_folder`, else next to `path`;
    fsynced if `durable`), then `os.replace`."""
    temp = (temp_folder or path.parent) / f"{path.name}.{unique_token()}.tmp"
    try:
        with os.fdopen(os.open(temp, NEW_FILE_FLAGS, 0o644), "w", encoding="utf-8") as file:
            json.dump(data, file)
            if durable:
                file.flush()
                os.fsync(file.fileno())
        os.replace(temp, path)  # replaces a planted symlink itself, never its target
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
