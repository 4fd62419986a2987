"""`DownloadBackend.list`: declared by `supports_listing`, under the same rule as
`supports_ranges`; the local, S3 (paged, on moto's server) and fsspec backends list;
HTTP cannot and says so; `check_backend` checks a listing backend's promises."""

from __future__ import annotations

import builtins
import os
from pathlib import Path
from typing import Any, ClassVar

import attrs
import pytest
from framework_plugins.http import HttpBackend
from framework_plugins.local import LocalBackend

from framework.download import DownloadManager
from framework.download.backend import DownloadBackend, ListedObject
from framework.download.shards import resolve_shards
from framework.errors import (
    HTTPStatusError,
    InvalidArgumentError,
    ListingUnsupportedError,
)
from framework.testing import MemoryBackend, check_backend

pytestmark = pytest.mark.timeout(60)


def test_listing_is_declared_by_the_backends_that_list() -> None:
    from framework_plugins.fsspec import FsspecBackend
    from framework_plugins.s3 import S3Backend

    assert LocalBackend.supports_listing and S3Backend.supports_listing and FsspecBackend.supports_listing
    assert MemoryBackend.supports_listing
    assert not HttpBackend.supports_listing and not DownloadBackend.supports_listing


def test_http_cannot_list_and_says_how_to_name_shards() -> None:
    with pytest.raises(ListingUnsupportedError) as caught:
        HttpBackend().list("https://host/train-")
    assert (caught.value.scheme, caught.value.backend) == ("https", "HttpBackend")
    assert "brace range" in str(caught.value) and "manifest:" in str(caught.value)
    assert isinstance(caught.value, InvalidArgumentError)


def test_the_promises_are_class_attributes_a_subclass_inherits() -> None:
    """`supports_listing` and `supports_ranges` are declared, never inferred from which
    methods a class overrides: a subclass keeps its parent's, or says otherwise."""

    class Overrides(LocalBackend):
        def list(self, prefix: str, *, recursive: bool = True) -> builtins.list[ListedObject]:
            return []

    class Declines(LocalBackend):
        supports_listing: ClassVar[bool] = False

    class OnlyOpens(LocalBackend):  # an `open` of its own says nothing about listing
        def open(self, url: str, offset: int = 0, **keywords: Any) -> Any:
            return super().open(url, offset, **keywords)

    assert Overrides.supports_listing is True
    assert Declines.supports_listing is False
    assert OnlyOpens.supports_listing is True and OnlyOpens.supports_ranges is LocalBackend.supports_ranges


def test_the_local_backend_lists_a_prefix_and_one_level(tmp_path: Path) -> None:
    for name in ("a-1.csv", "a-2.csv", "b.csv", "sub/a-3.csv", "sub/deep/a-4.csv", "other/x.csv"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    backend, root = LocalBackend(), f"{tmp_path}/"
    assert [item.url for item in backend.list(root + "a-")] == [root + "a-1.csv", root + "a-2.csv"]
    assert [item.size for item in backend.list(root + "a-")] == [len("a-1.csv"), len("a-2.csv")]
    assert [item.url for item in backend.list(root, recursive=False)] == [
        root + name for name in ("a-1.csv", "a-2.csv", "b.csv")
    ]
    assert [item.url for item in backend.list(root + "s")] == [
        root + "sub/a-3.csv",
        root + "sub/deep/a-4.csv",
    ]
    assert backend.list(root + "nothing-") == [] and backend.list(f"{tmp_path}/missing/x") == []
    uri = tmp_path.as_uri() + "/"
    assert [item.url for item in backend.list(uri + "sub/")] == [
        uri + "sub/a-3.csv",
        uri + "sub/deep/a-4.csv",
    ]


def test_the_local_backend_walks_only_folders_that_can_match(tmp_path: Path) -> None:
    from tests.support.download import counted_listings

    for name in ("train-0.csv", "train-1.csv", "skipped/x.csv", "skipped/deeper/y.csv", "train-dir/z.csv"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    with counted_listings() as listings:
        found = LocalBackend().list(f"{tmp_path}/train-")
    assert [Path(item.url).name for item in found] == ["train-0.csv", "train-1.csv", "z.csv"]
    assert listings.of(tmp_path) == 1 and listings.of(tmp_path / "train-dir") == 1
    assert listings.of(tmp_path / "skipped") == 0 and len(listings.folders) == 2


def test_s3_lists_a_prefix_in_pages_with_sizes_and_etags(
    listed_bucket: tuple[str, dict[str, str]], list_calls: list[str]
) -> None:
    from framework_plugins.s3 import S3Backend

    bucket, etags = listed_bucket
    found = S3Backend().list(f"s3://{bucket}/train/")
    under = sorted(key for key in etags if key.startswith("train/"))
    assert [item.url for item in found] == [f"s3://{bucket}/{key}" for key in under]
    assert [item.size for item in found] == [len(key) for key in under]
    assert [item.etag for item in found] == [etags[key] for key in under]
    assert all(item.last_modified for item in found)
    page = S3Backend.list_page_size
    assert page == 50 and list_calls == ["train/"] * 5  # 212 keys, 50 a page

    list_calls.clear()
    level = S3Backend().list(f"s3://{bucket}/train/", recursive=False)
    assert len(level) == 210 and all("/sub/" not in item.url for item in level)
    assert len(list_calls) == 5  # 210 keys and train/sub/, one common prefix


def test_s3_listing_errors_name_the_prefix(listed_bucket: tuple[str, dict[str, str]], s3_env: str) -> None:
    from framework_plugins.s3 import S3Backend

    bucket, etags = listed_bucket
    assert S3Backend().list(f"s3://{bucket}/nothing-") == []
    assert len(S3Backend().list(f"s3://{bucket}/")) == len(etags) == 213
    with pytest.raises(HTTPStatusError) as caught:
        S3Backend().list("s3://no-such-bucket-here/train/")
    assert caught.value.status == 404 and caught.value.url == "s3://no-such-bucket-here/train/"
    with pytest.raises(InvalidArgumentError, match="names one bucket"):
        S3Backend().list(f"s3://{bucket}")
    with pytest.raises(InvalidArgumentError, match="no credentials"):
        S3Backend().list("s3://key:secret@bucket/x")


def test_the_fsspec_backend_lists_a_memory_filesystem() -> None:
    fsspec = pytest.importorskip("fsspec")
    from framework_plugins.fsspec import FsspecBackend

    root = f"listing-{os.getpid()}-{os.urandom(3).hex()}"
    memory = fsspec.filesystem("memory")
    for name in ("a-1.csv", "a-2.csv", "sub/a-3.csv"):
        memory.pipe(f"/{root}/{name}", name.encode())
    try:
        with FsspecBackend() as backend:
            base = f"memory://{root}/"
            assert [item.url for item in backend.list(base)] == [
                base + "a-1.csv",
                base + "a-2.csv",
                base + "sub/a-3.csv",
            ]
            assert [item.url for item in backend.list(base, recursive=False)] == [
                base + "a-1.csv",
                base + "a-2.csv",
            ]
            assert [item.size for item in backend.list(base + "sub/")] == [len("sub/a-3.csv")]
            assert backend.list(f"memory://{root}-missing/x") == []
            check_backend(backend, base + "a-1.csv", b"a-1.csv")
    finally:
        memory.rm(f"/{root}", recursive=True)


class _Lister(MemoryBackend):
    """A listing backend that breaks one promise of `list`, chosen by `how`."""

    supports_listing: ClassVar[bool] = True
    how: ClassVar[str] = ""

    def list(self, prefix: str, *, recursive: bool = True) -> builtins.list[ListedObject]:
        found = super().list(prefix, recursive=recursive)
        if self.how == "unsorted":
            return found[::-1]
        if self.how == "stray":
            return [*found, ListedObject("mem://zz-elsewhere/x")]
        if self.how == "recursive":
            return super().list(prefix, recursive=True)
        if self.how == "size":
            return [attrs.evolve(item, size=1) for item in found]
        return found


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("unsorted", "not sorted"),
        ("stray", "not starting with the prefix"),
        ("recursive", "below the folder's level"),
        ("size", "says 1 bytes"),
    ],
)
def test_check_backend_catches_a_broken_listing(how: str, message: str) -> None:
    MemoryBackend.objects.update({"mem://d/a": b"first", "mem://d/b": b"second", "mem://d/sub/c": b"third"})
    try:
        _Lister.how = ""
        check_backend(_Lister(), "mem://d/a", b"first")
        _Lister.how = how
        with pytest.raises(AssertionError, match=message):
            check_backend(_Lister(), "mem://d/a", b"first")
    finally:
        MemoryBackend.reset()


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
