"""Safe, atomic extraction of tar and zip archives.

An archive is untrusted input. The format is chosen by the file's first bytes, never
by its name. Each member is checked twice before it is written: by name (no absolute
paths, nothing that normalises outside the target, compared with
`os.path.commonpath` so a sibling such as `data-evil` next to `data` does not
pass as a prefix) and against the real extracted tree (no folder on its path may be
a symlink, nothing is written through an existing symlink, link targets are resolved
with `os.path.realpath`), so a chain of links cannot lead outside even where
`tarfile` has no data filter (Python < 3.12 before the 2023 backports). A final walk
checks that every symlink left in the tree points inside it. Devices, FIFOs and
sparse members are refused; the member count, the total size and the expansion ratio
are capped, counting declared sizes before writing and, for zip, the bytes really
written. A damaged archive raises `CorruptArchiveError`. Everything is extracted into
a temporary folder next to the target, which appears at the target only through
`os.replace`. A marker next to the folder (`<folder>.json`) records the sha256 of
the archive it came from, so a folder left from an older archive is never served for
a newer one; the old marker goes before the old folder does.
"""

from __future__ import annotations

import copy
import lzma
import os
import shutil
import stat
import tarfile
import zipfile
import zlib
from pathlib import Path
from typing import IO, Any, Final, Optional, Union

import attrs

from framework.download._cache import (
    dead_leftovers,
    enter_work_folder,
    parse_json,
    read_small_file,
    unique_token,
    write_json_atomic,
)
from framework.errors import CorruptArchiveError, DownloadError, UnsafeArchiveError

__all__ = [
    "DEFAULT_MAX_MEMBERS",
    "DEFAULT_MAX_RATIO",
    "DEFAULT_MAX_SIZE",
    "ExtractLimits",
    "archive_format",
    "check_member_path",
    "extract_archive",
    "extracted_from",
]

DEFAULT_MAX_SIZE: Final = 64 << 30
DEFAULT_MAX_RATIO: Final = 200.0
DEFAULT_MAX_MEMBERS: Final = 1_000_000

# Below this many uncompressed bytes, no ratio is suspicious.
_RATIO_FLOOR: Final = 1 << 20
_COPY_CHUNK: Final = 1 << 20
_O_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)

# Leading bytes of each format we read; "ustar" sits at offset 257 of a tar header.
_ZIP_MAGIC: Final = (b"PK\x03\x04", b"PK\x05\x06")
_TAR_COMPRESSED_MAGIC: Final = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")

# What the readers raise for damaged input (bz2 raises OSError without an errno).
_CORRUPT: Final = (
    EOFError,
    zipfile.BadZipFile,
    zlib.error,
    lzma.LZMAError,
    tarfile.ReadError,
    NotImplementedError,  # a zip compression method we cannot read
)
# The data filter's refusals (Python 3.12, and 3.8-3.11 since the 2023 backports).
_TAR_REFUSED: Final = (getattr(tarfile, "FilterError", tarfile.ExtractError), tarfile.ExtractError)


@attrs.frozen
class ExtractLimits:
    """Caps on what an archive may expand to."""

    max_total_size: int = DEFAULT_MAX_SIZE
    max_ratio: float = DEFAULT_MAX_RATIO
    max_members: int = DEFAULT_MAX_MEMBERS


def _tar_header(head: bytes) -> bool:
    """Whether `head` is a tar header whose checksum holds (v7, ustar, GNU or PAX)."""
    try:
        tarfile.TarInfo.frombuf(head, "utf-8", "surrogateescape")
    except (tarfile.HeaderError, ValueError):
        return False
    return True


def archive_format(archive: Union[Path, IO[bytes]]) -> Optional[str]:
    """`"zip"`, `"tar"`, `"ambiguous"` or `None`, from the file's content (its name
    is ignored).

    A valid tar header is checked first: a tar whose first member is named `PK\x03\x04`
    starts with the zip magic, and a zip appended as its last member would then be read in
    its place. A file that is both a valid tar header and starts like a zip is
    `"ambiguous"`, which the extractor refuses."""
    if isinstance(archive, Path):
        with open(archive, "rb") as file:
            head = file.read(512)
    else:  # an open archive: read from its start, and leave it there
        archive.seek(0)
        head = archive.read(512)
        archive.seek(0)
    zip_magic = head.startswith(_ZIP_MAGIC)
    if len(head) == 512 and _tar_header(head):
        return "ambiguous" if zip_magic else "tar"
    if zip_magic:
        return "zip"
    # A ustar magic with a bad checksum is a damaged tar (CorruptArchiveError), not "no archive".
    if head.startswith(_TAR_COMPRESSED_MAGIC) or head[257:262] == b"ustar":
        return "tar"
    return None


def check_member_path(root: str, name: str, url: str) -> str:
    """The absolute path `name` extracts to under `root`, or `UnsafeArchiveError`."""
    if "\x00" in name:
        raise UnsafeArchiveError(url, name, "NUL byte in the name")
    if name.startswith(("/", "\\")) or os.path.isabs(name) or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchiveError(url, name, "absolute path")
    path = os.path.normpath(os.path.join(root, name))
    if not _inside(root, path):
        raise UnsafeArchiveError(url, name, "path escapes the target folder ('..')")
    return path


def _inside(root: str, path: str) -> bool:
    return os.path.commonpath([root, path]) == root


def _check_parents(root: str, path: str, member: str, url: str) -> None:
    """Refuse `member` when a folder between `root` and `path` exists but is not a real folder."""
    relative = os.path.relpath(os.path.dirname(path), root)
    if relative == os.curdir:
        return
    current = root
    for part in relative.split(os.sep):
        current = os.path.join(current, part)
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            return  # the rest is created by the extractor, as real folders
        folder = os.path.relpath(current, root)
        if stat.S_ISLNK(mode):
            raise UnsafeArchiveError(url, member, f"its folder {folder!r} is a symlink")
        if not stat.S_ISDIR(mode):
            raise UnsafeArchiveError(url, member, f"its folder {folder!r} is a file")


def _clear_target(path: str, member: str, url: str, is_dir: bool, is_link: bool = False) -> None:
    """Make room for a member at `path`: never write through a link left by an earlier member
    (a new link may replace one: making a link does not follow the old one)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        if not is_link:
            raise UnsafeArchiveError(
                url, member, "it would be written through a symlink of an earlier member"
            )
        os.unlink(path)
        return
    if stat.S_ISDIR(mode):
        if not is_dir:
            raise UnsafeArchiveError(url, member, "a folder of an earlier member has that name")
        return
    if is_dir:
        raise UnsafeArchiveError(url, member, "a file of an earlier member has that name")
    os.unlink(path)  # a duplicate member replaces the file, not a hard link's other names


def _check_link(root: str, member: str, path: str, link: str, url: str, *, hard: bool) -> str:
    """Refuse a link reaching outside `root`; return the link target to write: a hard
    link's normalised path from `root` (what was checked), a symlink's own text."""
    kind = "hard link" if hard else "symlink"
    if "\x00" in link:
        raise UnsafeArchiveError(url, member, f"NUL byte in the {kind} target")
    if not link or os.path.isabs(link) or link.startswith(("/", "\\")):
        raise UnsafeArchiveError(url, member, f"{kind} to an absolute path {link!r}")
    # A hard link's target is named from the archive's root, a symlink's from its folder.
    base = root if hard else os.path.dirname(path)
    textual = os.path.normpath(os.path.join(base, link))
    real = os.path.realpath(textual)  # through the links already extracted
    if not (_inside(root, textual) and _inside(root, real)):
        raise UnsafeArchiveError(url, member, f"{kind} pointing outside the target: {link!r}")
    if hard:
        _check_parents(root, textual, member, url)
        try:
            regular = stat.S_ISREG(os.lstat(textual).st_mode)
        except FileNotFoundError:
            regular = False
        if not regular:
            raise UnsafeArchiveError(url, member, f"hard link to {link!r}, which is not an extracted file")
        return os.path.relpath(textual, root)
    return link


def _check_links_stay_inside(root: str, url: str) -> None:
    """Links made early can be redirected by later ones (`a -> .`): check the final tree."""
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            if os.path.islink(path) and not _inside(root, os.path.realpath(path)):
                why = f"symlink pointing outside the target: {os.readlink(path)!r}"
                raise UnsafeArchiveError(url, os.path.relpath(path, root), why)


class _Budget:
    """Counts members and bytes against `ExtractLimits`."""

    def __init__(self, archive_size: int, limits: ExtractLimits, url: str) -> None:
        self.archive_size = max(archive_size, 1)
        self.limits = limits
        self.url = url
        self.total = 0
        self.members = 0

    def member(self, name: str) -> None:
        self.members += 1
        if self.members > self.limits.max_members:
            raise UnsafeArchiveError(
                self.url, name, f"the archive has more than {self.limits.max_members} members"
            )

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


# The most bytes a pax extended header or a GNU long name may declare: tarfile reads one
# whole, in memory, before the member it describes reaches the caps (real ones are a few
# KiB: a long name, a few attributes).
_LARGEST_EXTENDED_HEADER: Final = 1 << 20
_EXTENDED_TYPES: Final = (
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
)


class _HugeHeader(Exception):
    def __init__(self, name: str, size: int) -> None:
        super().__init__(name, size)
        self.name, self.size = name, size


class _CappedTarInfo(tarfile.TarInfo):
    """A member header that refuses an extended header larger than
    `_LARGEST_EXTENDED_HEADER` before tarfile reads it (a pax bomb: a few hundred KB
    of gzip that tarfile would read as GiBs into memory)."""

    def _proc_member(self, tarfile: Any) -> Any:  # tarfile's hook for each header read
        if self.type in _EXTENDED_TYPES and self.size > _LARGEST_EXTENDED_HEADER:
            raise _HugeHeader(self.name, self.size)
        return super()._proc_member(tarfile)  # type: ignore[misc]


def _extract_tar(archive: IO[bytes], root: str, limits: ExtractLimits, url: str) -> None:
    try:
        _extract_tar_members(archive, root, limits, url)
    except _HugeHeader as error:
        raise UnsafeArchiveError(
            url,
            error.name,
            f"an extended header declaring {error.size} bytes (at most {_LARGEST_EXTENDED_HEADER}: "
            "a tar bomb?)",
        ) from None


def _extract_tar_members(archive: IO[bytes], root: str, limits: ExtractLimits, url: str) -> None:
    budget = _Budget(os.fstat(archive.fileno()).st_size, limits, url)
    extra: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    with tarfile.open(fileobj=archive, mode="r:*", tarinfo=_CappedTarInfo) as tar:
        for member in tar:  # one pass: check each member, then extract it
            budget.member(member.name)
            path = check_member_path(root, member.name, url)
            if member.isdev() or member.isfifo():
                raise UnsafeArchiveError(url, member.name, "device or FIFO member")
            if member.issparse():
                raise UnsafeArchiveError(url, member.name, "sparse member (its size on disk is not its size)")
            if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
                raise UnsafeArchiveError(url, member.name, "unsupported member type")
            _check_parents(root, path, member.name, url)
            is_link = member.issym() or member.islnk()
            _clear_target(path, member.name, url, member.isdir(), is_link)
            linkname = member.linkname
            if is_link:
                linkname = _check_link(root, member.name, path, member.linkname, url, hard=member.islnk())
            budget.add(member.name, member.size)
            try:
                tar.extract(_checked_member(member, os.path.relpath(path, root), linkname), root, **extra)
            except _TAR_REFUSED as error:  # the stdlib's second opinion
                raise UnsafeArchiveError(url, member.name, str(error)) from error


def _checked_member(member: tarfile.TarInfo, name: str, linkname: str) -> tarfile.TarInfo:
    """A copy of `member` that writes exactly what was checked, with safe attributes.

    tarfile joins the raw name (`a/../x`) and the kernel resolves it through links made
    earlier, so the copy carries the normalised name and hard-link target. Without the data
    filter, modes and owners are applied as the archive says: no setuid/setgid/sticky bits,
    no group or other write, folders 0o755, owned by us (chown happens only as root)."""
    safe = copy.copy(member)
    safe.name, safe.linkname = name, linkname
    if member.isdir():
        safe.mode = 0o700 if name == os.curdir else 0o755  # the root stays private until published
    elif member.isfile():
        safe.mode = (member.mode & 0o755) | 0o600
    safe.uid, safe.gid, safe.uname, safe.gname = os.getuid(), os.getgid(), "", ""
    return safe


def _write_new(path: str, source: IO[bytes], member: str, written: _Budget) -> None:
    """Copy `source` into a new file at `path`, counting the bytes as they come."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW, 0o666)
    with open(fd, "wb") as target:
        while chunk := source.read(_COPY_CHUNK):
            written.add(member, len(chunk))
            target.write(chunk)


def _extract_zip(archive: IO[bytes], root: str, limits: ExtractLimits, url: str) -> None:
    size = os.fstat(archive.fileno()).st_size
    declared, written = _Budget(size, limits, url), _Budget(size, limits, url)
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        for info in infos:  # check all before writing anything: the directory is up front
            declared.member(info.filename)
            check_member_path(root, info.filename, url)
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode):
                raise UnsafeArchiveError(url, info.filename, "link, device or FIFO member")
            if info.flag_bits & 1:
                raise UnsafeArchiveError(
                    url, info.filename, "encrypted member (a password is needed): extract it yourself"
                )
            declared.add(info.filename, info.file_size)
        for info in infos:
            path = check_member_path(root, info.filename, url)
            _check_parents(root, path, info.filename, url)
            _clear_target(path, info.filename, url, info.is_dir())
            if info.is_dir():
                os.makedirs(path, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(path), exist_ok=True)
            # Headers can lie about sizes: the caps also count the bytes really written.
            with zf.open(info) as source:
                _write_new(path, source, info.filename, written)


def _marker(target: Path) -> Path:
    return target.with_name(f"{target.name}.json")


def extracted_from(target: Path, digest: str) -> bool:
    """Whether `target` is a real folder (never a link to one) extracted from the archive
    whose sha256 is `digest`: the marker names the digest and the folder itself (device,
    inode), so a folder or link put at that name later is not vouched for."""
    try:
        folder = os.lstat(target)
    except OSError:
        return False
    if not stat.S_ISDIR(folder.st_mode):
        return False
    marker = parse_json(read_small_file(_marker(target)))
    return (
        isinstance(marker, dict)
        and marker.get("sha256") == digest
        and marker.get("folder") == [folder.st_dev, folder.st_ino]
    )


def _sweep(target: Path, folder: Path) -> None:
    """Remove temporary folders (and marker files) left in `folder` (`target`'s work
    folder) by dead extractors of `target` on this host."""
    for leftover in dead_leftovers(folder / target.name, (".tmp", ".old")):
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


def _unpack(archive: Union[Path, IO[bytes]], root: str, limits: ExtractLimits, url: str) -> None:
    """Extract into `root`, turning every reader's complaint into a `DownloadError`."""
    if isinstance(archive, Path):
        with open(archive, "rb") as file:
            return _unpack(file, root, limits, url)
    kind = archive_format(archive)
    if kind is None:
        raise DownloadError(url, "--extract: not a tar or zip archive (judged by its content)")
    if kind == "ambiguous":
        raise DownloadError(
            url,
            "--extract: the file reads both as a tar (a valid tar header) and as a zip (it starts "
            "with the zip magic); refusing to guess. Extract it yourself with the tool you trust",
        )
    try:
        if kind == "zip":
            _extract_zip(archive, root, limits, url)
        else:
            _extract_tar(archive, root, limits, url)
    except DownloadError:
        raise
    except _CORRUPT as error:
        raise CorruptArchiveError(url, f"{type(error).__name__}: {error}") from error
    except OSError as error:
        if error.errno is None:  # bz2 and gzip say "invalid data" this way
            raise CorruptArchiveError(url, str(error)) from error
        raise  # a real I/O error (disk full, permissions): extract_archive names the folder
    except Exception as error:  # hostile headers: NaN/huge mtimes, bad hdrcharset, ...
        raise CorruptArchiveError(url, f"{type(error).__name__}: {error}") from error
    _check_links_stay_inside(root, url)


def extract_archive(
    archive: Union[Path, IO[bytes]],
    target: Path,
    url: str,
    limits: ExtractLimits,
    *,
    replace: bool,
    digest: Optional[str] = None,
    in_cache: bool = False,
) -> Path:
    """Extract `archive` to `target` atomically; with `replace`, swap out an old `target`.
    With `digest` (the archive's sha256), mark the folder as extracted from it. With
    `in_cache`, the work folder made for it stays (others of the cache use it).

    `archive` may be an open file: the one whose digest was checked, so what is
    extracted is never something renamed over its path since."""
    try:
        work = enter_work_folder(target)  # the cache folder itself is never listed
        if not work.fresh:
            _sweep(target, work.path)
        temp = work.path / f"{target.name}.{unique_token()}.tmp"
        os.mkdir(temp, 0o700)  # nobody else may plant anything in it while we check and write
    except OSError as error:
        raise DownloadError(
            url, f"cannot extract into {target.parent}: {error.strerror}; use a writable cache folder"
        ) from error
    try:
        return _extract_into(archive, temp, target, url, limits, replace=replace, digest=digest)
    finally:
        # A cache's work folder is made once and kept: another extraction or fetch may
        # have entered it since, and removing it would fail theirs.
        if work.fresh and not in_cache:  # made for a one-off extraction: leave none behind
            try:
                os.rmdir(work.path)
            except OSError:
                pass


def _extract_into(
    archive: Union[Path, IO[bytes]],
    temp: Path,
    target: Path,
    url: str,
    limits: ExtractLimits,
    *,
    replace: bool,
    digest: Optional[str],
) -> Path:
    """`extract_archive`'s work once its temporary folder `temp` is made."""
    try:
        _unpack(archive, os.path.realpath(temp), limits, url)
        # Published with the cache folder's permissions (group-writable in a shared cache),
        # never other-writable.
        os.chmod(temp, (os.stat(target.parent).st_mode & 0o775) | 0o700)
        old: Optional[Path] = None
        if replace and os.path.lexists(target):  # a planted symlink is moved away too
            _marker(target).unlink(missing_ok=True)  # no moment where it vouches for other files
            old = temp.with_name(f"{target.name}.{unique_token()}.old")
            os.rename(target, old)
        ours = True
        try:
            os.replace(temp, target)
        except OSError:
            if not stat.S_ISDIR(os.lstat(target).st_mode):
                raise
            # Another process published an extraction first: use theirs, vouched for by
            # their marker only (ours would name our archive on a folder we did not write).
            shutil.rmtree(temp, ignore_errors=True)
            ours = False
        if digest is not None and ours:
            folder = os.lstat(target)
            marked = {"sha256": digest, "folder": [folder.st_dev, folder.st_ino]}
            write_json_atomic(_marker(target), marked, temp_folder=temp.parent)
        if old is not None and old.is_symlink():
            old.unlink()
        elif old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return target
    except OSError as error:
        shutil.rmtree(temp, ignore_errors=True)
        raise DownloadError(url, f"cannot extract into {target.parent}: {error.strerror or error}") from error
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
