"""Helpers for the reader tests: read a file as every shard of a worker/rank grid would."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from framework.data.reader import DatasetReader, DistributedInfo, WorkerInfo

ShardReader = Callable[[DatasetReader, str, int, int], list[list[Any]]]


def read_shards(reader: DatasetReader, path: str, num_workers: int, world_size: int) -> list[list[Any]]:
    """The instances each (rank, worker) shard reads, in shard order."""
    shards = []
    for rank in range(world_size):
        for worker in range(num_workers):
            reader._set_distributed_info(DistributedInfo(world_size, rank) if world_size > 1 else None)
            reader._set_worker_info(WorkerInfo(num_workers, worker) if num_workers > 1 else None)
            shards.append(list(reader.read(path)))
    reader._set_worker_info(None)
    reader._set_distributed_info(None)
    return shards


@pytest.fixture
def shard_reader() -> ShardReader:
    return read_shards
