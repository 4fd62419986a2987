"""Test helpers for plugin authors (and this project's own tests).

- `fresh_registry()`: a copy of the active registry for the length of a block, so
  what a test registers never leaks into the next (pluggy's fresh `pm` per test).
- `MemoryBackend`: a download backend serving `mem://` URLs from a dict of bytes,
  counting how often each URL is opened; it lists them too.
- `check_backend(backend, url, data)`: checks a download backend against the
  `DownloadBackend` contract on one object, ranges and listing included when it
  declares them.
- `assert_reader_shards_exactly_once(reader, path)`: reads `path` as every worker of
  every rank would, for several worker/rank grids (some always leaving a remainder for
  this data), and checks the shards together yield each instance exactly once.

Importing this module imports no torch.
"""

from __future__ import annotations

import builtins
import collections
import inspect
import uuid
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar, Optional

import attrs

from framework.data.reader import DatasetReader, DatasetReaderInput, DistributedInfo, Instance, WorkerInfo
from framework.download.backend import (
    ByteStream,
    DownloadBackend,
    ListedObject,
    RemoteInfo,
    range_unsupported,
)
from framework.errors import DownloadError, HTTPStatusError
from framework.registry import Registry, get_registry, use_registry

__all__ = [
    "DEFAULT_SHARD_GRIDS",
    "MemoryBackend",
    "assert_reader_shards_exactly_once",
    "check_backend",
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
    """Serves `mem://` URLs from `objects`; `opens` counts the opens of each URL, `lists`
    the calls to `list`.

    Register it under the scheme's name (`MemoryBackend.register("mem")` inside
    `fresh_registry`, or `registrar.add(DownloadBackend, "mem", MemoryBackend)` in a
    plugin). Both dicts are class-level, since the download manager makes the instance.
    """

    supports_listing: ClassVar[bool] = True
    objects: ClassVar[dict[str, bytes]] = {}
    opens: ClassVar[collections.Counter[str]] = collections.Counter()
    lists: ClassVar[builtins.list[str]] = []

    def __init__(self, **options: Any) -> None:
        self.options = options  # retries, timeouts: nothing to retry in memory

    @classmethod
    def reset(cls) -> None:
        cls.objects.clear()
        cls.opens.clear()
        cls.lists.clear()

    def open(
        self, url: str, offset: int = 0, *, end: Optional[int] = None, if_range: Optional[str] = None
    ) -> ByteStream:
        if end is not None:  # one stream (`supports_ranges` is False): never asked for a range
            raise range_unsupported(url, self, offset, end)
        data = self.objects.get(url)
        if data is None:
            raise HTTPStatusError(url, 404, "no such object in MemoryBackend.objects")
        if offset > len(data):
            return ByteStream(iter(()), start=offset, size=len(data), status=416)
        self.opens[url] += 1
        return ByteStream(iter([data[offset:]]), start=offset, size=len(data), etag=self._etag(url))

    def list(self, prefix: str, *, recursive: bool = True) -> builtins.list[ListedObject]:
        self.lists.append(prefix)
        return [
            ListedObject(url, size=len(data), etag=self._etag(url))
            for url, data in sorted(self.objects.items())
            if url.startswith(prefix) and (recursive or "/" not in url[len(prefix) :])
        ]

    def stat(self, url: str) -> RemoteInfo:
        data = self.objects.get(url)
        if data is None:
            raise DownloadError(url, "no such object in MemoryBackend.objects")
        return RemoteInfo(size=len(data), etag=self._etag(url))

    def _etag(self, url: str) -> str:
        import hashlib

        return '"' + hashlib.sha256(self.objects[url]).hexdigest()[:16] + '"'


def check_backend(backend: DownloadBackend, url: str, data: bytes) -> None:
    """Check `backend` against the `DownloadBackend` contract on `url`, an object whose
    bytes are `data` (two bytes or more): `check_url` accepts `url`, `open` takes
    `(url, offset=0, *, end=None, if_range=None)`, serves the object from 0 and
    resumes from an offset (or answers whole from 0), answers an offset past the end
    with an empty stream of status 416, `stat` agrees with it, a stream closes twice,
    and the backend works after `close`. With `supports_ranges`, `end` bounds the range (answered
    with status 206), an `end` past the object ends at its end, and `if_range` naming
    the version serves the range. With `supports_listing`, `list` takes `(prefix, *,
    recursive=True)` and, for the object's folder (the URL up to its last `/`) and for
    the URL itself, finds the object with its size, every URL starting with the prefix,
    sorted and once; `recursive=False` keeps to the folder's level; a prefix nothing
    starts with finds nothing; a listed ETag agrees with `stat`'s.

    Raises AssertionError saying which promise was broken."""
    name = type(backend).__name__
    if len(data) < 2:
        raise ValueError("check_backend needs an object of two bytes or more")
    try:
        inspect.signature(backend.open).bind(url, 0, end=None, if_range=None)
    except TypeError as error:
        raise AssertionError(
            f"{name}.open must take (url, offset=0, *, end=None, if_range=None): {error}"
        ) from None
    try:
        backend.check_url(url)
    except DownloadError as error:
        raise AssertionError(f"{name}.check_url refuses the URL it serves: {error}") from None
    whole = _read(backend, url, 0)
    _expect(whole.start == 0 and whole.body == data, f"{name} opened at 0 gave {whole}, not the object")
    _expect(whole.size in (None, len(data)), f"{name} says the object is {whole.size} bytes, not {len(data)}")
    for offset in (1, len(data) // 2, len(data)):
        got = _read(backend, url, offset)
        resumed = got.start == offset and got.body == data[offset:]
        _expect(resumed or (got.start == 0 and got.body == data), f"{name} opened at {offset} gave {got}")
    past = _read(backend, url, len(data) + 1)
    _expect(past.body == b"", f"{name} opened past the end gave bytes ({past})")
    _expect(past.status == 416, f"{name} opened past the end answered status {past.status}, not 416")
    info = backend.stat(url)
    _expect(info.size in (None, len(data)), f"{name}.stat says {info.size} bytes, not {len(data)}")
    _expect(None in (info.etag, whole.etag) or info.etag == whole.etag, f"{name}.stat names another version")
    if backend.supports_ranges:
        _check_ranges(backend, url, data, whole.if_range)
    if backend.supports_listing:
        _check_listing(backend, url, data, info)
    stream = backend.open(url, 0)
    stream.close()
    stream.close()
    backend.close()
    _expect(_read(backend, url, 0).body == data, f"{name} does not work after close()")


@attrs.frozen
class _Read:
    start: int
    status: Optional[int]
    size: Optional[int]
    etag: Optional[str]
    if_range: Optional[str]
    body: bytes

    def __str__(self) -> str:
        return f"start={self.start}, size={self.size}, {len(self.body)} bytes"


def _read(backend: DownloadBackend, url: str, offset: int, **keywords: Any) -> _Read:
    with backend.open(url, offset, **keywords) as stream:
        body = b"".join(stream.chunks)
        return _Read(
            stream.start, stream.status, stream.size, stream.etag, stream.etag or stream.last_modified, body
        )


def _check_ranges(backend: DownloadBackend, url: str, data: bytes, version: Optional[str]) -> None:
    name, middle = type(backend).__name__, len(data) // 2
    for start, end in ((0, 1), (1, middle + 1), (middle, len(data)), (1, len(data) + 100)):
        got = _read(backend, url, start, end=end)
        _expect(
            got.start == start and got.body == data[start:end],
            f"{name} asked for [{start}, {end}) gave {got}",
        )
        _expect(
            got.status == 206, f"{name} answered the range [{start}, {end}) with status {got.status}, not 206"
        )
    if version is not None:
        got = _read(backend, url, 1, end=middle + 1, if_range=version)
        wanted = got.start == 1 and got.body == data[1 : middle + 1]
        _expect(wanted, f"{name} asked for [1, {middle + 1}) if still {version} gave {got}")


def _check_listing(backend: DownloadBackend, url: str, data: bytes, info: RemoteInfo) -> None:
    name, folder = type(backend).__name__, url[: url.rfind("/") + 1]
    try:
        inspect.signature(backend.list).bind(folder, recursive=True)
    except TypeError as error:
        raise AssertionError(f"{name}.list must take (prefix, *, recursive=True): {error}") from None
    for prefix, recursive in ((folder, True), (folder, False), (url, True)):
        listed = backend.list(prefix, recursive=recursive)
        urls = [item.url for item in listed]
        asked = f"{name}.list({prefix!r}, recursive={recursive})"
        _expect(urls == sorted(set(urls)), f"{asked} is not sorted by URL, each once: {urls[:5]}")
        stray = [found for found in urls if not found.startswith(prefix)]
        _expect(not stray, f"{asked} gave URLs not starting with the prefix: {stray[:5]}")
        deeper = [found for found in urls if "/" in found[len(prefix) :]]
        _expect(recursive or not deeper, f"{asked} gave objects below the folder's level: {deeper[:5]}")
        mine = [item for item in listed if item.url == url]
        _expect(len(mine) == 1, f"{asked} did not find {url} (found {urls[:5]})")
        _expect(mine[0].size in (None, len(data)), f"{asked} says {mine[0].size} bytes, not {len(data)}")
        etags = (mine[0].etag, info.etag)
        _expect(None in etags or etags[0] == etags[1], f"{asked} names another version than stat: {etags}")
    nothing = f"{folder}no-such-object-{uuid.uuid4().hex}"
    _expect(backend.list(nothing) == [], f"{name}.list({nothing!r}) found objects")


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


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
