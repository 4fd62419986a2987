"""Review of issue 27 (cache ls|verify|prune, shard specs, compressed readers): each
test reproduces a break found in review, marked `xfail(strict=True)` so that it flips
(and fails the suite) once the break is fixed and the mark can go."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import filelock
import pytest
from framework_plugins.compressed import open_data_file

from framework.data.multiprocess import MultiProcessDataLoader
from framework.data.reader import DatasetReader
from framework.download import DownloadManager
from framework.download._cache import Entry
from framework.download.inventory import entries, prune
from framework.download.shards import Shard, resolve_shards
from framework.errors import ShardSpecError, WorkerError
from tests.download import conftest as download_fixtures
from tests.support.download import FORK, FaultServer, end_child, serving, unique_path

pytestmark = pytest.mark.timeout(60)

# moto's S3 server on 127.0.0.1 and the environment pointing boto3 at it
s3_server = download_fixtures.s3_server
s3_env = download_fixtures.s3_env


@pytest.fixture(scope="module")
def http_server() -> Iterator[FaultServer]:
    with serving(FaultServer()) as server:
        yield server


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def manager(cache: Path) -> Iterator[DownloadManager]:
    with DownloadManager(cache, progress=False, connections=1, lock_timeout=20) as made:
        yield made


# Cache inventory -------------------------------------------------------------------------


def test_prune_never_sweeps_a_cached_json_file_as_a_stale_sidecar(
    http_server: FaultServer, manager: DownloadManager, cache: Path
) -> None:
    # A dataset's own checksum record, as many hosts publish next to their shards.
    record = json.dumps({"file": "train-00000.jsonl.gz", "size": 8388608, "sha256": "9f" * 32}).encode()
    url = http_server.add(unique_path("corpus") + "/checksums.json", record)
    path = manager.cached_path(url)
    assert [entry.url for entry in entries(cache)] == [url]
    done = prune(cache, 1 << 40)  # a terabyte: nothing has to go
    assert done.swept == () and done.removed == ()
    assert path.read_bytes() == record


def _hold_soft_lock(lock_path: str, held: object, release: object) -> None:
    # What a fetch by `DownloadManager(lock="softfilelock")` holds (filesystems without flock).
    with filelock.SoftFileLock(lock_path):
        held.set()  # type: ignore[attr-defined]
        release.wait(30)  # type: ignore[attr-defined]


def test_prune_skips_an_entry_a_softfilelock_fetch_holds(http_server: FaultServer, cache: Path) -> None:
    url = http_server.add(unique_path("soft"), os.urandom(20_000))
    with DownloadManager(cache, progress=False, connections=1, lock="softfilelock") as soft:
        soft.cached_path(url)
    held, release = FORK.Event(), FORK.Event()
    child = FORK.Process(target=_hold_soft_lock, args=(str(Entry(cache, url).lock), held, release))
    child.start()
    try:
        assert held.wait(20)
        done = prune(cache, 0, lock="softfilelock")  # the lock the cache's fetches take
        assert [entry.url for entry in done.skipped] == [url]
        assert [entry.url for entry in entries(cache)] == [url]
    finally:
        release.set()
        end_child(child)


def test_a_url_pruned_from_a_softfilelock_cache_is_fetched_again(
    http_server: FaultServer, cache: Path
) -> None:
    url = http_server.add(unique_path("soft-again"), os.urandom(5000))
    with DownloadManager(cache, progress=False, connections=1, lock="softfilelock", lock_timeout=2) as soft:
        soft.cached_path(url)
        assert [entry.url for entry in prune(cache, 0, lock="softfilelock").removed] == [url]
        assert soft.cached_path(url).read_bytes() == http_server.route(url).data


# Shard specs ----------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["relative", "file-url"])
def test_one_file_named_twice_in_two_forms_is_refused(
    form: str, tmp_path: Path, manager: DownloadManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("train-0.jsonl", "train-1.jsonl"):
        (tmp_path / name).write_text('{"x": 1}\n')
    monkeypatch.chdir(tmp_path)
    named = "train-0.jsonl" if form == "relative" else (tmp_path / "train-0.jsonl").as_uri()
    with pytest.raises(ShardSpecError, match="named more than once"):
        resolve_shards([named, f"{tmp_path}/train-*.jsonl"], manager)


def test_a_glob_matching_nothing_never_says_a_folder_of_shards_is_empty(
    tmp_path: Path, manager: DownloadManager
) -> None:
    (tmp_path / "year-2024").mkdir()
    (tmp_path / "year-2024" / "part-0.jsonl.gz").write_bytes(gzip.compress(b'{"x": 1}\n'))
    with pytest.raises(ShardSpecError, match="the glob matched nothing") as raised:
        resolve_shards(f"{tmp_path}/*.jsonl.gz", manager)
    message = str(raised.value)
    assert "year-2024" in message or "nothing is under" not in message


@pytest.mark.parametrize("separator", ["\u2028", "\x0c"])
def test_a_manifest_comment_is_never_a_shard_and_lines_are_counted_at_newlines(
    separator: str, tmp_path: Path, manager: DownloadManager
) -> None:
    manifest = tmp_path / "train.tsv"
    manifest.write_text(f"# made by shardtool{separator}on the cluster\ntrain-0.jsonl.gz\n", encoding="utf-8")
    assert resolve_shards(f"manifest:{manifest}", manager) == [Shard(str(tmp_path / "train-0.jsonl.gz"))]
    manifest.write_text(f"# made by shardtool{separator}\ntrain-0.jsonl.gz\tnot-a-digest\n", encoding="utf-8")
    with pytest.raises(ShardSpecError) as raised:
        resolve_shards(f"manifest:{manifest}", manager)
    assert raised.value.line == 2  # as an editor, `sed -n 2p` and `wc -l` count


# Compressed readers ---------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("name", ["data.jsonl.gz", "data.jsonl.bz2"])
def test_a_data_file_that_is_not_text_is_an_error_naming_the_file(
    tmp_path: Path, name: str, workers: int
) -> None:
    records = b'{"id": 1}\n' * 100
    path = tmp_path / name
    # compressed twice; or in a form that is read as it is
    path.write_bytes(gzip.compress(gzip.compress(records)) if name.endswith(".gz") else bz2.compress(records))
    loader = MultiProcessDataLoader(
        DatasetReader.by_name("jsonl")(),
        str(path),
        batch_size=5,
        num_workers=workers,
        max_instances_in_memory=10,
        quiet=True,
    )
    with pytest.raises(WorkerError) as raised:
        list(loader)
    assert name in str(raised.value).splitlines()[0]


def test_an_s3_glob_never_yields_a_folder_marker(s3_env: str, tmp_path: Path) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=s3_env)
    bucket = f"markers-{os.getpid()}-{os.urandom(3).hex()}"
    client.create_bucket(Bucket=bucket)
    for key in ("train/", "train/part-0.jsonl", "train/sub/", "train/sub/part-1.jsonl"):
        client.put_object(Bucket=bucket, Key=key, Body=b"" if key.endswith("/") else b'{"x": 1}\n')
    with DownloadManager(tmp_path / "cache", progress=False) as manager:
        flat = [shard.url for shard in resolve_shards(f"s3://{bucket}/train/*", manager)]
        deep = [shard.url for shard in resolve_shards(f"s3://{bucket}/train/**", manager)]
    assert flat == [f"s3://{bucket}/train/part-0.jsonl"]
    assert deep == [f"s3://{bucket}/train/part-0.jsonl", f"s3://{bucket}/train/sub/part-1.jsonl"]


def test_an_intact_long_window_zst_file_is_read_or_refused_for_what_it_is(tmp_path: Path) -> None:
    zstandard = pytest.importorskip("zstandard")
    raw = b'{"x": 1}\n' * 1000
    params = zstandard.ZstdCompressionParameters.from_level(
        19, window_log=30, enable_ldm=True, write_content_size=False
    )
    written = io.BytesIO()
    with zstandard.ZstdCompressor(compression_params=params).stream_writer(written, closefd=False) as sink:
        sink.write(raw)
    path = tmp_path / "data.jsonl.zst"
    path.write_bytes(written.getvalue())
    assert zstandard.get_frame_parameters(written.getvalue()).window_size == 1 << 30  # as --long=30 writes
    try:
        with open_data_file(path) as handle:
            assert handle.read() == raw
    except ValueError as error:  # refusing it is fine, as long as the cause is named
        assert "damaged" not in str(error) and "fetch or copy" not in str(error)
