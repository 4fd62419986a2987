"""`LoaderPass`: the iterator of one pass over the data, and `Progress`, where a
loader's iteration stands between passes.

As torch's DataLoader and its iterator: the loader keeps the settings, the
`DataLoader` interface and the worker pools; a pass gets what it needs (settings,
progress, instance cache, pool lease) explicitly and never refers to the loader, so a
pass the loader keeps between epochs makes no reference cycle with it.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any, Optional

from framework.data._cache import InstanceCache
from framework.data._distributed import even
from framework.data._lease import WorkerPools
from framework.data._position import Position
from framework.data._settings import LoaderSettings
from framework.data._streams import eager_pass, lazy_pass_in_process, lazy_pass_in_workers
from framework.data.loader import TensorDict
from framework.data.reader import current_distributed_info

__all__ = ["KEPT", "LoaderPass", "Progress"]

KEPT = 64  # ended passes a rank keeps: how many epochs it may run ahead of another rank


@dataclass
class Progress:
    """Where a loader's iteration stands: the passes update it, the saved state reads it."""

    epoch: int = 0  # the next fresh pass's epoch
    pending: Optional[Position] = None  # where the next pass starts
    current: Optional[Position] = None  # the pass in progress
    # The passes that ended, by epoch (the newest KEPT): state_dict() speaks for a rank
    # that ran ahead of the others (uneven ranks) with its pass of their epoch.
    ended: dict[int, Position] = field(default_factory=dict)
    # batches_per_epoch: batches the current iter() has yielded (0 between epochs);
    # after a load, the saved count, so the first iter() yields the rest.
    epoch_batches: int = 0
    # batches_per_epoch: the iter() epochs that have ended (their last batch taken):
    # the training loop's epoch, which the pass epoch (`epoch`) is not.
    loop_epoch: int = 0
    batches: int = 0  # batches yielded since built or loaded: ranks compare it in state_dict()
    # batches_per_epoch: the open iter() whose batches `epoch_batches` counts (None: none)
    counting: Optional[object] = None

    def next_position(self, settings: LoaderSettings) -> Position:
        """Where the next pass starts (a fresh epoch unless one is pending)."""
        if self.pending is None:
            self.pending = Position(epoch=self.epoch, seed=settings.epoch_seed(self.epoch))
        return self.pending

    def mid_epoch(self) -> bool:
        """Whether an epoch has begun and not ended: a pass under way, or the rest of
        one cut short (or loaded) waiting for the next pass."""
        pending = self.pending
        fresh = pending is None or pending == Position(epoch=pending.epoch, seed=pending.seed)
        return self.current is not None or not fresh

    def resume_at(self, position: Position, epoch_batches: int, loop_epoch: int) -> None:
        """Start over at a loaded `position` (any pass still open is stale)."""
        self.pending = position
        self.current = None
        self.ended = {}
        self.epoch = position.epoch
        self.epoch_batches = epoch_batches
        self.loop_epoch = loop_epoch
        self.batches = 0
        self.counting = None  # the loaded count is the next iter()'s, whatever is still open


class LoaderPass:
    """One pass over the data: an iterator of batches, each on its device.

    It takes its position from `progress` when its first batch is asked for. Closed
    before its end (`close()`, `break`, an exception, Ctrl-C) it stops its workers at
    once and leaves its rest pending in `progress`, for the next pass to yield."""

    def __init__(
        self,
        settings: LoaderSettings,
        progress: Progress,
        cache: InstanceCache,
        pools: WorkerPools,
    ) -> None:
        self._batches = _run(settings, progress, cache, pools)

    def __iter__(self) -> LoaderPass:
        return self

    def __next__(self) -> TensorDict:
        return next(self._batches)

    def close(self) -> None:
        self._batches.close()


def _stream(
    settings: LoaderSettings, cache: InstanceCache, pools: WorkerPools, position: Position
) -> Iterator[Any]:
    info = current_distributed_info()
    if not settings.lazy:
        return eager_pass(settings, cache, position)
    if settings.num_workers == 0:
        stream = lazy_pass_in_process(settings, position)
    else:
        stream = lazy_pass_in_workers(settings, pools, position, info)
    # Lazy ranks stop together when any runs out (with batches_per_epoch the loader's
    # epoch loop shares each batch's failure instead).
    if settings.evened() and settings.batches_per_epoch is None:
        stream = even(stream)
    return stream


def _run(
    settings: LoaderSettings, progress: Progress, cache: InstanceCache, pools: WorkerPools
) -> Generator[TensorDict, None, None]:
    position = progress.next_position(settings)
    progress.pending = None
    progress.current = position
    progress.epoch = position.epoch + 1
    stream = _stream(settings, cache, pools, position)
    finished = False
    try:
        for batch in stream:  # each on its device already (`finish`), then counted
            progress.batches += 1
            yield batch
        finished = True
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()  # stops the workers at once when the consumer stops early
        if finished:
            progress.ended[position.epoch] = position  # for state_dict() while other ranks are still in it
            for old in sorted(progress.ended)[:-KEPT]:
                del progress.ended[old]
        elif progress.current is position and progress.pending is None:
            # Cut short (`break`, an exception, Ctrl-C): the pass is not over. The next
            # pass yields its rest, as a loader restored from state_dict() does. (Not a
            # stale pass closed late, after load_state_dict() or another pass.)
            progress.pending = Position.from_dict(position.to_dict())
        if progress.current is position:
            progress.current = None
