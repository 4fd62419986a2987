"""The multiprocess loader engine: readers, samplers, collators and loaders.

Names load on first use (PEP 562) so that importing this package, as plugin listing
does, never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "BatchSampler",
    "DataCollator",
    "DataLoader",
    "DatasetReader",
    "DefaultDataCollator",
    "DistributedInfo",
    "MultiProcessDataLoader",
    "WorkerInfo",
]

_LOCATIONS = {
    "BatchSampler": "framework.data.sampler",
    "DataCollator": "framework.data.collate",
    "DataLoader": "framework.data.loader",
    "DatasetReader": "framework.data.reader",
    "DefaultDataCollator": "framework.data.collate",
    "DistributedInfo": "framework.data.reader",
    "MultiProcessDataLoader": "framework.data.multiprocess",
    "WorkerInfo": "framework.data.reader",
}

if TYPE_CHECKING:
    from framework.data.collate import DataCollator, DefaultDataCollator
    from framework.data.loader import DataLoader
    from framework.data.multiprocess import MultiProcessDataLoader
    from framework.data.reader import DatasetReader, DistributedInfo, WorkerInfo
    from framework.data.sampler import BatchSampler


def __getattr__(name: str) -> Any:
    module = _LOCATIONS.get(name)
    if module is None:
        raise AttributeError(f"module 'framework.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
