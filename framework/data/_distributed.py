"""torch.distributed helpers: every rank yields the same number of batches."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["even", "min_over_ranks"]


END = object()


def min_over_ranks(count: int) -> int:
    """The smallest `count` over every rank of the default process group."""
    import torch.distributed as dist

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    value = torch.tensor([count], dtype=torch.int64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return int(value.item())


def even(stream: Iterator[Any]) -> Iterator[Any]:
    """Stop every rank as soon as any rank runs out (one tiny all_reduce per batch)."""
    try:
        while True:
            batch = next(stream, END)
            if min_over_ranks(0 if batch is END else 1) == 0:
                return
            yield batch
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()
