"""Whole streamed shards dealt to the reading processes: with at least as many shards
as slots (ranks x workers), each worker reads only its own shards, whole, so no two
processes fetch or parse one shard; the record indexes of such an epoch stay
topology-free, so it resumes exactly on the same topology and exactly once on any other."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from framework import MultiProcessDataLoader
from tests.support.download import FaultServer
from tests.support.streaming import TaggedJsonl, all_ids, brace, gets, loader, serve, shard_bytes

pytestmark = pytest.mark.timeout(120)

SHARDS = 12
RECORDS = 10


def _loader(reader: Any, data_path: str, cache: Path, **options: Any) -> MultiProcessDataLoader:
    return loader(
        data_path, cache, reader, **{"batch_size": 4, "max_instances_in_memory": 16, "seed": 1, **options}
    )


def _cut(built: MultiProcessDataLoader, batches: int) -> tuple[list[int], dict[str, Any]]:
    """The ids of `built`'s first `batches` batches, and its state after them."""
    iterator = iter(built)
    seen = [i for i, _ in _pairs(next(iterator) for _ in range(batches))]
    state = built.state_dict()
    iterator.close()  # type: ignore[attr-defined]
    return seen, state


def _pairs(batches: Any) -> list[tuple[int, int]]:
    return [(i, w) for batch in batches for i, w in zip(batch["id"].tolist(), batch["worker"].tolist())]


def _readers_of_each_shard(pairs: list[tuple[int, int]]) -> dict[int, set[int]]:
    readers: dict[int, set[int]] = defaultdict(set)
    for record, worker in pairs:
        readers[record // 1000].add(worker)
    return readers


@pytest.mark.parametrize(("kind", "workers"), [("builtin", 2), ("builtin", 3), ("automatic", 2)])
def test_each_worker_reads_whole_shards_of_its_own(
    http_server: FaultServer, tmp_path: Path, kind: str, workers: int
) -> None:
    name = f"deal-{kind}-{workers}"
    serve(http_server, name, shards=SHARDS, records=RECORDS)
    reader = getattr(TaggedJsonl, kind)()
    pairs = _pairs(
        _loader(reader, brace(http_server, name, SHARDS), tmp_path / "c", num_workers=workers, shuffle=True)
    )
    assert sorted(i for i, _ in pairs) == all_ids(SHARDS, RECORDS)
    readers = _readers_of_each_shard(pairs)
    assert all(len(found) == 1 for found in readers.values()), readers  # one reader a shard
    per_worker = defaultdict(int)
    for found in readers.values():
        per_worker[found.pop()] += 1
    assert sorted(per_worker.values()) == [SHARDS // workers] * workers
    assert gets(http_server, name) == SHARDS


def test_fewer_shards_than_workers_deal_records(http_server: FaultServer, tmp_path: Path) -> None:
    serve(http_server, "few", shards=1, records=40)
    pairs = _pairs(
        _loader(TaggedJsonl.builtin(), brace(http_server, "few", 1), tmp_path / "c", num_workers=2)
    )
    assert sorted(i for i, _ in pairs) == all_ids(1, 40)
    assert _readers_of_each_shard(pairs) == {0: {0, 1}}  # records dealt one by one


def test_a_reader_that_shards_by_itself_is_given_every_shard(
    http_server: FaultServer, tmp_path: Path
) -> None:
    # It deals files to workers by itself: handed only a worker's share, it would deal
    # that again and drop the rest.
    serve(http_server, "itself", shards=SHARDS, records=RECORDS)
    reader = TaggedJsonl.by_itself()
    pairs = _pairs(_loader(reader, brace(http_server, "itself", SHARDS), tmp_path / "c", num_workers=2))
    assert sorted(i for i, _ in pairs) == all_ids(SHARDS, RECORDS)


def test_max_instances_reads_the_first_records_of_the_whole_stream(
    http_server: FaultServer, tmp_path: Path
) -> None:
    serve(http_server, "capped", shards=SHARDS, records=RECORDS)
    reader = TaggedJsonl.builtin(max_instances=25)
    pairs = _pairs(_loader(reader, brace(http_server, "capped", SHARDS), tmp_path / "c", num_workers=2))
    assert sorted(i for i, _ in pairs) == all_ids(3, RECORDS)[:25]


# The seekable built-in reader on every path; the automatic one (it reads past) on two.
@pytest.mark.parametrize(
    ("kind", "before", "after", "again"),
    [
        ("builtin", 2, 2, None),
        ("builtin", 2, 0, None),
        ("builtin", 2, 3, 2),
        ("builtin", 3, 2, 0),
        ("automatic", 2, 2, None),
        ("automatic", 2, 3, 2),
    ],
)
def test_a_dealt_epoch_resumes_exactly_on_any_topology(
    http_server: FaultServer, tmp_path: Path, kind: str, before: int, after: int, again: Any
) -> None:
    name = f"resume-{kind}-{before}-{after}-{again}"
    serve(http_server, name, shards=SHARDS, records=RECORDS)
    data_path = brace(http_server, name, SHARDS)
    cache = tmp_path / "c"

    def build(workers: int) -> MultiProcessDataLoader:
        return _loader(getattr(TaggedJsonl, kind)(), data_path, cache, num_workers=workers, shuffle=True)

    whole = [i for i, _ in _pairs(build(before))]
    seen, state = _cut(build(before), 7)
    resumed = build(after)
    resumed.load_state_dict(state)
    if again is None:
        rest = [i for i, _ in _pairs(resumed)]
    else:  # cut the resumed pass (each worker reading several streams) and resume again
        rest, state = _cut(resumed, 5)
        last = build(again)
        last.load_state_dict(state)
        rest += [i for i, _ in _pairs(last)]
    assert sorted(seen + rest) == all_ids(SHARDS, RECORDS)
    if after == before and again is None:
        assert seen + rest == whole  # the same topology: batch for batch


@pytest.mark.parametrize("kind", ["builtin", "automatic"])
def test_a_resume_on_another_topology_fetches_no_shard_its_streams_read_already(
    http_server: FaultServer, tmp_path: Path, kind: str
) -> None:
    name = f"marks-{kind}"
    urls = serve(http_server, name, shards=SHARDS, records=RECORDS)
    data_path = brace(http_server, name, SHARDS)
    reader = getattr(TaggedJsonl, kind)
    first = _loader(reader(), data_path, tmp_path / "node0", num_workers=2, shuffle=True)
    seen, state = _cut(first, 16)  # 64 of 120 records
    order = first._settings.source_for(0).urls
    marks = state["consumed"]["marks"]
    read = {url for stream, place, _ in marks for url in order[stream::2][: place if place >= 0 else None]}
    assert len(read) >= 2, marks  # each stream's mark is past a shard at least
    before = {url: http_server.route(url).gets for url in urls}
    # Resumed on another node (an empty cache) with 3 workers: the shards the streams
    # read before their marks are not fetched again.
    resumed = _loader(reader(), data_path, tmp_path / "node1", num_workers=3, shuffle=True)
    resumed.load_state_dict(state)
    rest = [i for i, _ in _pairs(resumed)]
    assert sorted(seen + rest) == all_ids(SHARDS, RECORDS)
    again = {url for url in urls if http_server.route(url).gets > before[url]}
    assert not again & read, sorted(again & read)
    assert len(again) <= SHARDS - len(read)


@pytest.mark.parametrize("ahead", [3, 70])
def test_a_rank_epochs_ahead_of_another_saves_the_epoch_the_other_is_in(
    http_server: FaultServer, tmp_path: Path, ahead: int
) -> None:
    import json

    from framework.data._pass import KEPT
    from tests.support.ranks import free_port, start_ranks
    from tests.support.streaming import uneven_rank

    # Whole shards dealt over 2 ranks: rank 0 reads the shard of 6 records, rank 1 the
    # one of 1, so rank 1 runs through epochs while rank 0 is still in its first.
    http_server.add("/ahead/train-00000.jsonl.gz", shard_bytes(0, 6))
    http_server.add("/ahead/train-00001.jsonl.gz", shard_bytes(1, 1))
    data_path = brace(http_server, "ahead", 2)
    start_ranks(uneven_rank, (2, free_port(), str(tmp_path), data_path, [3, ahead]), 2)
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    if ahead > KEPT:  # rank 1 no longer holds its pass of epoch 0: refused on both ranks
        assert all("no longer holds its pass of epoch 0" in part["error"] for part in ranks), ranks
        return
    state = ranks[0]["state"]
    assert state == ranks[1]["state"] and state["epoch"] == 0
    # Each rank's position is its pass of epoch 0 (rank 1's finished one), not a later one.
    assert [rank["epoch"] for rank in state["ranks"]] == [0, 0] and state["ranks"][1]["done"] == [True]
    resumed = loader(data_path, tmp_path / "cache", batch_size=1, max_instances_in_memory=4, seed=3)
    resumed.load_state_dict(state)
    rest = [i for batch in resumed for i in batch["id"].tolist()]
    assert sorted(ranks[0]["first"] + ranks[1]["first"] + rest) == all_ids(2, 6)[:7]


def _dealt_rank(
    rank: int,
    world: int,
    port: int,
    out_dir: str,
    data_path: str,
    cache: str,
    workers: int,
    take: Any,
    state_in: Any,
) -> None:
    """A gloo rank reading `data_path` with the tagging built-in reader: its (id, worker)
    pairs and, after `take` batches, the loader's state, into rank{rank}.json."""
    import json

    import torch.distributed as dist

    from tests.support.ranks import join_gloo

    join_gloo(rank, world, port, collective_s=60, stuck_s=100)
    try:
        loader = _loader(TaggedJsonl.builtin(), data_path, Path(cache), num_workers=workers, shuffle=True)
        if state_in is not None:
            loader.load_state_dict(json.loads(Path(state_in).read_text()))
        pairs: list[tuple[int, int]] = []
        state = None
        for count, batch in enumerate(loader, 1):
            pairs += _pairs([batch])
            if count == take:
                state = loader.state_dict()
                break
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"pairs": pairs, "state": state}))
    finally:
        dist.destroy_process_group()


def _run_ranks(world: int, out: Path, *args: Any) -> list[dict[str, Any]]:
    import json

    from tests.support.ranks import free_port, start_ranks

    out.mkdir()
    start_ranks(_dealt_rank, (world, free_port(), str(out), *args), world)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(world)]


@pytest.mark.slow
def test_ranks_that_even_their_batches_split_each_workers_whole_shards(
    http_server: FaultServer, tmp_path: Path
) -> None:
    serve(http_server, "split", shards=8, records=20)
    data_path = brace(http_server, "split", 8)
    cache = str(tmp_path / "cache")
    ranks = _run_ranks(2, tmp_path / "whole", data_path, cache, 2, None, None)
    pairs = [tuple(pair) for rank in ranks for pair in rank["pairs"]]
    assert sorted(i for i, _ in pairs) == all_ids(8, 20)
    # Each shard is read whole by one worker index (on every rank), and its records are
    # split between the ranks, which end together: no batch evened away.
    readers = _readers_of_each_shard(pairs)
    assert all(len(found) == 1 for found in readers.values()), readers
    assert sorted(found.pop() for found in readers.values()) == [0] * 4 + [1] * 4
    for rank in ranks:
        assert len({i // 1000 for i, _ in rank["pairs"]}) == 8 and len(rank["pairs"]) == 80
    assert gets(http_server, "split") == 8
    # Cut after 3 batches; resumed on 3 ranks of 1 worker (they split the streams'
    # records three ways) and on 1 rank of 3 workers (whole streams).
    part = _run_ranks(2, tmp_path / "part", data_path, cache, 2, 3, None)
    seen = [i for rank in part for i, _ in rank["pairs"]]
    state = tmp_path / "state.json"
    state.write_text(__import__("json").dumps(part[0]["state"]))
    for world, workers in ((3, 1), (1, 3)):
        rest = _run_ranks(world, tmp_path / f"rest{world}", data_path, cache, workers, None, str(state))
        resumed = [i for rank in rest for i, _ in rank["pairs"]]
        got = seen + resumed
        assert len(got) == len(set(got)) and set(got) <= set(all_ids(8, 20)), (world, workers)
        # Evened ranks end together: what lies past the shortest rank's last batch (a
        # batch each at most, "as in any epoch") is not yielded; nothing else is lost.
        assert len(all_ids(8, 20)) - len(got) < world * 8, (world, workers, len(got))
        if world == 1:
            assert sorted(got) == all_ids(8, 20)
