"""Safe, atomic extraction of tar and zip archives.

Members are checked before anything is written: no absolute paths, nothing that
resolves outside the target (compared with `os.path.commonpath`, so a sibling
such as ``data-evil`` next to ``data`` does not pass as a prefix), no links
pointing outside, no devices or FIFOs, and caps on the total size and on the
expansion ratio (zip bombs). Everything is extracted into a temporary folder next
to the target, which appears at the target only through ``os.replace``.
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
import zipfile
from pathlib import Path
from typing import Any, Final, Optional

import attrs

from framework.download._cache import dead_leftovers, unique_token
from framework.errors import DownloadError, UnsafeArchiveError

__all__ = [
    "DEFAULT_MAX_RATIO",
    "DEFAULT_MAX_SIZE",
    "ExtractLimits",
    "check_member_path",
    "extract_archive",
]

DEFAULT_MAX_SIZE: Final = 64 << 30
DEFAULT_MAX_RATIO: Final = 200.0

# Below this many uncompressed bytes, no ratio is suspicious.
_RATIO_FLOOR: Final = 1 << 20


@attrs.frozen
class ExtractLimits:
    """Caps on what an archive may expand to."""

    max_total_size: int = DEFAULT_MAX_SIZE
    max_ratio: float = DEFAULT_MAX_RATIO


def check_member_path(root: str, name: str, url: str) -> str:
    """The absolute path `name` extracts to under `root`, or `UnsafeArchiveError`."""
    if name.startswith(("/", "\\")) or os.path.isabs(name) or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchiveError(url, name, "absolute path")
    path = os.path.normpath(os.path.join(root, name))
    if os.path.commonpath([root, path]) != root:
        raise UnsafeArchiveError(url, name, "path escapes the target folder ('..')")
    return path


def _check_link(root: str, member: str, source_dir: str, link: str, url: str, kind: str) -> None:
    if not link or os.path.isabs(link) or link.startswith(("/", "\\")):
        raise UnsafeArchiveError(url, member, f"{kind} to an absolute path {link!r}")
    target = os.path.normpath(os.path.join(source_dir, link))
    if os.path.commonpath([root, target]) != root:
        raise UnsafeArchiveError(url, member, f"{kind} pointing outside the target: {link!r}")


class _Budget:
    def __init__(self, archive_size: int, limits: ExtractLimits, url: str) -> None:
        self.archive_size = max(archive_size, 1)
        self.limits = limits
        self.url = url
        self.total = 0

    def add(self, member: str, size: int) -> None:
        self.total += size
        if self.total > self.limits.max_total_size:
            raise UnsafeArchiveError(
                self.url,
                member,
                f"the archive expands past the size cap of {self.limits.max_total_size} bytes",
            )
        ratio = self.total / self.archive_size
        if self.total > _RATIO_FLOOR and ratio > self.limits.max_ratio:
            raise UnsafeArchiveError(
                self.url,
                member,
                f"expansion ratio {ratio:.0f}:1 exceeds {self.limits.max_ratio:g}:1 (zip bomb?)",
            )


def _extract_tar(archive: Path, root: str, limits: ExtractLimits, url: str) -> None:
    budget = _Budget(archive.stat().st_size, limits, url)
    extra: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    with tarfile.open(archive, "r:*") as tar:
        for member in tar:  # one pass: check each member, then extract it
            path = check_member_path(root, member.name, url)
            if member.isdev() or member.isfifo():
                raise UnsafeArchiveError(url, member.name, "device or FIFO member")
            if member.issym():
                _check_link(root, member.name, os.path.dirname(path), member.linkname, url, "symlink")
            elif member.islnk():
                _check_link(root, member.name, root, member.linkname, url, "hard link")
            elif not (member.isfile() or member.isdir()):
                raise UnsafeArchiveError(url, member.name, "unsupported member type")
            budget.add(member.name, member.size)
            try:
                tar.extract(member, root, **extra)
            except tarfile.TarError as error:  # FilterError: the stdlib's second opinion
                raise UnsafeArchiveError(url, member.name, str(error)) from error


def _extract_zip(archive: Path, root: str, limits: ExtractLimits, url: str) -> None:
    budget = _Budget(archive.stat().st_size, limits, url)
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        for info in infos:  # check all before writing anything: the directory is up front
            check_member_path(root, info.filename, url)
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode):
                raise UnsafeArchiveError(url, info.filename, "link, device or FIFO member")
            budget.add(info.filename, info.file_size)
        for info in infos:
            # ZipExtFile stops at the declared file_size, so the caps above hold.
            zf.extract(info, root)


def _sweep(target: Path) -> None:
    """Remove temporary folders left by dead extractors of `target` on this host."""
    for leftover in dead_leftovers(target, (".tmp", ".old")):
        shutil.rmtree(leftover, ignore_errors=True)


def extract_archive(archive: Path, target: Path, url: str, limits: ExtractLimits, *, replace: bool) -> Path:
    """Extract `archive` to `target` atomically; with `replace`, swap out an old `target`."""
    _sweep(target)
    temp = target.with_name(f"{target.name}.{unique_token()}.tmp")
    os.mkdir(temp)
    try:
        root = os.path.realpath(temp)
        if zipfile.is_zipfile(archive):
            _extract_zip(archive, root, limits, url)
        elif tarfile.is_tarfile(archive):
            _extract_tar(archive, root, limits, url)
        else:
            raise DownloadError(url, "--extract: not a tar or zip archive")
        old: Optional[Path] = None
        if replace and target.exists():
            old = target.with_name(f"{target.name}.{unique_token()}.old")
            os.rename(target, old)
        try:
            os.replace(temp, target)
        except OSError:
            if not target.is_dir():
                raise
            # Another process published the same extraction first: use theirs.
            shutil.rmtree(temp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return target
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
