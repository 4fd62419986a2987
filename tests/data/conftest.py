"""Fixtures for the loader engine tests (real worker processes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.download.conftest import http_server, s3_env, s3_server  # noqa: F401 (fixtures, streaming tests)
from tests.support import ranks
from tests.support.loader import child_pids, new_shm_entries, shm_entries


@pytest.fixture
def no_leaks() -> Iterator[None]:
    """Fail if a test leaves worker processes or /dev/shm entries behind."""
    import time

    children = child_pids()
    shm = shm_entries()
    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (child_pids() - children):
        time.sleep(0.05)
    assert child_pids() - children == set(), "worker processes left running"
    assert new_shm_entries(shm) == set(), "shared-memory segments left in /dev/shm"


@pytest.fixture
def free_port() -> int:
    return ranks.free_port()


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "lines.txt"
    path.write_text("".join(f"line {i} has {'word ' * (i % 7)}\n" for i in range(40)))
    return path
