"""`use_registry` / `fresh_registry` blocks in several threads, and slow plugin imports."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Optional

import pytest

from framework.registry import Registry, RegistryEntry, get_registry, use_registry
from framework.testing import fresh_registry

pytestmark = pytest.mark.timeout(30)


def _in_thread(
    block: Callable[[], AbstractContextManager[Registry]], entered: threading.Event, leave: threading.Event
) -> threading.Thread:
    def body() -> None:
        with block():
            entered.set()
            leave.wait(10)

    thread = threading.Thread(target=body)
    thread.start()
    assert entered.wait(10)
    return thread


@pytest.mark.parametrize("kind", ["fresh_registry", "use_registry"])
def test_blocks_whose_ends_do_not_nest_give_the_default_back(kind: str) -> None:
    default = get_registry()
    make: Callable[[], AbstractContextManager[Registry]] = (
        fresh_registry if kind == "fresh_registry" else (lambda: use_registry(Registry()))
    )
    first_in, first_out, second_in, second_out = (threading.Event() for _ in range(4))
    first = _in_thread(make, first_in, first_out)
    active_first = get_registry()
    second = _in_thread(make, second_in, second_out)
    active_second = get_registry()
    assert default is not active_first is not active_second
    first_out.set()  # the first block ends while the second is still open
    first.join(10)
    assert get_registry() is active_second
    second_out.set()
    second.join(10)
    assert get_registry() is default


def test_a_lookup_waits_for_a_plugin_import_slower_than_the_wait_timeout() -> None:
    # A slow import (here 1 s against a wait_timeout of 0.05 s: 20 rounds of waiting)
    # is no deadlock: a thread that was already running waits until loading ends.
    import time

    from framework.data import DatasetReader

    class Slow(DatasetReader):
        def _read(self, file_path: object) -> Iterator[object]:
            yield from ()

    go, seen = threading.Event(), list[object]()
    rounds = [0]

    def discover(registry: Registry) -> None:
        with registry.loading_plugin("slow"):
            go.set()
            time.sleep(1.0)  # an import that takes its time, in this thread
            registry.commit([(RegistryEntry(DatasetReader, "slow", Slow, None, "slow 1.0"), False)], "raise")

    def lookup() -> None:
        go.wait(10)
        try:
            seen.append(DatasetReader.list_available())
        except Exception as error:
            seen.append(error)

    registry = Registry(discover, wait_timeout=0.05)
    original = registry._progress.wait

    def counted(timeout: Optional[float] = None) -> bool:
        rounds[0] += 1
        return original(timeout)

    registry._progress.wait = counted  # type: ignore[method-assign]
    with use_registry(registry):
        waiter = threading.Thread(target=lookup)
        waiter.start()  # running before loading begins
        assert "slow" in DatasetReader.list_available()
        waiter.join(10)
    assert seen == [["slow"]], seen
    assert rounds[0] >= 2  # it waited past wait_timeout at least once, and did not give up
