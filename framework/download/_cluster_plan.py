"""What the ranks of a cluster fetch decide from each other's probes: which copy a
cache folder holds, which folders are one (their markers), which rank leads a folder,
which fetches from the origin, which copy is newest, and which device moves the bytes."""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Collection, Sequence
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Optional

import attrs
import torch
import torch.distributed as dist

from framework.download._cache import NEW_FILE_FLAGS, Metadata, find_work_folder
from framework.download._collective import POLL_S as POLL_S
from framework.download._collective import _decode as _decode
from framework.download._collective import _encode as _encode
from framework.download._partial import (
    PartialName,
    orphaned,
    ours,
    remove_quietly,
)
from framework.download._validators import NO_VALIDATOR
from framework.errors import DownloadError

if TYPE_CHECKING:
    pass

logger = logging.getLogger("framework.download")

_MARKER_PREFIX: Final = ".framework-cluster-"
_STALE_MARKER_S: Final = 3600.0  # a marker lives for two steps: an older one is a killed rank's


@attrs.frozen
class _Held:
    """The verified copy a cache folder holds: its sha256 and what dates its version."""

    sha256: str
    last_modified: Optional[float]  # the server's Last-Modified, as a timestamp
    fetched: float  # when it was fetched (the sidecar's time)

    @classmethod
    def of(cls, meta: Optional[Metadata]) -> Optional[_Held]:
        if meta is None:
            return None
        modified = None
        if meta.get("last_modified"):
            try:
                modified = parsedate_to_datetime(meta["last_modified"] or "").timestamp()
            except (TypeError, ValueError, IndexError, OverflowError):
                modified = None
        return cls(meta["sha256"], modified, float(meta.get("time") or 0.0))


@attrs.frozen
class _Probe:
    """What one rank tells the others first."""

    args: tuple[Any, ...]  # the arguments that must agree across ranks
    marker: Optional[str]  # the marker file it wrote into its cache folder, if it could
    held: Optional[_Held]  # the verified copy its cache holds
    offline: bool  # its manager may not contact the origin
    device: str  # the device type it would move the bytes on (every rank must use one)

    @property
    def writable(self) -> bool:
        return self.marker is not None


@attrs.frozen
class _Source:
    """What the sending rank tells the receivers about the file."""

    sha256: str
    size: int
    etag: Optional[str]
    last_modified: Optional[str]
    fetched: float  # when the sender's copy was fetched: a received copy is as old as that


def _identity(meta: Metadata) -> tuple[int, int, int]:
    return meta["inode"], meta["size"], meta["mtime_ns"]


def _groups(seen: Sequence[Sequence[int]]) -> list[int]:
    """Each rank's group leader: ranks are in one group when one saw the other's marker
    (directly or through others); the leader is the group's lowest rank."""
    leader = list(range(len(seen)))

    def find(rank: int) -> int:
        while leader[rank] != rank:
            leader[rank] = leader[leader[rank]]
            rank = leader[rank]
        return rank

    for rank, others in enumerate(seen):
        for other in others:
            a, b = find(rank), find(other)
            leader[max(a, b)] = min(a, b)
    return [find(rank) for rank in range(len(seen))]


def _leaders(group_of: Sequence[int], probes: Sequence[_Probe]) -> list[int]:
    """Each rank's folder leader: the lowest rank of its group that can write the folder
    and reach the origin, else the lowest that can write, else the lowest."""
    best: dict[int, int] = {}
    for rank, group in enumerate(group_of):
        if group not in best or _rank_key(rank, probes) < _rank_key(best[group], probes):
            best[group] = rank
    return [best[group] for group in group_of]


def _rank_key(rank: int, probes: Sequence[_Probe]) -> tuple[bool, bool, int]:
    return not probes[rank].writable, probes[rank].offline, rank


def _origin_fetcher(leaders: Sequence[int], probes: Sequence[_Probe]) -> int:
    """The leader that fetches from the origin: one that can write and is online first."""
    return min(leaders, key=lambda rank: _rank_key(rank, probes))


def _newest(holders: Sequence[int], held: dict[int, Optional[_Held]]) -> int:
    """The holder of the newest copy (without a sha256 the folders may hold different
    versions: an older one never replaces a newer one). By the server's Last-Modified
    when every copy has one, else by when it was fetched; the lowest rank on a tie."""
    copies = {rank: held[rank] for rank in holders}
    by_modified = all(copy is not None and copy.last_modified is not None for copy in copies.values())

    def key(rank: int) -> tuple[float, float, int]:
        copy = copies[rank]
        assert copy is not None
        return (copy.last_modified or 0.0) if by_modified else 0.0, copy.fetched, -rank

    return max(holders, key=key)


def _digest(held: Optional[_Held]) -> Optional[str]:
    return held.sha256 if held is not None else None


def _device_type(config: str, accelerators: Collection[str]) -> Optional[str]:
    """The device type for the transfer's tensors, from the default group's backend
    config (`"cpu:gloo,cuda:nccl"`, or a bare `"nccl"`): an accelerator this process
    has whose backend is not gloo (NCCL's fast interconnect), else the CPU when it has
    a backend, else an accelerator that has one; None when none will do."""
    pairs = []
    for part in config.lower().split(","):
        device, colon, backend = part.strip().rpartition(":")
        pairs.append((device if colon else _BARE_BACKENDS.get(backend, "cpu"), backend))
    for device, backend in pairs:
        if device != "cpu" and backend != "gloo" and device in accelerators:
            return device
    if any(device == "cpu" for device, _ in pairs):
        return "cpu"
    for device, _ in pairs:
        if device in accelerators:
            return device
    return None


_BARE_BACKENDS: Final = {"nccl": "cuda", "xccl": "xpu", "hccl": "hpu", "gloo": "cpu", "mpi": "cpu"}


def _transfer_device(url: str) -> torch.device:
    """The device on which the default group moves the file's bytes (chosen before any
    download: a group that can move none is refused first, on every rank alike)."""
    accelerators = set()
    for name in ("cuda", "xpu", "hpu", "mps"):
        module = getattr(torch, name, None)
        try:
            if module is not None and module.is_available():
                accelerators.add(name)
        except Exception:  # a half-installed accelerator runtime
            continue
    config = str(dist.get_backend_config())
    kind = _device_type(config, accelerators)
    if kind is None:
        raise DownloadError(
            url,
            "cached_path(distributed=True) moves the bytes over the default process group, "
            f"which has no backend for the CPU nor for an accelerator this process has (its "
            f"backends: {config}); initialize it with a backend for one (gloo for the CPU)",
        )
    if kind == "cpu":
        return torch.device("cpu")
    current = getattr(getattr(torch, kind, None), "current_device", None)
    return torch.device(kind, current()) if callable(current) else torch.device(kind)


def _sweep(root: Path) -> None:
    """One listing of `root` for what killed calls left: markers older than
    `_STALE_MARKER_S`, and the partial files a dead receiver (or any dead writer whose
    file no later call could resume) left in this user's work folder, whatever their
    URL: this user's, untagged, their writer gone. A URL never asked for again would
    otherwise keep them forever."""
    try:
        names = os.listdir(root)
    except OSError:
        return
    now = time.time()
    for found in names:
        if found.startswith(_MARKER_PREFIX):
            try:
                if now - os.lstat(root / found).st_mtime > _STALE_MARKER_S:
                    os.unlink(root / found)
            except OSError:
                pass
    folder = find_work_folder(root / "any")
    if folder is None:  # none yet, or planted: never listed or swept through
        return
    try:
        work = os.listdir(folder)
    except OSError:
        return
    for found in work:
        name = PartialName.parse(root, found, folder)
        if name is None or name.tag != NO_VALIDATOR:
            continue  # a download's: the next plain call adopts it and resumes
        try:
            info = os.lstat(name.path)
        except OSError:
            continue
        if ours(info) and orphaned(name, info, now):
            remove_quietly(name.path)


def _write_marker(root: Path) -> Optional[Path]:
    """A new empty file with a random name in `root`; None if the folder is read-only
    (the rank then only looks for the others' markers)."""
    marker = root / f"{_MARKER_PREFIX}{secrets.token_hex(16)}"
    try:
        os.close(os.open(marker, NEW_FILE_FLAGS, 0o644))
    except OSError:
        return None
    return marker


def _exists(path: Path) -> bool:
    try:
        os.lstat(path)
    except OSError:
        return False
    return True


def _remove_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
