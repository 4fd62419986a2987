"""Whole-shard dealing at its edges: ranks that even their batches, elastic resumes
onto more ranks than streams, the disk budget's refetches, readers that deal per file
or hide their records, and the unsharded warning. Each test quotes the promise it
checks."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from framework import DatasetReader
from tests.support.download import FaultServer
from tests.support.streaming import ranks_reading, serve_sizes, shard_bytes

pytestmark = pytest.mark.timeout(60)

SMALL: dict[str, Any] = {"batch_size": 4, "max_instances_in_memory": 8, "seed": 1}


@pytest.mark.slow
def test_ranks_that_even_their_batches_are_dealt_records_and_lose_none(
    http_server: FaultServer, tmp_path: Path
) -> None:
    # Two ranks, no workers, two shards, one of them empty: dealt whole, one rank would
    # read nothing and evening the ranks' batch counts would drop the other's 40.
    urls = serve_sizes(http_server, "empty-rank", [40, 0])
    options = {"batch_size": 4, "max_instances_in_memory": 8, "seed": 0, "num_workers": 0}
    ranks = ranks_reading(urls, tmp_path, "out", 2, options)
    # docs/howto/streaming.md (Dealing): with `even_batches` across ranks, records are
    # dealt one by one, so the ranks end a batch apart at most and none is dropped.
    assert [rank["error"] for rank in ranks] == [None, None]
    assert sorted(i for rank in ranks for i in rank["ids"]) == list(range(40))
    assert [len(rank["ids"]) for rank in ranks] == [20, 20]


@pytest.mark.slow
def test_a_dealt_epoch_resumed_by_ranks_that_even_their_batches_loses_at_most_a_batch_each(
    http_server: FaultServer, tmp_path: Path
) -> None:
    urls = serve_sizes(http_server, "dealt-even", [10, 30, 10, 10])
    options: dict[str, Any] = {"batch_size": 4, "max_instances_in_memory": 8, "seed": 0, "num_workers": 0}
    first = ranks_reading(
        urls, tmp_path, "first", 2, {**options, "take": 1, "even_batches": False}, str(tmp_path / "c")
    )
    assert first[0]["state"]["ranks"][0]["deal"] == 2  # whole shards to the 2 ranks
    state = tmp_path / "state.json"
    state.write_text(json.dumps(first[0]["state"]))
    rest = ranks_reading(urls, tmp_path, "rest", 3, {**options, "state_in": str(state)}, str(tmp_path / "c"))
    assert [part["error"] for part in rest] == [None, None, None]
    seen = [i for part in first + rest for i in part["ids"]]
    # The 3 ranks split the 2 streams' records: they end together (evened), and evening
    # drops at most what one batch per rank holds ("ranks whose shares of the rest differ
    # by a batch end together"), never a shard's worth.
    assert len(seen) == len(set(seen))
    expected = {i * 1000 + k for i, n in enumerate([10, 30, 10, 10]) for k in range(n)}
    assert set(seen) <= expected and len(expected - set(seen)) < 3 * 4, sorted(expected - set(seen))


@pytest.mark.slow
def test_an_elastic_resume_onto_more_ranks_than_streams_skips_nothing(
    http_server: FaultServer, tmp_path: Path
) -> None:
    # Four equal shards, dealt whole over 2 ranks (no workers: 2 slots, 2 streams).
    urls = serve_sizes(http_server, "more-ranks", [10, 10, 10, 10])
    options: dict[str, Any] = {"batch_size": 4, "max_instances_in_memory": 8, "seed": 0, "num_workers": 0}
    first = ranks_reading(urls, tmp_path, "first", 2, {**options, "take": 1}, str(tmp_path / "c"))
    assert [part["error"] for part in first] == [None, None]
    state = tmp_path / "state.json"
    state.write_text(json.dumps(first[0]["state"]))
    # Resumed on 3 ranks: the epoch keeps its 2 streams, so rank 2 has none to read.
    rest = ranks_reading(urls, tmp_path, "rest", 3, {**options, "state_in": str(state)}, str(tmp_path / "c"))
    assert [part["error"] for part in rest] == [None, None, None]
    seen = [i for part in first + rest for i in part["ids"]]
    # docs/concepts/loader.md (Resume anywhere): "What never changes: no instance is
    # yielded twice in an epoch and none is skipped (`drop_last` still drops each slot's
    # short last batch, as in any epoch) ... with `even_batches=True`, ranks whose shares
    # of the rest differ by a batch end together". Here the rank dealt no stream yields
    # nothing, `even_batches` trims the others to 0 batches: the 32 records left vanish.
    assert sorted(seen) == sorted(i * 1000 + k for i in range(4) for k in range(10)), (
        len(seen),
        [len(p["ids"]) for p in rest],
    )


@pytest.mark.slow
@pytest.mark.parametrize(("shards", "workers"), [(120, 4)])  # 2 workers: test_stream_shards.py
def test_a_budget_of_a_quarter_refetches_at_most_0_8_with_whole_shards_dealt(
    http_server: FaultServer, tmp_path: Path, shards: int, workers: int
) -> None:
    from tests.support.streaming import brace, gets, ids_of, loader, serve

    name = f"quarter{workers}"
    serve(http_server, name, shards=shards, records=20, pad=100)
    limit = shards * len(shard_bytes(0, 20, 100)) // 4  # a quarter of the dataset
    reading = loader(
        brace(http_server, name, shards), tmp_path / "c", num_workers=workers, cache_limit=limit, shuffle=True
    )
    fetched = []
    for _ in range(4):
        before = gets(http_server, name)
        assert len(ids_of(reading)) == shards * 20
        fetched.append(gets(http_server, name) - before)
    # docs/howto/streaming.md (Bound the disk): "with a budget of a quarter of the
    # dataset a later epoch fetches about three quarters of it again" (the issue: at
    # most 0.8), where the budget is well above what the reading processes hold (each
    # its shard and the `prefetch` ahead: here 3 a worker).
    assert max(fetched[1:]) <= 0.8 * shards, fetched


class PerFileReader(DatasetReader):
    """Both sharding flags and `deals_with_shard_iterable = True`; calls `shard_iterable`
    once per file, after opening it. docs/howto/write-a-reader.md and `ShardPlan.filter`:
    "A reader may call it more than once in a read (once per file, say): the records
    are numbered on across calls"."""

    deals_with_shard_iterable = True

    def __init__(self) -> None:
        super().__init__(manual_distributed_sharding=True, manual_multiprocess_sharding=True)

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        for path in file_path:  # asking for the shard opens it (ShardFiles tells the plan)
            for record in self.shard_iterable(_ids_in(path)):
                yield {"id": record}


def _ids_in(path: str) -> Iterator[int]:
    with gzip.open(path, "rt") as handle:
        for line in handle:
            yield json.loads(line)["id"]


@pytest.mark.parametrize(("before", "after"), [(3, 2), (2, 0)])
def test_a_reader_calling_shard_iterable_per_file_resumes_exactly_on_another_topology(
    http_server: FaultServer, tmp_path: Path, before: int, after: int
) -> None:
    from framework import MultiProcessDataLoader
    from tests.support.streaming import ids_of, loader

    # Shards of uneven sizes: a stream read to its end while others go on.
    sizes = [0, 1, 37, 3, 0, 12, 5, 1, 20, 0, 2, 9]
    urls = serve_sizes(http_server, f"per-file-{before}-{after}", sizes)
    every = sorted(shard * 1000 + k for shard, count in enumerate(sizes) for k in range(count))

    def build(workers: int) -> MultiProcessDataLoader:
        return loader(urls, tmp_path / "c", PerFileReader(), **SMALL, shuffle=True, num_workers=workers)

    assert sorted(ids_of(build(before))) == every  # reads fine in one go
    broken = {}
    for cut in (16, 21):
        first = build(before)
        iterator = iter(first)
        seen = ids_of(next(iterator) for _ in range(cut))
        state = first.state_dict()
        iterator.close()
        resumed = build(after)
        resumed.load_state_dict(state)
        found = sorted(seen + ids_of(resumed))
        if found != every:
            broken[cut] = (len(found), len(set(found)))
    # docs/howto/streaming.md (Resume with whole shards): "Resumed on another, each
    # process reads the streams of shards of the old processes q, q + S', ... one after
    # another, from the shard each had reached"; docs/concepts/loader.md: "no instance
    # is yielded twice in an epoch and none is skipped". Records are lost and repeated.
    assert not broken, f"cut: (records yielded, distinct) of {len(every)}: {broken}"


class TwoPerRecord(DatasetReader):
    """Deals through `shard_iterable` and yields two instances per record (ids 2r, 2r+1
    of record r's shard-local id), so the loader cannot tell records from instances."""

    deals_with_shard_iterable = True

    def __init__(self) -> None:
        super().__init__(manual_distributed_sharding=True, manual_multiprocess_sharding=True)

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        for record in self.shard_iterable(_ids_of_files(file_path)):
            shard, k = divmod(record, 1000)
            yield {"id": shard * 2000 + 2 * k}
            yield {"id": shard * 2000 + 2 * k + 1}


def _ids_of_files(file_path: Any) -> Iterator[int]:
    for path in file_path:
        yield from _ids_in(path)


def test_a_reader_with_several_instances_a_record_resumes_on_the_same_topology(
    http_server: FaultServer, tmp_path: Path
) -> None:
    from framework import MultiProcessDataLoader
    from tests.support.streaming import brace, ids_of, loader, serve

    serve(http_server, "two-per-record", shards=12, records=10)

    def build() -> MultiProcessDataLoader:
        data_path = brace(http_server, "two-per-record", 12)
        return loader(data_path, tmp_path / "c", TwoPerRecord(), **SMALL, shuffle=True, num_workers=2)

    whole = ids_of(build())
    first = build()
    iterator = iter(first)
    seen = ids_of(next(iterator) for _ in range(10))
    state = first.state_dict()
    iterator.close()
    assert state["ranks"][0]["tracked"] is False  # records unknown: a same-topology resume only
    resumed = build()
    resumed.load_state_dict(state)
    # docs/howto/write-a-reader.md: a reader that does not say which record each
    # instance came from has states that "resume with the same num_workers and world
    # size only"; docs/concepts/loader.md: "The same topology changes nothing". Dealt
    # whole, worker 1's saved point has record -1, its plan starts at record 0, which is
    # in stream 0 (not its own): it reads past every record and raises "not deterministic".
    assert seen + ids_of(resumed) == whole


def test_no_unsharded_warning_for_a_resumed_pass_that_deals_whole_shards(
    http_server: FaultServer, tmp_path: Path
) -> None:
    import warnings

    from framework import MultiProcessDataLoader
    from framework.data import UnshardedReadWarning
    from tests.support.streaming import TaggedJsonl, brace, loader, serve

    serve(http_server, "warned", shards=3, records=12)

    def build(workers: int) -> MultiProcessDataLoader:
        data_path = brace(http_server, "warned", 3)
        return loader(data_path, tmp_path / "c", TaggedJsonl.automatic(), **SMALL, num_workers=workers)

    first = build(2)  # 3 shards over 2 slots: dealt whole
    iterator = iter(first)
    next(iterator)
    state = first.state_dict()
    iterator.close()
    resumed = build(4)  # the epoch keeps its dealing over 2 streams
    resumed.load_state_dict(state)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        readers: dict[int, set[int]] = {}
        for batch in resumed:
            for record, worker in zip(batch["id"].tolist(), batch["worker"].tolist()):
                readers.setdefault(record // 1000, set()).add(worker)
    assert all(len(found) == 1 for found in readers.values()), readers  # whole shards indeed
    # framework/data/multiprocess.py (num_workers): "Each worker parses every record and
    # keeps its share unless the reader shards by worker ...; with more than one worker
    # the loader says so (`UnshardedReadWarning`)"; _lease._advise: "streamed shards
    # dealt whole: each worker reads only its own" (no warning). It asks
    # settings.deal(world) for a fresh epoch on 4 slots (more than 3 shards: 0), not
    # the resumed pass's deal, and warns that every worker parses every record.
    assert not [w for w in caught if issubclass(w.category, UnshardedReadWarning)]
