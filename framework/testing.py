"""Test helpers for plugin authors (and this project's own tests).

- `fresh_registry()`: a copy of the active registry for the length of a block, so
  what a test registers never leaks into the next (pluggy's fresh `pm` per test).
- `MemoryBackend`: a download backend serving `mem://` URLs from a dict of bytes,
  counting how often each URL is opened.
- `assert_reader_shards_exactly_once(reader, path)`: reads `path` as every worker of
  every rank would, for several worker/rank grids (some always leaving a remainder for
  this data), and checks the shards together yield each instance exactly once.

Importing this module imports no torch.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar, Optional

from framework.data.reader import DatasetReader, DatasetReaderInput, DistributedInfo, Instance, WorkerInfo
from framework.download.backend import ByteStream, DownloadBackend, RemoteInfo
from framework.errors import DownloadError, HTTPStatusError
from framework.registry import Registry, get_registry, use_registry

__all__ = [
    "DEFAULT_SHARD_GRIDS",
    "MemoryBackend",
    "assert_reader_shards_exactly_once",
    "fresh_registry",
    "read_shards",
]

DEFAULT_SHARD_GRIDS: tuple[tuple[int, int], ...] = ((1, 1), (2, 1), (3, 1), (1, 2), (2, 3))
"""(num_workers, world_size) grids: no sharding, workers only, ranks only, and both.
`assert_reader_shards_exactly_once` adds grids whose shard count does not divide the
number of instances, so a reader dropping the remainder is caught whatever the data."""


@contextmanager
def fresh_registry(registry: Optional[Registry] = None) -> Iterator[Registry]:
    """Make a copy of the active registry (or `registry`) active inside the block."""
    with use_registry(registry if registry is not None else get_registry().copy()) as active:
        yield active


class MemoryBackend(DownloadBackend):
    """Serves `mem://` URLs from `objects`; `opens` counts the opens of each URL.

    Register it under the scheme's name (`MemoryBackend.register("mem")` inside
    `fresh_registry`, or `registrar.add(DownloadBackend, "mem", MemoryBackend)` in a
    plugin). Both dicts are class-level, since the download manager makes the instance.
    """

    objects: ClassVar[dict[str, bytes]] = {}
    opens: ClassVar[collections.Counter[str]] = collections.Counter()

    def __init__(self, **options: Any) -> None:
        self.options = options  # retries, timeouts: nothing to retry in memory

    @classmethod
    def reset(cls) -> None:
        cls.objects.clear()
        cls.opens.clear()

    def open(self, url: str, offset: int = 0, *, if_range: Optional[str] = None) -> ByteStream:
        data = self.objects.get(url)
        if data is None:
            raise HTTPStatusError(url, 404, "no such object in MemoryBackend.objects")
        if offset > len(data):
            return ByteStream(iter(()), start=offset, size=len(data), status=416)
        self.opens[url] += 1
        return ByteStream(iter([data[offset:]]), start=offset, size=len(data), etag=self._etag(url))

    def stat(self, url: str) -> RemoteInfo:
        data = self.objects.get(url)
        if data is None:
            raise DownloadError(url, "no such object in MemoryBackend.objects")
        return RemoteInfo(size=len(data), etag=self._etag(url))

    def _etag(self, url: str) -> str:
        import hashlib

        return '"' + hashlib.sha256(self.objects[url]).hexdigest()[:16] + '"'


def read_shards(
    reader: DatasetReader, path: DatasetReaderInput, num_workers: int, world_size: int
) -> list[list[Instance]]:
    """What each (rank, worker) of the grid reads from `path`, rank-major, as a loader
    with `num_workers` workers yields it.

    Sets the worker and distributed info a loader would set, in this process, and runs
    `apply_token_indexers` on each instance after reading, as the loader does once an
    instance has crossed from its worker; the reader's own settings are put back.
    """
    saved = (reader._worker_info, reader._distributed_info, reader._distributed_info_set)
    hook = type(reader).apply_token_indexers is not DatasetReader.apply_token_indexers
    shards: list[list[Instance]] = []
    try:
        for rank in range(world_size):
            for worker in range(num_workers):
                reader._set_distributed_info(DistributedInfo(world_size, rank) if world_size > 1 else None)
                reader._set_worker_info(WorkerInfo(num_workers, worker))  # as in a loader's worker
                shard = list(reader.read(path))
                for instance in shard if hook else ():
                    reader.apply_token_indexers(instance)
                shards.append(shard)
    finally:
        reader._worker_info, reader._distributed_info, reader._distributed_info_set = saved
    return shards


def _default_key(instance: Instance) -> Hashable:
    return repr(instance)


def assert_reader_shards_exactly_once(
    reader: DatasetReader,
    path: DatasetReaderInput,
    *,
    key: Callable[[Instance], Hashable] = _default_key,
    grids: Optional[Iterable[tuple[int, int]]] = None,
) -> list[Instance]:
    """Check that every grid's shards together yield what one unsharded read yields,
    each instance exactly once; returns the unsharded instances.

    `key` identifies an instance (its `repr` by default: give one for tensors).
    `grids` are (num_workers, world_size) pairs: by default `DEFAULT_SHARD_GRIDS` plus
    grids whose shard count does not divide the number of instances.
    Raises AssertionError naming the grid, the shard and the instances that differ.
    """
    (expected,) = read_shards(reader, path, 1, 1)
    if not expected:
        raise AssertionError(f"{type(reader).__name__} read nothing from {path!r}: nothing to check")
    wanted = collections.Counter(map(key, expected))
    if grids is None:
        grids = DEFAULT_SHARD_GRIDS + _remainder_grids(len(expected))
    for num_workers, world_size in grids:
        shards = read_shards(reader, path, num_workers, world_size)
        got = collections.Counter(key(instance) for shard in shards for instance in shard)
        if got != wanted:
            raise AssertionError(
                f"{type(reader).__name__} with {num_workers} worker(s) x {world_size} rank(s): "
                f"missing {_sample(wanted - got)}, extra or repeated {_sample(got - wanted)} "
                f"(shard sizes {[len(s) for s in shards]})"
            )
    return expected


def _remainder_grids(count: int) -> tuple[tuple[int, int], ...]:
    """Workers only, ranks only and both, each with a shard count leaving a remainder."""
    shards = next(k for k in range(2, count + 2) if count % k)
    both = next(k for k in range(2, count + 2) if count % (2 * k))
    return ((shards, 1), (1, shards), (2, both))


def _sample(counts: collections.Counter[Hashable], limit: int = 3) -> Sequence[Hashable]:
    return list(counts.elements())[:limit]
