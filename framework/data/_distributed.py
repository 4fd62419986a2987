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

__all__ = ["agree", "even"]


END = object()


def agree(count: int, error: Optional[Exception]) -> int:
    """The smallest `count` over every rank; if any rank passes an `error`, all raise.

    One `all_reduce` (MIN over ``[count, -failed]``). When a rank failed, a second
    collective shares the errors: a failed rank raises its own, the others raise a copy
    of the lowest failed rank's (same type where it can be rebuilt) naming that rank.
    """
    import torch.distributed as dist

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    value = torch.tensor([count, 0 if error is None else -1], dtype=torch.int64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    if int(value[1].item()) == 0:
        return int(value[0].item())
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


def _portable(error: Exception) -> tuple[str, str, Optional[bytes]]:
    """(type name, message, pickled error or None): always picklable, so never a hang."""
    try:
        text = str(error)
    except Exception:
        text = "<str() of the error failed>"
    try:
        blob = pickle.dumps(error)
        pickle.loads(blob)  # some exceptions pickle but cannot be rebuilt
    except Exception:
        return type(error).__name__, text, None
    return type(error).__name__, text, blob


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
