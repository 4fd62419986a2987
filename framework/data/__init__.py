"""The multiprocess loader engine: readers, samplers, collators and loaders.

Names load on first use (PEP 562) so that importing this package, as plugin listing
does, never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from framework._lazy import lazy_exports

__all__ = [
    "BatchSampler",
    "BucketBatchSampler",
    "DataCollator",
    "DataLoader",
    "DatasetReader",
    "DefaultDataCollator",
    "DistributedInfo",
    "MaxTokensBatchSampler",
    "MultiProcessDataLoader",
    "ShardFiles",
    "UnshardedReadWarning",
    "WorkerInfo",
]

_LOCATIONS = {
    "BatchSampler": "framework.data.sampler",
    "BucketBatchSampler": "framework.data.sampler",
    "DataCollator": "framework.data.collate",
    "DataLoader": "framework.data.loader",
    "DatasetReader": "framework.data.reader",
    "DefaultDataCollator": "framework.data.collate",
    "DistributedInfo": "framework.data.reader",
    "MaxTokensBatchSampler": "framework.data.sampler",
    "MultiProcessDataLoader": "framework.data.multiprocess",
    "ShardFiles": "framework.data.shard_files",
    "UnshardedReadWarning": "framework.data.reader",
    "WorkerInfo": "framework.data.reader",
}

if TYPE_CHECKING:
    from framework.data.collate import DataCollator, DefaultDataCollator
    from framework.data.loader import DataLoader
    from framework.data.multiprocess import MultiProcessDataLoader
    from framework.data.reader import DatasetReader, DistributedInfo, UnshardedReadWarning, WorkerInfo
    from framework.data.sampler import BatchSampler, BucketBatchSampler, MaxTokensBatchSampler
    from framework.data.shard_files import ShardFiles


__getattr__, __dir__ = lazy_exports(__name__, _LOCATIONS)
