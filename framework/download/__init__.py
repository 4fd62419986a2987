"""The atomic-publish download manager.

`cached_path` fetches a URL once into a cache folder, however many processes ask
at the same time, and returns the path of verified bytes; nobody ever sees a
partial file. `DownloadBackend` is the small interface a URL scheme implements;
`RedactingFilter` keeps URL secrets out of a backend's logs. `resolve_shards` turns a
spec naming many files (a list, a glob, a brace range, a manifest) into `Shard`s.

```python
from framework import cached_path

path = cached_path("https://example.org/corpus.tar.gz", sha256="9f86d0...", extract=True)
```

Each entry in the cache folder (`$FRAMEWORK_CACHE`, else `~/.cache/framework`)
is named by a hash of its URL plus the file name, with files next to it:
`<name>` (the bytes), `<name>.json` (url, etag, size, sha256, time),
`<name>.lock` (and `.lock.owner`: who is downloading), `<name>-extracted/`
(and `<name>-extracted.json`: the sha256 of the archive it was extracted from),
and, in `.framework-partial-<uid>/` while a download runs, its partial file
`<name>.<etag>.<host>.<pid>.<token>.part` and other temporaries. `inventory` lists,
verifies and trims them (`framework cache ls|verify|prune`).
"""

from __future__ import annotations

from framework._redact import RedactingFilter
from framework.download.backend import ByteStream, DownloadBackend, ListedObject, RemoteInfo
from framework.download.manager import DownloadManager, cached_path, default_cache_dir
from framework.download.shards import Shard, resolve_shards

__all__ = [
    "ByteStream",
    "DownloadBackend",
    "DownloadManager",
    "ListedObject",
    "RedactingFilter",
    "RemoteInfo",
    "Shard",
    "cached_path",
    "default_cache_dir",
    "resolve_shards",
]
