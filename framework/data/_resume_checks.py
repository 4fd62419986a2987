"""What a saved state is checked against before a pass resumes from it: digests of
instances at fixed places of an eager cache, the reader's class, the settings that
decide which records an epoch yields, and stamps of the local files read (a file
changed since is refused, not read on at the wrong record)."""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from collections.abc import Mapping
from typing import Any, Optional

from framework.data._shards import digest_of
from framework.errors import ResumeError
from framework.registry import import_target, imports_allowed

__all__ = [
    "check_files",
    "check_reader",
    "check_samples",
    "check_settings",
    "file_stamps",
    "fingerprint",
    "sample_digests",
]


SAMPLES_PER_RANK = 16  # eager mode: instances of a rank's cache whose digests a state keeps


def sample_digests(instances: list[Any], indexes: Optional[list[int]], rank: int) -> dict[str, str]:
    """Digests of instances at fixed places of a rank's eager cache, keyed by record
    index (comparable in any split) or, when records are unknown, by rank and place."""
    count = len(instances)
    spots = range(SAMPLES_PER_RANK)
    places = sorted({k * (count - 1) // (SAMPLES_PER_RANK - 1) for k in spots}) if count else []
    return {_sample_key(place, indexes, rank): digest_of(instances[place]) for place in places}


def check_samples(saved: Any, instances: list[Any], indexes: Optional[list[int]], rank: int) -> None:
    """ValueError unless this cache (of the split the state was saved in) has the
    instances `saved` (`sample_digests`) describes: an eager state holds positions in it."""
    if not isinstance(saved, Mapping):
        return  # a state from before the samples, or a lazy one
    if indexes is not None:
        places = {f"record {index}": place for place, index in enumerate(indexes)}
    else:
        places = {f"rank {rank} instance {place}": place for place in range(len(instances))}
    for key, digest in saved.items():
        place = places.get(key)
        if place is None:
            continue
        found = digest_of(instances[place])
        if found != digest:
            raise ResumeError(
                f"cannot resume exactly: the reader yielded another instance for {key} "
                f"(digest {found}) than when the state was saved ({digest}). The reader is "
                "not deterministic (its order or its instances change from run to run: a set "
                "or a directory listing iterated, a draw outside the loader's seeded streams) "
                "or the data changed, so the saved position would repeat and skip instances. "
                "Make the reader yield the same instances in the same order every run, or "
                "start the epoch afresh without load_state_dict()",
                "not_deterministic",
            )


def _sample_key(place: int, indexes: Optional[list[int]], rank: int) -> str:
    return f"record {indexes[place]}" if indexes is not None else f"rank {rank} instance {place}"


def check_reader(reader: Any) -> None:
    """ValueError if `reader` declares that it is not deterministic (`deterministic = False`)."""
    if getattr(reader, "deterministic", True) is False:
        raise ResumeError(
            f"{type(reader).__name__} declares deterministic = False: its instances or their "
            "order may change from run to run, so a saved position cannot be resumed "
            "exactly (it would repeat and skip instances). Start the epoch afresh without "
            "load_state_dict(), or make the reader deterministic",
            "not_deterministic",
        )


def check_settings(saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """ValueError unless a state saved under `saved` settings is valid under `current`.

    These say which instances exist and how they batch: resuming across another of
    them would silently repeat, skip or re-batch instances. (num_workers and world size
    are not among them: another split resumes.)
    """
    if bool(saved.get("lazy")) != current["lazy"]:
        raise ResumeError(
            "the state was saved by a loader in the other mode (eager/lazy); build the "
            "loader with the same max_instances_in_memory to resume it",
            "settings_differ",
        )
    for key, value in current.items():
        if key not in saved:
            raise ResumeError(
                f"the state's settings lack {key!r}; pass the loader's own state_dict()", "malformed"
            )
        if not _same_setting(saved[key], value, is_type=key == "reader"):
            raise ResumeError(
                f"the state was saved by a loader with {key}={saved[key]!r}, but this loader "
                f"has {key}={value!r}: resuming would repeat or skip instances. Build the "
                f"loader with {key}={saved[key]!r} to resume this state, or start without it",
                "settings_differ",
            )


# A data file's fingerprint: every byte of a file up to WHOLE bytes; above, the size,
# the first and last EDGE bytes and SAMPLES blocks of BLOCK bytes at fixed offsets
# (about 0.25 MiB read, whatever the size).
WHOLE = 1 << 20
EDGE = 64 << 10
SAMPLES = 32
BLOCK = 4 << 10

_fingerprints: dict[tuple[int, ...], str] = {}  # by (device, inode, size, mtime, ctime)


def fingerprint(path: str) -> Optional[str]:
    """A digest of the content of the local file `path` (None: no such file): a copy
    fingerprints the same, a reorder of its records changes it (see WHOLE)."""
    try:
        # Non-blocking: a FIFO put in the file's place is refused below, never waited on.
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(descriptor, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                return None
            key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
            known = _fingerprints.get(key)  # state_dict() runs often: read the file once
            if known is not None:
                return known
            size = info.st_size
            digest = hashlib.sha256(f"framework-data-file:{size}:".encode())
            if size <= WHOLE:
                digest.update(handle.read())
            else:
                offsets = [0, size - EDGE]
                offsets += [EDGE + k * (size - 2 * EDGE - BLOCK) // (SAMPLES - 1) for k in range(SAMPLES)]
                for offset in offsets:
                    handle.seek(offset)
                    digest.update(handle.read(EDGE if offset in (0, size - EDGE) else BLOCK))
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    value = digest.hexdigest()[:32]
    if len(_fingerprints) > 4096:
        _fingerprints.clear()
    _fingerprints[key] = value
    return value


def file_stamps(data_path: Any) -> dict[str, Any]:
    """`{path: {"size": bytes, "sha256": fingerprint}}` of the local files `data_path`
    names (a path or a list of paths; anything else names none): a state's positions
    (record indexes, byte offsets) hold only for the same data. By content, not by
    mtime: a byte-identical copy (re-staged data) is the same data."""
    paths = data_path if isinstance(data_path, list) else [data_path]
    stamps: dict[str, Any] = {}
    for path in paths:
        if isinstance(path, (str, os.PathLike)) and os.path.isfile(path):
            name = os.fspath(path)
            digest = fingerprint(name)
            if digest is not None:
                stamps[name] = {"size": os.stat(name).st_size, "sha256": digest}
    return stamps


def check_files(saved: Any) -> None:
    """ValueError unless the files stamped in `saved` (`file_stamps`) are unchanged."""
    if saved is None:  # a state from before the stamps
        return
    if not (isinstance(saved, Mapping) and all(_stamp_ok(stamp) for stamp in saved.values())):
        raise ResumeError(
            "the state's 'files' must map each data file to its size and fingerprint, got "
            f"{saved!r}; pass the loader's own state_dict()",
            "malformed",
        )
    for path, stamp in saved.items():
        if isinstance(stamp, list):  # a state from before the fingerprints: [size, mtime_ns]
            found = None
            if not os.path.isfile(path):
                found = "it is gone"
            elif [os.stat(path).st_size, os.stat(path).st_mtime_ns] != stamp:
                found = "its size or mtime differs"
        else:
            now = file_stamps(path).get(path)
            found = None
            if now is None:
                found = "it is gone"
            elif now["size"] != stamp["size"]:
                found = f"size {stamp['size']} -> {now['size']}"
            elif now["sha256"] != stamp["sha256"]:
                found = "same size, other content: records rewritten or reordered"
        if found is not None:
            raise ResumeError(
                f"data file {path} changed since the state was saved ({found}): the saved "
                "positions would land on other records (mid-line, past the end). Resume with "
                "the unchanged file, or start the epoch afresh without load_state_dict()",
                "files_changed",
            )


def _stamp_ok(stamp: Any) -> bool:
    if isinstance(stamp, list):
        return len(stamp) == 2 and all(isinstance(x, int) for x in stamp)
    return (
        isinstance(stamp, Mapping)
        and isinstance(stamp.get("size"), int)
        and isinstance(stamp.get("sha256"), str)
    )


def _same_setting(saved: Any, current: Any, *, is_type: bool = False) -> bool:
    """Equal; inside a component's settings (`describe`) a None on either side matches
    anything: it may be filled in on first use (a sampler's guessed sorting keys). A
    class path (`is_type`, a component's "type") matches a class that has moved since."""
    if is_type:
        return _same_class(saved, current)
    if isinstance(saved, Mapping) and isinstance(current, Mapping):
        return saved.keys() == current.keys() and all(
            saved[key] is None
            or current[key] is None
            or _same_setting(saved[key], current[key], is_type=key == "type")
            for key in saved
        )
    return bool(saved == current)


def _same_class(saved: Any, current: Any) -> bool:
    """Whether a class path a state recorded names the class `current` names: the same
    path, or the old path of a class that moved, where its old module still re-exports
    it (`framework_plugins.samplers.BucketBatchSampler`). A rule, not a table of old
    names: every move that keeps an alias keeps the states saved before it."""
    if saved == current:
        return True
    if not (isinstance(saved, str) and isinstance(current, str)):
        return False
    # Only a path that ends in the same class name is resolved, so a state naming
    # another class imports nothing. Its module is imported (running its code) only
    # through the gate for dotted paths from a config (`FRAMEWORK_REGISTERED_TYPES_ONLY`):
    # a saved state is the user's own, as trusted as the config that built the loader.
    if saved.rpartition(".")[2] != current.rpartition(".")[2]:
        return False
    mine = _resolved(current)
    return mine is not None and _resolved(saved) is mine


def _resolved(path: str) -> Any:
    """The object a `module.Name` path names, or None when it cannot be had safely."""
    module_name, _, name = path.rpartition(".")
    module = sys.modules.get(module_name)
    if module is not None:
        return getattr(module, name, None)
    if not imports_allowed():
        return None
    try:
        return import_target(path)
    except Exception:  # gone, or failing to import: not the same class
        return None
