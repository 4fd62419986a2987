"""Streamed-shard datasets for the loader's streaming tests: shards of jsonl.gz on the
fault-injecting HTTP server or in moto's S3, and a rank entry point that reads them
under a gloo group (importable by module name, for spawned ranks)."""

from __future__ import annotations

import gzip
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

from framework_plugins.readers import JsonlReader

from framework.data.reader import DatasetReader
from framework.download._cache import Entry, use_of
from framework.download._call import normalize
from framework.download._lock import UseLock
from tests.support.ranks import join_gloo

SHARDS = 200
RECORDS = 20


def serve(server: Any, name: str, shards: int = SHARDS, records: int = RECORDS, pad: int = 0) -> list[str]:
    """`shards` jsonl.gz shards under /`name`/ of the test HTTP server; their URLs."""
    return [
        server.add(f"/{name}/train-{index:05d}.jsonl.gz", shard_bytes(index, records, pad))
        for index in range(shards)
    ]


def serve_sizes(server: Any, name: str, sizes: list[int]) -> list[str]:
    """Shards of `sizes[i]` records each (`shard_bytes(i, ...)`) under /`name`/; their URLs."""
    return [
        server.add(f"/{name}/s{index:03d}.jsonl.gz", shard_bytes(index, n)) for index, n in enumerate(sizes)
    ]


def brace(server: Any, name: str, shards: int = SHARDS) -> str:
    """The brace range naming the shards `serve` put under /`name`/."""
    return f"{server.base}/{name}/train-{{00000..{shards - 1:05d}}}.jsonl.gz"


def gets(server: Any, name: str) -> int:
    return sum(route.gets for path, route in server.routes.items() if path.startswith(f"/{name}/"))


def fetched(server: Any, name: str) -> int:
    """Body bytes the server sent for the shards under /`name`/."""
    return sum(route.body_bytes for path, route in server.routes.items() if path.startswith(f"/{name}/"))


def loader(data_path: Any, cache: Any, reader: Any = None, **options: Any) -> Any:
    """A lazy loader streaming `data_path` through `cache` (the `"jsonl"` reader unless
    another is given)."""
    from framework import DatasetReader, MultiProcessDataLoader

    options = {"batch_size": 8, "max_instances_in_memory": 32, "quiet": True, "seed": 0, **options}
    reader = reader or DatasetReader.by_name("jsonl")()
    return MultiProcessDataLoader(reader, data_path, cache_dir=str(cache), **options)


def ids_of(batches: Any) -> list[int]:
    return [i for batch in batches for i in batch["id"].tolist()]


def in_use(cache: Path, url: str) -> bool:
    """Whether some open file holds `url`'s entry in use (a reader's shared lock)."""
    probe = UseLock(use_of(Entry(cache, normalize(url)).final))
    free = probe.exclusive()
    probe.release()
    return not free


def shard_bytes(shard: int, records: int, pad: int = 0) -> bytes:
    """Shard `shard`'s jsonl.gz: records with ids `shard * 1000 + k`; `pad` bytes of
    random text in each record make it that much larger (random: gzip cannot shrink it)."""
    lines = []
    for k in range(records):
        record: dict[str, Any] = {"id": shard * 1000 + k}
        if pad:
            record["pad"] = os.urandom(pad // 2).hex()
        lines.append(json.dumps(record) + "\n")
    return gzip.compress("".join(lines).encode(), mtime=0)


def all_ids(shards: int, records: int) -> list[int]:
    return [shard * 1000 + k for shard in range(shards) for k in range(records)]


def published_bytes(cache: Path, urls: list[str]) -> int:
    """The bytes of the shards of `urls` published in `cache` now: the names from one
    listing (a stat of each name in turn, under load, could count a shard evicted
    after it was counted and another published before it was reached, a state the
    folder was never in), then the sizes of those still there."""
    try:
        listed = {entry.name: entry for entry in os.scandir(cache)}
    except FileNotFoundError:
        return 0
    total = 0
    for url in urls:
        entry = listed.get(Entry(cache, normalize(url)).final.name)
        if entry is None:
            continue
        try:
            total += entry.stat(follow_symlinks=False).st_size
        except OSError:  # evicted since the listing
            pass
    return total


@contextmanager
def sampled(cache: Path, urls: list[str], every: float = 0.005) -> Iterator[list[int]]:
    """Samples of `published_bytes`, taken on a thread while the block runs."""
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append(published_bytes(cache, urls))
            done.wait(every)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        done.set()
        thread.join()


def stream_rank(
    rank: int,
    world: int,
    port: int,
    out_dir: str,
    data_path: Any,
    cache_dir: str,
    workers: int,
    take: Optional[int],
    state_in: Optional[str],
    even_batches: bool = True,
) -> None:
    """One rank of a gloo group reading `data_path` with `workers` workers: its ids, and,
    after `take` batches (None: the whole epoch), the loader's state, into
    `rank{rank}.json`. With `state_in` it first loads that state."""
    import torch.distributed as dist

    join_gloo(rank, world, port, collective_s=60, stuck_s=100)
    try:
        reading = loader(
            data_path, cache_dir, shuffle=True, seed=3, num_workers=workers, even_batches=even_batches
        )
        if state_in is not None:
            reading.load_state_dict(json.loads(Path(state_in).read_text()))
        ids: list[int] = []
        state = None
        for count, batch in enumerate(reading, 1):
            ids += batch["id"].tolist()
            if take is not None and count == take:
                state = reading.state_dict()
                break
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"ids": ids, "state": state}))
    finally:
        dist.destroy_process_group()


def options_rank(
    rank: int, world: int, port: int, out_dir: str, urls: list[str], cache: str, options: dict[str, Any]
) -> None:
    """A gloo rank reading `urls` with the reader `options["reader"]` names (`"jsonl"`,
    or `"automatic"`: `TaggedJsonl.automatic()`) for `options["epochs"]` epochs: its
    ids, its state after `take` batches, or its error, into rank{rank}.json. The rest
    of `options` go to the loader."""
    import torch.distributed as dist

    from framework import MultiProcessDataLoader

    join_gloo(rank, world, port, collective_s=30, stuck_s=60)
    options = dict(options)
    take, state_in = options.pop("take", None), options.pop("state_in", None)
    kind = options.pop("reader", "jsonl")
    epochs = options.pop("epochs", 1)
    ids: list[int] = []
    error = state = None
    try:
        reader = TaggedJsonl.automatic() if kind == "automatic" else DatasetReader.by_name("jsonl")()
        reading = MultiProcessDataLoader(reader, urls, cache_dir=cache, quiet=True, **options)
        if state_in is not None:
            reading.load_state_dict(json.loads(Path(state_in).read_text()))
        for _ in range(epochs):
            for count, batch in enumerate(reading, 1):
                ids += batch["id"].tolist()
                if count == take:
                    state = reading.state_dict()
                    break
    except Exception as failure:  # recorded: the test says what each rank did
        error = f"{type(failure).__name__}: {failure}"
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"ids": ids, "error": error, "state": state}))
        dist.destroy_process_group()


def ranks_reading(
    urls: list[str], tmp: Path, step: str, world: int, options: dict[str, Any], cache: str = ""
) -> list[dict[str, Any]]:
    """`world` gloo ranks running `options_rank` (the step `step`, in `tmp/step`), in
    `cache` (default: a folder of the step's own): what each rank wrote."""
    from tests.support.ranks import free_port, start_ranks

    out = tmp / step
    out.mkdir()
    cache = cache or str(tmp / f"cache-{step}")
    start_ranks(options_rank, (world, free_port(), str(out), urls, cache, options), world)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(world)]


class TaggedJsonl:
    """Readers of jsonl.gz shards whose instances say which loader worker read them
    (`worker`): the built-in `"jsonl"` reader (it deals through `shard_iterable`), an
    automatic one (no sharding flags), and one that deals whole files by itself."""

    @staticmethod
    def builtin(**options: Any) -> Any:
        return _Builtin(**options)

    @staticmethod
    def automatic(**options: Any) -> Any:
        return _Automatic(**options)

    @staticmethod
    def by_itself() -> Any:
        return _ByItself()


def _worker_of(reader: Any) -> int:
    info = reader.get_worker_info()
    return 0 if info is None else int(info.id)


def _records(path: str) -> Iterator[int]:
    with gzip.open(path, "rt") as handle:
        for line in handle:
            yield json.loads(line)["id"]


class _Builtin(JsonlReader):
    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        for instance in super()._read(file_path):
            yield {"id": instance["id"], "worker": _worker_of(self)}


class _Automatic(DatasetReader):
    """Reads every shard it is given; the loader deals (not seekable: a resume reads past)."""

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        for path in file_path:
            for record in _records(path):
                yield {"id": record, "worker": _worker_of(self)}


class _ByItself(DatasetReader):
    """Both sharding flags, and deals whole files to workers by itself."""

    def __init__(self) -> None:
        super().__init__(manual_distributed_sharding=True, manual_multiprocess_sharding=True)

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        info = self.get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        for place in range(worker, len(file_path), workers):
            for record in _records(file_path[place]):
                yield {"id": record, "worker": worker}


def uneven_rank(rank: int, world: int, port: int, out_dir: str, data_path: Any, takes: list[int]) -> None:
    """A rank of a gloo group taking `takes[rank]` batches of 1 on end, into the epochs
    after its first as a training loop does (`even_batches=False`), then the loader's
    state, into `rank{rank}.json` (with the ids of its first epoch), or the error of
    `state_dict()`."""
    import torch.distributed as dist

    join_gloo(rank, world, port, collective_s=60, stuck_s=100)
    try:
        reading = loader(
            data_path,
            Path(out_dir, "cache"),
            batch_size=1,
            max_instances_in_memory=4,
            even_batches=False,
            seed=3,
        )
        first: list[int] = []
        taken = epochs = 0
        while taken < takes[rank]:
            for batch in reading:
                if epochs == 0:
                    first += batch["id"].tolist()
                taken += 1
                if taken == takes[rank]:
                    break
            epochs += 1
        try:
            result: dict[str, Any] = {"state": reading.state_dict()}
        except Exception as error:
            result = {"error": f"{type(error).__name__}: {error}"}
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"first": first, **result}))
    finally:
        dist.destroy_process_group()
