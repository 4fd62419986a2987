"""framework: fetch research data safely and feed it to PyTorch fast.

Names are imported on first use (PEP 562), so `import framework` stays cheap and
does not import torch until something needs it.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from framework._lazy import lazy_exports as _lazy_exports
from framework._version import __version__ as __version__

__all__ = [
    "BatchSampler",
    "BucketBatchSampler",
    "ConfigError",
    "DataCollator",
    "DataLoader",
    "DatasetReader",
    "DefaultDataCollator",
    "DistributedInfo",
    "DownloadBackend",
    "DownloadError",
    "DownloadManager",
    "FrameworkError",
    "Lazy",
    "MultiProcessDataLoader",
    "Registrable",
    "WorkerError",
    "WorkerInfo",
    "cached_path",
    "hookimpl",
    "hookspec",
]

_LOCATIONS = {
    "BatchSampler": "framework.data",
    "BucketBatchSampler": "framework.data",
    "ConfigError": "framework.errors",
    "DataCollator": "framework.data",
    "DataLoader": "framework.data",
    "DatasetReader": "framework.data",
    "DefaultDataCollator": "framework.data",
    "DistributedInfo": "framework.data",
    "DownloadBackend": "framework.download.backend",
    "DownloadError": "framework.errors",
    "DownloadManager": "framework.download.manager",
    "FrameworkError": "framework.errors",
    "Lazy": "framework.config",
    "MultiProcessDataLoader": "framework.data",
    "Registrable": "framework.registry",
    "WorkerError": "framework.errors",
    "WorkerInfo": "framework.data",
    "cached_path": "framework.download.manager",
    "hookimpl": "framework.hookspecs",
    "hookspec": "framework.hookspecs",
}

if _TYPE_CHECKING:
    from framework.config import Lazy
    from framework.data import (
        BatchSampler,
        BucketBatchSampler,
        DataCollator,
        DataLoader,
        DatasetReader,
        DefaultDataCollator,
        DistributedInfo,
        MultiProcessDataLoader,
        WorkerInfo,
    )
    from framework.download.backend import DownloadBackend
    from framework.download.manager import DownloadManager, cached_path
    from framework.errors import ConfigError, DownloadError, FrameworkError, WorkerError
    from framework.hookspecs import hookimpl, hookspec
    from framework.registry import Registrable


__getattr__, __dir__ = _lazy_exports(__name__, _LOCATIONS)

# The composition root: no layer imports one above it, so the root, above them all,
# joins them. Importing `framework.cli.run_config` imports the config layer, which gives
# the registry its config builder (`Registrable.from_config`), and gives the config layer
# the shape of a `framework run` config (`framework.config.validate(config)`). Neither
# imports torch.
import framework.cli.run_config  # noqa: E402,F401
