"""What a cache folder holds, checked and trimmed: `entries`, `verify`, `remove`, `prune`.

An entry is a regular file named as `cached_path` names one (`<20 hex>-<suffix>`) whose
sidecar (`<name>.json`) holds valid metadata; its extracted folder (`<name>-extracted/`)
belongs to it. Nothing else in the folder is an entry: a file a user put there stays,
whatever its name. Its last use is the file's access time (a cache hit refreshes it,
see `Entry.lookup`), or its fetch if later.

`remove` takes the entry's lock without waiting, so an entry another process is
fetching is skipped, and removes in an order where no step leaves a hit that should not
be one: the extracted folder's marker first (its folder is then moved into the work
folder, out of sight), then the file, then its sidecar. A file without its sidecar is a
miss, and so is a sidecar without its file; a crash between the two leaves only the
small sidecar, which `prune` recognises as ours and sweeps.

`prune` also sweeps what no live process owns: partial files by the rule a fetch
adopts them by (`orphaned`), dead writers' temporaries (`dead_leftovers`).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final, Optional

import attrs

from framework._redact import redact_url
from framework.download._cache import (
    WORK_FALLBACKS,
    Entry,
    binds,
    dead_leftovers,
    enter_work_folder,
    file_identity,
    lock_of,
    private_folder,
    read_metadata,
    sidecar_of,
    unique_token,
    use_of,
    work_folder,
)
from framework.download._call import normalize
from framework.download._lock import EntryLock, LockKind, UseLock, in_use
from framework.download._partial import PartialName, orphaned, ours
from framework.errors import LockTimeoutError

__all__ = ["CacheEntry", "Pruned", "entries", "entry_for", "prune", "remove", "stale_files", "verify"]

_ENTRY_NAME: Final = re.compile(r"[0-9a-f]{20}-[A-Za-z0-9._-]{1,64}")
# Read to verify without counting as a use: O_NOATIME where the file is ours (Linux).
_VERIFY_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NOATIME: Final = getattr(os, "O_NOATIME", 0)
_LEFTOVERS: Final = (".tmp", ".old", ".parts")


@attrs.frozen
class CacheEntry:
    """One published file of a cache folder, as its sidecar describes it.

    `url` is as the sidecar records it (credentials redacted); `size` is the file's;
    `bound` says whether the sidecar names this very file (False: a copied cache, or a
    file changed since it was published: hashed again before it is served);
    `extracted` is its extracted folder, if there is one, and `extracted_size` the
    bytes of the files in it."""

    path: Path
    url: str
    size: int
    sha256: str
    expected_size: int
    fetched: float
    last_used: float
    bound: bool
    extracted: Optional[Path]
    extracted_size: int
    identity: tuple[int, int, int, int]  # device, inode, size, mtime_ns when listed

    @property
    def total(self) -> int:
        """The bytes the entry takes: its file and its extracted folder."""
        return self.size + self.extracted_size

    @property
    def sidecar(self) -> Path:
        return sidecar_of(self.path)

    @property
    def lock(self) -> Path:
        return lock_of(self.path)


@attrs.frozen
class Pruned:
    """What `prune` removed (or, with `dry_run`, would remove), skipped and left."""

    removed: tuple[CacheEntry, ...]  # least recently used first
    skipped: tuple[CacheEntry, ...]  # another process held their lock
    swept: tuple[Path, ...]  # stale partial and temporary files, sidecars without a file
    freed: int
    size: int  # what the cache holds afterwards
    max_size: int
    dry_run: bool

    @property
    def fits(self) -> bool:
        return self.size <= self.max_size


def entries(cache_dir: Path) -> list[CacheEntry]:
    """Every entry of `cache_dir`, sorted by URL. One listing of the folder, an `lstat`
    and a sidecar read per entry, a walk of each extracted folder; no file is read."""
    return _entries(cache_dir, _names(cache_dir))


def _entries(cache_dir: Path, names: set[str]) -> list[CacheEntry]:
    found = (_entry(cache_dir, name, names) for name in names)
    return sorted((entry for entry in found if entry is not None), key=lambda e: (e.url, e.path.name))


def entry_for(cache_dir: Path, url: str) -> Optional[CacheEntry]:
    """The entry `cached_path(url)` would hit or fill, if `cache_dir` holds one."""
    name = Entry(cache_dir, normalize(url)).final.name
    return _entry(cache_dir, name, {name, f"{name}.json", f"{name}-extracted"})


def verify(entry: CacheEntry) -> Optional[str]:
    """What is wrong with `entry`'s file (its size or sha256 is not its sidecar's), None
    when nothing is, or when the file was replaced or removed since it was listed (a new
    file was verified by its writer). Reading it does not count as a use."""
    try:
        try:
            fd = os.open(entry.path, _VERIFY_FLAGS | _NOATIME)
        except PermissionError:  # O_NOATIME on another user's file
            fd = os.open(entry.path, _VERIFY_FLAGS)
    except FileNotFoundError:
        return None
    with open(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if _identity(info) != entry.identity:
            return None
        if info.st_size != entry.expected_size:
            return f"{info.st_size} bytes, its record says {entry.expected_size} (truncated or grown)"
        digest = hashlib.file_digest(file, "sha256").hexdigest()
    if digest != entry.sha256:
        return f"sha256 {digest[:12]}..., its record says {entry.sha256[:12]}... (damaged on disk)"
    return None


def remove(entry: CacheEntry, *, lock: LockKind = "filelock") -> bool:
    """Remove `entry` (its file, sidecar and extracted folder) unless another process
    holds its lock, a reader holds it in use (`UseLock`: a streamed shard being read)
    or it was replaced since it was listed; whether it was removed."""
    use = UseLock(use_of(entry.path))
    if not use.exclusive():
        return False
    try:
        with _unlocked(entry.lock, entry.url, lock) as free:
            if not free or _published(entry.path) != entry.identity:
                return False
            if entry.extracted is not None:
                _remove_extracted(entry.extracted)
            _unlink(entry.path)  # a miss from here on: see the module's docstring
            _unlink(entry.sidecar)
            _unlink(use_of(entry.path))  # held: a reader waiting on it takes the next one
    finally:
        use.release()
    return True


def stale_files(cache_dir: Path) -> list[Path]:
    """What no live process owns in `cache_dir` and its work folders of this user:
    orphaned partial files (with a parallel fetch's record of parts), dead writers'
    temporaries, and sidecars whose file is gone."""
    return _stale(cache_dir, _names(cache_dir))


def _stale(cache_dir: Path, names: set[str]) -> list[Path]:
    found = [cache_dir / name for name in names if _dangling(cache_dir, name, names)]
    bases = {name.rsplit(".", 4)[0] for name in names if name.endswith(".tmp")}
    for base in sorted(bases):  # a sidecar rewritten in place (`Entry.rebind`)
        found.extend(dead_leftovers(cache_dir / base, (".tmp",)))
    for folder in _work_folders(cache_dir):
        found.extend(_stale_in(cache_dir, folder))
    return found


def prune(cache_dir: Path, max_size: int, *, dry_run: bool = False, lock: LockKind = "filelock") -> Pruned:
    """Trim `cache_dir` to at most `max_size` bytes: sweep `stale_files`, then remove
    the least recently used entries until the rest fits. Entries another process is
    fetching are skipped (their lock is held); with `dry_run` nothing is removed."""
    if max_size < 0:
        raise ValueError(f"max_size cannot be negative, got {max_size}")
    names = _names(cache_dir)  # one listing of the folder for both
    listed = _entries(cache_dir, names)
    swept: list[Path] = []
    freed = stale_bytes = 0
    for path in _stale(cache_dir, names):
        size = _disk_bytes(path)
        if dry_run or _sweep(cache_dir, path, lock):
            swept.append(path)
            freed += size
        else:
            stale_bytes += size
    held = sum(entry.total for entry in listed) + stale_bytes
    removed: list[CacheEntry] = []
    skipped: list[CacheEntry] = []
    for entry in sorted(listed, key=lambda e: e.last_used):
        if held <= max_size:
            break
        if (not _locked(entry, lock)) if dry_run else remove(entry, lock=lock):
            removed.append(entry)
            held -= entry.total
            freed += entry.total
        elif _published(entry.path) is None:  # another prune (or a --force fetch's failure) took it
            held -= entry.total
        else:
            skipped.append(entry)
    return Pruned(tuple(removed), tuple(skipped), tuple(swept), freed, held, max_size, dry_run)


def _names(cache_dir: Path) -> set[str]:
    try:
        return set(os.listdir(cache_dir))
    except FileNotFoundError:
        raise FileNotFoundError(f"no cache folder at {cache_dir}") from None


def _entry(cache_dir: Path, name: str, names: set[str]) -> Optional[CacheEntry]:
    if _ENTRY_NAME.fullmatch(name) is None or f"{name}.json" not in names:
        return None
    path = cache_dir / name
    try:
        info = os.lstat(path)
    except OSError:
        return None
    meta = read_metadata(sidecar_of(path))
    if meta is None or not stat.S_ISREG(info.st_mode):
        return None
    folder = path.with_name(f"{name}-extracted")
    extracted = folder if folder.name in names and _real_folder(folder) else None
    return CacheEntry(
        path=path,
        url=redact_url(meta["url"]),  # an older release's sidecar may not have redacted it
        size=info.st_size,
        sha256=meta["sha256"],
        expected_size=meta["size"],
        fetched=meta["time"],
        last_used=max(info.st_atime, meta["time"]),
        bound=binds(meta, info),
        extracted=extracted,
        extracted_size=_tree_bytes(extracted) if extracted is not None else 0,
        identity=_identity(info),
    )


def _identity(info: os.stat_result) -> tuple[int, int, int, int]:
    return (info.st_dev, *file_identity(info))


def _published(path: Path) -> Optional[tuple[int, int, int, int]]:
    try:
        return _identity(os.lstat(path))
    except OSError:
        return None


def _real_folder(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _tree_bytes(folder: Path) -> int:
    """Bytes of the regular files under `folder`, links never followed."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                info = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                total += info.st_size
    return total


def _disk_bytes(path: Path) -> int:
    """The bytes `path` takes: a sparse partial file's blocks, a folder's files."""
    try:
        info = os.lstat(path)
    except OSError:
        return 0
    if stat.S_ISDIR(info.st_mode):
        return _tree_bytes(path)
    return min(info.st_size, info.st_blocks * 512) if stat.S_ISREG(info.st_mode) else 0


def _dangling(cache_dir: Path, name: str, names: set[str]) -> bool:
    """Whether `name` is a sidecar of ours (valid metadata, named for an entry) whose file
    is gone. A file with a sidecar of its own is an entry (a cached `.json` file), never
    a sidecar, whatever its bytes hold."""
    if not name.endswith(".json") or f"{name}.json" in names:
        return False
    base = name[: -len(".json")]
    return (
        _ENTRY_NAME.fullmatch(base) is not None
        and base not in names
        and read_metadata(cache_dir / name) is not None
    )


def _work_folders(cache_dir: Path) -> Iterator[Path]:
    """This user's work folders of `cache_dir` (a planted one is never listed)."""
    for fallback in range(WORK_FALLBACKS + 1):
        folder = work_folder(cache_dir / "any", fallback)
        if private_folder(folder):
            yield folder


def _stale_in(cache_dir: Path, folder: Path) -> list[Path]:
    """Orphaned partial files (and their records) and dead writers' temporaries in `folder`."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    now, found, partials = time.time(), [], set()
    for name in names:
        partial = PartialName.parse(cache_dir, name, folder)
        if partial is None:
            continue
        partials.add(name[: -len(".part")])
        try:
            info = os.lstat(partial.path)
        except OSError:
            continue
        if ours(info) and orphaned(partial, info, now):
            found.append(partial.path)
            if f"{name}s" in names:  # a parallel fetch's record of parts goes with its file
                found.append(folder / f"{name}s")
    bases = {name.rsplit(".", 4)[0] for name in names if name.endswith(_LEFTOVERS)}
    for base in sorted(bases):
        for path in dead_leftovers(folder / base, _LEFTOVERS):
            if path.name.endswith(".parts") and path.name[: -len(".parts")] in partials:
                continue  # judged with its partial file, above
            found.append(path)
    return found


def _sweep(cache_dir: Path, path: Path, lock: LockKind) -> bool:
    """Remove a stale file (a folder: a dead extractor's). A partial file, or a sidecar
    without its file, only while nobody holds its entry's lock: a fetch may be adopting
    the one, or publishing the file of the other (its sidecar goes first)."""
    final: Optional[Path] = None
    if path.name.endswith(".part"):
        partial = PartialName.parse(cache_dir, path.name, path.parent)
        final = partial.final if partial is not None else None
    elif path.parent == cache_dir and path.name.endswith(".json"):
        final = path.with_name(path.name[: -len(".json")])
    if final is not None:
        with _unlocked(lock_of(final), path.name, lock) as free:
            if free:
                _unlink(path)
            return free
    if _real_folder(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        _unlink(path)
    return True


def _remove_extracted(folder: Path) -> None:
    """Stop vouching for `folder` (its marker goes first), move it into the work folder
    (named as a dead extractor's leftover would be, should this process die), remove it."""
    _unlink(folder.with_name(f"{folder.name}.json"))
    moved = enter_work_folder(folder).path / f"{folder.name}.{unique_token()}.old"
    try:
        os.rename(folder, moved)
    except OSError:
        moved = folder
    shutil.rmtree(moved, ignore_errors=True)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _locked(entry: CacheEntry, lock: LockKind) -> bool:
    """Whether another process holds `entry`'s lock now, or reads it (`UseLock`): a lock
    file that is not there is held by nobody (none is made to find out)."""
    if in_use(use_of(entry.path)):
        return True
    if not os.path.lexists(entry.lock):
        return False
    with _unlocked(entry.lock, entry.url, lock) as free:
        return not free


@contextmanager
def _unlocked(path: Path, url: str, kind: LockKind) -> Iterator[bool]:
    """The entry lock at `path` taken without waiting: True while held, False when
    another process holds it."""
    entry_lock = EntryLock(path, kind, 0.0, url)
    try:
        entry_lock.__enter__()
    except LockTimeoutError:
        yield False
        return
    try:
        yield True
    finally:
        entry_lock.__exit__(None, None, None)
