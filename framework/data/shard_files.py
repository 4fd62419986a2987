"""`ShardFiles`: what a reader reads when `data_path` names shards.

The loader resolves a `data_path` that names shards (a glob on a backend that lists, a
brace range, `manifest:URL`, a URL, or a list holding any of those; see
`framework.download.resolve_shards`), once, when it is built or the setting is
assigned. The reader gets a `ShardFiles`, a sequence of local paths: a local shard is
read in place; a remote one is fetched (through the download manager: verified, one
fetch per cache folder across processes) when the reader comes to it, while the next
`prefetch` are fetched in the background, within `cache_limit`
(`framework.download.streaming.ShardCache`). A plain list of local files names no
shards: the reader gets that list.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from concurrent import futures
from concurrent.futures import Future
from typing import Any, Optional, Union, overload
from urllib.parse import urlsplit

from framework.data._batching import derive_seed
from framework.download import DownloadManager, Shard, resolve_shards
from framework.download.shards import MANIFEST_PREFIX, expand_braces, local_path
from framework.download.sizes import parse_size
from framework.download.streaming import Held, Ranking, ShardCache, budget_problem, shard_sizes
from framework.errors import ConfigError, InvalidArgumentError, ShardSpecError

__all__ = ["CLOSE_WAIT_S", "DEEPEST", "ShardFiles", "let_go", "names_shards", "read_since", "resolve_source"]

DEEPEST = 4  # how many times `prefetch` a reader that waits may fetch ahead (no cache_limit)
# How long a pass that ends waits for its fetches ahead; past it (a stalled server) they
# end on their own, on daemon threads that never keep the program from exiting.
CLOSE_WAIT_S = 5.0


class ShardFiles(Sequence[str]):
    """The local paths of a streamed dataset's shards, fetched as a reader comes to them.

    `files[i]` is shard `i`'s path once it is fetched and verified; asking for it also
    starts fetching shards `i+1 .. i+prefetch` on threads, and holds shard `i` (no
    process evicts it) until the reader asks for a later shard or the pass ends. Read
    the shards in order, one at a time, as the built-in readers do; `urls` names them
    without fetching anything. A fetch that fails raises `ShardError` naming the shard.

    Picklable: a worker process sends nothing back and starts its own threads.
    """

    def __init__(
        self,
        shards: Sequence[Shard],
        *,
        cache_dir: Optional[str] = None,
        cache_limit: Optional[int] = None,
        prefetch: int = 2,
    ) -> None:
        self.shards = tuple(shards)
        self.cache_dir = cache_dir
        self.cache_limit = cache_limit
        self.prefetch = prefetch
        # `order` is the epoch's order of the shards and `upcoming` the next epoch's (for
        # eviction); item i is shard reads[i]: the epoch's order, or one process's share
        # of it (`dealt`), whose shard at place j of `order` is read at step j // stride.
        self.order: tuple[int, ...] = tuple(range(len(self.shards)))
        self.upcoming: tuple[int, ...] = self.order
        self.reads: tuple[int, ...] = self.order
        self.stride = 1
        # dealt: each item's (stream, place in the stream); `on_open` is told them as it opens
        self.streams: tuple[tuple[int, int], ...] = ()
        self.on_open: Optional[Callable[[int, int], None]] = None
        self._here: Optional[_Fetching] = None
        self._shares: list[ShardFiles] = []  # `dealt` views made of this one here

    def in_epoch_order(self, seed: int, epoch: int) -> ShardFiles:
        """The same shards in epoch `epoch`'s order: shuffled by `seed` and the epoch, the
        same in every process and every run."""
        count = len(self.shards)
        return self._view(self.shards, _shuffled(count, seed, epoch), _shuffled(count, seed, epoch + 1))

    def dealt(self, streams: Sequence[int], stride: int, marks: Mapping[int, Sequence[int]]) -> ShardFiles:
        """One reading process's share when whole shards are dealt over `stride` slots:
        stream p is the shards at places p, p + stride, p + 2 * stride, ... of the
        epoch's order; the view reads the `streams` given one after another, each from
        the place its mark gives (`[place, ...]`, -1: none of it), the shards before
        it read already."""
        view = self._view(self.shards, self.order, self.upcoming)
        items = []
        for stream in streams:
            dealt = self.order[stream::stride]
            place = marks[stream][0] if stream in marks else 0
            start = len(dealt) if place < 0 else place
            items += [(stream, at, dealt[at]) for at in range(start, len(dealt))]
        view.reads = tuple(shard for _, _, shard in items)
        view.streams = tuple((stream, at) for stream, at, _ in items)
        view.stride = stride
        self._shares.append(view)  # closed with this one: a pass lets go of what it read
        return view

    def pinned(self, digests: Mapping[str, str]) -> ShardFiles:
        """The same shards, each URL in `digests` to be fetched with that sha256 only: a
        resumed epoch reads the bytes its state was saved with, or fails naming the shard."""
        shards = [
            Shard(shard.url, digests.get(_named(shard.url), shard.sha256), shard.size)
            for shard in self.shards
        ]
        view = self._view(shards, self.order, self.upcoming)
        view.reads, view.streams, view.stride = self.reads, self.streams, self.stride
        return view

    def _view(
        self, shards: Sequence[Shard], order: Optional[tuple[int, ...]] = None, upcoming: tuple[int, ...] = ()
    ) -> ShardFiles:
        """`shards` with this one's cache settings, read in `order` (default: as given)."""
        view = ShardFiles(
            shards, cache_dir=self.cache_dir, cache_limit=self.cache_limit, prefetch=self.prefetch
        )
        if order is not None:
            view.order, view.upcoming = order, upcoming
            view.reads = order
        return view

    def read_since(self) -> dict[str, str]:
        """The sha256 of each remote shard this process opened since the last call (by
        URL without its query): what a saved state pins the epoch's shards to."""
        here = self._here
        if here is None or here.pid != os.getpid():
            return {}
        with here.lock:
            read, here.read = here.read, {}
        return read

    def local_files(self) -> list[str]:
        """The shards read in place: local files, which a state stamps as it does a list."""
        return [path for path in (local_path(shard.url) for shard in self.shards) if path is not None]

    def describe(self) -> str:
        """Which shards, in the dataset's order: their count and a digest of their URLs
        (without a query: a presigned URL signed anew names the same object)."""
        names = "\n".join(_named(shard.url) for shard in self.shards)
        listed = hashlib.sha256(names.encode()).hexdigest()
        return f"{len(self.shards)} shards, listed as {listed[:16]}"

    @property
    def urls(self) -> list[str]:
        """The shards' URLs, in the order read."""
        return [self.shards[index].url for index in self.reads]

    def __len__(self) -> int:
        return len(self.reads)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[str, Sequence[str]]:
        if isinstance(index, slice):
            return self._view([self.shards[i] for i in self.reads[index]])
        count = len(self.reads)
        if not -count <= index < count:
            raise IndexError(f"shard index {index} out of range: there are {count} shards")
        if self.on_open is not None and self.streams:
            self.on_open(*self.streams[index % count])
        return self._fetching().path(index % count)

    def __iter__(self) -> Iterator[str]:
        for index in range(len(self.reads)):
            yield self[index]

    def close(self) -> None:
        """Release every shard held and stop fetching ahead (the next item starts again)."""
        here, self._here = self._here, None
        shares, self._shares = self._shares, []
        for share in shares:
            share.close()
        if here is not None and here.pid == os.getpid():
            here.close()

    def __repr__(self) -> str:
        shown = ", ".join(repr(url) for url in self.urls[:3])
        more = f", ... ({len(self.shards)} shards)" if len(self.shards) > 3 else ""
        return f"ShardFiles([{shown}{more}])"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_here"] = None  # threads and held locks stay in the process that made them
        state["on_open"] = None  # the reading process's shard plan
        state["_shares"] = []
        return state

    def __copy__(self) -> ShardFiles:
        """The same shards, with fetches and holds of its own (a copied loader's)."""
        other = ShardFiles.__new__(ShardFiles)
        other.__dict__.update(self.__getstate__())
        return other

    def __del__(self) -> None:
        self.close()

    def _fetching(self) -> _Fetching:
        here = self._here
        if here is None or here.pid != os.getpid():  # a forked worker starts its own
            manager = DownloadManager(self.cache_dir, progress=False)
            cache = ShardCache(self.shards, manager, self.cache_limit)
            here = self._here = _Fetching(self, cache)
        return here


class _Fetching:
    """A process's fetches of one `ShardFiles`: the shards held and being fetched, by
    their place in what it reads; `where` is the step of the epoch each shard is read
    at (its place in the epoch's order, over the processes it is dealt to)."""

    def __init__(self, files: ShardFiles, cache: ShardCache) -> None:
        self.pid = os.getpid()
        self.cache = cache
        self.order = files.reads
        self.stride = stride = files.stride
        self.places = {shard: place for place, shard in enumerate(files.order)}
        self.where = {shard: place // stride for place, shard in enumerate(files.order)}
        self.where_next = {shard: place // stride for place, shard in enumerate(files.upcoming)}
        self.steps = -(-len(files.order) // stride)
        prefetch = files.prefetch
        # Shards fetched ahead: `prefetch`, deepened while the reader still waits for its
        # next shard (fetches slower than reads: a far server, small shards), up to
        # DEEPEST times as many; with a cache_limit, `prefetch` is what it was sized for.
        self.depth = prefetch
        self.deepest = prefetch if cache.limit is not None else DEEPEST * prefetch
        self.wanted: dict[int, Future[Held]] = {}
        self.lock = threading.Lock()
        self.read: dict[str, str] = {}  # opened since `ShardFiles.read_since`: URL -> sha256

    def farthest_first(self, now: int) -> Ranking:
        """Seen from step `now`, the published shards not held, farthest next use first.

        A shard ahead is read next at its step; one behind, by a slower process of the
        same pass when a held shard (that process's) lies behind it, else at its step in
        the next epoch. When records are dealt one by one, every reading process reads
        every shard, so evicting what this one passed would fetch it again for the others.
        With whole shards dealt, a shard's stream has one reader: a shard behind is still
        to be read only when that stream's held shard lies behind it."""
        count, stride = self.steps, self.stride

        def ranked(published: Sequence[int], held: AbstractSet[int]) -> list[int]:
            low = min((self.where[shard] for shard in held if self.where[shard] < now), default=now)
            reading: dict[int, int] = {}  # dealt: a stream's step, where its reader holds a shard
            for shard in held:
                stream = self.places[shard] % stride
                reading[stream] = min(reading.get(stream, now), self.where[shard])

            def until(shard: int) -> int:
                place = self.where[shard]
                if place >= now:
                    return place - now
                behind = reading.get(self.places[shard] % stride, now) if stride > 1 else low
                if place >= behind:
                    return place - behind
                return count - now + self.where_next[shard]

            return sorted((shard for shard in published if shard not in held), key=until, reverse=True)

        return ranked

    def path(self, index: int) -> str:
        last = min(len(self.order), index + 1 + self.depth)
        with self.lock:
            for other in [other for other in self.wanted if not index <= other < last]:
                _let_go(self.wanted.pop(other))  # read already, or not ahead any more
            # At a cold start the shards ahead wait for the first one: fetched alone, it
            # comes sooner (on a server that spends time on each request, such as moto,
            # six at once took several times as long), and so does the first batch.
            first = None if self.wanted else index
            for ahead in range(index, last):
                if ahead not in self.wanted:
                    shard = self.order[ahead]
                    self.wanted[ahead] = _in_thread(
                        self.cache.hold,
                        shard,
                        self.farthest_first(self.where[shard]),
                        after=None if first is None or ahead == first else self.wanted[first],
                    )
            wanted = self.wanted[index]
        if not wanted.done() and self.depth < self.deepest:
            self.depth += 1  # the reader waits: fetch one more ahead from the next shard on
        try:
            held = wanted.result()
        except BaseException:
            with self.lock:
                if self.wanted.get(index) is wanted:
                    del self.wanted[index]  # asked again, it is fetched again
            raise
        if held.sha256 is not None:
            with self.lock:
                self.read[_named(self.cache.shards[self.order[index]].url)] = held.sha256
        return held.path

    def close(self) -> None:
        """Let go of every shard; fetches ahead still under way are waited for (at most
        CLOSE_WAIT_S), so a pass that ends leaves no thread writing into the cache."""
        with self.lock:
            wanted, self.wanted = self.wanted, {}
        for future in wanted.values():
            _let_go(future)  # one still waiting for its turn is cancelled, not started
        # A cancelled one writes nothing (and counts as not done until its turn comes).
        futures.wait([future for future in wanted.values() if not future.cancelled()], timeout=CLOSE_WAIT_S)


def read_since(source: Any) -> dict[str, str]:
    """`ShardFiles.read_since` of `source` ({} for anything else)."""
    return source.read_since() if isinstance(source, ShardFiles) else {}


def let_go(source: Any) -> None:
    """At a pass's end: release the shards a `ShardFiles` holds and its fetches ahead, so
    an idle process (between epochs, a persistent worker) keeps nothing from eviction."""
    if isinstance(source, ShardFiles):
        source.close()


def _in_thread(fetch: Callable[..., Held], *args: Any, after: Optional[Future[Held]] = None) -> Future[Held]:
    """`fetch(*args)` on a daemon thread of its own (at most `prefetch` + 1 run at once),
    started once `after` is done (at once without it): a program that stops reading
    exits without waiting for fetches ahead, whose partial files are never published
    and are swept later. Cancelled before it starts, it never runs."""
    future: Future[Held] = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return  # let go of before its turn
        try:
            future.set_result(fetch(*args))
        except BaseException as error:  # handed to the reader that asks for the shard
            future.set_exception(error)

    def start(_: object = None) -> None:
        try:
            threading.Thread(target=run, name="framework-shard-fetch", daemon=True).start()
        except BaseException as error:  # no thread (from a done callback, nobody else would hear)
            if future.set_running_or_notify_cancel():
                future.set_exception(error)
            if after is None:
                raise

    if after is None:
        start()
    else:
        after.add_done_callback(start)  # at once if it is done already
    return future


def _let_go(future: Future[Held]) -> None:
    """Release a shard's hold now, or once its fetch ends; a fetch not yet started is
    cancelled."""
    future.cancel()  # False once it runs

    def release(done: Future[Held]) -> None:
        if not done.cancelled() and done.exception() is None:
            done.result().release()

    future.add_done_callback(release)


def _named(url: str) -> str:
    """A shard's URL without its query: a presigned URL signed anew names the same object."""
    return url.split("?", 1)[0]


def _shuffled(count: int, seed: int, epoch: int) -> tuple[int, ...]:
    order = list(range(count))
    random.Random(derive_seed(seed, "shards", epoch)).shuffle(order)
    return tuple(order)


def names_shards(data_path: Any, *, one_url: bool = True) -> bool:
    """Whether `data_path` is a shard spec the loader resolves (see the module): a glob,
    a brace, `manifest:`, a URL of a scheme other than `file` (unless `one_url` is
    False: then only a list holds one), or a list holding any of those. A local path
    that exists is a file of its own, whatever characters it holds."""
    if isinstance(data_path, list):
        return any(names_shards(item) for item in data_path)
    if not isinstance(data_path, (str, os.PathLike)):
        return False
    text = os.fspath(data_path)
    if not isinstance(text, str):
        return False
    local = local_path(text)
    if local is not None and os.path.exists(local):
        # A file that exists is itself, whatever its name holds; a `file://` URL of one
        # is read as the path it names (by the loader; `framework run` reads it itself).
        return local != text and one_url
    if text.startswith(MANIFEST_PREFIX) or (one_url and local is None):
        return True
    # A web URL's query (a signature, say) holds `?`, which is no glob there.
    named = text
    if text.lower().startswith(("http://", "https://")):
        try:
            named = urlsplit(text).path
        except ValueError:  # not a URL urlsplit reads: resolving it says what is wrong
            pass
    return any(mark in named for mark in "*?[") or expand_braces(text) != [text]


def _backend_serves(text: str, manager: DownloadManager) -> bool:
    try:
        manager.backend_for(text)
    except InvalidArgumentError:  # no backend for the scheme
        return False
    return True


def resolve_source(
    data_path: Any, cache_dir: Optional[str], cache_limit: Optional[Union[int, str]], prefetch: int
) -> Any:
    """What `reader.read()` gets for `data_path`: `data_path` itself unless it names
    shards (`names_shards`: a plain list of local files is read as that list); else a
    `ShardFiles` (local shards in it are read in place). Raises `ConfigError` for a
    `cache_limit` that cannot hold a reader's shard and the `prefetch` ahead of it,
    and the errors of `resolve_shards` (`ShardSpecError`, `ListingUnsupportedError`,
    `DownloadError`)."""
    if not names_shards(data_path):
        return data_path
    with DownloadManager(cache_dir, progress=False) as manager:
        shards = _shards_named(data_path, manager)
        if shards is None:
            return data_path
        limit = None if cache_limit is None else parse_size(cache_limit)
        if limit is not None:
            problem = budget_problem(shard_sizes(shards, manager), limit, prefetch)
            if problem is not None:
                raise ConfigError("cache_limit", problem)
    return ShardFiles(shards, cache_dir=cache_dir, cache_limit=limit, prefetch=prefetch)


def _shards_named(data_path: Any, manager: DownloadManager) -> Optional[list[Shard]]:
    """The shards `data_path` names; None for one string that names nothing this library
    fetches (a URL of a scheme no backend serves, a pattern no file matches): a name the
    user's reader understands (`squad[0:6]`, `myapi://warehouse/t`), which reaches it as
    it is."""
    text = os.fspath(data_path) if isinstance(data_path, (str, os.PathLike)) else None
    if not isinstance(text, str) or text.startswith(MANIFEST_PREFIX):
        return resolve_shards(data_path, manager)
    if local_path(text) is None:
        return resolve_shards(data_path, manager) if _backend_serves(text, manager) else None
    try:
        return resolve_shards(data_path, manager)
    except ShardSpecError:
        return None
