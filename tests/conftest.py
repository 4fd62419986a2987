"""Shared fixtures: every test gets a registry that it cannot leak into the next."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from framework.registry import Registry
from framework.testing import fresh_registry as _fresh_registry
from tests.support.ranks import FORKSERVER_PRELOAD

REPO_ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    # A shell starts a background job (`... &`) with SIGINT ignored, Python then installs
    # no handler, and every process the tests start inherits it: the tests that send
    # Ctrl-C would wait on processes that never get it. Ctrl-C raises KeyboardInterrupt
    # here, as in a terminal, and so in every forked or started test process.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # Ranks and "forkserver" workers fork from a server that has torch imported already.
    multiprocessing.set_forkserver_preload(FORKSERVER_PRELOAD)


# The files that take longest, longest first: `pytest -n 3 --dist loadfile` hands files
# out in collection order, and one of these started last would run on alone at the end
# (about 10 s of the suite's 4 minutes). An outdated list costs only that time.
LONGEST_FIRST = [
    "tests/data/test_loader_robust.py",
    "tests/download/test_cluster_fetch.py",
    "tests/download/test_parallel_fetch.py",
    "tests/test_plugin_loading.py",
    "tests/data/test_worker_lifecycle.py",
    "tests/readers/test_reader_resume.py",
    "tests/cli/test_run.py",
    "tests/data/test_stream_promises.py",
    "tests/data/test_stream_shards.py",
    "tests/data/test_loader_transfer.py",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: place for place, path in enumerate(LONGEST_FIRST)}
    # A stable sort: the rest keep their order.
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[Registry]:
    """A copy of the registry for each test, active until it ends, like pluggy's fresh
    PluginManager per test: whatever a test registers is gone for the next one."""
    with _fresh_registry() as registry:
        yield registry


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point FRAMEWORK_CACHE at a fresh folder, so no test touches ~/.cache."""
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("FRAMEWORK_CACHE", str(cache))
    monkeypatch.delenv("FRAMEWORK_OFFLINE", raising=False)
    return cache


@pytest.fixture
def cli_env() -> dict[str, str]:
    """Environment for running the CLI in a subprocess with this interpreter."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


def framework_command() -> list[str]:
    return [sys.executable, "-m", "framework"]
