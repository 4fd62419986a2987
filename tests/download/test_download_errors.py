"""Every failure is a `DownloadError` naming the URL, and `framework download` says it in
one line: sources that are not files, S3 parameter errors, read-only caches, damaged
archives, bad arguments. Cases that hung before run in a subprocess with a timeout."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any, Callable

import pytest

from framework.download import DownloadManager
from framework.download._cache import Entry
from framework.errors import DownloadError, InvalidArgumentError
from tests.support.download import FaultServer, cache_files

pytestmark = pytest.mark.timeout(120)


def _cli(args: list[str], cache: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "framework", "download", "--no-progress", "--cache-dir", str(cache)]
    return subprocess.run([*command, *args], capture_output=True, text=True, env=env, timeout=30)


def _assert_one_line_error(result: subprocess.CompletedProcess[str], *expected: str) -> str:
    assert result.returncode != 0 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("framework download: error:") and "Traceback" not in result.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def _source(kind: str, tmp_path: Path) -> str:
    if kind == "folder":
        (tmp_path / "a-folder").mkdir()
        return str(tmp_path / "a-folder")
    if kind == "fifo":  # no writer: an ordinary open() waits forever
        os.mkfifo(tmp_path / "a-fifo")
        return str(tmp_path / "a-fifo")
    return "/dev/null"  # a device: reads as empty, so it would be "downloaded"


@pytest.mark.parametrize("kind", ["folder", "fifo", "device"])
def test_local_source_that_is_not_a_regular_file_is_refused(
    tmp_path: Path, cli_env: dict[str, str], kind: str
) -> None:
    source, cache = _source(kind, tmp_path), tmp_path / "cache"
    line = _assert_one_line_error(_cli([source], cache, cli_env), "not a regular file", source)
    assert f"is a {kind}" in line.lower()
    assert not Entry(cache, Path(source).resolve().as_uri()).final.exists()


def test_invalid_bucket_name_is_a_download_error(s3_env: str, manager: DownloadManager) -> None:
    url = "s3://Not_A_Valid_Bucket!/key.bin"
    with pytest.raises(InvalidArgumentError) as info:
        manager.cached_path(url)
    assert info.value.url == url and "bucket" in str(info.value).lower()
    assert isinstance(info.value, ValueError)


def test_missing_profile_is_a_download_error(s3_env: str, cache: Path) -> None:
    from framework_plugins.s3 import S3Backend

    manager = DownloadManager(cache, progress=False, backends={"s3": S3Backend(profile="no-such-profile")})
    with pytest.raises(DownloadError, match="no-such-profile") as info:
        manager.cached_path("s3://bucket/key.bin")
    assert info.value.url == "s3://bucket/key.bin"


def _read_only(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """Make writes under `folder` fail as on a read-only mount (root ignores chmod)."""
    real_open, real_mkdir = os.open, os.mkdir
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT

    def refuse(path: Any) -> OSError:
        return OSError(errno.EROFS, "Read-only file system", os.fspath(path))

    def ro_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if os.fspath(path).startswith(str(folder)) and flags & writes:
            raise refuse(path)
        return real_open(path, flags, *args, **kwargs)

    def ro_mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
        if os.fspath(path).startswith(str(folder)):
            raise refuse(path)
        real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", ro_open)
    monkeypatch.setattr(os, "mkdir", ro_mkdir)


def test_read_only_cache_miss_is_a_download_error(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "data.tar"
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo("a.txt")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"alpha"))
    manager = DownloadManager(cache, progress=False, lock="none")
    cached = manager.cached_path(archive)  # cached while the folder was writable
    _read_only(monkeypatch, cache)
    assert manager.cached_path(archive) == cached  # a hit needs no write
    other = tmp_path / "other.bin"
    other.write_bytes(b"other")
    for call in (lambda: manager.cached_path(other), lambda: manager.cached_path(archive, extract=True)):
        with pytest.raises(DownloadError, match="Read-only file system") as info:
            call()
        assert "writable" in str(info.value)
    assert cache_files(cache) == sorted([cached.name, cached.name + ".json"])


def _truncated_archive(tmp_path: Path) -> Path:
    archive = tmp_path / "cut.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("a.bin")
        data = os.urandom(50_000)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    archive.write_bytes(archive.read_bytes()[:20_000])
    return archive


def _unsafe_archive(tmp_path: Path) -> Path:
    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as tar:
        tar.addfile(tarfile.TarInfo("../evil.txt"), io.BytesIO(b""))
    return archive


def _plain(tmp_path: Path) -> Path:
    path = tmp_path / "plain.bin"
    path.write_bytes(b"plain")
    return path


# name -> (arguments given the test's folder and server, what the line must say)
CASES: dict[str, Callable[[Path, FaultServer], tuple[list[str], list[str]]]] = {
    "http-404": lambda t, s: ([s.base + "/nothing-here.bin"], ["404", "nothing-here.bin"]),
    "unknown-scheme": lambda t, s: (["gopher://host/x"], ["no download backend", "'gopher'"]),
    "invalid-sha256": lambda t, s: ([str(_plain(t)), "--sha256", "xyz"], ["sha256", "64"]),
    "checksum": lambda t, s: ([str(_plain(t)), "--sha256", "0" * 64], ["mismatch", "plain.bin"]),
    "corrupt-archive": lambda t, s: ([str(_truncated_archive(t)), "--extract"], ["damaged", "cut.tar.gz"]),
    "unsafe-archive": lambda t, s: ([str(_unsafe_archive(t)), "--extract"], ["../evil.txt"]),
    "missing-file": lambda t, s: ([str(t / "missing.bin")], ["no such file"]),
    "no-host": lambda t, s: (["http:///nohost.bin"], ["InvalidArgumentError", "No host"]),
    "bad-port": lambda t, s: (["http://host:notaport/x"], ["InvalidArgumentError", "notaport"]),
    "bad-ipv6": lambda t, s: (["http://[::1/x"], ["not a valid URL", "http://[::1/x"]),
    "secret-url": lambda t, s: (
        [s.base.replace("//", "//bob:hunter2@") + "/x.bin?token=toksecret"],
        ["404", "***@", "token=***"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_cli_prints_one_line_for_every_failure(
    case: str, tmp_path: Path, http_server: FaultServer, cli_env: dict[str, str]
) -> None:
    args, expected = CASES[case](tmp_path, http_server)
    line = _assert_one_line_error(_cli(args, tmp_path / "cache", cli_env), *expected)
    assert "hunter2" not in line and "toksecret" not in line


def test_cli_invalid_bucket_and_offline_are_one_line(
    s3_env: str, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    env = {**cli_env, **{k: v for k, v in os.environ.items() if k.startswith("AWS_")}}
    _assert_one_line_error(_cli(["s3://Bad_Bucket!/k"], tmp_path / "cache", env), "Bad_Bucket!")
    offline = {**env, "FRAMEWORK_OFFLINE": "1"}
    _assert_one_line_error(_cli([str(_plain(tmp_path))], tmp_path / "cache", offline), "offline")
