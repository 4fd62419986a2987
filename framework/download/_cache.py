"""Cache entries: where a URL's file, sidecar, lock and extracted folder live.

An entry is named by a stable hash of the URL plus a readable suffix taken from
the file name, so ``ls`` in the cache folder still tells entries apart. The
sidecar JSON (url, etag, size, sha256, time) is what makes a cache hit cheap: a
``stat`` of the file and one small read, never a re-hash.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import socket
import time
from pathlib import Path
from typing import Any, Final, Optional, TypedDict
from urllib.parse import unquote, urlsplit

__all__ = [
    "HOST",
    "Entry",
    "Metadata",
    "dead_leftovers",
    "is_alive_local",
    "parse_owner",
    "read_metadata",
    "unique_token",
    "write_json_atomic",
]

_SUFFIX_CHARS: Final = re.compile(r"[^A-Za-z0-9._-]+")
# This host, as it appears in temporary file names (no dots: names are split on them).
HOST: Final = re.sub(r"[^A-Za-z0-9-]+", "-", socket.gethostname()) or "host"


class Metadata(TypedDict):
    """The sidecar of a published file."""

    url: str
    etag: Optional[str]
    size: int
    sha256: str
    time: float


def unique_token() -> str:
    """``host.pid.random``: names temporary files so that each process owns its own."""
    return f"{HOST}.{os.getpid()}.{secrets.token_hex(4)}"


def parse_owner(name: str) -> Optional[tuple[str, int]]:
    """The (host, pid) in a name made with `unique_token`, followed by one more suffix."""
    parts = name.split(".")
    if len(parts) < 5:
        return None
    try:
        return parts[-4], int(parts[-3])
    except ValueError:
        return None


def is_alive_local(host: str, pid: int) -> bool:
    """Whether `pid` still runs; True (unknown, so assume alive) for another host."""
    if host != HOST:
        return True
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def dead_leftovers(target: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """Temporary siblings of `target` (``target.<token>.<suffix>``) whose owner
    process, on this host, is dead: safe to remove."""
    prefix = target.name + "."
    try:
        names = os.listdir(target.parent)
    except OSError:
        return []
    return [
        target.parent / name
        for name in names
        if name.startswith(prefix)
        and name.endswith(suffixes)
        and (owner := parse_owner(name)) is not None
        and not is_alive_local(*owner)
    ]


def _readable_suffix(url: str) -> str:
    path = unquote(urlsplit(url).path) if "://" in url else url
    name = path.rstrip("/").rsplit("/", 1)[-1]
    name = _SUFFIX_CHARS.sub("_", name).strip("._")
    return name[-64:] or "download"


class Entry:
    """The paths of one URL's cache entry inside `cache_dir`."""

    __slots__ = ("extracted", "final", "lock", "sidecar", "url")

    def __init__(self, cache_dir: Path, url: str) -> None:
        digest = hashlib.sha256(url.encode("utf-8")).hexdigest()[:20]
        name = f"{digest}-{_readable_suffix(url)}"
        self.url = url
        self.final = cache_dir / name
        self.sidecar = cache_dir / f"{name}.json"
        self.lock = cache_dir / f"{name}.lock"
        self.extracted = cache_dir / f"{name}-extracted"

    def lookup(self, sha256: Optional[str]) -> Optional[Metadata]:
        """The sidecar if the file is published, its size matches, and so does `sha256`.

        Costs one ``stat`` and one small read; the file itself is never read.
        """
        try:
            size = os.stat(self.final).st_size
        except OSError:
            return None
        meta = read_metadata(self.sidecar)
        if meta is None or meta.get("size") != size:
            return None
        if sha256 is not None and meta.get("sha256") != sha256.lower():
            return None
        return meta

    def publish_metadata(self, etag: Optional[str], size: int, sha256: str) -> None:
        meta: Metadata = {
            "url": self.url,
            "etag": etag,
            "size": size,
            "sha256": sha256,
            "time": time.time(),
        }
        write_json_atomic(self.sidecar, dict(meta))


def read_metadata(path: Path) -> Optional[Metadata]:
    try:
        with open(path, "rb") as file:
            data: Any = json.loads(file.read())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    meta: Metadata = data  # type: ignore[assignment]
    return meta


def write_json_atomic(path: Path, data: dict[str, Any], durable: bool = True) -> None:
    """Write JSON to a unique temporary name (fsynced if `durable`), then ``os.replace``."""
    temp = path.with_name(f"{path.name}.{unique_token()}.tmp")
    try:
        with open(temp, "w", encoding="utf-8") as file:
            json.dump(data, file)
            if durable:
                file.flush()
                os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
