"""torch.distributed helpers: every rank yields the same number of batches, or fails together.

A rank that raises before a collective must still take part in it, or the other
ranks wait until the process group's timeout (30 minutes by default). So each
collective carries an error flag: if any rank failed, every rank raises.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any, Optional

import torch

from framework.distributed import portable_error as _portable
from framework.errors import RanksOutOfStepError

__all__ = ["agree", "even", "in_step"]


END = object()

# What a rank is doing when it meets the others in the loader's one-shape all_reduce.
_BATCH, _STATE = 0, 1
_DOING = {_BATCH: "taking a batch", _STATE: "in state_dict()"}


def _reduce(count: int, failed: bool, kind: int, batches: int) -> list[int]:
    """MIN over every rank of `[count, -failed, kind, -kind, batches, -batches]`:
    the loader's collectives all have this shape, so a rank in one of them meets a rank
    in another at once (never a hang until the group's timeout), and both can tell."""
    import torch.distributed as dist

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    values = [count, -int(failed), kind, -kind, batches, -batches]
    value = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    reduced = [int(x) for x in value.tolist()]
    if reduced[2] != -reduced[3]:  # some ranks in state_dict(), others taking a batch
        raise RanksOutOfStepError(
            f"rank {dist.get_rank()} of {dist.get_world_size()} was {_DOING[kind]} while "
            f"another rank was {_DOING[_BATCH if kind == _STATE else _STATE]}: under "
            "torch.distributed, state_dict() is a collective, so every rank must call it "
            "after the same batch (count steps the same way on every rank, and call it "
            "on every rank, not only on the one that saves)"
        )
    return reduced


def in_step(batches: int, same_batches: bool) -> None:
    """The first collective of `state_dict()`: every rank is in it, after the same
    number of `batches` when `same_batches` (even_batches); else `RanksOutOfStepError`."""
    reduced = _reduce(0, False, _STATE, batches)
    fewest, most = reduced[4], -reduced[5]
    if same_batches and fewest != most:
        raise RanksOutOfStepError(
            f"ranks called state_dict() after different numbers of batches (from {fewest} "
            f"to {most}; this rank after {batches}), although even_batches keeps them in "
            "step: call it on every rank after the same batch, or the saved state mixes "
            "steps the model never saw together",
            batches=(fewest, most),
        )


def agree(count: int, error: Optional[Exception]) -> int:
    """The smallest `count` over every rank; if any rank passes an `error`, all raise.

    One `all_reduce` (`_reduce`: MIN over `[count, -failed, ...]`). When a rank
    failed, a second collective shares the errors: a failed rank raises its own, the
    others raise a copy of the lowest failed rank's (same type where it can be rebuilt)
    naming that rank. A rank in `state_dict()` meanwhile: `RanksOutOfStepError`.
    """
    import torch.distributed as dist

    try:
        value = _reduce(count, error is not None, _BATCH, 0)
    except RanksOutOfStepError as mismatch:
        raise mismatch from error
    if value[1] == 0:
        return value[0]
    mine = None if error is None else _portable(error)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    if error is not None:
        raise error
    rank, (kind, text, blob) = next((r, e) for r, e in enumerate(gathered) if e is not None)
    message = (
        f"rank {rank} of {len(gathered)} raised {kind}: {text} (this rank stops too, so "
        "no rank waits for it in a collective)"
    )
    copy: Optional[BaseException] = None
    if blob is not None:
        try:
            copy = pickle.loads(blob)
        except Exception:
            copy = None
    if isinstance(copy, Exception):
        copy.args = (message,)
        if hasattr(copy, "message"):
            copy.message = message  # errors whose str() shows an attribute, not args
        if message not in str(copy):
            copy.add_note(message)  # at least the traceback names the failed rank
        raise copy
    raise RuntimeError(message)


def even(stream: Iterator[Any]) -> Iterator[Any]:
    """Stop every rank as soon as any rank runs out or fails (one tiny all_reduce per batch)."""
    try:
        while True:
            error: Optional[Exception] = None
            try:
                batch = next(stream, END)
            except Exception as raised:
                error, batch = raised, END
            if agree(0 if batch is END else 1, error) == 0:
                return
            yield batch
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()
