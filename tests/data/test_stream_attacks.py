"""The promises of streaming a sharded dataset (docs/howto/streaming.md, the
`MultiProcessDataLoader` docstring) where they meet state and sharing: pins of a
resumed epoch, local files beside remote ones, holds across fork and copies, use
files swept with their entries, budgets and their refusals. Real parts: the
fault-injecting HTTP server, the real cache, real workers and gloo ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from framework.data import ShardFiles
from framework.download import Shard
from framework.download._cache import Entry
from framework.download._call import normalize
from framework.download.inventory import prune
from framework.errors import ShardError, WorkerError
from tests.support.download import FaultServer, sha256
from tests.support.streaming import all_ids, brace, ids_of, in_use, loader, serve, shard_bytes

pytestmark = pytest.mark.timeout(60)


def exact_or_named(resumed: Any, seen: list[int], expected: list[int]) -> None:
    """The rest of a resumed epoch completes `seen` to `expected` exactly, or the epoch
    ends with a ShardError naming a shard it cannot read as saved."""
    try:
        rest = ids_of(resumed)
    except WorkerError as error:
        assert isinstance(error.__cause__, ShardError)
        return
    assert sorted(seen + rest) == expected, sorted(set(rest) - set(expected))


def test_the_first_shard_fetched_into_a_fresh_cache_is_held_while_read(
    http_server: FaultServer, tmp_path: Path
) -> None:
    urls = serve(http_server, "afresh", shards=2)
    cache = tmp_path / "cache"  # a new cache folder (a new node, a new job's scratch disk)
    files = ShardFiles([Shard(url) for url in urls], cache_dir=str(cache), prefetch=0)
    path = files[0]  # a reader reads shard 0
    # "A shard any process is reading is never removed (readers hold a shared lock on
    # <entry>.use in the cache folder), and `framework cache prune` skips it too":
    # `UseLock.share` opens the use file before the entry's folder exists, fails, and
    # reads holding nothing; prune (or another process's cache_limit) removes the shard.
    try:
        assert in_use(cache, urls[0])
        assert prune(cache, 0).removed == ()
        assert Path(path).exists()
    finally:
        files.close()


def test_a_resumed_shard_evicted_before_the_state_was_saved_is_pinned_too(
    http_server: FaultServer, tmp_path: Path
) -> None:
    urls = serve(http_server, "apin", shards=4)
    largest = max(len(http_server.route(url).data) for url in urls)
    cache = tmp_path / "cache"
    # About one shard of budget beyond the one read, none fetched ahead.
    options: dict[str, Any] = dict(num_workers=0, shuffle=False, prefetch=0, cache_limit=largest + 64)
    first = loader(brace(http_server, "apin", 4), cache, **options)
    seen: list[int] = []
    for count, batch in enumerate(first, 1):
        seen += batch["id"].tolist()
        if count == 3:  # 24 records: the position is 4 records into shard 1
            break
    # The pass was cut short: no shard is held ("once a pass ends by ... a break, a
    # process holds no shard"). A reader of the same cache and budget (another rank of
    # the node, or this loader's worker reading batches ahead) reads shards 2 and 3,
    # evicting shard 1 (next epoch's second) before shard 0 (next epoch's first).
    other = ShardFiles(
        [Shard(url) for url in urls], cache_dir=str(cache), cache_limit=largest + 64, prefetch=0
    )
    other[2], other[3]
    other.close()
    assert not Entry(cache, normalize(urls[1])).final.exists()
    state = first.state_dict()
    first.close()
    assert seen == [*all_ids(1, 20), 1000, 1001, 1002, 1003]
    # Shard 1 is uploaded again with other records before the job resumes.
    http_server.route(urls[1]).data = shard_bytes(7, 20)
    http_server.route(urls[1]).etag = '"changed"'
    again = loader(brace(http_server, "apin", 4), cache, **options)
    again.load_state_dict(state)
    # "the resumed epoch reads those bytes only: a shard changed on the server since
    # then ends it with a ShardError naming the shard, never with records read at
    # positions that now point elsewhere": the state pins the shards the epoch read,
    # shard 1 among them though it was evicted before the save.
    assert state["shards"][urls[1]] == sha256(shard_bytes(1, 20))
    exact_or_named(again, seen, all_ids(4, 20))


def test_a_local_file_in_the_list_takes_no_part_of_the_cache_limit(
    http_server: FaultServer, tmp_path: Path
) -> None:
    urls = serve(http_server, "alocal", shards=2)
    local = tmp_path / "big.jsonl"  # read in place: "Local files are never removed", nor fetched
    local.write_text("".join(f'{{"id": {9000 + k}, "pad": "{"x" * 100}"}}\n' for k in range(2000)))
    # `cache_limit`: "the most bytes the dataset's fetched shards take": the two
    # remote shards take under 1 KB each; the budget check counts the 200 KB local
    # file as a shard to fetch and refuses the loader (ConfigError).
    streamed = loader([*urls, str(local)], tmp_path / "cache", cache_limit="20KB", num_workers=0)
    assert len(ids_of(streamed)) == 2 * 20 + 2000


def test_a_hold_taken_before_workers_fork_is_let_go_with_the_holder(
    http_server: FaultServer, tmp_path: Path
) -> None:
    urls = serve(http_server, "afork", shards=2)
    cache = tmp_path / "cache"
    ids_of(loader(brace(http_server, "afork", 2), cache))  # cached (and the entry folder made)
    validation = ShardFiles([Shard(url) for url in urls], cache_dir=str(cache), prefetch=0)
    validation[0]  # a pass in this process reads shard 0 of one dataset ...
    local = tmp_path / "train.jsonl"
    local.write_text("".join(f'{{"id": {k}}}\n' for k in range(40)))
    # ... while another loader forks persistent workers (as a training loop's loaders do)
    training = loader(str(local), cache, num_workers=1, persistent_workers=True)
    try:
        assert len(ids_of(training)) == 40
        validation.close()  # the pass ends: this process holds nothing
        # "Between epochs ... a process holds no shard": the forked worker inherited the
        # open use file, and an flock belongs to the open file, so the worker holds
        # shard 0 for as long as it lives: no prune or cache_limit can remove it.
        assert not in_use(cache, urls[0])
    finally:
        training.close()


def test_a_state_saved_between_epochs_lets_the_next_epoch_read_what_the_server_has(
    http_server: FaultServer, tmp_path: Path
) -> None:
    urls = serve(http_server, "afresh_epoch", shards=3)
    first = loader(brace(http_server, "afresh_epoch", 3), tmp_path / "cache", num_workers=0)
    assert sorted(ids_of(first)) == all_ids(3, 20)  # epoch 0 ran to its end
    state = first.state_dict()  # a checkpoint at the epoch's end: the next epoch, from its start
    # A shard is uploaded again before the job resumes, on a node with another cache.
    http_server.route(urls[1]).data = shard_bytes(7, 20)
    http_server.route(urls[1]).etag = '"changed"'
    again = loader(brace(http_server, "afresh_epoch", 3), tmp_path / "other-cache", num_workers=0)
    again.load_state_dict(state)
    # "The next fresh epoch reads what the server has": no record of epoch 1 was read
    # when the state was saved, yet it pins epoch 1 to the old bytes and the epoch
    # ends with a ShardError (sha256 mismatch) for shard 2 of 3.
    assert sorted(ids_of(again)) == sorted([*all_ids(1, 20), *range(2000, 2020), *range(7000, 7020)])


def test_a_copied_loaders_pass_keeps_the_originals_shard_held(
    http_server: FaultServer, tmp_path: Path
) -> None:
    import copy

    urls = serve(http_server, "acopy", shards=4)
    cache = tmp_path / "cache"
    train = loader(brace(http_server, "acopy", 4), cache, num_workers=0, shuffle=False, prefetch=0)
    probe = copy.copy(train)  # "the same settings at the same point, but its own"
    batches = iter(train)
    for _ in range(3):
        next(batches)  # 24 records: train reads shard 1
    held = [url for url in urls if in_use(cache, url)]
    assert held
    assert len(ids_of(probe)) == 4 * 20  # the copy's pass runs to its end
    # Both share one ShardFiles (copy.copy of the settings): the copy's pass end lets go
    # of what the original's pass, still under way, holds; prune may now remove it.
    assert [url for url in urls if in_use(cache, url)] == held
    assert len(ids_of(batches)) == 4 * 20 - 24


def test_a_resume_with_urls_signed_anew_is_pinned_to_the_saved_bytes(
    http_server: FaultServer, tmp_path: Path
) -> None:
    def signed(signature: str, changed: bool) -> list[str]:
        return [
            http_server.add(
                f"/asign/train-{index}.jsonl.gz?sig={signature}",
                shard_bytes(7 if changed and index == 1 else index, 20),
            )
            for index in range(3)
        ]

    manifest = http_server.add("/asign/list.tsv", ("\n".join(signed("old", False)) + "\n").encode())
    first = loader(f"manifest:{manifest}", tmp_path / "cache", num_workers=0, shuffle=False)
    seen: list[int] = []
    for count, batch in enumerate(first, 1):
        seen += batch["id"].tolist()
        if count == 3:  # 24 records: 4 into shard 1
            break
    state = first.state_dict()
    # The job resumes on another node the next day: the presigned URLs are signed anew
    # ("a presigned URL signed anew names the same object": the state's shard list
    # matches), and shard 1's object was uploaded again since.
    http_server.route(manifest).data = ("\n".join(signed("new", True)) + "\n").encode()
    http_server.route(manifest).etag = '"signed anew"'
    again = loader(f"manifest:{manifest}", tmp_path / "other-cache", num_workers=0, shuffle=False)
    again.load_state_dict(state)
    # "the resumed epoch reads those bytes only: a shard changed on the server since
    # then ends it with a ShardError": the pins are keyed by the URL with its old
    # query, so none applies, and the resume reads the new object from record 4 on.
    exact_or_named(again, seen, all_ids(3, 20))


def test_a_file_url_of_a_file_named_like_a_glob_is_that_file(tmp_path: Path) -> None:
    named = tmp_path / "part[1].jsonl"  # a file whose name holds brackets
    named.write_text("".join(f'{{"id": {9000 + k}}}\n' for k in range(3)))
    (tmp_path / "part1.jsonl").write_text('{"id": 7777}\n')  # what the bracket, read as a glob, matches
    # "A local path that exists is always that one file, even when its name holds *, [
    # or braces": `names_shards` and `resolve_shards` check that for a plain path only;
    # a `file://` URL of it (a local path to `local_path`) is listed as a glob and the
    # loader reads part1.jsonl in its place, silently.
    streamed = loader(f"file://{named}", tmp_path / "cache", num_workers=0)
    assert sorted(ids_of(streamed)) == [9000, 9001, 9002]


def test_a_refused_cache_limit_says_how_much_it_falls_short(http_server: FaultServer, tmp_path: Path) -> None:
    import re

    from framework.errors import ConfigError

    urls = serve(http_server, "ashort", shards=3, pad=400)
    need = sum(sorted((len(http_server.route(url).data) for url in urls), reverse=True)[:3])
    with pytest.raises(ConfigError) as raised:
        loader(brace(http_server, "ashort", 3), tmp_path / "cache", cache_limit=need - 1)
    # "cache_limit 14.0 KiB cannot hold ... take 14.0 KiB. Raise cache_limit to at least
    # 14.0 KiB": rounded to one decimal, the limit refused and the one asked for read the
    # same, and the advice repeats the value just refused.
    figures = re.findall(r"\d+(?:\.\d+)? ?(?:[KMGT]?i?B\b|bytes)", str(raised.value))
    assert len(set(figures)) > 1, str(raised.value)


def test_prune_leaves_no_use_file_of_a_removed_shard(http_server: FaultServer, tmp_path: Path) -> None:
    serve(http_server, "ause", shards=20)
    cache = tmp_path / "cache"
    assert len(ids_of(loader(brace(http_server, "ause", 20), cache))) == 20 * 20
    assert len(prune(cache, 0).removed) == 20
    # `framework cache prune --max-size 0` empties the cache of a dataset it removed
    # entirely; each shard ever read leaves its `<entry>.use` behind for good (one
    # inode a shard, 10,000 for a 10,000-shard dataset, never swept).
    leftovers = sorted(path.name for path in cache.iterdir() if path.name.endswith(".use"))
    assert leftovers == [], f"{len(leftovers)} use files left, such as {leftovers[:1]}"


def test_a_local_file_beside_remote_shards_that_changed_is_refused_on_resume(
    http_server: FaultServer, tmp_path: Path
) -> None:
    from framework.errors import ResumeError

    urls = serve(http_server, "amixed", shards=1)
    local = tmp_path / "extra.jsonl"
    local.write_text("".join(f'{{"id": {9000 + k}}}\n' for k in range(20)))
    options: dict[str, Any] = dict(num_workers=0, shuffle=False)
    first = loader([str(local), *urls], tmp_path / "cache", **options)
    seen = next(iter(first))["id"].tolist()  # 8 records into the local file
    state = first.state_dict()
    # The file is rewritten: its first record (the resumed chunk's first, which the
    # resume checks) is the same, the others are not.
    local.write_text("".join(f'{{"id": {9000 if k == 0 else 8000 + k}}}\n' for k in range(20)))
    again = loader([str(local), *urls], tmp_path / "cache", **options)
    # A list of local files is stamped in the state and a changed one is refused
    # (ResumeError); a local file in a list with a URL is neither stamped (the source is
    # a ShardFiles, which `file_stamps` does not look into) nor pinned (`digests` skips
    # local files): the resume reads the new file from record 8 on, silently.
    try:
        again.load_state_dict(state)
        rest = ids_of(again)
    except (ResumeError, WorkerError):
        return
    assert sorted(seen + rest) == sorted([*range(9000, 9020), *all_ids(1, 20)]), rest[:3]


def _rank_with_a_cache_of_its_own(
    rank: int, world: int, port: int, out_dir: str, data_path: str, cache: str
) -> None:
    """A rank of `stream_rank` with its node's cache folder, saving its state after 2 batches."""
    from tests.support.streaming import stream_rank

    stream_rank(rank, world, port, out_dir, data_path, f"{cache}-{rank}", 0, 2, None)


def test_ranks_whose_caches_hold_different_bytes_of_a_shard_do_not_save_one_pin(
    http_server: FaultServer, tmp_path: Path
) -> None:
    import json

    from tests.support.ranks import free_port, start_ranks

    # One shard, so both ranks read records of it (with a shard per slot or more, each
    # shard is dealt whole to one process, and no two processes read one shard).
    urls = serve(http_server, "aranks", shards=1, records=40)
    data_path = brace(http_server, "aranks", 1)
    cache = str(tmp_path / "cache")
    # Node 0 read the dataset yesterday; the shard was uploaded again since; node 1 is new.
    assert len(ids_of(loader(data_path, Path(f"{cache}-0")))) == 40
    http_server.route(urls[0]).data = shard_bytes(7, 40)
    http_server.route(urls[0]).etag = '"changed"'
    out = tmp_path / "out"
    out.mkdir()
    try:
        start_ranks(_rank_with_a_cache_of_its_own, (2, free_port(), str(out), data_path, cache), 2)
    except Exception as error:
        if "shard" not in str(error):  # not a refusal naming the shard: a failure
            raise
        return  # refused: the ranks read different bytes of one shard
    state = json.loads((out / "rank0.json").read_text())["state"]
    # "A state saved mid-epoch names the sha256 of each remote shard the epoch has opened ...
    # the resumed epoch reads those bytes only": rank 0 reads the shard's old bytes, rank
    # 1 its new ones; the state keeps one of the two digests (the last rank's, silently),
    # and a resume reads the other rank's positions in bytes that rank never read.
    pytest.fail(
        f"state_dict() saved one pin for the shard of two ranks' bytes: {state['shards'][urls[0]][:12]}"
    )
