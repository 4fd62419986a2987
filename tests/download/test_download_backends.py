"""S3 (moto's server on 127.0.0.1), local files, plugin-added schemes, the CLI and the
public surface of `framework.download`."""

from __future__ import annotations

import io
import os
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import pytest

import framework
import framework.download
from framework.cli import main
from framework.download import ByteStream, DownloadBackend, DownloadManager, RemoteInfo
from framework.download._cache import Entry
from framework.errors import ChecksumError, DownloadError, HTTPStatusError, InvalidArgumentError
from framework.testing import MemoryBackend
from tests.support.download import MemoryPlugin, sha256, stray_files

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def bucket(s3_env: str) -> str:
    import boto3

    name = f"bucket-{os.getpid()}-{os.urandom(3).hex()}"
    boto3.client("s3", endpoint_url=s3_env).create_bucket(Bucket=name)
    return name


def test_s3_end_to_end(bucket: str, s3_env: str, manager: DownloadManager) -> None:
    import boto3

    data = os.urandom(3 << 20)
    boto3.client("s3", endpoint_url=s3_env).put_object(Bucket=bucket, Key="dir/data.bin", Body=data)
    url = f"s3://{bucket}/dir/data.bin"
    path = manager.cached_path(url, sha256=sha256(data))
    assert path.read_bytes() == data and path.name.endswith("-data.bin")
    with pytest.raises(HTTPStatusError) as info:
        manager.cached_path(f"s3://{bucket}/missing.bin")
    assert info.value.status == 404 and "missing.bin" in str(info.value)


def test_s3_resumes_with_range(bucket: str, s3_env: str, manager: DownloadManager) -> None:
    import boto3

    data = os.urandom(2 << 20)
    client = boto3.client("s3", endpoint_url=s3_env)
    client.put_object(Bucket=bucket, Key="resume.bin", Body=data)
    backend = manager.backend_for("s3://x/y")
    with backend.open(f"s3://{bucket}/resume.bin", 1000) as stream:
        assert stream.start == 1000 and stream.size == len(data)
        assert b"".join(stream.chunks) == data[1000:]
    with backend.open(f"s3://{bucket}/resume.bin", len(data)) as stream:
        assert stream.start == len(data) and b"".join(stream.chunks) == b""
    assert backend.stat(f"s3://{bucket}/resume.bin").size == len(data)


def test_s3_without_boto3_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from framework_plugins.s3 import S3Backend

    monkeypatch.setitem(sys.modules, "boto3", None)
    with pytest.raises(ImportError, match=r"pip install 'framework\[s3\]'"):
        S3Backend().open("s3://bucket/key")


def test_local_paths_and_file_urls(tmp_path: Path, manager: DownloadManager) -> None:
    source = tmp_path / "some dir" / "data.bin"
    source.parent.mkdir()
    data = os.urandom(10_000)
    source.write_bytes(data)
    by_path = manager.cached_path(source, sha256=sha256(data))
    assert by_path.read_bytes() == data and by_path.parent == manager.cache_dir
    assert manager.cached_path(source.as_uri()) == by_path
    assert manager.cached_path(str(source)) == by_path
    with pytest.raises(ChecksumError):
        manager.cached_path(source, sha256="0" * 64, force=True)
    assert by_path.read_bytes() == data
    with pytest.raises(DownloadError, match="no such file"):
        manager.cached_path(tmp_path / "missing.bin")
    assert stray_files(manager.cache_dir) == []


def test_third_party_backend_via_plugin_hook(manager: DownloadManager) -> None:
    from framework.registry import get_registry

    # What plugin discovery does for each entry point: pluggy registers it, its hook adds.
    assert get_registry().add_plugin(MemoryPlugin, name="mem", provider="memory-plugin 1.0")
    assert "mem" in DownloadBackend.list_available()
    MemoryBackend.objects["mem://store/weights.bin"] = b"weights"
    path = manager.cached_path("mem://store/weights.bin")
    assert path.read_bytes() == b"weights" and path.name.endswith("-weights.bin")
    assert type(manager.backend_for("mem://x")).__name__ == "MemoryBackend"


def test_third_party_backend_via_register_decorator(manager: DownloadManager) -> None:
    @DownloadBackend.register("myscheme")
    class Mine(DownloadBackend):
        def open(
            self, url: str, offset: int = 0, *, end: Optional[int] = None, if_range: Optional[str] = None
        ) -> ByteStream:
            return ByteStream(iter([b"mine"[offset:]]), start=offset, size=4)

    assert manager.cached_path("myscheme://anything/x.txt").read_bytes() == b"mine"
    assert isinstance(manager.backend_for("myscheme://a"), Mine)
    assert Mine().stat("myscheme://a") == RemoteInfo(size=4)


def test_unknown_scheme_lists_known_ones(manager: DownloadManager) -> None:
    with pytest.raises(DownloadError) as info:
        manager.cached_path("gopher://example.org/file")
    message = str(info.value)
    assert "'gopher'" in message
    for scheme in ("file", "http", "https", "s3"):
        assert scheme in message


def test_builtin_backends_come_through_the_plugin_path() -> None:
    entries = DownloadBackend.registry_entries()
    assert {"http", "s3", "local"} <= set(entries)
    assert entries["http"].target_path == "framework_plugins.http:HttpBackend"
    assert entries["local"].plugin == "local"


def test_cli_prints_path_and_reports_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "cli.bin"
    source.write_bytes(b"cli bytes")
    cache = tmp_path / "cli-cache"
    code = main(
        [
            "download",
            str(source),
            "--cache-dir",
            str(cache),
            "--no-progress",
            "--sha256",
            sha256(b"cli bytes"),
        ]
    )
    out, _ = capsys.readouterr()
    assert code == 0 and Path(out.strip()).read_bytes() == b"cli bytes"
    assert Path(out.strip()).parent == cache
    code = main(["download", str(source), "--cache-dir", str(cache), "--sha256", "0" * 64, "--force"])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert err.startswith("framework download: error: ChecksumError") and err.count("\n") == 1


def test_cli_extract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import tarfile

    archive = tmp_path / "a.tar"
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo("inside.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    assert main(["download", str(archive), "--extract", "--cache-dir", str(tmp_path / "c")]) == 0
    folder = Path(capsys.readouterr().out.strip())
    assert (folder / "inside.txt").read_bytes() == b"hi"


def test_default_cache_dir_and_top_level_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "env.bin"
    source.write_bytes(b"env")
    monkeypatch.setenv("FRAMEWORK_CACHE", str(tmp_path / "env-cache"))
    path = framework.cached_path(source, progress=False)
    assert path.parent == tmp_path / "env-cache"
    assert framework.DownloadManager is DownloadManager
    assert framework.DownloadBackend is DownloadBackend
    assert Entry(tmp_path / "env-cache", source.as_uri()).final == path


def test_exported_members() -> None:
    assert framework.download.__all__ == sorted(framework.download.__all__)
    public = {
        name
        for name, value in vars(framework.download).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)  # submodules
    }
    assert public - {"annotations"} == set(framework.download.__all__)


@pytest.fixture(autouse=True)
def _forget_memory_objects() -> Iterator[None]:
    yield
    MemoryBackend.reset()


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("http://h/x", "http"),
        ("HTTPS://h/x", "http"),
        ("s3://b/k", "s3"),
        ("file:///tmp/x", "local"),
        ("/tmp/x", "local"),
        ("relative/x.txt", "local"),
        ("myscheme://a/b", "myscheme"),
    ],
)
def test_scheme_to_backend_name(url: str, name: str) -> None:
    from framework.download.manager import backend_name_for

    assert backend_name_for(url) == name


def test_waiter_progress_bar(capsys: pytest.CaptureFixture[str]) -> None:
    from framework.download.manager import _WaitBar

    bar = _WaitBar("data.bin")
    bar(512 * 1024, 1024 * 1024)
    bar(1024 * 1024, 1024 * 1024)
    del bar
    err = capsys.readouterr().err
    assert "waiting: data.bin" in err and "1.00M/1.00M" in err


@pytest.mark.parametrize("name", ["http", "s3", "local"])
@pytest.mark.parametrize(
    ("key", "value"), [("retries", -1), ("timeout", 0), ("timeout", -2.5), ("backoff_factor", -0.1)]
)
def test_a_retry_setting_no_request_could_use_is_refused_by_validate_and_the_constructor(
    name: str, key: str, value: float
) -> None:
    # A retry setting no request could use (a negative retry count, a zero timeout) is refused
    # by validate(), the schema and the constructor, not at the first request.
    import jsonschema

    from framework import DownloadBackend
    from framework.config import json_schema, validate
    from framework.errors import ConfigError

    config = {"type": name, key: value}
    errors = validate(config, base=DownloadBackend)
    assert [error.path for error in errors] == [key]
    assert not jsonschema.Draft202012Validator(json_schema(DownloadBackend)).is_valid(config)
    with pytest.raises(ConfigError, match=key):
        DownloadBackend.by_name(name)(**{key: value})
    assert validate({"type": name, "retries": 0, "timeout": 0.5}, base=DownloadBackend) == []


@pytest.fixture
def twins(tmp_path: Path) -> Path:
    """A file literally named ``x%41.txt`` next to ``xA.txt``, what it decodes to."""
    (tmp_path / "x%41.txt").write_bytes(b"the literal name")
    (tmp_path / "xA.txt").write_bytes(b"the decoded name")
    return tmp_path


def test_file_url_is_decoded_exactly_once(twins: Path, manager: DownloadManager) -> None:
    base = twins.resolve().as_uri()
    assert manager.cached_path(f"{base}/x%2541.txt").read_bytes() == b"the literal name"
    assert manager.cached_path(f"{base}/x%41.txt").read_bytes() == b"the decoded name"


def test_plain_path_is_never_decoded(twins: Path, manager: DownloadManager) -> None:
    literal = twins / "x%41.txt"
    assert manager.cached_path(literal).read_bytes() == b"the literal name"
    assert manager.cached_path(str(literal)).read_bytes() == b"the literal name"
    odd = twins / "100%.txt"  # not even valid percent-encoding
    odd.write_bytes(b"odd")
    assert manager.cached_path(odd).read_bytes() == b"odd"


KEYS = ["report?v=2", "report", "frag#1", "frag", "a//b", "a/b", "x%41", "xA", "sp ace+plus"]


def test_s3_key_is_taken_literally(s3_env: str, manager: DownloadManager) -> None:
    import boto3

    bucket = f"names-{os.getpid()}-{os.urandom(3).hex()}"
    client = boto3.client("s3", endpoint_url=s3_env)
    client.create_bucket(Bucket=bucket)
    for key in KEYS:
        client.put_object(Bucket=bucket, Key=key, Body=f"object {key}".encode())
    for key in KEYS:
        path = manager.cached_path(f"s3://{bucket}/{key}")
        assert path.read_bytes() == f"object {key}".encode(), key


@pytest.mark.parametrize("source", ["plain-path", "file-url"])
def test_a_nul_byte_in_a_path_is_an_invalid_argument(
    tmp_path: Path, manager: DownloadManager, source: str
) -> None:
    url = str(tmp_path / "a\x00b") if source == "plain-path" else f"file://{tmp_path}/a%00b"
    with pytest.raises(InvalidArgumentError, match="NUL") as info:
        manager.cached_path(url)
    assert info.value.url == url
