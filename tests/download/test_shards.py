"""`resolve_shards`: lists, globs (local, S3 on moto's server, fsspec), brace ranges
and manifests (on the HTTP test server and S3), and each way a spec can be wrong."""

from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from framework.download import DownloadManager
from framework.download.shards import Shard, expand_braces, resolve_shards
from framework.errors import HTTPStatusError, ListingUnsupportedError, ShardSpecError
from framework.testing import MemoryBackend
from tests.support.download import FaultServer, unique_path

pytestmark = pytest.mark.timeout(60)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# Brace expansion -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ("t-{00000..00002}.gz", ["t-00000.gz", "t-00001.gz", "t-00002.gz"]),
        ("t-{8..11}", ["t-8", "t-9", "t-10", "t-11"]),
        ("t-{08..10}", ["t-08", "t-09", "t-10"]),
        ("t-{3..1}", ["t-3", "t-2", "t-1"]),
        ("{train,valid}.csv", ["train.csv", "valid.csv"]),
        ("x{a,b{1..2},}y", ["xay", "xb1y", "xb2y", "xy"]),
        ("{a,b}-{0..1}", ["a-0", "a-1", "b-0", "b-1"]),
        ("plain.txt", ["plain.txt"]),
    ],
)
def test_braces_expand_as_a_shell_does(spec: str, names: list[str]) -> None:
    assert expand_braces(spec) == names


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("t-{0..3", "without its '}'"),
        ("t-0..3}", "without its '{'"),
        ("t-{}", "neither a range"),
        ("t-{1..}", "neither a range"),
        ("t-{a..c}", "neither a range"),
        ("t-{0..9999999}", "more than 1000000"),
        ("{0..999}{0..9999}", "more than 1000000"),
    ],
)
def test_a_malformed_brace_is_refused(spec: str, why: str, manager: DownloadManager) -> None:
    with pytest.raises(ShardSpecError, match=why) as caught:
        resolve_shards(spec, manager)
    assert caught.value.url == spec and caught.value.line is None


def test_a_brace_range_names_http_shards_without_a_request(
    http_server: FaultServer, manager: DownloadManager
) -> None:
    before = http_server.connections
    shards = resolve_shards(f"{http_server.base}/train-{{00000..00255}}.jsonl.gz?sig=a", manager)
    assert len(shards) == 256 and shards[0] == Shard(f"{http_server.base}/train-00000.jsonl.gz?sig=a")
    assert shards[-1].url == f"{http_server.base}/train-00255.jsonl.gz?sig=a"
    assert http_server.connections == before  # expanded, never listed or fetched


def test_an_http_url_with_a_query_or_an_ipv6_host_is_one_shard(manager: DownloadManager) -> None:
    spec = ["https://host/data.gz?X-Amz-Signature=ab&x=[1]", "http://[::1]:8080/data-{0..1}.gz"]
    assert [shard.url for shard in resolve_shards(spec, manager)] == [
        "https://host/data.gz?X-Amz-Signature=ab&x=[1]",
        "http://[::1]:8080/data-0.gz",
        "http://[::1]:8080/data-1.gz",
    ]


# Globs ---------------------------------------------------------------------------------


@pytest.fixture
def shard_folder(tmp_path: Path) -> Path:
    names = (
        "a-1.csv",
        "a-2.csv",
        "a-10.csv",
        "b.csv",
        ".a-hidden.csv",
        "sub/a-3.csv",
        "sub/x/a-4.csv",
        "c[1]*.csv",
    )
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    return tmp_path


@pytest.mark.parametrize(
    ("pattern", "names"),
    [
        ("a-*.csv", ["a-1.csv", "a-10.csv", "a-2.csv"]),
        ("a-?.csv", ["a-1.csv", "a-2.csv"]),
        ("a-[!1].csv", ["a-2.csv"]),
        ("*/a-*.csv", ["sub/a-3.csv"]),
        ("**/a-*.csv", ["a-1.csv", "a-10.csv", "a-2.csv", "sub/a-3.csv", "sub/x/a-4.csv"]),
        ("sub/**", ["sub/a-3.csv", "sub/x/a-4.csv"]),
        ("*a-hidden*", [".a-hidden.csv"]),
        ("c[[]1][*].csv", ["c[1]*.csv"]),
    ],
)
def test_a_local_glob_matches_name_by_name(
    shard_folder: Path, pattern: str, names: list[str], manager: DownloadManager
) -> None:
    shards = resolve_shards(f"{shard_folder}/{pattern}", manager)
    assert [shard.url for shard in shards] == [f"{shard_folder}/{name}" for name in names]


def test_relative_and_file_url_globs(
    shard_folder: Path, manager: DownloadManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(shard_folder)
    assert [shard.url for shard in resolve_shards("a-?.csv", manager)] == ["a-1.csv", "a-2.csv"]
    uri = shard_folder.as_uri()
    assert [shard.url for shard in resolve_shards(f"{uri}/sub/**/*.csv", manager)] == [
        f"{uri}/sub/a-3.csv",
        f"{uri}/sub/x/a-4.csv",
    ]


def test_a_list_keeps_its_order_and_sorts_each_glob(shard_folder: Path, manager: DownloadManager) -> None:
    spec = [shard_folder / "b.csv", f"{shard_folder}/a-{{2,1}}.csv", f"{shard_folder}/sub/*.csv"]
    assert [
        Path(shard.url).relative_to(shard_folder).as_posix() for shard in resolve_shards(spec, manager)
    ] == [
        "b.csv",
        "a-2.csv",
        "a-1.csv",
        "sub/a-3.csv",
    ]


def test_a_glob_matching_nothing_names_the_pattern_and_what_was_listed(
    shard_folder: Path, manager: DownloadManager
) -> None:
    pattern = f"{shard_folder}/a-*.jsonl"
    with pytest.raises(ShardSpecError) as caught:
        resolve_shards(pattern, manager)
    assert caught.value.url == pattern
    assert f"3 object(s) directly under '{shard_folder}/a-'" in str(caught.value)
    assert "a-1.csv" in str(caught.value) and "`**/` matches in subfolders" in str(caught.value)
    with pytest.raises(ShardSpecError, match="no object directly under"):
        resolve_shards(f"{shard_folder}/missing/*.csv", manager)


def test_a_glob_on_http_is_refused_without_a_request(
    http_server: FaultServer, manager: DownloadManager
) -> None:
    before = http_server.connections
    with pytest.raises(ListingUnsupportedError) as caught:
        resolve_shards(f"{http_server.base}/train-*.jsonl.gz", manager)
    assert caught.value.scheme == "http" and "brace range" in str(caught.value)
    assert "manifest:" in str(caught.value) and http_server.connections == before


def test_an_s3_glob_lists_its_literal_prefix_once(
    listed_bucket: tuple[str, dict[str, str]], list_calls: list[str], manager: DownloadManager
) -> None:
    bucket, etags = listed_bucket
    shards = resolve_shards(f"s3://{bucket}/train/*.jsonl.gz", manager)
    assert len(shards) == 210 and [shard.url for shard in shards] == sorted(
        f"s3://{bucket}/{key}" for key in etags if key.startswith("train/part-")
    )
    assert list_calls == ["train/"] * 5  # one level, 210 keys and a common prefix, 50 a page
    # The listing's sizes come along: a cache budget is checked without a request a shard.
    assert all(shard.size == len(shard.url.split("/", 3)[3]) for shard in shards)
    list_calls.clear()
    assert len(resolve_shards(f"s3://{bucket}/train/**/*.jsonl.gz", manager)) == 212
    list_calls.clear()
    tens = resolve_shards(f"s3://{bucket}/train/part-0010?.jsonl.gz", manager)
    assert [shard.url[-14:] for shard in tens] == [f"00{n}.jsonl.gz" for n in range(100, 110)]
    assert list_calls == ["train/part-0010"]
    list_calls.clear()
    both = resolve_shards(f"s3://{bucket}/{{train,valid}}/part-00000.jsonl.gz", manager)
    assert len(both) == 2 and list_calls == []  # braces alone list nothing


def test_an_fsspec_and_a_memory_glob(manager: DownloadManager) -> None:
    fsspec = pytest.importorskip("fsspec")
    root = unique_path("shards").strip("/")
    memory = fsspec.filesystem("memory")
    for name in ("p-0.txt", "p-1.txt", "q.txt"):
        memory.pipe(f"/{root}/{name}", name.encode())
    try:
        urls = [shard.url for shard in resolve_shards(f"memory://{root}/p-*.txt", manager)]
        assert urls == [f"memory://{root}/p-0.txt", f"memory://{root}/p-1.txt"]
    finally:
        memory.rm(f"/{root}", recursive=True)
    MemoryBackend.objects.update({"mem://d/a": b"1", "mem://d/b": b"2", "mem://e/a": b"3"})
    try:
        with DownloadManager(manager.cache_dir, backends={"mem": MemoryBackend()}) as memory_manager:
            assert [shard.url for shard in resolve_shards("mem://*/a", memory_manager)] == [
                "mem://d/a",
                "mem://e/a",
            ]
        assert MemoryBackend.lists == ["mem://"]
    finally:
        MemoryBackend.reset()


# Manifests -----------------------------------------------------------------------------


def test_a_manifest_over_http_gives_urls_checksums_and_sizes(
    http_server: FaultServer, manager: DownloadManager
) -> None:
    folder = unique_path("manifest")
    bodies = {
        f"train-{index:05d}.jsonl": f'{{"n": {index}}}\n'.encode() * (index + 1) for index in range(200)
    }
    for name, body in bodies.items():
        http_server.add(f"{folder}/{name}", body)
    lines = ["\ufeff# 200 shards, then three written other ways", ""]
    lines += [f"{name}\t{_sha(body)}\t{len(body)}" for name, body in bodies.items()]
    lines += ["  ", "/elsewhere/root.jsonl", "../up.jsonl\t\t12", "s3://bucket/key.jsonl"]
    url = http_server.add(f"{folder}/manifest.tsv", "\r\n".join(lines).encode())

    shards = resolve_shards(f"manifest:{url}", manager)
    assert shards[:200] == [
        Shard(f"{http_server.base}{folder}/{name}", _sha(body), len(body)) for name, body in bodies.items()
    ]
    parent = folder.rsplit("/", 1)[0]
    assert shards[200:] == [
        Shard(f"{http_server.base}/elsewhere/root.jsonl"),
        Shard(f"{http_server.base}{parent}/up.jsonl", None, 12),
        Shard("s3://bucket/key.jsonl"),
    ]
    # What the manifest says is what the shards are: fetched and checked against it.
    for shard in shards[:200:50]:
        assert shard.sha256 is not None
        assert manager.cached_path(shard.url, sha256=shard.sha256).stat().st_size == shard.size
    route = http_server.route(url)
    assert route.gets == 1
    assert resolve_shards(f"manifest:{url}", manager) == shards
    assert route.gets == 1 and route.heads >= 1  # cached, and asked whether it is still current


def test_a_cached_manifest_resolves_offline(http_server: FaultServer, manager: DownloadManager) -> None:
    url = http_server.add(unique_path("offline") + "/manifest.txt", b"a.gz\t\t3\nb.gz\n")
    online = resolve_shards(f"manifest:{url}", manager)
    route = http_server.route(url)
    asked = (route.gets, route.heads)
    with DownloadManager(manager.cache_dir, offline=True, progress=False) as offline:
        assert resolve_shards(f"manifest:{url}", offline) == online
    assert (route.gets, route.heads) == asked  # not even asked whether it changed


def test_a_manifest_edited_in_place_is_read_again(http_server: FaultServer, manager: DownloadManager) -> None:
    path = unique_path("edited") + "/manifest.txt"
    url = http_server.add(path, b"a.gz\nb.gz\n")
    assert [shard.url[-4:] for shard in resolve_shards(f"manifest:{url}", manager)] == ["a.gz", "b.gz"]
    http_server.add(path, b"c.gz\n")  # a new version: another ETag and size
    assert [shard.url[-4:] for shard in resolve_shards(f"manifest:{url}", manager)] == ["c.gz"]


def test_a_manifest_on_s3_resolves_relative_keys(s3_env: str, manager: DownloadManager) -> None:
    import boto3

    bucket = f"manifest-{os.getpid()}-{os.urandom(3).hex()}"
    client = boto3.client("s3", endpoint_url=s3_env)
    client.create_bucket(Bucket=bucket)
    body = b"part-00000.jsonl.gz\n../valid/part-00000.jsonl.gz\n/root.gz\ngs://other/x.gz\n"
    client.put_object(Bucket=bucket, Key="train/manifest.txt", Body=body)
    assert [shard.url for shard in resolve_shards(f"manifest:s3://{bucket}/train/manifest.txt", manager)] == [
        f"s3://{bucket}/train/part-00000.jsonl.gz",
        f"s3://{bucket}/train/../valid/part-00000.jsonl.gz",  # S3 keys are taken literally
        f"s3://{bucket}/root.gz",
        "gs://other/x.gz",
    ]


def test_a_local_manifest_is_read_relative_to_its_folder(tmp_path: Path, manager: DownloadManager) -> None:
    manifest = tmp_path / "lists" / "train.txt"
    manifest.parent.mkdir()
    manifest.write_text(f"a.csv\n{tmp_path}/b.csv\nhttps://host/c.csv\n")
    assert [shard.url for shard in resolve_shards(f"manifest:{manifest}", manager)] == [
        f"{tmp_path}/lists/a.csv",
        f"{tmp_path}/b.csv",
        "https://host/c.csv",
    ]


@pytest.mark.parametrize(
    ("text", "line", "why"),
    [
        ("a.gz\n# fine\n\nb.gz\tx\ty\tz\n", 4, "got 4 field"),
        ("a.gz\n\tdeadbeef\n", 2, "got 2 field"),
        (f"a.gz\t{'0' * 63}\n", 1, "not 64 hex digits"),
        (f"a.gz\t{'0' * 64}\t12k\n", 1, "not a whole number"),
        ("a.gz\t\t-1\n", 1, "not a whole number"),
        ("\ufeffa.gz\n# \u00b2\nb.gz\t\t\u00b2\n", 3, "not a whole number"),
    ],
)
def test_a_bad_manifest_line_is_named_by_its_number(
    http_server: FaultServer, manager: DownloadManager, text: str, line: int, why: str
) -> None:
    url = http_server.add(unique_path("bad") + "/manifest.txt", text.encode())
    with pytest.raises(ShardSpecError, match=why) as caught:
        resolve_shards(f"manifest:{url}", manager)
    assert caught.value.line == line and caught.value.url == url and f"line {line}:" in str(caught.value)


@pytest.mark.parametrize(
    ("body", "why"),
    [(b"# nothing\n\n", "names no shard"), (b"\xff\xfe bytes\n", "UTF-8")],
)
def test_an_empty_or_binary_manifest_is_refused(
    http_server: FaultServer, manager: DownloadManager, body: bytes, why: str
) -> None:
    url = http_server.add(unique_path("empty") + "/manifest.txt", body)
    with pytest.raises(ShardSpecError, match=why):
        resolve_shards(f"manifest:{url}", manager)


def test_a_missing_manifest_is_the_fetch_error(http_server: FaultServer, manager: DownloadManager) -> None:
    url = http_server.add(unique_path("gone") + "/manifest.txt", b"", status=404)
    with pytest.raises(HTTPStatusError) as caught:
        resolve_shards(f"manifest:{url}", manager)
    assert caught.value.status == 404 and caught.value.url == url


# Other refusals ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ([], "the list is empty"),
        (["a.gz", 3], "got int"),
        ("manifest:", "names its file"),
        (["a.gz", "b.gz", "a.gz"], "1 shard\\(s\\) named more than once: a.gz"),
        (["x-{0..3}.gz", "x-{2..5}.gz"], "2 shard\\(s\\) named more than once: x-2.gz, x-3.gz"),
    ],
)
def test_a_spec_that_names_no_shard_or_one_twice_is_refused(
    spec: Any, why: str, manager: DownloadManager
) -> None:
    with pytest.raises(ShardSpecError, match=why):
        resolve_shards(spec, manager)


def test_without_a_manager_one_from_the_environment_is_used(
    shard_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FRAMEWORK_CACHE", os.fspath(shard_folder / "cache"))
    manifest = shard_folder / "list.txt"
    manifest.write_text("a-1.csv\n")
    shards = resolve_shards(f"manifest:{manifest}")
    assert shards == [Shard(f"{shard_folder}/a-1.csv")]
    assert any((shard_folder / "cache").iterdir())  # fetched into the environment's cache


def test_a_glob_and_a_list_that_overlap_are_refused(shard_folder: Path, manager: DownloadManager) -> None:
    with pytest.raises(ShardSpecError, match="named more than once") as caught:
        resolve_shards([f"{shard_folder}/a-*.csv", os.fspath(shard_folder / "a-2.csv")], manager)
    assert caught.value.url == f"{shard_folder}/a-2.csv"


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
