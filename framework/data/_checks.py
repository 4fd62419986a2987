"""Parameter checks for MultiProcessDataLoader: each bad value a ValueError saying what to change."""

from __future__ import annotations

import multiprocessing
from typing import Any, Optional

from framework.data.reader import DatasetReader, current_distributed_info
from framework.data.sampler import BatchSampler

__all__ = ["TRANSFERS", "no_instances", "validate"]

TRANSFERS = ("pickle5", "shared_memory")


def no_instances(reader: DatasetReader, data_path: Any) -> ValueError:
    info = current_distributed_info()
    if info is not None and info.world_size > 1:
        return ValueError(
            f"{type(reader).__name__} read no instances from {data_path!r} on rank "
            f"{info.global_rank} of {info.world_size} (each rank reads its own shard; with "
            "fewer instances than ranks some shards are empty). Use fewer ranks or more "
            "data, and check the path and that _read() yields."
        )
    return ValueError(
        f"{type(reader).__name__} read no instances from {data_path!r}. Is the path right, "
        "and does _read() yield? (With max_instances=0 or an empty file this is expected.)"
    )


def validate(
    batch_size: Optional[int],
    drop_last: bool,
    shuffle: bool,
    batch_sampler: Optional[BatchSampler],
    batches_per_epoch: Optional[int],
    num_workers: int,
    max_instances_in_memory: Optional[int],
    start_method: str,
    persistent_workers: bool,
    transfer: str,
    timeout: Optional[float],
) -> None:
    if num_workers is None or num_workers < 0:
        raise ValueError(f"num_workers must be 0 or more, got {num_workers}")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if batch_sampler is not None:
        for name, value in (("batch_size", batch_size), ("drop_last", drop_last),
                            ("shuffle", shuffle)):
            if value:
                raise ValueError(
                    f"batch_sampler is mutually exclusive with {name}: set {name} on the "
                    "sampler, or drop batch_sampler"
                )
    elif batch_size is None:
        raise ValueError("batch_size is required when batch_sampler is not given")
    if batches_per_epoch is not None and batches_per_epoch < 1:
        raise ValueError(f"batches_per_epoch must be at least 1, got {batches_per_epoch}")
    if max_instances_in_memory is not None:
        if batch_size is not None and max_instances_in_memory < batch_size:
            raise ValueError(
                f"max_instances_in_memory ({max_instances_in_memory}) must be at least "
                f"batch_size ({batch_size}); raise it (10x batch_size is a good start)"
            )
        if max_instances_in_memory < 1:
            raise ValueError(
                f"max_instances_in_memory must be at least 1, got {max_instances_in_memory}"
            )
    if start_method not in multiprocessing.get_all_start_methods():
        raise ValueError(
            f"start_method must be one of {multiprocessing.get_all_start_methods()}, "
            f"got {start_method!r}"
        )
    if persistent_workers and num_workers == 0:
        raise ValueError("persistent_workers=True needs num_workers > 0")
    if transfer not in TRANSFERS:
        raise ValueError(f"transfer must be one of {TRANSFERS}, got {transfer!r}")
    if timeout is not None and timeout <= 0:
        raise ValueError(f"timeout must be positive seconds or None, got {timeout}")
