"""A `data_path` naming many remote shards: streamed through the download manager into
the loader (`framework.data.shard_files`, `framework.download.streaming`), against the
real HTTP test server and moto's S3 server, with real workers and gloo ranks."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from framework import DatasetReader
from framework.data import ShardFiles
from framework.data.shard_files import names_shards
from framework.download import DownloadManager
from framework.download._cache import Entry, use_of
from framework.download._call import normalize
from framework.download._lock import UseLock
from framework.download.inventory import entry_for, prune
from framework.errors import ChecksumError, ConfigError, HTTPStatusError, ShardError, WorkerError
from tests.support.download import FaultServer, sha256
from tests.support.ranks import free_port, start_ranks
from tests.support.streaming import (
    RECORDS,
    SHARDS,
    all_ids,
    brace,
    fetched,
    gets,
    ids_of,
    loader,
    published_bytes,
    sampled,
    serve,
    shard_bytes,
    stream_rank,
)

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("workers", [0, 2])
def test_every_record_once_from_a_brace_range_of_200_http_shards(
    http_server: FaultServer, tmp_path: Path, workers: int
) -> None:
    name = f"once{workers}"
    serve(http_server, name)
    streamed = loader(brace(http_server, name), tmp_path / "cache", num_workers=workers, shuffle=True)
    assert isinstance(streamed._settings.source, ShardFiles)
    ids = ids_of(streamed)
    assert sorted(ids) == all_ids(SHARDS, RECORDS)
    assert gets(http_server, name) == SHARDS  # one fetch per shard, whatever the workers


def test_a_manifest_with_sha256_and_size_streams_and_checks_them(
    http_server: FaultServer, tmp_path: Path
) -> None:
    urls = serve(http_server, "manifest", shards=20)
    lines = [
        f"{url}\t{sha256(http_server.routes[url[len(http_server.base) :]].data)}\t"
        f"{len(http_server.routes[url[len(http_server.base) :]].data)}"
        for url in urls
    ]
    manifest = http_server.add("/manifest/list.tsv", ("\n".join(lines) + "\n").encode())
    ids = ids_of(loader(f"manifest:{manifest}", tmp_path / "cache", num_workers=2))
    assert sorted(ids) == all_ids(20, RECORDS)


def test_a_wrong_sha256_mid_epoch_is_a_worker_error_naming_the_shard_and_publishes_nothing(
    http_server: FaultServer, tmp_path: Path
) -> None:
    urls = serve(http_server, "badsum", shards=12)
    lines = [f"{url}\t{sha256(http_server.routes[url[len(http_server.base) :]].data)}" for url in urls]
    lines[7] = f"{urls[7]}\t{'0' * 64}"
    manifest = http_server.add("/badsum/list.tsv", ("\n".join(lines) + "\n").encode())
    cache = tmp_path / "cache"
    with pytest.raises(WorkerError) as raised:
        ids_of(loader(f"manifest:{manifest}", cache, num_workers=2))
    assert "shard 8 of 12" in str(raised.value) and urls[7] in str(raised.value)
    assert isinstance(raised.value.__cause__, ShardError)
    assert isinstance(raised.value.__cause__.cause, ChecksumError)
    assert not Entry(cache, normalize(urls[7])).final.exists()


def test_a_404_mid_epoch_is_a_worker_error_naming_the_shard(http_server: FaultServer, tmp_path: Path) -> None:
    serve(http_server, "gone", shards=12)
    http_server.routes["/gone/train-00005.jsonl.gz"].status = 404
    for workers in (0, 2):
        with pytest.raises(WorkerError) as raised:
            ids_of(loader(brace(http_server, "gone", 12), tmp_path / f"cache{workers}", num_workers=workers))
        assert "shard 6 of 12" in str(raised.value) and "train-00005" in str(raised.value)
        cause = raised.value.__cause__
        assert isinstance(cause, ShardError) and isinstance(cause.cause, HTTPStatusError)


@pytest.mark.slow
def test_the_disk_stays_within_cache_limit_and_later_epochs_fetch_under_0_8(
    http_server: FaultServer, tmp_path: Path
) -> None:
    urls = serve(http_server, "budget", records=4, pad=2000)  # about 4 KiB a shard
    sizes = [len(http_server.routes[url[len(http_server.base) :]].data) for url in urls]
    dataset = sum(sizes)
    cache = tmp_path / "cache"
    limit = dataset // 4
    streamed = loader(brace(http_server, "budget"), cache, num_workers=2, cache_limit=limit, shuffle=True)
    epochs = []
    with sampled(cache, urls) as samples:
        for _ in range(3):
            before = fetched(http_server, "budget")
            assert sorted(ids_of(streamed)) == all_ids(SHARDS, 4)
            epochs.append((fetched(http_server, "budget") - before) / dataset)
    assert epochs[0] >= 1.0
    # Farthest next use keeps what the next epoch reads first: least recently used
    # would fetch the whole dataset again every epoch.
    assert max(epochs[1:]) <= 0.8, epochs
    # Over the limit only by what is held: each of the 2 workers' shard and the 2 it
    # fetches ahead.
    assert len(samples) > 10 and max(samples) <= limit + 2 * 3 * max(sizes), (max(samples), limit)
    assert published_bytes(cache, urls) <= limit + 2 * 3 * max(sizes)


def test_a_shard_held_in_use_by_another_process_is_never_evicted(
    http_server: FaultServer, tmp_path: Path
) -> None:
    urls = serve(http_server, "held", shards=16, records=8, pad=4000)
    cache = tmp_path / "cache"
    DownloadManager(cache, progress=False).cached_path(urls[3])
    held = UseLock(use_of(Entry(cache, normalize(urls[3])).final))
    held.share()  # as a reader in another process holds it (flock: per open file)
    try:
        size = len(http_server.routes["/held/train-00003.jsonl.gz"].data)
        ids = ids_of(
            loader(brace(http_server, "held", 16), cache, num_workers=2, cache_limit=4 * size, prefetch=1)
        )
        assert sorted(ids) == all_ids(16, 8)
        assert Entry(cache, normalize(urls[3])).final.exists()
        assert prune(cache, 0).skipped  # nor does `framework cache prune`
        assert Entry(cache, normalize(urls[3])).final.exists()
    finally:
        held.release()
    assert entry_for(cache, urls[3]) is not None
    prune(cache, 0)
    assert not Entry(cache, normalize(urls[3])).final.exists()  # released: removable


def test_a_budget_too_small_for_prefetch_is_refused_before_anything_runs(
    http_server: FaultServer, tmp_path: Path
) -> None:
    urls = serve(http_server, "small", shards=10, records=8, pad=4000)
    size = max(len(http_server.routes[url[len(http_server.base) :]].data) for url in urls)
    with pytest.raises(ConfigError) as raised:
        loader(
            brace(http_server, "small", 10),
            tmp_path / "cache",
            num_workers=2,
            cache_limit=2 * size,
            prefetch=2,
        )
    assert raised.value.path == "cache_limit" and "prefetch" in str(raised.value)
    assert gets(http_server, "small") == 0  # sizes from HEAD: no shard was fetched
    with pytest.raises(ConfigError, match="prefetch"):
        loader(brace(http_server, "small", 10), tmp_path / "cache", prefetch=-1)
    with pytest.raises(ConfigError, match="cache_limit"):
        loader(brace(http_server, "small", 10), tmp_path / "cache", cache_limit="lots")


def test_offline_with_every_shard_cached_reads_without_a_request(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    serve(http_server, "offline", shards=30)
    cache = tmp_path / "cache"
    first = ids_of(loader(brace(http_server, "offline", 30), cache, num_workers=2))
    requests = gets(http_server, "offline")
    monkeypatch.setenv("FRAMEWORK_OFFLINE", "1")
    second = ids_of(loader(brace(http_server, "offline", 30), cache, num_workers=2))
    assert sorted(first) == sorted(second) == all_ids(30, RECORDS)
    assert gets(http_server, "offline") == requests


def test_resume_mid_epoch_with_other_num_workers_is_exactly_once(
    http_server: FaultServer, tmp_path: Path
) -> None:
    serve(http_server, "resume", shards=40)
    cache = tmp_path / "cache"
    first = loader(brace(http_server, "resume", 40), cache, num_workers=2, shuffle=True)
    seen: list[int] = []
    for count, batch in enumerate(first, 1):
        seen += batch["id"].tolist()
        if count == 37:
            state = first.state_dict()
            break
    again = loader(brace(http_server, "resume", 40), cache, num_workers=1, shuffle=True)
    again.load_state_dict(json.loads(json.dumps(state)))
    seen += ids_of(again)
    assert sorted(seen) == all_ids(40, RECORDS)


@pytest.mark.slow
def test_s3_glob_over_2_ranks_of_2_workers_then_resumed_on_1_rank(s3_env: str, tmp_path: Path) -> None:
    import boto3

    client = boto3.client("s3")
    bucket = f"stream-{os.getpid()}-{os.urandom(3).hex()}"
    client.create_bucket(Bucket=bucket)

    def put(index: int) -> None:
        client.put_object(
            Bucket=bucket, Key=f"train/part-{index:05d}.jsonl.gz", Body=shard_bytes(index, RECORDS)
        )

    threads = [threading.Thread(target=put, args=(index,)) for index in range(SHARDS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    spec = f"s3://{bucket}/train/*.jsonl.gz"
    cache = str(tmp_path / "cache")
    whole, part, rest = tmp_path / "whole", tmp_path / "part", tmp_path / "rest"
    for folder in (whole, part, rest):
        folder.mkdir()
    # even_batches=False: the ranks are dealt whole shards too (evened ranks get records
    # one by one, so they end together).
    start_ranks(stream_rank, (2, free_port(), str(whole), spec, cache, 2, None, None, False), 2)
    ranks = [json.loads((whole / f"rank{rank}.json").read_text())["ids"] for rank in range(2)]
    assert not set(ranks[0]) & set(ranks[1])
    assert sorted(ranks[0] + ranks[1]) == all_ids(SHARDS, RECORDS)
    # Whole shards dealt: no shard has records on both ranks, and each rank read half.
    shards = [{i // 1000 for i in ids} for ids in ranks]
    assert not shards[0] & shards[1] and len(shards[0]) == len(shards[1]) == SHARDS // 2
    # Cut at batch 30 on 2 ranks of 2 workers, resumed on 1 rank of 1 worker.
    start_ranks(stream_rank, (2, free_port(), str(part), spec, cache, 2, 30, None, False), 2)
    saved = [json.loads((part / f"rank{rank}.json").read_text()) for rank in range(2)]
    (part / "state.json").write_text(json.dumps(saved[0]["state"]))
    start_ranks(stream_rank, (1, free_port(), str(rest), spec, cache, 1, None, str(part / "state.json")), 1)
    resumed = json.loads((rest / "rank0.json").read_text())["ids"]
    assert sorted(saved[0]["ids"] + saved[1]["ids"] + resumed) == all_ids(SHARDS, RECORDS)


def test_what_names_shards(tmp_path: Path) -> None:
    odd = tmp_path / "data[1].jsonl"
    odd.write_text('{"id": 1}\n')
    assert not names_shards(str(odd))  # a file that exists is itself, brackets and all
    assert not names_shards(str(tmp_path / "plain.jsonl")) and not names_shards([str(odd)])
    assert names_shards("https://host/a.jsonl") and names_shards(["x.jsonl", "s3://b/k"])
    assert names_shards(str(tmp_path / "part-*.jsonl")) and names_shards("d/{a,b}.jsonl")
    assert names_shards("manifest:list.txt") and not names_shards({"a": 1})


@pytest.mark.parametrize("workers", [0, 2])
def test_a_local_glob_is_read_in_place_as_shards(tmp_path: Path, workers: int) -> None:
    paths = [str(tmp_path / f"part-{index}.jsonl") for index in range(3)]
    for index, path in enumerate(paths):
        Path(path).write_text("".join(f'{{"id": {index * 10 + k}}}\n' for k in range(4)))
    local = loader(str(tmp_path / "part-*.jsonl"), tmp_path / "cache", num_workers=workers)
    assert isinstance(local._settings.source, ShardFiles) and local._settings.source.urls == paths
    assert sorted(ids_of(local)) == [index * 10 + k for index in range(3) for k in range(4)]
    assert not (tmp_path / "cache").exists()  # read in place, never copied
    # A plain list of the same files names no shards: the reader gets the list.
    assert loader(paths, tmp_path / "cache")._settings.source == paths


def test_from_config_takes_a_url_and_the_streaming_keys(http_server: FaultServer, tmp_path: Path) -> None:
    from framework.data import DataLoader

    serve(http_server, "config", shards=3)
    built = DataLoader.from_config(
        {
            "type": "multiprocess",
            "batch_size": 4,
            "cache_dir": str(tmp_path / "c"),
            "cache_limit": "1MB",
            "prefetch": 1,
        },
        reader=DatasetReader.by_name("jsonl")(),
        data_path=f"{http_server.base}/config/train-00001.jsonl.gz",
    )
    assert sorted(ids_of(built)) == [1000 + k for k in range(RECORDS)]


def test_shards_are_read_in_an_order_shuffled_per_epoch_by_the_seed(
    http_server: FaultServer, tmp_path: Path
) -> None:
    serve(http_server, "order", shards=30)
    spec = brace(http_server, "order", 30)

    def orders(seed: int, shuffle: bool) -> list[list[str]]:
        built = loader(spec, tmp_path / "cache", seed=seed, shuffle=shuffle)
        return [built._settings.source_for(epoch).urls for epoch in range(3)]

    seeded = orders(5, True)
    assert seeded == orders(5, True)  # every process and run derives the same order
    assert len({tuple(order) for order in seeded}) == 3 and seeded != orders(6, True)
    assert all(sorted(order) == sorted(seeded[0]) for order in seeded)
    assert orders(5, False) == [[f"{http_server.base}/order/train-{i:05d}.jsonl.gz" for i in range(30)]] * 3
    # In-process the epoch reads in that order (batches of one shard's records, unshuffled
    # within the chunk of one batch).
    built = loader(
        spec, tmp_path / "cache", seed=5, shuffle=True, batch_size=RECORDS, max_instances_in_memory=RECORDS
    )
    first = [batch["id"][0].item() // 1000 for batch in built]
    assert [f"{http_server.base}/order/train-{i:05d}.jsonl.gz" for i in first] == seeded[0]


def test_a_streamed_state_resumes_only_with_the_seed_that_ordered_its_shards(
    http_server: FaultServer, tmp_path: Path
) -> None:
    from framework.errors import ResumeError

    serve(http_server, "seeded", shards=10)
    first = loader(brace(http_server, "seeded", 10), tmp_path / "cache", seed=1, shuffle=True)
    next(iter(first))
    state = first.state_dict()
    other = loader(brace(http_server, "seeded", 10), tmp_path / "cache", seed=2, shuffle=True)
    with pytest.raises(ResumeError, match="shard_seed"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="seed cannot change in the middle of an epoch"):
        first.seed = 3


def test_a_signed_url_is_one_file_for_framework_run() -> None:
    signed = "https://host/data.jsonl?X-Amz-Signature=abc&X-Amz-Expires=60"
    assert not names_shards(signed, one_url=False)  # `?` in the query is no glob
    assert names_shards(signed)  # the loader streams it, as one shard
    assert names_shards("https://host/part-*.jsonl", one_url=False)


def test_a_shard_changed_on_the_server_after_the_state_was_saved_is_named_not_read(
    http_server: FaultServer, tmp_path: Path
) -> None:
    urls = serve(http_server, "changed", shards=10)
    cache = tmp_path / "cache"
    first = loader(brace(http_server, "changed", 10), cache, num_workers=2)
    batches = iter(first)
    next(batches)
    state = json.loads(json.dumps(first.state_dict()))
    del batches
    assert set(state["shards"]) <= set(urls) and state["shards"]
    pinned = sorted(state["shards"])[-1]
    # The shard changes on the server (same size, other records), and the cache lets
    # its copy go: the resumed epoch must not read the new bytes at the old positions.
    route = http_server.routes[pinned[len(http_server.base) :]]
    route.data = shard_bytes(99, RECORDS)
    route.etag = '"changed"'
    Entry(cache, normalize(pinned)).final.unlink()
    again = loader(brace(http_server, "changed", 10), cache, num_workers=2)
    again.load_state_dict(state)
    with pytest.raises(WorkerError) as raised:
        ids_of(again)
    assert isinstance(raised.value.__cause__, ShardError) and pinned in str(raised.value)
    assert isinstance(raised.value.__cause__.cause, ChecksumError)
    fresh = loader(brace(http_server, "changed", 10), cache, num_workers=2)  # no state: the new bytes
    assert sorted(ids_of(fresh)) == sorted(
        [i for i in all_ids(10, RECORDS) if f"{i // 1000:05d}" not in pinned]
        + all_ids(100, RECORDS)[-RECORDS:]
    )


def test_a_reader_that_waits_fetches_further_ahead_within_no_budget(
    http_server: FaultServer, tmp_path: Path
) -> None:
    """`prefetch` deepens (up to DEEPEST times) while the reader waits for its next
    shard; with a cache_limit it stays what the budget was checked for."""
    from framework.data.shard_files import DEEPEST

    urls = serve(http_server, "deeper", shards=24, records=4)
    for url in urls:
        route = http_server.routes[url[len(http_server.base) :]]
        route.delay = 0.05  # each answer takes 50 ms: far slower than reading 4 records
    sizes = [len(http_server.routes[url[len(http_server.base) :]].data) for url in urls]
    for limit, most in ((None, 1 + DEEPEST), (10 * max(sizes), 2)):
        http_server.max_in_flight = 0
        streamed = loader(
            brace(http_server, "deeper", 24), tmp_path / f"cache{limit}", prefetch=1, cache_limit=limit
        )
        assert sorted(ids_of(streamed)) == all_ids(24, 4)
        assert http_server.max_in_flight <= most
        if limit is None:
            assert http_server.max_in_flight > 2  # deeper than prefetch=1 asked
