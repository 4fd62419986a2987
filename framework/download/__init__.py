"""The atomic-publish download manager.

`cached_path` fetches a URL once into a cache folder, however many processes ask
at the same time, and returns the path of verified bytes; nobody ever sees a
partial file. `DownloadBackend` is the small interface a URL scheme implements.
"""

from __future__ import annotations

from framework.download.backend import ByteStream, DownloadBackend, RemoteInfo
from framework.download.manager import DownloadManager, cached_path, default_cache_dir

__all__ = [
    "ByteStream",
    "DownloadBackend",
    "DownloadManager",
    "RemoteInfo",
    "cached_path",
    "default_cache_dir",
]
