"""Seeding the global random streams, and the loader's own streams in the main process.

Readers, samplers and collators draw from the global `random`, numpy and torch
streams. In a worker the loader owns the process and seeds them; in the main process
(`num_workers=0`) they belong to the training loop, so the loader swaps its own
streams in around each call into that code and the caller's back afterwards.
"""

from __future__ import annotations

import itertools
import random
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any, Optional, TypeVar

import torch

from framework.data.collate import DefaultDataCollator

__all__ = ["PrivateRandom", "after_fork", "draws_nothing", "scoped", "seed_everything", "unseeded_seed"]

_T = TypeVar("_T")

# Seconds a forked worker waits for one draw from torch's generator (it takes
# microseconds unless the mutex was copied held, when it never ends).
LOCK_WAIT = 10.0


def _numpy_random() -> Optional[ModuleType]:
    """`numpy.random` if imported and initialised: not half-imported by another thread
    (after `fork` such an import never finishes, and seeding it would fail)."""
    module = sys.modules.get("numpy.random")
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return module if hasattr(module, "seed") else None


def after_fork() -> None:
    """Make the random streams of a freshly forked worker safe to seed (call it first).

    Another thread of the main process may have held a stream's lock at the fork (a
    draw releases the GIL while holding it); the copy here stays held forever.
    numpy's global RandomState gets a new bit generator, so a lock of its own.
    torch's generator mutex cannot be replaced from Python, so one draw is made in a
    helper thread (it waits for the mutex with the GIL released): RuntimeError if it
    does not end, rather than hang at the first seeding.
    """
    numpy_random = _numpy_random()
    rand = getattr(getattr(numpy_random, "mtrand", None), "_rand", None)
    if numpy_random is not None and rand is not None:
        rand.__init__(numpy_random.MT19937(0))  # seed_everything seeds it before any use
    drawn = threading.Event()

    def draw() -> None:
        torch.rand(1)
        drawn.set()

    threading.Thread(target=draw, name="framework-loader-rng-probe", daemon=True).start()
    if not drawn.wait(LOCK_WAIT):
        raise RuntimeError(
            "a thread in the main process held torch's random generator lock when this "
            "worker was forked, so torch's random functions would wait forever here; use "
            "start_method='forkserver' or 'spawn' (workers that do not inherit the main "
            "process's threads)"
        )


def seed_everything(seed: int, cuda: bool = True) -> None:
    """Seed random, numpy's global RNG (if imported) and torch in this process.

    Cheap on purpose (it runs at the start of every worker epoch): torch's CPU
    generator directly (`torch.manual_seed` also visits every device backend,
    ~3 ms), CUDA's when there is CUDA and `cuda`, and numpy's only when
    `numpy.random` is already imported (touching it first imports it, ~15-25 ms).
    """
    random.seed(seed)
    torch.default_generator.manual_seed(seed)
    if cuda and torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)  # queued until CUDA is initialised: cheap
    numpy_random = _numpy_random()
    if numpy_random is not None:
        numpy_random.seed(seed % 2**32)


def _streams() -> tuple[Any, Any, Any]:
    numpy_random = _numpy_random()
    numpy_state = numpy_random.get_state() if numpy_random is not None else None
    return random.getstate(), torch.default_generator.get_state(), numpy_state


def _restore(state: tuple[Any, Any, Any]) -> None:
    python_state, torch_state, numpy_state = state
    random.setstate(python_state)
    torch.default_generator.set_state(torch_state)
    numpy_random = _numpy_random()
    if numpy_random is not None:
        if numpy_state is None:
            return  # first imported inside our block: nothing of the caller's to restore
        numpy_random.set_state(numpy_state)


@contextmanager
def scoped(seed: int) -> Iterator[None]:
    """Inside the block, the CPU streams are fresh ones seeded from `seed`; after it,
    the streams are back as they were (whoever's they were: the caller's, a reader's).

    One random draw of the loader's (a collator's, a hook's) thus depends on its own
    seed only, never on how far another stream has gone. Costs about one swap of
    `PrivateRandom` (tens of microseconds).
    """
    saved = _streams()
    seed_everything(seed, cuda=False)
    try:
        yield
    finally:
        _restore(saved)


def draws_nothing(function: Any) -> bool:
    """Whether `function` is known to draw no random numbers (the default collator), so
    it needs no stream of its own."""
    return type(function) is DefaultDataCollator


def unseeded_seed() -> int:
    """A seed for an unseeded loader, from the state of `random` without drawing from it:
    the caller's stream does not move, and seeding `random` first makes the run repeat."""
    import hashlib

    digest = hashlib.sha256(repr(random.getstate()).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class PrivateRandom:
    """The loader's own random, numpy and torch (CPU) streams in the main process.

    Seeded as a worker's would be, so `num_workers=0` and 1 give the same data;
    independent of the caller's draws, so resuming is exact whatever the training
    loop does with `random` between batches. (CUDA's streams are neither seeded nor
    swapped here: a reader in the main process draws from them as the caller does.)
    """

    def __init__(self, seed: int) -> None:
        self._seed = seed
        self._state: Optional[tuple[Any, Any, Any]] = None

    @contextmanager
    def active(self) -> Iterator[None]:
        """Inside the block the global streams are ours; after it, the caller's again."""
        caller = _streams()
        if self._state is None:
            seed_everything(self._seed, cuda=False)
        else:
            _restore(self._state)
        try:
            yield
        finally:
            self._state = _streams()
            _restore(caller)

    def wrap(self, iterator: Iterator[_T], step: Optional[int] = 1) -> Iterator[_T]:
        """`iterator`'s items, each `step` of them (None: all) drawn inside `active()`.

        A swap costs tens of microseconds (numpy's state most), so callers that are
        not interleaved with the training loop take many items per swap; the first
        swap takes one item, so that the first comes as soon as it is made.
        """
        size: Optional[int] = 1 if step is not None and step > 1 else step
        while True:
            with self.active():
                items = list(itertools.islice(iterator, size))
            yield from items
            if size is None or len(items) < size:
                return
            size = step
