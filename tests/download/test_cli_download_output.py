"""`framework download` prints one line: the path, or the error. urllib3's retry warnings
and the manager's progress logs are for -v."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.download import FaultServer

pytestmark = pytest.mark.timeout(90)


def _cli(cache: Path, url: str, verbose: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEWORK_")}
    flags = ["-v"] if verbose else []
    # The real command, with the manager's retries kept but their waits cut to 10 ms: an
    # unreachable host is otherwise tried for 15 s before the one line comes.
    launch = (
        "import runpy, sys; from framework.download import DownloadManager; "
        "DownloadManager.__init__.__kwdefaults__['backoff_factor'] = 0.01; "
        "sys.argv[0] = 'framework'; runpy.run_module('framework', run_name='__main__')"
    )
    command = [
        sys.executable,
        "-c",
        launch,
        *flags,
        "download",
        "--no-progress",
        "--cache-dir",
        str(cache),
    ]
    return subprocess.run([*command, url], capture_output=True, text=True, env=env, timeout=60)


def test_a_resumed_download_prints_only_the_path(http_server: FaultServer, cache: Path) -> None:
    data = os.urandom(256 << 10)
    url = http_server.add("/cli/resumed.bin", data, drop_after=100_000, drops=1)
    result = _cli(cache, url)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and len(result.stdout.strip().splitlines()) == 1
    assert Path(result.stdout.strip()).read_bytes() == data
    again = http_server.add("/cli/resumed-again.bin", data, drop_after=100_000, drops=1)
    verbose = _cli(cache, again, verbose=True)
    assert "resuming from byte" in verbose.stderr  # still there when asked for


def test_an_unreachable_host_is_one_line(cache: Path) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = _cli(cache, f"http://127.0.0.1:{port}/file.bin")
    assert result.returncode != 0 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("framework download: error:"), result.stderr


def test_the_download_command_leaves_the_callers_log_levels(tmp_path: Path) -> None:
    # `framework download` quiets urllib3's and framework.download's loggers only while it
    # runs: a notebook (or the next test) keeps their warnings.
    import logging

    from framework.cli import main

    source = tmp_path / "f.bin"
    source.write_bytes(b"bytes")
    names = ("urllib3", "framework.download")
    before = {name: logging.getLogger(name).level for name in names}
    assert main(["download", "--cache-dir", str(tmp_path / "cache"), "--no-progress", source.as_uri()]) == 0
    assert {name: logging.getLogger(name).level for name in names} == before
