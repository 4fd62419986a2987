"""Ranks that split each stream's records (even_batches across ranks) and the pins of a
saved state, under resumes across topologies. Each test quotes the promise it checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.download import FaultServer
from tests.support.streaming import ranks_reading, serve_sizes, shard_bytes

pytestmark = pytest.mark.timeout(90)


def _expected(sizes: list[int]) -> set[int]:
    return {i * 1000 + k for i, n in enumerate(sizes) for k in range(n)}


def _save(tmp: Path, state: Any) -> str:
    path = tmp / "state.json"
    path.write_text(json.dumps(state))
    return str(path)


BASE: dict[str, Any] = {"batch_size": 4, "max_instances_in_memory": 8, "seed": 0}


@pytest.mark.slow
def test_a_whole_shard_epoch_resumed_on_the_same_ranks_that_now_even_loses_at_most_a_batch(
    http_server: FaultServer, tmp_path: Path
) -> None:
    # docs/concepts/loader.md (Resume anywhere): "no instance is yielded twice in an
    # epoch and none is skipped ... with even_batches=True, ranks whose shares of the rest
    # differ by a batch end together". docs/howto/streaming.md (Dealing): whole shards
    # per rank "would leave ranks far apart, and evening would drop the difference".
    # Saved with even_batches=False on 2 ranks (whole shards per rank), loaded on the
    # same 2 ranks with even_batches=True: the exact path keeps split=1 (even_batches is
    # not a saved setting, and the refusal of this case was removed), so one rank reads
    # the 40-record shard, the other ends after its 4-record ones, and evening drops
    # tens of records silently.
    sizes = [4, 40, 4, 4]
    urls = serve_sizes(http_server, "flip", sizes)
    first = ranks_reading(
        urls, tmp_path, "first", 2, {**BASE, "num_workers": 0, "take": 1, "even_batches": False}
    )
    assert [part["error"] for part in first] == [None, None]
    assert first[0]["state"]["ranks"][0]["split"] in (None, 1)  # whole shards per rank
    rest = ranks_reading(
        urls, tmp_path, "rest", 2, {**BASE, "num_workers": 0, "state_in": _save(tmp_path, first[0]["state"])}
    )
    assert [part["error"] for part in rest] == [None, None]
    seen = [i for part in first + rest for i in part["ids"]]
    assert len(seen) == len(set(seen))
    missing = _expected(sizes) - set(seen)
    assert len(missing) < 2 * 4, (len(missing), sorted(missing))


@pytest.mark.slow
def test_ranks_splitting_streams_of_uneven_shards_lose_less_than_a_batch_to_evening(
    http_server: FaultServer, tmp_path: Path
) -> None:
    # docs/howto/streaming.md (Dealing, `R` ranks, `even_batches=True`): "worker `w` of
    # every rank reads stream `w` and keeps every `R`-th record: the ranks end a few
    # records apart, as evening their batch counts needs". docs/concepts/loader.md:
    # "ranks whose shares ... differ by a batch end together".
    # One shard a stream (3 shards, 3 workers): the ranks' shares differ by 2 records
    # (the odd shards of 9), but each of rank 0's workers 1 and 2 makes one more (short)
    # batch than rank 1's; those end early, so the 2 batches evening cuts from rank 0
    # are the long stream's last, full ones: 8 records, not 2.
    sizes = [40, 9, 9]
    urls = serve_sizes(http_server, "uneven", sizes)
    ranks = ranks_reading(urls, tmp_path, "fresh", 2, {**BASE, "num_workers": 3})
    assert [part["error"] for part in ranks] == [None, None]
    seen = [i for part in ranks for i in part["ids"]]
    assert len(seen) == len(set(seen))
    missing = _expected(sizes) - set(seen)
    assert len(missing) < BASE["batch_size"], (len(missing), sorted(missing))


CHAINS = {
    "2x2e-3x1e-1x2": [(2, 2, True, 3), (3, 1, True, 2), (1, 2, True, None)],
    "1x3-2x2e-2x2": [(1, 3, True, 2), (2, 2, True, 2), (2, 2, False, None)],
}


@pytest.mark.slow
# Each chain with one reader: the seekable built-in one and the automatic one that reads past.
@pytest.mark.parametrize(("chain", "kind"), [("2x2e-3x1e-1x2", "jsonl"), ("1x3-2x2e-2x2", "automatic")])
def test_a_resume_chain_across_split_and_whole_topologies_yields_each_record_once(
    http_server: FaultServer, tmp_path: Path, chain: str, kind: str
) -> None:
    # docs/concepts/loader.md (Resume anywhere): "no instance is yielded twice in an
    # epoch and none is skipped"; evening drops at most what differs by a batch a rank.
    sizes = [13, 7, 21, 5, 9, 17]
    urls = serve_sizes(http_server, f"chain-{chain}-{kind}", sizes)
    seen: list[int] = []
    bound = 0
    state_in = None
    for step, (world, workers, even, take) in enumerate(CHAINS[chain]):
        options = {**BASE, "num_workers": workers, "even_batches": even, "shuffle": True, "take": take}
        options["reader"] = kind
        if state_in is not None:
            options["state_in"] = state_in
        parts = ranks_reading(urls, tmp_path, f"step{step}", world, options)
        assert [part["error"] for part in parts] == [None] * world, parts
        seen += [i for part in parts for i in part["ids"]]
        if take is not None:
            state_in = _save(tmp_path, parts[0]["state"])
        elif even and world > 1:
            bound += world * max(1, workers) * BASE["batch_size"]
    assert len(seen) == len(set(seen)), sorted(i for i in set(seen) if seen.count(i) > 1)
    missing = _expected(sizes) - set(seen)
    assert not set(seen) - _expected(sizes)
    assert len(missing) <= bound, (len(missing), sorted(missing))


@pytest.mark.slow
def test_ranks_splitting_one_record_shards_each_get_records(http_server: FaultServer, tmp_path: Path) -> None:
    # 3 one-record shards on 2 ranks of 3 workers: rank r keeps record k of stream p
    # when (k + p) % 2 == r, so both ranks get records (without the rotation by p rank 0
    # got all 3 and rank 1 none, and evening dropped them all). docs/concepts/loader.md:
    # "ranks whose shares of the rest differ by a batch end together": rank 0's second
    # batch (of 1) is evened away.
    sizes = [1, 1, 1]
    urls = serve_sizes(http_server, "ones", sizes)
    ranks = ranks_reading(urls, tmp_path, "fresh", 2, {**BASE, "batch_size": 1, "num_workers": 3})
    assert [part["error"] for part in ranks] == [None, None], ranks
    seen = [i for part in ranks for i in part["ids"]]
    assert [len(part["ids"]) for part in ranks] == [1, 1]
    assert len(set(seen)) == 2 and set(seen) <= _expected(sizes)


@pytest.mark.slow
@pytest.mark.parametrize(("after", "workers"), [(3, 1)])
def test_a_split_epoch_resumed_after_its_shards_changed_reads_no_new_bytes(
    http_server: FaultServer, tmp_path: Path, after: int, workers: int
) -> None:
    # docs/howto/streaming.md (Two ranks with torchrun): "A state saved mid-epoch names
    # the sha256 of each remote shard the epoch has opened ... and the resumed epoch
    # reads those bytes only: a shard changed on the server since ends it with a
    # ShardError naming the shard, never with records read at positions that now point
    # elsewhere."
    sizes = [13, 7, 21, 5, 9, 17]
    urls = serve_sizes(http_server, f"pins-{after}-{workers}", sizes)
    first = ranks_reading(urls, tmp_path, "first", 2, {**BASE, "num_workers": 2, "shuffle": True, "take": 3})
    assert [part["error"] for part in first] == [None, None]
    state = first[0]["state"]
    pinned = set(state["shards"])
    assert pinned, state["shards"]
    for index, url in enumerate(urls):  # every opened shard uploaded anew, other records
        if url in pinned:
            http_server.route(url).data = shard_bytes(index + 50, sizes[index])
            http_server.route(url).etag = '"changed"'
    rest = ranks_reading(
        urls,
        tmp_path,
        "rest",
        after,
        {**BASE, "num_workers": workers, "shuffle": True, "state_in": _save(tmp_path, state)},
    )
    new = [i for part in rest for i in part["ids"] if i >= 50_000]
    assert not new, new
    errors = [part["error"] for part in rest if part["error"]]
    assert errors and all("ShardError" in error or "could not be fetched" in error for error in errors), (
        errors
    )


@pytest.mark.parametrize(("workers", "after"), [(0, 2), (2, 0)])
def test_an_eager_epoch_resumed_after_a_pinned_shard_changed_reads_no_new_bytes(
    http_server: FaultServer, tmp_path: Path, workers: int, after: int
) -> None:
    from framework import DatasetReader, MultiProcessDataLoader

    # docs/howto/streaming.md (Two ranks with torchrun): "the resumed epoch reads those
    # bytes only: a shard changed on the server since ends it with a ShardError naming
    # the shard, never with records read at positions that now point elsewhere."
    sizes = [10, 10, 10, 10]
    urls = serve_sizes(http_server, f"eager-{workers}-{after}", sizes)

    def build(cache: str, workers: int = workers) -> Any:
        options = {"batch_size": 4, "seed": 0, "num_workers": workers, "shuffle": False}
        return MultiProcessDataLoader(
            DatasetReader.by_name("jsonl")(), urls, cache_dir=str(tmp_path / cache), quiet=True, **options
        )

    first = build("node0")
    iterator = iter(first)
    seen = [i for _ in range(3) for i in next(iterator)["id"].tolist()]
    state = first.state_dict()
    iterator.close()
    assert urls[3] in state.get("shards", {}), state.get("shards")
    http_server.route(urls[3]).data = shard_bytes(53, 10)
    http_server.route(urls[3]).etag = '"changed"'
    rest: list[int] = []
    error = None
    try:
        resumed = build("node1", after)  # another node: a fresh cache
        resumed.load_state_dict(state)
        rest = [i for batch in resumed for i in batch["id"].tolist()]
    except Exception as failure:
        error = failure
    assert not [i for i in rest if i >= 50_000], rest
    assert error is not None or sorted(seen + rest) == sorted(_expected(sizes))


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "take"), [(2, 4), (3, 6)])
def test_a_split_epoch_resumed_on_the_same_ranks_goes_on_batch_for_batch(
    http_server: FaultServer, tmp_path: Path, workers: int, take: int
) -> None:
    # docs/howto/streaming.md (Resume with whole shards): "Resumed on the same number of
    # ranks and workers it goes on batch for batch." docs/concepts/loader.md: "The same
    # topology changes nothing."
    # Seen with the built-in (seekable) "jsonl" reader, cut after a worker's first
    # chunk: every rank raises WorkerError(ResumeError "cannot resume exactly: the chunk
    # this worker resumes in ... the reader now yields another instance"). Cause
    # (framework/data/_shards.py ShardPlan): a point is `last + stride` with the seek
    # token `tell()` taken right after record `last`, kept by this rank; under split R
    # the next R - 1 records are other ranks', so the token sits R - 1 records before
    # the point's record. `_dealt` seeks there and sets `next` to the point's place, so
    # every record after the seek is numbered R - 1 too high (and the wrong rank's are
    # kept). The automatic (non-seekable) reader reads past and resumes exactly.
    sizes = [13, 7, 21, 5, 9, 17, 3]
    urls = serve_sizes(http_server, f"same-{workers}-{take}", sizes)
    options = {**BASE, "num_workers": workers, "shuffle": True}
    whole = ranks_reading(urls, tmp_path, "whole", 2, options)
    first = ranks_reading(urls, tmp_path, "first", 2, {**options, "take": take})
    rest = ranks_reading(
        urls, tmp_path, "rest", 2, {**options, "state_in": _save(tmp_path, first[0]["state"])}
    )
    assert [part["error"] for part in whole + first + rest] == [None] * 6
    for rank in range(2):
        assert first[rank]["ids"] + rest[rank]["ids"] == whole[rank]["ids"], rank
