"""The cluster fetch's transfer: the sending rank's file goes to one leader per other
cache folder over the process group, piece by piece, while the origin fetch still
arrives.

Each heartbeat of the fetching step (`_collective.Rounds`) carries the sender's offer
of the next piece (up to `CHUNK_BYTES`, read from the prefix of its partial file that
its fetch has hashed, `_tap`, and once the fetch is done from the published file);
after it, the sender sends the piece to each receiver (point to point: a node's
ingress is one copy, whatever its number of ranks) while every other rank goes on to
the next heartbeat. Reading the next piece overlaps sending this one; a receiver's
writer thread writes and hashes a piece while the next one arrives. A fetch that
starts over (another version) starts the receivers' files over too.

A receiver writes a private partial file and publishes it like a download (verified
against the sender's sha256, fsynced, sidecar, `os.replace`); a receiver whose write
failed keeps taking part, dropping the bytes, so the ranks' collectives never diverge.
"""

from __future__ import annotations

import logging
import os
import queue
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Optional

import attrs
import torch
import torch.distributed as dist

from framework.download._cache import file_identity
from framework.download._call import cache_writes
from framework.download._cluster_plan import _identity, _Source
from framework.download._collective import Rounds, _group_failed, group_timeout
from framework.download._partial import Partial, new_hasher, publish_fetched
from framework.download._pipeline import write_all
from framework.download._tap import Tap, tapping
from framework.download._validators import Validators
from framework.errors import ChecksumError, DownloadError

if TYPE_CHECKING:
    from framework.download._cluster import _Call

__all__ = ["CHUNK_BYTES", "Transfer"]

logger = logging.getLogger("framework.download")

# Memory during a transfer: a sender's two pieces, a receiver's three.
CHUNK_BYTES: Final = 8 << 20

_SYNC_RANGE: Final = getattr(os, "sync_file_range", None)
_SYNC_WRITE: Final[int] = getattr(os, "SYNC_FILE_RANGE_WRITE", 2)

# A piece offered: (start over from byte 0, its offset, its length, more to come).
Offer = tuple[bool, int, int, bool]


class _Owned:
    """Resources that a step's thread may still be using when the call gives up (the
    group failed): whichever of `close` and the step's end comes last releases them, so
    a descriptor is never closed under a running thread (which would then close the
    number again, by then perhaps the application's file)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy = False
        self._closed = False

    @contextmanager
    def _working(self) -> Iterator[None]:
        with self._lock:
            if self._closed:
                raise DownloadError(self.url, "the call was given up before this step began")
            self._busy = True
        try:
            yield
        finally:
            with self._lock:
                self._busy = False
                if self._closed:
                    self._release()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if not self._busy:
                self._release()

    @property
    def url(self) -> str:
        raise NotImplementedError

    def _release(self) -> None:
        raise NotImplementedError


class _Sender(_Owned):
    """The rank that holds the file: fetched from the origin (followed as it lands),
    or found in its cache."""

    def __init__(self, call: _Call) -> None:
        super().__init__()
        self.call = call
        self.fd: Optional[int] = None  # the published file, once `prepare` opened it
        self.info: Optional[_Source] = None
        self.tap: Optional[Tap] = None
        self.ended = threading.Event()  # `prepare` returned or raised
        self.error: Optional[BaseException] = None  # reading the published file failed

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    @property
    def url(self) -> str:
        return self.call.url

    def prepare(self) -> _Source:
        try:
            with self._working():
                return self._prepare()
        finally:
            self.ended.set()
            if self.tap is not None:
                self.tap.wake()

    def _prepare(self) -> _Source:
        call = self.call
        meta = None if call.force or call.revalidate else call._held(call.sha256)
        if meta is None:
            self.tap = Tap()
            with tapping(call.entry.final, self.tap):
                call.plain(extract=False)  # the one fetch from the origin, locked and atomic
            meta = call.entry.cached()
        # Never waited on: a FIFO renamed over the file opens at once and fails the check.
        fd = os.open(call.entry.final, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        self.fd = fd
        now = os.fstat(fd)
        if meta is None or not stat.S_ISREG(now.st_mode) or file_identity(now) != _identity(meta):
            raise DownloadError(call.url, f"{call.entry.final} was replaced during the call; call again")
        self.info = _Source(
            meta["sha256"], meta["size"], meta.get("etag"), meta.get("last_modified"), float(meta["time"])
        )
        return self.info

    def _release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.tap is not None:
            self.tap.close()


class _Feed:
    """What the sender offers next: bytes its fetch has hashed (one generation of its
    partial file), then, once the file is published, the rest of it."""

    def __init__(self, sender: _Sender) -> None:
        self.sender = sender
        self.generation = 0
        self.sent = 0  # bytes of this generation offered
        self.restart = False  # the next offer starts the receivers' files over
        self.published = False  # reading the published file

    def wait(self, timeout: float) -> None:
        tap = self.sender.tap
        if tap is not None and not self.sender.ended.is_set():
            tap.wait(self.generation, self.sent + CHUNK_BYTES - 1, timeout, self.sender.ended)
        else:
            self.sender.ended.wait(timeout)

    def read(self, buffer: torch.Tensor) -> Optional[Offer]:
        """The next piece into `buffer` (a CPU tensor of `CHUNK_BYTES`); None for none now."""
        sender = self.sender
        if sender.ended.is_set() and sender.info is not None and sender.fd is not None:
            self._to_published(sender.fd)
            size = sender.info.size
            try:
                length = _pread(sender.fd, buffer, self.sent, min(CHUNK_BYTES, size - self.sent))
            except OSError as error:  # raised on every rank in the publish step
                sender.error, length = sender.error or error, 0
            more = self.sent + length < size and sender.error is None
            if length == 0 and more:
                sender.error = DownloadError(sender.url, f"{sender.call.entry.final} shrank while being sent")
                more = False
            return self._offered(length, more)
        tap = sender.tap
        if tap is None or sender.ended.is_set():
            return None
        generation, fd, hashed = tap.snapshot()
        if generation != self.generation:  # the fetch started over
            self.generation, self.sent, self.restart = generation, 0, self.sent > 0 or self.restart
        if fd is None or hashed <= self.sent:
            return None
        try:
            length = _pread(fd, buffer, self.sent, min(CHUNK_BYTES, hashed - self.sent))
        except OSError:  # sent from the published file instead
            return None
        if tap.generation != generation or not length:  # started over while it was read
            return None
        return self._offered(length, True)

    def _to_published(self, fd: int) -> None:
        """Go on from the published file: where it is the file followed so far, after
        what was sent; else from byte 0."""
        if self.published:
            return
        self.published = True
        tap = self.sender.tap
        followed = tap.fd if tap is not None and tap.generation == self.generation else None
        if followed is None or not _same_file(followed, fd):
            self.restart, self.sent = self.restart or self.sent > 0, 0

    def _offered(self, length: int, more: bool) -> Offer:
        offer = (self.restart, self.sent, length, more)
        self.restart = False
        self.sent += length
        return offer


def _same_file(a: int, b: int) -> bool:
    try:
        one, other = os.fstat(a), os.fstat(b)
    except OSError:  # then sent again from byte 0
        return False
    return (one.st_dev, one.st_ino) == (other.st_dev, other.st_ino)


def _pread(fd: int, buffer: torch.Tensor, offset: int, length: int) -> int:
    """Read up to `length` bytes at `offset` into `buffer`; how many (fewer at the end)."""
    view = buffer.numpy().data.cast("B")
    done = 0
    while done < length:
        got = os.preadv(fd, [view[done:length]], offset + done)
        if got == 0:
            break
        done += got
    return done


class _Receiver(_Owned):
    """A leader receiving the file into a private partial file in its cache folder; a
    writer thread writes and hashes the pieces while the next ones arrive."""

    def __init__(self, call: _Call) -> None:
        super().__init__()
        self.call = call
        self.writes = partial(cache_writes, call.url, call.root)
        self.partial: Optional[Partial] = None
        self.error: Optional[BaseException] = None
        self.received = 0  # bytes received in this generation
        self._pieces: queue.Queue[Any] = queue.Queue()  # pieces to write, in order; None ends
        self._free: queue.Queue[torch.Tensor] = queue.Queue()  # buffers written out, for reuse
        self._buffers = 0
        self._writer: Optional[threading.Thread] = None
        try:
            with self.writes():
                self.partial = Partial.create(call.entry.final)
        except BaseException as error:
            self.error = error
            return
        self._writer = threading.Thread(target=self._write_all, name="framework-cluster-write", daemon=True)
        self._writer.start()

    @property
    def url(self) -> str:
        return self.call.url

    def buffer(self, length: int) -> torch.Tensor:
        """A CPU buffer for the next piece: a free one, or a new one (three at most)."""
        try:
            return self._free.get_nowait()[:length]
        except queue.Empty:
            pass
        if self._buffers < 3:
            self._buffers += 1
            return torch.empty(CHUNK_BYTES, dtype=torch.uint8)[:length]
        try:
            return self._free.get(timeout=group_timeout())[:length]
        except queue.Empty:  # the disk took no piece for that long: drop the rest
            self.error = self.error or DownloadError(
                self.url, f"the disk holding {self.call.root} took no write for {group_timeout():g}s"
            )
            return torch.empty(CHUNK_BYTES, dtype=torch.uint8)[:length]

    def start_over(self) -> None:
        """The sender's fetch started over: so does this file."""
        self.received = 0
        self._pieces.put("restart")

    def write(self, chunk: torch.Tensor) -> None:
        """Hand `chunk` (received in full) to the writer; after a failure it is dropped."""
        self.received += chunk.numel()
        if self._writer is None:  # no partial file: the bytes are dropped
            self._free.put(_whole(chunk))
        else:
            self._pieces.put(chunk)

    def _write_all(self) -> None:
        while (piece := self._pieces.get()) is not None:
            if isinstance(piece, str):  # start over
                if self.error is None and self.partial is not None:
                    self._guard(self._empty)
                continue
            if self.error is None and self.partial is not None:
                self._guard(partial(self._write, piece))
            self._free.put(_whole(piece))

    def _guard(self, work: Any) -> None:
        try:
            with self.writes():
                work()
        except BaseException as error:
            self.error = error

    def _empty(self) -> None:
        assert self.partial is not None
        os.ftruncate(self.partial.fd, 0)
        os.lseek(self.partial.fd, 0, os.SEEK_SET)  # writes go where the file position is
        self.partial.offset, self.partial.hasher = 0, new_hasher()

    def _write(self, piece: torch.Tensor) -> None:
        target = self.partial
        assert target is not None
        data = piece.numpy().data.cast("B")
        write_all(target.fd, [data], self.call.url, target.name.path)  # type: ignore[list-item]
        target.hasher.update(data)
        start = target.offset
        target.offset += len(data)
        if _SYNC_RANGE is not None:
            try:  # start writing back to disk now, so the final fsync has little left
                _SYNC_RANGE(target.fd, start, len(data), _SYNC_WRITE)
            except OSError:
                pass

    def _drain(self) -> None:
        """Wait for the writer to take in every piece."""
        if self._writer is not None and self._writer.is_alive():
            self._pieces.put(None)
            self._writer.join()

    def publish(self, info: _Source) -> None:
        """Verify against the sender's sha256 (and the caller's), then publish atomically."""
        with self._working():
            self._drain()
            self._publish(info)

    def _publish(self, info: _Source) -> None:
        call, partial_file = self.call, self.partial
        if self.error is not None:
            raise self.error
        assert partial_file is not None
        partial_file.validators = Validators(info.etag, info.last_modified)
        with self.writes():
            os.fsync(partial_file.fd)
            if self._closed:  # the call gave up (this fsync hung): publish nothing afterwards
                raise DownloadError(call.url, "the call was given up while this copy was written")
            fetched = partial_file.verified(call.url, info.sha256)
            if not fetched.info.st_size == fetched.size == info.size:  # the digest covers what was written
                raise DownloadError(
                    call.url,
                    f"the received copy is {fetched.info.st_size} bytes on disk, {fetched.size} "
                    f"received, where the sender has {info.size}",
                )
            if call.sha256 is not None and fetched.sha256 != call.sha256:
                raise ChecksumError(call.url, call.sha256, fetched.sha256)
            self.partial = None
            partial_file.close(keep=True)
            publish_fetched(call.entry, attrs.evolve(fetched, fetched=info.fetched))
        logger.info("published %s (%d bytes, sha256 %s)", call.entry.final, fetched.size, fetched.sha256)

    def _release(self) -> None:
        writer = self._writer
        if writer is not None and writer.is_alive():
            self.error = self.error or DownloadError(self.url, "the call was given up")
            self._pieces.put(None)
            writer.join(group_timeout())  # it ends after the piece it writes
            if writer.is_alive():  # a hung disk: the partial file goes once it returns
                threading.Thread(target=self._release_after, args=(writer,), daemon=True).start()
                return
        self._remove()

    def _release_after(self, writer: threading.Thread) -> None:
        writer.join()
        self._remove()

    def _remove(self) -> None:
        if self.partial is not None:  # not published: remove the partial file
            self.partial.close(keep=False)
            self.partial = None


class Transfer(Rounds):
    """One transfer from `source` to `receivers`, riding on a step's heartbeats."""

    def __init__(
        self,
        call: _Call,
        source: int,
        receivers: list[int],
        sender: Optional[_Sender],
        receiver: Optional[_Receiver],
    ) -> None:
        self.call = call
        self.source = source
        self.receivers = receivers
        self.feed = _Feed(sender) if sender is not None and receivers else None
        self.receiver = receiver
        self._buffers = [torch.empty(CHUNK_BYTES, dtype=torch.uint8) for _ in range(2 if self.feed else 0)]
        self._pending: Optional[tuple[Offer, torch.Tensor]] = None  # offered, not yet sent
        self._sending: list[Any] = []  # the works of the piece being sent
        self._turn = 0

    def wait(self, thread: threading.Thread, timeout: float) -> None:
        if self.feed is not None and self._pending is None:
            self.feed.wait(timeout)
        else:
            thread.join(timeout)

    def offer(self) -> Optional[Offer]:
        if self.feed is None:
            return None
        if self._pending is None:
            buffer = self._buffers[self._turn % 2]
            offer = self.feed.read(buffer)
            if offer is not None:
                self._pending = (offer, buffer[: offer[2]])
                self._turn += 1
        if self._pending is not None:
            return self._pending[0]
        return (False, self.feed.sent, 0, True)  # the fetch goes on: nothing new yet

    def exchange(self, offers: list[Any]) -> bool:
        offer = offers[self.source]
        if offer is None:  # the sender has no receivers: nothing to move
            return False
        if not _is_offer(offer):
            self.call._out_of_step(self.source, offer)
        restart, offset, length, more = offer
        try:
            self._move(restart, offset, length)
        except RuntimeError as error:  # DistBackendError, a timeout, a closed connection, CUDA
            raise DownloadError(self.call.url, _group_failed(error)) from error
        return bool(more)

    def _move(self, restart: bool, offset: int, length: int) -> None:
        for work in self._sending:  # the previous piece is in: its buffer is free again
            work.wait()
        self._sending = []
        device = self.call.device
        if self.feed is not None:
            pending, self._pending = self._pending, None
            if not length:
                return
            assert pending is not None
            chunk = pending[1]
            if device.type != "cpu":
                chunk = chunk.to(device)
            self._sending = [w for w in (dist.isend(chunk, dst=other) for other in self.receivers) if w]
            if device.type != "cpu":
                for work in self._sending:
                    work.wait()
                self._sending = []
        elif self.receiver is not None:
            receiver = self.receiver
            if restart:
                receiver.start_over()
            if not length:
                return
            if offset != receiver.received:
                raise DownloadError(
                    self.call.url, f"a piece at byte {offset} arrived after byte {receiver.received}"
                )
            chunk = receiver.buffer(length)
            target = chunk if device.type == "cpu" else torch.empty(length, dtype=torch.uint8, device=device)
            work = dist.irecv(target, src=self.source)
            if work is not None:
                work.wait()
            receiver.write(chunk if target is chunk else chunk.copy_(target))


def _whole(piece: torch.Tensor) -> torch.Tensor:
    """The whole buffer that `piece` is the start of."""
    return piece.as_strided((CHUNK_BYTES,), (1,), 0)


def _is_offer(value: Any) -> bool:
    return (
        isinstance(value, tuple)
        and len(value) == 4
        and all(isinstance(field, bool) for field in (value[0], value[3]))
        and all(isinstance(field, int) and field >= 0 for field in value[1:3])
    )
