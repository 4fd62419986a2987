"""`use_registry` / `fresh_registry` blocks in several threads, and slow plugin imports."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest

from framework.registry import Registry, get_registry, use_registry
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
