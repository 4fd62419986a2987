"""The promises of streaming a sharded dataset (docs/howto/streaming.md), attacked
where they could break: shards held and let go, names a user's reader owns, sizes and
HEAD-less servers, refused settings, shared caches of several users, programs that
stop early. Real parts: the fault-injecting HTTP server, real workers, the real cache."""

from __future__ import annotations

import gc
import gzip
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest

from framework import DatasetReader, MultiProcessDataLoader
from framework.data import ShardFiles
from framework.data import shard_files as shard_files_module
from framework.download import Shard
from framework.download._cache import Entry, use_of
from framework.download._call import normalize
from framework.download._lock import UseLock
from framework.download.inventory import prune
from framework.errors import ResumeError, ShardError, WorkerError
from tests.support.download import FaultServer, wait_for
from tests.support.streaming import (
    RECORDS,
    all_ids,
    brace,
    ids_of,
    in_use,
    loader,
    serve,
    shard_bytes,
)

pytestmark = pytest.mark.timeout(60)


def fetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("framework-shard-fetch")]


def test_a_shard_whose_size_differs_from_the_manifest_is_not_left_published(
    http_server: FaultServer, tmp_path: Path
) -> None:
    urls = serve(http_server, "rsize", shards=4)
    good = http_server.route(urls[2]).data
    lines = [f"{url}\t\t{len(http_server.route(url).data)}" for url in urls]
    manifest = http_server.add("/rsize/list.tsv", ("\n".join(lines) + "\n").encode())
    http_server.route(urls[2]).data = good + b"\n"  # the server answers other bytes this once
    cache = tmp_path / "cache"
    with pytest.raises(WorkerError) as raised:
        ids_of(loader(f"manifest:{manifest}", cache, num_workers=0))
    assert isinstance(raised.value.__cause__, ShardError)
    # "nothing partial is published": the bytes the manifest refused stay out of the cache ...
    assert not Entry(cache, normalize(urls[2])).final.exists()
    # ... so once the server answers the shard the manifest names, the epoch reads it.
    http_server.route(urls[2]).data = good
    assert sorted(ids_of(loader(f"manifest:{manifest}", cache, num_workers=0))) == all_ids(4, RECORDS)


def test_a_finished_in_process_epoch_holds_no_shard_and_no_fetch_thread(
    http_server: FaultServer, tmp_path: Path
) -> None:
    urls = serve(http_server, "rheld", shards=6)
    cache = tmp_path / "cache"
    streamed = loader(brace(http_server, "rheld", 6), cache, num_workers=0, shuffle=False)
    assert sorted(ids_of(streamed)) == all_ids(6, RECORDS)  # the pass ran to its end
    gc.collect()
    # "holds shard i ... until the reader asks for a later shard or the pass ends"
    assert [url for url in urls if in_use(cache, url)] == []
    assert fetch_threads() == []
    assert len(prune(cache, 0).removed) == 6  # `framework cache prune` can trim all of it


def test_a_state_is_refused_on_load_when_the_manifest_changed_since(
    http_server: FaultServer, tmp_path: Path
) -> None:
    urls = serve(http_server, "rgrow", shards=6)
    manifest = http_server.add("/rgrow/list.tsv", ("\n".join(urls[2:]) + "\n").encode())
    cache = tmp_path / "cache"
    first = loader(f"manifest:{manifest}", cache, num_workers=0)
    for count, _batch in enumerate(first, 1):
        if count == 2:
            state = first.state_dict()
            break
    # The dataset grew a shard in front (as a glob's listing does when a shard is
    # uploaded): the saved [shard index, byte offset] now points into another shard.
    http_server.route(manifest).data = ("\n".join(urls[1:]) + "\n").encode()
    http_server.route(manifest).etag = '"grown"'
    again = loader(f"manifest:{manifest}", cache, num_workers=0)
    # Local files are stamped in the state and a change is refused here; streamed shards
    # are not: the state loads, and the epoch fails later with a WorkerError blaming
    # the reader's determinism.
    with pytest.raises(ResumeError):
        again.load_state_dict(state)


def test_a_server_without_head_streams_within_a_cache_limit(http_server: FaultServer, tmp_path: Path) -> None:
    urls = serve(http_server, "rnohead", shards=6)
    for url in urls:
        http_server.route(url).head_status = 405  # GET-only (as many presigned or CDN URLs)
    # Without cache_limit the shards stream; with one, the size probe's refusal is not
    # "cannot say" (unknown size, no budget check) but an HTTPStatusError out of the
    # constructor naming no shard.
    streamed = loader(brace(http_server, "rnohead", 6), tmp_path / "cache", cache_limit="1MB")
    assert sorted(ids_of(streamed)) == all_ids(6, RECORDS)


def test_a_missing_shard_with_a_cache_limit_is_a_shard_error_naming_it(
    http_server: FaultServer, tmp_path: Path
) -> None:
    serve(http_server, "rgone", shards=6)
    http_server.routes["/rgone/train-00004.jsonl.gz"].status = 404
    # "ends the epoch with a WorkerError whose cause is a ShardError naming the shard"
    with pytest.raises(WorkerError) as raised:
        ids_of(loader(brace(http_server, "rgone", 6), tmp_path / "cache", cache_limit="1MB"))
    assert isinstance(raised.value.__cause__, ShardError) and "shard 5 of 6" in str(raised.value)


def test_a_refused_cache_limit_assignment_keeps_the_limit_in_force(
    http_server: FaultServer, tmp_path: Path
) -> None:
    serve(http_server, "rassign", shards=6, pad=2000)
    streamed = loader(brace(http_server, "rassign", 6), tmp_path / "cache", cache_limit="1MB")
    with pytest.raises(ValueError):  # ConfigError: too small for prefetch + 1 shards
        streamed.cache_limit = 10
    # The attribute now says 10 bytes while the shards stream under the old limit: what
    # the loader reports (and saves) is not what it does.
    assert streamed.cache_limit == "1MB"
    assert isinstance(streamed._settings.source, ShardFiles)
    assert streamed._settings.source.cache_limit == 10**6


def test_an_assigned_prefetch_is_checked_as_the_constructor_checks_it(
    http_server: FaultServer, tmp_path: Path
) -> None:
    from framework.errors import ConfigError

    serve(http_server, "rprefetch", shards=4)
    streamed = loader(brace(http_server, "rprefetch", 4), tmp_path / "cache")
    # `prefetch=-1` in the constructor is a ConfigError; assigned, it is taken, and the
    # next epoch fails in the reader with "max_workers must be greater than 0".
    with pytest.raises(ConfigError, match="prefetch"):
        streamed.prefetch = -1


def test_a_script_that_stops_reading_exits_while_a_prefetch_is_still_downloading(
    http_server: FaultServer, tmp_path: Path
) -> None:
    urls = serve(http_server, "rexit", shards=4)
    http_server.route(urls[1]).hold_after = 0  # shard 1's answer waits (a large shard, a slow link)
    script = (
        "from pathlib import Path\n"
        "from tests.support.streaming import loader\n"
        f"streamed = loader({brace(http_server, 'rexit', 4)!r}, Path({str(tmp_path / 'cache')!r}), "
        "num_workers=0, batch_size=2, max_instances_in_memory=2)\n"
        "print(next(iter(streamed))['id'].tolist(), flush=True)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).parents[2])
    try:
        # The fetch-ahead threads are joined at interpreter exit (concurrent.futures'
        # atexit hook): the script cannot end until every shard fetched ahead is in.
        assert child.wait(timeout=20) == 0
    except subprocess.TimeoutExpired:
        pytest.fail("the script did not exit: it waits for shard 1's fetch ahead")
    finally:
        http_server.route(urls[1]).released.set()
        child.kill()
        child.wait()


class _NamedSplits(DatasetReader):
    """A reader of the user's own whose data_path is no file: a dataset name and a split
    slice (as `datasets.load_dataset` takes), or a URI of a service it queries itself."""

    def _read(self, file_path: Any) -> Any:
        assert isinstance(file_path, str), f"the reader got {file_path!r}, not the data_path given"
        for index in range(6):
            yield {"id": index}


@pytest.mark.parametrize("data_path", ["squad[0:6]", "squad?split=train", "myapi://warehouse/table"])
def test_a_data_path_that_is_no_shard_spec_still_reaches_a_users_reader(
    data_path: str, tmp_path: Path
) -> None:
    # "data_path: passed to `reader.read()`": a string the user's reader understands
    # (and that names no file) is now resolved as shards: a glob matching nothing
    # (ShardSpecError when the loader is built), or a ShardFiles of an unfetchable URL.
    built = MultiProcessDataLoader(
        _NamedSplits(), data_path, batch_size=3, quiet=True, cache_dir=str(tmp_path / "cache")
    )
    assert sorted(ids_of(built)) == list(range(6))


def test_persistent_workers_hold_no_shard_between_epochs(http_server: FaultServer, tmp_path: Path) -> None:
    urls = serve(http_server, "rpersist", shards=6)
    cache = tmp_path / "cache"
    streamed = loader(
        brace(http_server, "rpersist", 6), cache, num_workers=2, persistent_workers=True, shuffle=True
    )
    assert sorted(ids_of(streamed)) == all_ids(6, RECORDS)  # the epoch ran to its end
    # The idle workers keep the epoch's last shard held: no other process's cache_limit
    # can evict it, and `framework cache prune` skips it, until the next epoch.
    assert [url for url in urls if in_use(cache, url)] == []
    assert len(prune(cache, 0).removed) == 6


def test_prune_dry_run_reports_what_prune_removes_beside_a_reader(
    http_server: FaultServer, tmp_path: Path
) -> None:
    urls = serve(http_server, "rdry", shards=3)
    cache = tmp_path / "cache"
    assert sorted(ids_of(loader(brace(http_server, "rdry", 3), cache))) == all_ids(3, RECORDS)
    held = UseLock(use_of(Entry(cache, normalize(urls[1])).final))
    held.share()  # a reader in another process reads shard 1
    try:
        planned = {entry.url for entry in prune(cache, 0, dry_run=True).removed}
        done = {entry.url for entry in prune(cache, 0).removed}
    finally:
        held.release()
    # `--dry-run` checks the entry lock only: it lists the shard in use as removed.
    assert planned == done == {urls[0], urls[2]}


def test_a_relative_manifest_in_a_run_config_is_taken_from_the_configs_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from framework.cli import main

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    for index in range(2):
        (project / f"part-{index}.jsonl").write_text(
            "".join(json.dumps({"x": float(k), "label": k % 2}) + "\n" for k in range(5))
        )
    (project / "list.tsv").write_text("part-0.jsonl\npart-1.jsonl\n")
    config = {
        "dataset_reader": {"type": "jsonl"},
        "data_path": "manifest:list.tsv",  # relative, as "data_path": "lines.txt" is
        "data_loader": {"type": "multiprocess", "batch_size": 4, "max_instances_in_memory": 8},
        "epochs": 1,
    }
    (project / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("FRAMEWORK_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(elsewhere)
    # A relative local path (a glob's too) is taken from the config's folder; the
    # manifest's is left as it is and looked up in the current folder.
    code = main(["run", "--no-progress", "--json", str(Path("..") / "project" / "config.json")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["instances"] == 10


def test_a_listed_glob_checks_cache_limit_with_no_request_a_shard(
    s3_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3
    from framework_plugins.s3 import S3Backend

    client = boto3.client("s3")
    bucket = f"promises-{os.getpid()}-{os.urandom(3).hex()}"
    client.create_bucket(Bucket=bucket)
    for index in range(8):
        client.put_object(Bucket=bucket, Key=f"train/part-{index}.jsonl.gz", Body=shard_bytes(index, RECORDS))
    stats: list[str] = []
    real_stat = S3Backend.stat

    def counted_stat(self: S3Backend, url: str) -> Any:
        stats.append(url)
        return real_stat(self, url)

    monkeypatch.setattr(S3Backend, "stat", counted_stat)
    # "sizes come from the manifest, the listing, the cache, or one HEAD request a
    # shard": the listing had every size, yet `_glob` keeps only the URLs.
    streamed = loader(f"s3://{bucket}/train/*.jsonl.gz", tmp_path / "cache", cache_limit="1MB")
    assert len(stats) == 0
    assert sorted(ids_of(streamed)) == all_ids(8, RECORDS)


def test_framework_run_asks_each_shard_size_once(
    http_server: FaultServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    from framework.cli import main

    urls = [
        http_server.add(
            f"/rrun/part-{index}.jsonl.gz",
            gzip.compress("".join(json.dumps({"x": 1.0, "label": k % 2}) + "\n" for k in range(5)).encode()),
        )
        for index in range(6)
    ]
    config = {
        "dataset_reader": {"type": "jsonl"},
        "data_path": f"{http_server.base}/rrun/part-{{0..5}}.jsonl.gz",
        "data_loader": {
            "type": "multiprocess",
            "batch_size": 4,
            "max_instances_in_memory": 8,
            "cache_limit": "1MB",
        },
        "epochs": 1,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("FRAMEWORK_CACHE", str(tmp_path / "cache"))
    code = main(["run", "--no-progress", "--json", str(tmp_path / "config.json")])
    _out, err = capsys.readouterr()
    assert code == 0, err
    # "sizes come from ... one HEAD request a shard": the preflight build and the real
    # one each resolve data_path, so every shard's size is asked twice.
    assert [http_server.route(url).heads for url in urls] == [1] * 6


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="runs a reader as another user"
)
def test_a_reader_of_another_user_holds_its_shard_in_a_shared_cache(
    http_server: FaultServer, request: pytest.FixtureRequest
) -> None:
    urls = serve(http_server, "rshared", shards=1)
    shared = Path(tempfile.mkdtemp(prefix="shared-cache-"))  # tmp_path's parents are private
    request.addfinalizer(lambda: shutil.rmtree(shared, ignore_errors=True))
    os.chmod(shared, 0o777)  # a cache folder users share
    cache = shared / "cache"
    cache.mkdir()
    os.chmod(cache, 0o777)
    assert sorted(ids_of(loader(urls[0], cache))) == all_ids(1, RECORDS)  # this user made its `.use`
    script = (
        "import sys\n"
        "from framework.data import ShardFiles\n"
        "from framework.download import Shard\n"
        f"files = ShardFiles([Shard({urls[0]!r})], cache_dir={str(cache)!r}, prefetch=0)\n"
        "path = files[0]\n"
        "print('held', flush=True)\n"
        "sys.stdin.readline()\n"
        "open(path).close()\n"
    )
    command = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-c", script]
    child = subprocess.Popen(
        command,
        cwd=Path(__file__).parents[2],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HOME": str(shared)},
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "held\n", child.stderr
        # The `.use` file is this user's, mode 0644: the other user's reader cannot open
        # it read-write, so it reads holding nothing and a prune removes its shard.
        assert in_use(cache, urls[0])
        assert prune(cache, 0).removed == ()
    finally:
        _out, err = child.communicate("\n", timeout=30)
    assert child.returncode == 0, err


def test_a_local_file_named_like_a_glob_in_a_list_with_a_url_is_that_file(
    http_server: FaultServer, tmp_path: Path
) -> None:
    urls = serve(http_server, "rnamed", shards=1)
    named = tmp_path / "part[1].jsonl"  # a file whose name holds brackets
    named.write_text("".join(f'{{"id": {9000 + k}}}\n' for k in range(3)))
    (tmp_path / "part1.jsonl").write_text('{"id": 7777}\n')  # what the bracket, read as a glob, matches
    # "A local path that exists is always that one file, even when its name holds *, [
    # or braces": `names_shards` keeps that promise, `resolve_shards` (a list holding a
    # URL) does not, and reads another file in its place, silently.
    streamed = loader([str(named), urls[0]], tmp_path / "cache")
    assert sorted(ids_of(streamed)) == [*all_ids(1, RECORDS), 9000, 9001, 9002]


class _CountedOs:
    """`os` as `framework.download.streaming` sees it, counting `lstat` calls."""

    def __init__(self) -> None:
        self.lstats = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def lstat(self, *args: Any, **kwargs: Any) -> os.stat_result:
        self.lstats += 1
        return os.lstat(*args, **kwargs)


def test_an_epoch_within_a_cache_limit_stats_each_shard_a_few_times_not_once_per_read(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from framework.download import streaming

    shards = 200
    serve(http_server, "rstat", shards=shards)
    streamed = loader(brace(http_server, "rstat", shards), tmp_path / "cache", cache_limit="1GB")
    ids_of(streamed)  # every shard cached; the limit is never reached
    counted = _CountedOs()
    monkeypatch.setattr(streaming, "os", counted)
    assert sorted(ids_of(streamed)) == all_ids(shards, RECORDS)
    # Every hold sums the sizes of all the dataset's shards (`_trim`): shards**2 lstat
    # calls an epoch in each reading process (10**8 for 10,000 shards, on a shared
    # filesystem too), where a running total would need a few a shard.
    assert counted.lstats <= 10 * shards, counted.lstats


def _rank_on_its_own_node(rank: int, world: int, port: int, out_dir: str, data_path: str, cache: str) -> None:
    """A rank of `stream_rank` with a cache folder of its own (a node's local disk)."""
    from tests.support.streaming import stream_rank

    stream_rank(rank, world, port, out_dir, data_path, f"{cache}-{rank}", 0, None, None)


@pytest.mark.xfail(
    strict=True,
    reason="ranks compare their shard lists only in state_dict() (a collective already); a "
    "check when the loader is built or a pass starts needs a collective there, which a rank "
    "that never gets there would leave the others waiting in",
)
def test_ranks_that_resolve_different_shard_lists_do_not_read_on_silently(
    http_server: FaultServer, tmp_path: Path
) -> None:
    import json

    from tests.support.ranks import free_port, start_ranks

    urls = serve(http_server, "rranks", shards=6)
    first, grown = urls[:4], urls[:6]
    manifest = http_server.add("/rranks/list.tsv", ("\n".join(first) + "\n").encode())
    # The list changes between the two ranks' reads of it (a shard uploaded, a listing
    # that caught up): the second request gets the grown version.
    route = http_server.route(manifest)
    route.swap_at_get = 2
    route.then = {"data": ("\n".join(grown) + "\n").encode(), "etag": '"grown"'}
    out = tmp_path / "out"
    out.mkdir()
    args = (2, free_port(), str(out), f"manifest:{manifest}", str(tmp_path / "cache"))
    try:
        start_ranks(_rank_on_its_own_node, args, 2)
    except Exception as error:
        if "shard" not in str(error):  # not a refusal naming the shard lists: a failure
            raise
        return  # refused: the ranks found out they disagree
    ranks = [json.loads((out / f"rank{rank}.json").read_text())["ids"] for rank in range(2)]
    read = sorted(ranks[0] + ranks[1])
    # "the same on every rank": each rank deals records out of its own list, so some
    # records are read by both ranks and others by none.
    assert route.gets == 2
    assert read in (all_ids(4, RECORDS), all_ids(6, RECORDS)), read


def test_an_epoch_ended_by_a_shard_error_holds_no_shard(http_server: FaultServer, tmp_path: Path) -> None:
    urls = serve(http_server, "rfail", shards=6)
    http_server.route(urls[3]).status = 404
    cache = tmp_path / "cache"
    streamed = loader(brace(http_server, "rfail", 6), cache, num_workers=0)
    with pytest.raises(WorkerError):
        ids_of(streamed)
    gc.collect()
    # The pass ended (with an error): the shards fetched ahead of the failed one are let
    # go as their fetches end (the error is not kept waiting for them), and nothing stays
    # held for as long as the loader lives.
    wait_for(
        lambda: not [url for url in urls if in_use(cache, url)] and not fetch_threads(), 10, "holds let go"
    )


def _ctrl_c_when(predicate: Any) -> threading.Thread:
    """Send SIGINT to the main thread once `predicate()` holds: a Ctrl-C that lands
    while the main thread waits."""
    main = threading.main_thread().ident
    assert main is not None

    def send() -> None:
        wait_for(predicate, what="the moment for a Ctrl-C")
        signal.pthread_kill(main, signal.SIGINT)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_close_after_ctrl_c_on_the_first_shard_does_not_wait_for_cancelled_fetches(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/howto/streaming.md: a pass that ends "waits up to CLOSE_WAIT_S for fetches
    ahead so nothing writes into the cache after it". A fetch ahead that was cancelled
    before it started writes nothing: close has nothing to wait for. The first shard's
    server stalls; a Ctrl-C lands while the reader waits for it; close() is called as a
    `finally` would. Counted: the futures close's wait returned as not done."""
    urls = serve(http_server, "ctrl-c-first", shards=4)
    first = http_server.route(urls[0])
    first.chunk, first.stall_after, first.stall_s = 16, 16, 30.0  # released by the test
    seen: list[tuple[int, int, int]] = []  # (done, not done, of those cancelled)
    real_wait = futures.wait

    def wait(fs: Any, timeout: Any = None, return_when: Any = futures.ALL_COMPLETED) -> Any:
        done, not_done = real_wait(fs, timeout=timeout, return_when=return_when)
        seen.append((len(done), len(not_done), sum(1 for f in not_done if f.cancelled())))
        return done, not_done

    monkeypatch.setattr(shard_files_module.futures, "wait", wait)
    monkeypatch.setattr(shard_files_module, "CLOSE_WAIT_S", 0.5)  # the bound, shortened
    files = ShardFiles([Shard(url) for url in urls], cache_dir=str(tmp_path / "cache"), prefetch=2)
    sender = _ctrl_c_when(lambda: first.stalling)
    try:
        with pytest.raises(KeyboardInterrupt):
            files[0]
    finally:
        sender.join(5)
        files.close()
        first.released.set()
    assert seen, "close() waited for nothing"
    _, not_done, cancelled = seen[-1]
    assert not_done == 0, f"close() timed out on {not_done} fetches ahead, {cancelled} of them cancelled"


def test_a_fetch_ahead_that_cannot_start_is_an_error_not_a_wait_forever(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process out of threads (the parallel engine keeps to fewer connections when
    one cannot start): the first shard's fetch starts, the ones ahead cannot. The
    reader that then asks for shard 1 must get an error; counted: once no fetch thread
    is left, shard 1's fetch is done (an error) or running, never pending with no
    thread to run it."""
    urls = serve(http_server, "no-thread", shards=4)
    real_start = threading.Thread.start
    starts: list[str] = []

    def start(thread: threading.Thread) -> None:
        if thread.name == "framework-shard-fetch":
            starts.append(thread.name)
            if len(starts) > 1:
                raise RuntimeError("can't start new thread")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    monkeypatch.setattr(shard_files_module, "CLOSE_WAIT_S", 0.5)  # close waits on it too
    files = ShardFiles([Shard(url) for url in urls], cache_dir=str(tmp_path / "cache"), prefetch=2)
    try:
        try:
            files[0]
        except RuntimeError:
            return  # the reader was told: no wait
        wait_for(lambda: not fetch_threads(), what="the first fetch's thread to end")
        here = files._here
        assert here is not None
        ahead = here.wanted[1]
        assert ahead.done() or ahead.running(), "shard 1's fetch is pending with no thread to run it"
    finally:
        files.close()


def test_ctrl_c_in_a_loader_waiting_for_its_first_shard_returns_without_the_close_wait(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same promise through the loader (num_workers=0): Ctrl-C while the first
    shard's server stalls ends the pass (`let_go` in its `finally`); nothing ahead was
    started, so nothing can write into the cache and there is nothing to wait for.
    Counted: the futures close's wait returned as not done."""
    from tests.support.streaming import brace, loader

    name = "loader-ctrl-c"
    urls = serve(http_server, name, shards=6)
    first = http_server.route(urls[0])  # read first: the loader does not shuffle here
    first.chunk, first.stall_after, first.stall_s = 16, 16, 30.0  # released by the test
    seen: list[tuple[int, int]] = []  # (not done, of those cancelled)
    real_wait = futures.wait

    def wait(fs: Any, timeout: Any = None, return_when: Any = futures.ALL_COMPLETED) -> Any:
        done, not_done = real_wait(fs, timeout=timeout, return_when=return_when)
        seen.append((len(not_done), sum(1 for f in not_done if f.cancelled())))
        return done, not_done

    monkeypatch.setattr(shard_files_module.futures, "wait", wait)
    monkeypatch.setattr(shard_files_module, "CLOSE_WAIT_S", 0.5)  # the bound, shortened
    sender = _ctrl_c_when(lambda: first.stalling)
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in loader(brace(http_server, name, 6), tmp_path / "cache", num_workers=0, shuffle=False):
                pass
    finally:
        sender.join(5)
        first.released.set()
    assert seen, "the pass ended without letting go of its shards"
    not_done, cancelled = seen[-1]
    assert not_done == 0, f"close() timed out on {not_done} fetches ahead, {cancelled} of them cancelled"
