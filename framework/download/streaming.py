"""`ShardCache`: a streamed dataset's shards passing through a cache folder within a
disk budget.

A process that reads shard `i` holds it (`hold`): a shared lock on the entry's use
file (`UseLock`) for as long as it reads, taken *before* the entry is looked up, so a
removal (which takes the exclusive lock without waiting) cannot come between the
lookup and the open. Before a shard is fetched, and again once it is published, the
dataset's published shards are trimmed to `limit`: the shard whose next use is
farthest away goes first. The reader ranks them (it knows the order of this epoch and
the next: the loader's seed decides them, and a shard another process holds marks a
reader behind it, which still reads the shards between); least
recently used would instead evict exactly the shards the next epoch reads first, and
fetch the whole dataset again every epoch whenever the budget is smaller than it.
Shards held by any process, and local files (which have no remote to fetch them from
again), are never removed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

import attrs

from framework.download._cache import Entry, use_of
from framework.download._call import normalize
from framework.download._lock import UseLock, in_use
from framework.download.inventory import entry_for, remove
from framework.download.manager import DownloadManager
from framework.download.shards import Shard, local_path
from framework.download.sizes import format_size
from framework.errors import DownloadError, ShardError

__all__ = ["Held", "Ranking", "ShardCache", "budget_problem", "shard_sizes"]

Ranking = Callable[[Sequence[int], AbstractSet[int]], Iterable[int]]
"""`(published, held) -> the published shards not held, farthest next use first`."""

_STATS = 16  # threads asking a server for shard sizes at once


@attrs.define
class Held:
    """A shard's local path, held in use until `release` (a local file holds nothing),
    and the sha256 of its bytes (None: a local file)."""

    path: str
    use: Optional[UseLock] = None
    sha256: Optional[str] = None

    def release(self) -> None:
        if self.use is not None:
            self.use.release()


class ShardCache:
    """Fetches and holds a dataset's shards in `manager`'s cache folder, keeping the
    bytes of the published ones within `limit` (None: no bound). See the module."""

    def __init__(
        self, shards: Sequence[Shard], manager: DownloadManager, limit: Optional[int] = None
    ) -> None:
        self.shards = tuple(shards)
        self.manager = manager
        self.limit = limit
        root = manager.cache_dir
        self._entries = [
            None if local_path(shard.url) is not None else Entry(root, normalize(shard.url))
            for shard in self.shards
        ]

    def hold(self, index: int, farthest_first: Ranking) -> Held:
        """Shard `index`'s local path, fetched and verified if it is not cached, and held
        in use until the `Held` is released. When shards must go to make room,
        `farthest_first(published, held)` orders the published shards that are not held
        by the next use (the caller knows the order of this epoch and the next).

        Raises:
            ShardError: the fetch failed (a 404, a checksum or size that does not
                match the manifest's, offline and not cached); its `__cause__` says how.
        """
        shard = self.shards[index]
        entry = self._entries[index]
        if entry is None:
            return Held(str(local_path(shard.url)))
        use = UseLock(use_of(entry.final))
        try:
            entry.final.parent.mkdir(parents=True, exist_ok=True)  # a fresh cache: the use file goes there
        except OSError:  # unwritable: cached_path says so
            pass
        use.share()  # before the lookup: no removal can come between it and the read
        try:
            # A cached shard (the common case once the cache is warm) costs no scan.
            missing = self.limit is not None and not os.path.lexists(entry.final)
            if missing:
                self._trim(index, farthest_first)
            path = self.manager.cached_path(shard.url, sha256=shard.sha256, progress=False)
            size = os.stat(path).st_size
            if shard.size is not None and size != shard.size:
                use.release()
                self._unpublish(index)
                raise DownloadError(shard.url, f"{size} bytes, where the manifest says {shard.size}")
            if missing:
                self._trim(index, farthest_first)
            record = entry_for(self.manager.cache_dir, shard.url)
            sha256 = record.sha256 if record is not None else shard.sha256
        except DownloadError as error:
            use.release()
            raise ShardError(shard.url, index, len(self.shards), error) from error
        except BaseException:
            use.release()
            raise
        return Held(str(path), use, sha256)

    def _trim(self, current: int, farthest_first: Ranking) -> None:
        """Remove published shards, farthest next use first, until those no process
        holds fit in `limit` (the held ones, `current` among them, come on top: they
        cannot go, and counting them would leave less room for the shards read next)."""
        assert self.limit is not None
        published: list[int] = []
        sizes: dict[int, int] = {}
        for index, entry in enumerate(self._entries):
            if entry is None or index == current:
                continue
            try:
                sizes[index] = os.lstat(entry.final).st_size
            except OSError:
                continue
            published.append(index)
        if sum(sizes.values()) <= self.limit:
            return
        held = {index for index in published if in_use(use_of(self._final(index)))}
        total = sum(size for index, size in sizes.items() if index not in held)
        for index in farthest_first(published, held):
            if total <= self.limit:
                return
            found = entry_for(self.manager.cache_dir, self.shards[index].url)
            if found is not None and remove(found, lock=self.manager.lock):
                total -= found.total

    def _unpublish(self, index: int) -> None:
        """Remove shard `index`'s entry: bytes its manifest refuses are not left to be read."""
        found = entry_for(self.manager.cache_dir, self.shards[index].url)
        if found is not None:
            remove(found, lock=self.manager.lock)

    def _final(self, index: int) -> Path:
        entry = self._entries[index]
        assert entry is not None  # a remote shard's
        return entry.final


def shard_sizes(shards: Sequence[Shard], manager: DownloadManager) -> list[Optional[int]]:
    """Each remote shard's size in bytes: the manifest's or listing's, a cached copy's,
    else the backend's `stat` (asked for on threads; None offline, or when it cannot
    say). A local file is None: read in place, it takes nothing of a cache budget."""
    sizes: list[Optional[int]] = []
    unknown: list[int] = []
    for index, shard in enumerate(shards):
        size = shard.size
        if local_path(shard.url) is not None:
            size = None
        elif size is None:
            found = entry_for(manager.cache_dir, shard.url)
            size = found.size if found is not None else None
            if size is None and not manager.offline:
                unknown.append(index)
        sizes.append(size)

    def stat(index: int) -> Optional[int]:
        url = shards[index].url
        try:
            return manager.backend_for(url).stat(url).size
        except DownloadError:  # no HEAD (405), or gone: the fetch names the shard when it comes to it
            return None

    with ThreadPoolExecutor(_STATS, thread_name_prefix="framework-shard-stat") as pool:
        for index, size in zip(unknown, pool.map(stat, unknown)):
            sizes[index] = size
    return sizes


def budget_problem(sizes: Sequence[Optional[int]], limit: int, prefetch: int) -> Optional[str]:
    """Why `limit` bytes cannot hold a reader's shard and the `prefetch` after it
    (None: it can, or the sizes are unknown)."""
    known = sorted((size for size in sizes if size is not None), reverse=True)
    if not known:
        return None
    need = sum(known[: prefetch + 1])
    if limit >= need:
        return None
    shown_limit, shown_need = format_size(limit), format_size(need)
    if shown_limit == shown_need:  # rounded alike: say the bytes
        shown_limit, shown_need = f"{limit} bytes", f"{need} bytes"
    return (
        f"cache_limit {shown_limit} cannot hold the shard being read and the {prefetch} "
        f"fetched ahead of it (prefetch={prefetch}): the largest {prefetch + 1} shards take "
        f"{shown_need}. Raise cache_limit to at least {shown_need}, or lower prefetch"
    )
