"""Each defence of the download path alone: a server or proxy that breaks one rule.

The test server honours If-Range, so elsewhere a later check never has to act on its
own. Here each check is the only one that can catch what goes wrong (found by removing
each in turn: with it gone, its test fails)."""

from __future__ import annotations

import errno
import gzip
import os
import stat
import uuid
from pathlib import Path
from typing import Any, Optional

import pytest
from dl_helpers import PART, SLOW, FaultServer, parts_manager, sha256, unique_path
from framework_plugins.http import HttpBackend

from framework.download import DownloadManager
from framework.download._cache import Entry, unique_token
from framework.download._validators import _etag_tag
from framework.errors import ChecksumError, DownloadError, HTTPStatusError

pytestmark = pytest.mark.timeout(60)
OLD, V = '"old"', '"v"'


def _parallel(cache: Path, backend: HttpBackend) -> DownloadManager:
    return parts_manager(cache, backends={"http": backend})


def _single(cache: Path, backend: HttpBackend) -> DownloadManager:
    return parts_manager(cache, connections=1, backends={"http": backend})


def _planted_partial(cache: Path, url: str, etag: str, data: bytes) -> Path:
    """A partial file of `url` at version `etag` holding `data`, left by a writer that is gone."""
    final = Entry(cache, url).final
    cache.mkdir(exist_ok=True)
    token = unique_token().split(".")
    token[1] = "999999"  # a pid that does not run
    part = final.with_name(f"{final.name}.{_etag_tag(etag)}.{'.'.join(token)}.part")
    part.write_bytes(data)
    return part


class NoIfRange(HttpBackend):
    """A proxy that strips If-Range: the engine's own checks must refuse another version."""

    def open(
        self, url: str, offset: int = 0, *, if_range: Optional[str] = None, end: Optional[int] = None
    ) -> Any:
        return super().open(url, offset, end=end)


class Lying(HttpBackend):
    """Lies on part requests (offset > 0 with an end) in one way; whole requests are honest."""

    def __init__(self, how: str) -> None:
        super().__init__(backoff_factor=0.01)
        self.how = how

    def open(
        self, url: str, offset: int = 0, *, if_range: Optional[str] = None, end: Optional[int] = None
    ) -> Any:
        if self.how == "start" and offset > 0:  # bytes from one byte earlier than asked
            return super().open(url, offset - 1, if_range=if_range, end=end)
        stream = super().open(url, offset, if_range=if_range, end=end)
        if self.how == "encoding" and offset > 0 and end is not None:
            body = gzip.compress(b"".join(stream.chunks))
            stream.chunks, stream.encoding = iter([body]), "gzip"
        if self.how == "oversize" and offset == 0 and end is None:
            inner = stream.chunks
            stream.chunks = (c for cs in (inner, iter([b"extra"])) for c in cs)
        return stream


# -- _engine._check: tag
def test_parts_of_another_version_are_refused_without_if_range(
    http_server: FaultServer, tmp_path: Path
) -> None:
    old, new = os.urandom(PART * 16), os.urandom(PART * 16)
    url = http_server.add(
        unique_path("swap-noifr"),
        old,
        swap_at_get=2,
        etag='"old"',
        then={"data": new, "etag": '"new"'},
        **SLOW,
    )
    path = _parallel(tmp_path, NoIfRange(backoff_factor=0.01)).cached_path(url)
    assert sha256(path.read_bytes()) == sha256(new)


# -- _engine._check: size
def test_parts_with_another_total_size_are_refused(http_server: FaultServer, tmp_path: Path) -> None:
    old, new = os.urandom(PART * 16), os.urandom(PART * 20)  # same ETag (a server bug), another length
    url = http_server.add(
        unique_path("swap-size"), old, swap_at_get=2, etag='"same"', then={"data": new}, **SLOW
    )
    path = _parallel(tmp_path, HttpBackend(backoff_factor=0.01)).cached_path(url)
    assert sha256(path.read_bytes()) == sha256(new)


# -- _engine._check: start, encoding
@pytest.mark.parametrize("how", ["start", "encoding"])
def test_parts_from_the_wrong_byte_or_encoded_are_refused(
    http_server: FaultServer, tmp_path: Path, how: str
) -> None:
    data = os.urandom(PART * 16)
    url = http_server.add(unique_path("lie-" + how), data, etag='"v"', **SLOW)
    path = _parallel(tmp_path, Lying(how)).cached_path(url)
    assert path.read_bytes() == data


# -- _place: start on a single-stream resume
def test_resume_answered_from_the_wrong_byte_starts_over(http_server: FaultServer, tmp_path: Path) -> None:
    data = os.urandom(1 << 20)
    url = http_server.add(unique_path("resume-start"), data, etag='"v"', drop_after=300_000, drops=1)
    path = _single(tmp_path, Lying("start")).cached_path(url)
    assert path.read_bytes() == data


# -- _receive: more bytes than the declared size
def test_a_body_longer_than_its_size_is_a_checksum_error(http_server: FaultServer, tmp_path: Path) -> None:
    data = os.urandom(100_000)
    url = http_server.add(unique_path("oversize"), data, etag='"v"')
    with pytest.raises(ChecksumError):
        _single(tmp_path, Lying("oversize")).cached_path(url)
    assert not Entry(tmp_path, url).final.exists()


# -- _place: 416 must name the partial's version
def test_a_416_for_another_version_of_the_same_size_starts_over(
    http_server: FaultServer, tmp_path: Path
) -> None:
    old, new = os.urandom(200_000), os.urandom(200_000)
    url = http_server.add(unique_path("416-version"), new, etag='"new"')
    _planted_partial(tmp_path, url, OLD, old)
    path = _single(tmp_path, NoIfRange(backoff_factor=0.01)).cached_path(url)  # a proxy that drops If-Range
    assert path.read_bytes() == new


# -- _ours: another user's partial is never adopted
def test_another_users_partial_is_never_adopted(http_server: FaultServer, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    data = os.urandom(200_000)
    url = http_server.add(unique_path("foreign-partial"), data, etag='"v"')
    part = _planted_partial(tmp_path, url, V, data[:50_000])
    os.chown(part, 12345, 12345)
    path = _single(tmp_path, HttpBackend(backoff_factor=0.01)).cached_path(url)
    assert path.read_bytes() == data
    assert http_server.route(url).ranges == [""]  # fetched from byte 0, never resumed from their bytes
    assert part.exists() and part.stat().st_uid == 12345  # their file untouched, not renamed


# -- _Partial._take: fstat re-check after the rename
def test_a_file_swapped_in_after_the_rename_is_not_adopted(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    data = os.urandom(200_000)
    url = http_server.add(unique_path("swap-after-rename"), data, etag='"v"')
    part = _planted_partial(tmp_path, url, V, data[:50_000])
    real_rename = os.rename

    def rename(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        real_rename(src, dst, *args, **kwargs)
        if str(src) == str(part):  # another user swaps their own file in, between rename and open
            os.unlink(dst)
            Path(dst).write_bytes(b"\0" * 50_000)
            os.chown(dst, 12345, 12345)

    monkeypatch.setattr(os, "rename", rename)
    path = _single(tmp_path, HttpBackend(backoff_factor=0.01)).cached_path(url)
    assert path.read_bytes() == data
    assert http_server.route(url).ranges == [""]


# -- fetch: the partial file is fsynced before it is published
def test_a_failed_fsync_of_the_partial_publishes_nothing(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = http_server.add(unique_path("fsync-part"), os.urandom(100_000), etag='"v"')
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".part"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(DownloadError):
        _single(tmp_path, HttpBackend(backoff_factor=0.01)).cached_path(url)
    assert not Entry(tmp_path, url).final.exists()


# -- publish_file: the folder is fsynced after the rename
def test_the_folder_is_fsynced_after_the_rename(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = http_server.add(unique_path("fsync-dir"), os.urandom(100_000), etag='"v"')
    final = Entry(tmp_path, url).final
    real_fsync = os.fsync
    synced_after_publish: list[bool] = []

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            synced_after_publish.append(final.exists())
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    _single(tmp_path, HttpBackend(backoff_factor=0.01)).cached_path(url)
    assert True in synced_after_publish


# -- S3: a part is asked for with IfMatch
def test_s3_part_of_another_version_is_refused_with_412(s3_env: str) -> None:
    import boto3
    from framework_plugins.s3 import S3Backend

    bucket = f"b-{uuid.uuid4().hex[:8]}"
    client = boto3.client("s3", endpoint_url=s3_env)
    client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key="k", Body=os.urandom(1000))
    backend = S3Backend()
    with pytest.raises(HTTPStatusError) as caught:
        backend.open(f"s3://{bucket}/k", 10, if_range='"not-this-version"', end=20)
    assert caught.value.status == 412
    backend.close()
