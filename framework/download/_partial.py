"""The partial file a download writes, and publishing it atomically.

Bytes go to a partial file that only this process writes (`PartialName`: named
with the version's tag, its host, pid and a random token), are hashed in the same
pass, checked against the expected size and sha256, fsynced, and only then renamed
to the final path (`publish_fetched`). An interrupted download leaves its partial
file behind; a later call adopts it by renaming it to its own name first, so two
processes never append to one file.

Partial files, their records and temporary files live in the cache folder's work
folder of this user (`enter_work_folder`: made once, the next name when one is
planted), which holds only what is being written or was kept: a miss looks there for
what earlier calls of its entry left, and the cache folder itself, however many
entries it holds, is never listed.

The cache folder may be shared with people we do not trust: only a regular file
owned by this user is adopted, it is opened with `O_NOFOLLOW` and checked with
`fstat` on the descriptor that is then written, so a planted symlink, FIFO or
folder is never followed, written through or waited on.

This is the bottom layer of a fetch: the single-stream path (`_stream`) and the
parallel one (`parallel`) write through `Partial`, and `_fetch` picks between them.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import secrets
import stat
import time
from pathlib import Path
from typing import Any, Final, Optional

import attrs

from framework.download._cache import (
    HOST,
    NEW_FILE_FLAGS,
    RELEASED_PID,
    Entry,
    WorkFolder,
    dead_leftovers,
    enter_work_folder,
    find_work_folder,
    is_alive_local,
    parse_owner,
    unique_token,
    work_folder,
)
from framework.download._tap import followed
from framework.download._validators import NO_VALIDATOR, Validators
from framework.errors import ChecksumError, DownloadError, HTTPStatusError, NetworkError

__all__ = [
    "ACTIVE",
    "NEW_PARTIAL_FLAGS",
    "PARALLEL_TAG",
    "READ_CHUNK",
    "RESUMABLE",
    "STALE_AFTER_S",
    "TRANSIENT_STATUSES",
    "Fetched",
    "Partial",
    "PartialName",
    "discard",
    "foreign",
    "new_hasher",
    "orphaned",
    "ours",
    "partial_bytes",
    "publish_fetched",
    "publish_file",
    "remove_quietly",
    "resumable",
    "work_leftovers",
]

logger = logging.getLogger("framework.download")

READ_CHUNK: Final = 1 << 20
# A partial file of another host's process, untouched this long, is taken to be orphaned;
# longer than any read timeout, so a stalled but live writer is not robbed.
STALE_AFTER_S: Final = 300.0
PARALLEL_TAG: Final = "P"  # prefixes the tag of a parallel partial file (never resumed as contiguous)


def new_hasher() -> Any:
    return hashlib.sha256()  # looked up at each call, so a test can inject a failing hash


# Partial files this process is writing right now; any other partial of this process
# is left over from an interrupted call (Ctrl-C) and may be adopted like a dead one's.
ACTIVE: set[str] = set()
# What may interrupt a fetch that a later call resumes: the partial file (and a parallel
# fetch's record of its parts) is kept. A status the server may answer otherwise later
# (an outage: 5xx after retries, 408, 429) is one too (see `resumable`).
RESUMABLE: Final = (NetworkError, KeyboardInterrupt)
# 501 (not implemented) is final: asking again cannot help.
TRANSIENT_STATUSES: Final = frozenset({408, 429, *range(500, 600)} - {501})


def resumable(error: BaseException) -> bool:
    """Whether a later call may resume after `error`: the partial file and its record stay.
    A broken connection, Ctrl-C, or a status of an outage (a 503 at 90% of 10 GiB must
    not cost 10 GiB)."""
    if isinstance(error, HTTPStatusError):
        return error.status in TRANSIENT_STATUSES
    return isinstance(error, RESUMABLE)


@attrs.frozen
class PartialName:
    """The one place that knows a partial file's name:
    `<final>.<tag>.<host>.<pid>.<random>.part` (see `unique_token`), inside `final`'s
    work folder: `folder` when it is not the first name (something planted there made
    the fetch use the next one, see `enter_work_folder`)."""

    final: Path
    tag: str
    token: str = attrs.field(factory=unique_token)
    folder: Optional[Path] = None

    @property
    def path(self) -> Path:
        folder = work_folder(self.final) if self.folder is None else self.folder
        return folder / f"{self.final.name}.{self.tag}.{self.token}.part"

    @property
    def owner(self) -> Optional[tuple[str, int]]:
        return parse_owner(self.path.name)

    def renamed(self, tag: Optional[str] = None) -> PartialName:
        """This process's own name for the same file (a fresh token), optionally retagged."""
        return PartialName(self.final, self.tag if tag is None else tag, folder=self.folder)

    def claimed(self) -> PartialName:
        """A fresh name that keeps the writer's host and pid: what an adopter renames a
        foreign writer's file to before copying it. Killed before the copy is done, it
        leaves a file that is still foreign (copied again, never renamed into use)."""
        host, pid, _random = self.token.split(".")
        return PartialName(self.final, self.tag, f"{host}.{pid}.{secrets.token_hex(4)}", self.folder)

    @classmethod
    def parse(cls, final_folder: Path, name: str, folder: Optional[Path] = None) -> Optional[PartialName]:
        """The partial file called `name` in the work folder `folder` (None: the first
        name) of an entry of `final_folder`; None for any other name.
        (`FINAL.TAG.HOST.PID.RANDOM.part`: neither a tag nor a host holds a dot.)"""
        fields = name[: -len(".part")].rsplit(".", 4) if name.endswith(".part") else []
        if len(fields) != 5 or not fields[0]:
            return None
        final = final_folder / fields[0]
        return cls(final, fields[1], ".".join(fields[2:]), _unless_first(final, folder))

    @classmethod
    def all(cls, final: Path) -> list[PartialName]:
        """Every partial file of `final` in its work folder, whoever wrote it: one listing
        of that folder (the cache folder is never listed); a planted one is skipped,
        never listed, nor renamed or written through (see `find_work_folder`)."""
        folder = find_work_folder(final)
        if folder is None:
            return []
        try:
            names = os.listdir(folder)
        except OSError:
            return []
        found = (cls.parse(final.parent, name, folder) for name in names if name.startswith(final.name + "."))
        return [name for name in found if name is not None and name.final == final]


def work_leftovers(final: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """Dead writers' temporary files of `final` in its work folder (see `dead_leftovers`
    and `find_work_folder`: a planted one is never listed)."""
    folder = find_work_folder(final)
    return dead_leftovers(folder / final.name, suffixes) if folder is not None else []


def _unless_first(final: Path, folder: Optional[Path]) -> Optional[Path]:
    """`folder` for a `PartialName`: None when it is `final`'s first work folder name."""
    return None if folder is None or folder == work_folder(final) else folder


@attrs.frozen
class Fetched:
    """A verified partial file, ready for `publish_file`; `info` is its `fstat`."""

    temp: Path
    size: int
    sha256: str
    validators: Validators
    info: os.stat_result
    fetched: Optional[float] = None  # when its version was fetched (a copy of another cache's), else now


def partial_bytes(final: Path) -> int:
    """Bytes in every partial file of `final`: a waiter's view of the holder's progress."""
    total = 0
    for name in PartialName.all(final):
        try:
            info = os.lstat(name.path)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode):
            # Blocks, not length: a parallel fetch's file is sparse, as long as the object
            # from the start; it fills as parts arrive.
            total += min(info.st_size, info.st_blocks * 512)
    return total


def remove_quietly(path: Path) -> None:
    try:
        os.unlink(path)  # a symlink is removed itself, never its target
    except OSError:
        pass


def discard(temp: Path) -> None:
    """Remove a fetched file that will not be published."""
    ACTIVE.discard(str(temp))
    remove_quietly(temp)


def ours(info: os.stat_result) -> bool:
    """A plain file of this user, with no other name (a hard link to elsewhere)."""
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and info.st_nlink == 1


def orphaned(name: PartialName, info: os.stat_result, now: float) -> bool:
    """Whether nobody writes `name` any more. A pid is only checked on this host and in
    this PID namespace; elsewhere, a file untouched for `STALE_AFTER_S` is orphaned."""
    owner = name.owner
    if owner is None:
        return False
    if owner == (HOST, os.getpid()):
        return str(name.path) not in ACTIVE
    if owner[0] == HOST:  # a pid from before this boot may run again, another process's now
        return not is_alive_local(*owner) or _before_this_boot(info)
    return now - info.st_mtime >= STALE_AFTER_S


@functools.cache
def boot_time() -> Optional[float]:
    """When this machine booted (Linux's `/proc/stat`, read once), None where unknown."""
    try:
        with open("/proc/stat", encoding="ascii") as stat_file:
            for line in stat_file:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _before_this_boot(info: os.stat_result) -> bool:
    booted = boot_time()
    return booted is not None and info.st_mtime < booted


def lost_in_a_reboot(name: PartialName, info: os.stat_result) -> bool:
    """Whether `name` was last written before this machine booted by a writer that never
    let it go (killed by the crash, not closed): the bytes it wrote last may never have
    reached the disk (a power loss keeps the file's length but not always its data, and
    a resume after zeros would publish them). A released file was fsynced before it was
    let go (`Partial.close`); an adopter refreshes the time of the file it takes
    (`_take`), so bytes it trusted stay trusted until it writes. Whatever the host: a
    container restarted after the crash has another PID namespace, so its own file of
    before looks like another host's."""
    owner = name.owner
    if owner is None or owner[1] == RELEASED_PID:
        return False
    return _before_this_boot(info)


def foreign(name: PartialName) -> bool:
    """Whether `name`'s writer is on another host or in another PID namespace: one we
    cannot tell is dead, only silent (`STALE_AFTER_S`), and may wake."""
    owner = name.owner
    return owner is not None and owner[0] != HOST


# A new partial file: read back too (a parallel fetch hashes it as its prefix grows).
NEW_PARTIAL_FLAGS: Final = (NEW_FILE_FLAGS & ~os.O_WRONLY) | os.O_RDWR


class Partial:
    """The partial file this process writes: its name, checked descriptor, hash and length."""

    def __init__(self, name: PartialName, fd: int) -> None:
        self.name = name
        self.fd = fd
        self.hasher = self.followed(new_hasher())
        self.offset = 0
        self._verified = False  # a verified file stays active until it is published
        # The version the bytes belong to, once a response said so (unknown for an
        # adopted file until the server confirms its tag).
        self.validators: Optional[Validators] = None
        # That version's size, once an answer said it: what a later answer that does not
        # say it (`bytes 1000-1999/*`) is counted against, and one that says another
        # size is not resumed after.
        self.size: Optional[int] = None
        # Where a range of that version and of unknown total ended, in this process: a 416
        # there that names the version says the object ends there, even without its size.
        self.open_end: Optional[int] = None

    def followed(self, hasher: Any) -> Any:
        """`hasher`, new, for this file's bytes from byte 0; counted if the entry is
        tapped (`_tap`: the cluster fetch sends them on as they land)."""
        return followed(self.name.final, hasher, self.fd, self.name.path)

    @classmethod
    def create(cls, final: Path, folder: Optional[WorkFolder] = None) -> Partial:
        """A new, empty partial file of `final` in `folder` (entered now if not given)."""
        where, attempts = folder or enter_work_folder(final), 0
        while True:
            name = PartialName(final, NO_VALIDATOR, folder=_unless_first(final, where.path))
            ACTIVE.add(str(name.path))
            try:
                return cls(name, os.open(name.path, NEW_FILE_FLAGS, 0o644))
            except FileNotFoundError:
                ACTIVE.discard(str(name.path))
                attempts += 1
                if attempts == 3:
                    raise
                where = enter_work_folder(final)  # someone removed it meanwhile
            except BaseException:
                ACTIVE.discard(str(name.path))
                raise

    @classmethod
    def adopt(cls, final: Path) -> Optional[Partial]:
        """Take over the largest orphaned partial file by renaming it to our own name.

        Only regular files of this user, written for a version a validator names,
        are candidates; this does not trust the lock, which may silently not work on
        a shared filesystem: a live writer's file is never taken. Our other orphans
        are removed; what another user left, or planted, is never touched.
        """
        now = time.time()
        orphans = []
        for name in PartialName.all(final):
            try:
                info = os.lstat(name.path)
            except OSError:
                continue
            if ours(info) and orphaned(name, info, now):
                orphans.append((info.st_size, name, info))
        for leftover in work_leftovers(final, (".tmp", ".parts")):  # a parallel partial's record too
            remove_quietly(leftover)
        orphans.sort(key=lambda found: found[0], reverse=True)
        adopted: Optional[Partial] = None
        for _size, name, info in orphans:
            # A parallel partial file has holes: only `parallel.adopt_parts`, with its record, takes it.
            whole = name.tag != NO_VALIDATOR and not name.tag.startswith(PARALLEL_TAG)
            if adopted is None and whole and not lost_in_a_reboot(name, info):
                adopted = cls._take(name)
                if adopted is not None:
                    continue
            remove_quietly(name.path)
        return adopted

    @classmethod
    def _take(cls, name: PartialName) -> Optional[Partial]:
        mine = name.claimed() if foreign(name) else name.renamed()
        ACTIVE.add(str(mine.path))
        try:
            os.rename(name.path, mine.path)  # atomic: at most one adopter wins
            fd = os.open(mine.path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            ACTIVE.discard(str(mine.path))
            return None
        if not ours(os.fstat(fd)):  # swapped between the lstat and the open
            os.close(fd)
            ACTIVE.discard(str(mine.path))
            return None
        if foreign(name):  # its writer may wake: its bytes go to a file it never had open
            return cls._copy(mine, fd)
        if os.utime in os.supports_fd:  # trusted now: not "lost in a reboot" if this process dies
            os.utime(fd)
        try:
            partial = cls(mine, fd)
            while chunk := os.read(fd, READ_CHUNK):
                partial.hasher.update(chunk)
                partial.offset += len(chunk)
        except BaseException:  # Ctrl-C while hashing: a later call (of ours too) adopts it
            os.close(fd)
            ACTIVE.discard(str(mine.path))
            raise
        return partial

    @classmethod
    def _copy(cls, taken: PartialName, fd: int) -> Optional[Partial]:
        """Copy the bytes of a stale partial file (`fd`, renamed to `taken`) into a new
        file of ours, hashing them, and remove it: its writer, silent but maybe alive
        (another host or PID namespace), still holds its inode and may write through it
        when it wakes (its own renames fail now: it stops at the next). The file we
        publish is never that inode. On failure both go; killed, the taken file keeps its
        writer's host and pid (`PartialName.claimed`), so it is copied again, never
        renamed into use."""
        copy = PartialName(taken.final, taken.tag, folder=taken.folder)  # ours
        ACTIVE.add(str(copy.path))
        partial: Optional[Partial] = None
        try:
            partial = cls(copy, os.open(copy.path, NEW_PARTIAL_FLAGS, 0o644))
            while chunk := os.read(fd, READ_CHUNK):
                partial.hasher.update(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(partial.fd, view) :]
                partial.offset += len(chunk)
        except BaseException as error:
            if partial is not None:
                os.close(partial.fd)
            discard(copy.path)
            if isinstance(error, OSError):
                logger.info("cannot copy the stale partial file %s (%s); starting over", taken.path, error)
                return None
            raise
        finally:
            os.close(fd)
            discard(taken.path)
        return partial

    def restart(self, validators: Validators) -> None:
        """Start the file over, empty, for the version `validators` name."""
        if self.offset:
            os.ftruncate(self.fd, 0)
            self.offset, self.hasher = 0, self.followed(new_hasher())
        self.validators, self.size, self.open_end = validators, None, None
        if validators.tag != self.name.tag:
            self.retag(validators.tag)

    def empty(self) -> None:
        """Make the file empty, with no version (its bytes cannot be trusted)."""
        os.ftruncate(self.fd, 0)
        self.offset, self.hasher = 0, self.followed(new_hasher())
        self.restart(Validators())

    def retag(self, tag: str) -> None:
        """Rename the file to carry `tag` (as `restart` does for a validator's tag)."""
        renamed = self.name.renamed(tag)
        ACTIVE.add(str(renamed.path))
        os.rename(self.name.path, renamed.path)
        ACTIVE.discard(str(self.name.path))
        self.name = renamed

    def close(self, keep: bool) -> None:
        """Close the descriptor; remove the file unless `keep` (a resumable failure, or
        a verified file that is about to be published). A file in a fallback work folder
        (the first name was planted) is never kept: once the first name is free again, no
        later call looks there. A file kept for a later call is fsynced first: released,
        it is trusted after a reboot too (see `lost_in_a_reboot`)."""
        if not self._verified and (self.offset == 0 or self.name.tag == NO_VALIDATOR):
            keep = False  # nothing a later call could resume
        if not self._verified and self.name.folder is not None:
            keep = False  # in a fallback work folder: see above
            remove_quietly(_record_of(self.name.path))  # a parallel fetch's record too
        synced = False
        try:
            if keep and not self._verified and not self.name.tag.startswith(PARALLEL_TAG):
                # (a parallel file's record vouches only for parts already fsynced)
                os.fsync(self.fd)
            synced = True
        except OSError:
            keep = False  # its bytes may not be on disk: a later call starts over
        finally:
            os.close(self.fd)
            if not keep:
                discard(self.name.path)
            elif not self._verified and synced:  # left for a later call, of this process or another
                self._release()
            elif not self._verified:  # Ctrl-C in the fsync: this process's, trusted until a reboot
                ACTIVE.discard(str(self.name.path))

    def _release(self) -> None:
        """Rename the kept file (and a parallel one's record, first) to a name no live
        process owns (`RELEASED_PID`), so that any process resumes it, not only this
        one while it lives. This process writes it no more (a parallel fetch's
        workers stopped). A failed rename leaves it ours: this process resumes it."""
        token = f"{HOST}.{RELEASED_PID}.{secrets.token_hex(4)}"
        released = PartialName(self.name.final, self.name.tag, token, self.name.folder)
        try:
            if self.name.tag.startswith(PARALLEL_TAG):
                os.rename(_record_of(self.name.path), _record_of(released.path))
            os.rename(self.name.path, released.path)
        except OSError:
            pass
        ACTIVE.discard(str(self.name.path))

    def verified(self, url: str, sha256: Optional[str]) -> Fetched:
        info = os.fstat(self.fd)
        digest = self.hasher.hexdigest()
        if sha256 is not None and digest != sha256:
            raise ChecksumError(url, sha256, digest)
        self._verified = True
        return Fetched(self.name.path, self.offset, digest, self.validators or Validators(), info)


def _record_of(path: Path) -> Path:
    """A parallel partial file's record of parts (as `parallel._parts._record_path`)."""
    return path.with_name(path.name[: -len(".part")] + ".parts")


def publish_file(temp: Path, final: Path) -> None:
    """Rename `temp` (fsynced) onto `final`: atomic. The folder is not fsynced: after a
    power loss a file published in the last seconds may be missing (fetched again, or
    its partial file resumed), never there with other bytes."""
    try:
        os.replace(temp, final)  # a symlink at `final` is replaced itself, never followed
    finally:
        ACTIVE.discard(str(temp))


def _stillours(url: str, result: Fetched) -> None:
    """Refuse to publish a partial file that another process took over (renamed away)
    while this one was silent: it must not write the sidecar of the file that one
    publishes."""
    try:
        info = os.lstat(result.temp)
    except OSError:
        info = None
    if info is None or (info.st_dev, info.st_ino) != (result.info.st_dev, result.info.st_ino):
        raise DownloadError(
            url,
            f"{result.temp} was taken over by another process while this one was silent (longer "
            f"than {STALE_AFTER_S:g}s); nothing published by this one, the other publishes its own",
        )


def publish_fetched(entry: Entry, result: Fetched) -> None:
    """Publish a verified file as `entry`: its sidecar first, then the file (`publish_file`).

    The sidecar names the new file's inode before the file takes the final name: a
    crash in between leaves a sidecar that matches no file, never old metadata vouching
    for new bytes (or new metadata for old ones). On failure the file is removed.
    """
    try:
        _stillours(entry.url, result)
        validators = result.validators
        entry.publish_metadata(
            validators.etag,
            validators.last_modified,
            result.sha256,
            result.info,
            result.fetched,
            temp_folder=result.temp.parent,  # swept with the partial files, never by listing the cache
        )
        publish_file(result.temp, entry.final)
    except IsADirectoryError as error:  # os.replace never removes a folder
        discard(result.temp)
        where = error.filename2 or error.filename or entry.final  # the file, or its sidecar
        raise DownloadError(
            entry.url,
            f"cannot publish {entry.final}: a folder sits at {where} (not one this cache "
            "makes); remove it, or use another cache folder",
        ) from error
    except BaseException:
        discard(result.temp)
        raise
