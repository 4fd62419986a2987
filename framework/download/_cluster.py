"""`cached_path(..., distributed=True)`: one fetch from the origin for a whole job.

Every rank of torch.distributed's default group calls it with the same arguments:

1. **Who shares a cache folder** is asked of the filesystem itself: each rank writes a
   marker file with a random name into its cache folder and, after a collective, looks
   for every rank's marker in its own folder. Ranks that see each other's markers share
   a folder (a group). Hostnames are never used: containers and simulated nodes share
   one, and hosts mounting NFS share a folder. A group's **leader** is its lowest rank
   that could write its marker there and may reach the origin (else the lowest that
   could write, else the lowest): a rank that alone sees the folder read-only, or is
   offline, does not lead.
2. **Who already holds a verified copy** is agreed on next: a leader whose entry needs
   re-binding (a cache copied with `cp -a` or rsync, restored, baked into an image)
   hashes it first, as a plain call would. When every folder holds the same sha256,
   nothing moves and no connection is opened.
3. **One rank gets the file**: the holder of the newest copy (by the server's
   Last-Modified when every copy has one, else by when it was fetched: without
   `sha256`, folders may hold different versions, and an older one never replaces a
   newer one), else, from the origin through the ordinary locked, atomic-publish path,
   the first leader that can write and is online.
4. **The leader of each other folder receives the bytes** from it over the process group
   (per `CHUNK_BYTES` piece: a point-to-point send to each receiving leader, one copy per
   folder whatever its number of ranks, then a one-byte `all_reduce` that every rank
   joins; the tensors live on the device the group has a backend for, see
   `_device_type`) and publishes them like a download: a private partial file hashed
   while written, checked against the sender's sha256 (and the caller's), fsynced, the
   sidecar, then `os.replace`. Partial files of dead receivers are swept by every
   later call.
5. `extract=True`: each leader then extracts its own copy through the ordinary path.

**Failures.** Every local step runs to its end on every rank and its outcome is
gathered; a failure anywhere is raised on every rank as the same `DownloadError`
subclass (rebuilt by name from `framework.errors`, from plain fields only). A receiver
whose write fails keeps taking part in the transfer, dropping the bytes, so the ranks'
collectives never diverge.

**Bounds.** Local steps run in a thread while the rank takes part in a heartbeat
`all_gather` every `POLL_S` seconds, so a download may last longer than the process
group's timeout (`init_process_group(timeout=...)`), while no single collective waits
longer than that timeout unless a rank stopped answering. A step that makes no progress
(its thread's reads and writes, a download's bytes) for longer than the timeout (a
hung disk, a hard NFS mount) is given up on every rank alike, in the same heartbeat:
`StepTimeoutError`. The transfer is one collective per piece, so it too may outlast the
timeout. A rank that dies or stalls makes the others' next collective fail (gloo: as
soon as its connections close, else at the timeout), raised as a `DownloadError`. A step
still running in its thread when the call raises releases its own resources when it
ends, and publishes nothing.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Optional, Union

import attrs
import torch
import torch.distributed as dist

from framework.download._cache import Entry, Metadata, file_identity
from framework.download._call import cache_writes, check_sha256, extracted, normalize
from framework.download._cluster_plan import (  # noqa: F401 - tests reach them here
    _BARE_BACKENDS,
    _MARKER_PREFIX,
    _STALE_MARKER_S,
    _device_type,
    _digest,
    _exists,
    _groups,
    _Held,
    _identity,
    _leaders,
    _newest,
    _origin_fetcher,
    _Probe,
    _rank_key,
    _remove_quietly,
    _Source,
    _sweep,
    _transfer_device,
    _write_marker,
)
from framework.download._collective import POLL_S as POLL_S
from framework.download._collective import _Collective, _group_failed
from framework.download._collective import _decode as _decode
from framework.download._collective import _encode as _encode
from framework.download._partial import (
    Partial,
    partial_bytes,
    publish_fetched,
)
from framework.download._pipeline import write_all
from framework.download._validators import Validators
from framework.errors import ChecksumError, DownloadError, InvalidArgumentError

if TYPE_CHECKING:
    from framework.download.manager import DownloadManager

__all__ = ["CHUNK_BYTES", "POLL_S", "cluster_cached_path"]


logger = logging.getLogger("framework.download")


CHUNK_BYTES: Final = 8 << 20  # memory during a transfer: a sender's one chunk, a receiver's two

PathOrUrl = Union[str, "os.PathLike[str]"]


def cluster_cached_path(
    manager: DownloadManager,
    url_or_path: PathOrUrl,
    *,
    cache_dir: Optional[PathOrUrl],
    sha256: Optional[str],
    extract: bool,
    force: bool,
    progress: Optional[bool],
    revalidate: bool,
) -> Path:
    """`manager.cached_path` as a collective over the default process group (see the
    module docstring); a plain call when torch.distributed is not initialized."""
    call = _Call(manager, url_or_path, cache_dir, sha256, extract, force, progress, revalidate)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return call.plain()
    return call.run()


class _Call(_Collective):
    """One collective call; every rank makes the same decisions from the gathered facts."""

    def __init__(
        self,
        manager: DownloadManager,
        url_or_path: PathOrUrl,
        cache_dir: Optional[PathOrUrl],
        sha256: Optional[str],
        extract: bool,
        force: bool,
        progress: Optional[bool],
        revalidate: bool,
    ) -> None:
        self.manager = manager
        self.given = url_or_path
        # Normalized in the first step, where errors are shared; anything else than a str
        # or a path (None: a node's unset variable; bytes) is refused there.
        try:
            text = os.fspath(url_or_path)
        except TypeError:
            text = None
        self.url: str = text if isinstance(text, str) else repr(url_or_path)
        self._url_ok = isinstance(text, str)
        self.cache_dir = cache_dir
        self.sha256 = sha256
        self.extract = extract
        self.force = force
        self.progress = progress
        self.revalidate = revalidate
        self._root: Optional[Path] = None  # resolved in the first step, where errors are shared
        self.marker: Optional[Path] = None
        self._looked = False  # the markers are no longer needed
        self.device = torch.device("cpu")  # chosen in the first step, where errors are shared
        # The caller's device, looked up in its thread (CUDA's current device is per
        # thread: a step's thread starts on device 0); raised in the first step.
        self._device: Union[torch.device, Exception, None] = None

    @property
    def root(self) -> Path:
        """This rank's cache folder; a folder that cannot be named is a `DownloadError`."""
        if self._root is None:
            given = self.cache_dir if self.cache_dir is not None else "the manager's cache_dir"
            try:
                self._root = (
                    Path(self.cache_dir).expanduser()
                    if self.cache_dir is not None
                    else self.manager.cache_dir
                )
            except (RuntimeError, OSError, TypeError) as error:  # "~user" of no such user, ...
                raise DownloadError(
                    self.url,
                    f"cannot use the cache folder {given!r}: {error}; pass an existing or creatable folder",
                ) from error
        return self._root

    @property
    def entry(self) -> Entry:
        return Entry(self.root, self.url)

    def plain(self, **changes: Any) -> Path:
        arguments: dict[str, Any] = dict(
            cache_dir=self.root,
            sha256=self.sha256,
            extract=self.extract,
            force=self.force,
            progress=self.progress,
            revalidate=self.revalidate,
        )
        arguments.update(changes)
        return self.manager.cached_path(self.url if self._url_ok else self.given, **arguments)

    def run(self) -> Path:
        rank = dist.get_rank()
        try:
            self._device = _transfer_device(self.url)
        except Exception as error:  # raised in the first step, on every rank alike
            self._device = error
        try:
            probes: list[_Probe] = self._step(self._probe, _Probe, "checking its cache folder")
            first = probes[0].args
            for other, probe in enumerate(probes):
                if probe.args != first:
                    raise InvalidArgumentError(
                        self.url,
                        "cached_path(distributed=True) is a collective: every rank must pass the "
                        f"same arguments (cache_dir may differ); rank 0 passed {first}, rank {other} "
                        f"passed {probe.args}",
                    )
            self._agree_on_device(probes)
            seen: list[list[int]] = self._step(
                partial(self._look, probes), list, "looking for the other ranks' markers"
            )
        finally:
            self._looked = True  # a probe still running (a hung disk) removes its marker itself
            if self.marker is not None:
                _remove_quietly(self.marker)
        leader_of = _leaders(_groups(seen), probes)
        leaders = sorted(set(leader_of))
        held = {leader: probes[leader].held for leader in leaders}
        if not self.force and any(held[leader] is None for leader in leaders):
            # A copied cache (cp -a, rsync, a restore, an image) is re-bound, as a plain call would.
            rebound: list[Optional[_Held]] = self._step(
                self._rebind if leader_of[rank] == rank and held[rank] is None else None,
                (_Held, type(None)),
                "hashing a copied cache entry",
            )
            held.update({leader: rebound[leader] for leader in leaders if held[leader] is None})
        holders = [leader for leader in leaders if held[leader] is not None]
        fetcher = _origin_fetcher(leaders, probes)
        # As a plain call: revalidate asks the origin only when online and without a pin
        # (a copy with the sha256 asked for is served without asking).
        asks = self.revalidate and self.sha256 is None and not probes[fetcher].offline
        from_origin = self.force or asks or not holders
        source = fetcher if from_origin else _newest(holders, held)
        digest = None if from_origin else held[source].sha256  # type: ignore[union-attr]
        if from_origin or any(_digest(held[leader]) != digest for leader in leaders):
            sender = _Sender(self) if rank == source else None
            try:
                what = "fetching the file" if from_origin else "opening its cached copy"
                progress = partial(partial_bytes, self.entry.final)
                info: _Source = self._step(
                    sender.prepare if sender else None, (_Source, type(None)), what, progress
                )[source]
                receivers = [
                    leader
                    for leader in leaders
                    if leader != source and (self.force or _digest(held[leader]) != info.sha256)
                ]
                if receivers:
                    self._transfer(info, source, receivers, sender)
            finally:
                if sender is not None:
                    sender.close()
            digest = info.sha256
        assert digest is not None
        if self.extract:
            self._step(
                partial(self._extract, digest) if leader_of[rank] == rank else None,
                (Path, type(None)),
                "extracting the archive",
            )
        path: list[Path] = self._step(partial(self._resolve, digest), Path, "checking its copy")
        return path[rank]

    def _probe(self) -> _Probe:

        if not self._url_ok:
            raise InvalidArgumentError(
                self.url,
                f"rank {dist.get_rank()} passed url_or_path={self.url} ({type(self.given).__name__}); "
                "pass a URL or a path (str or os.PathLike), the same on every rank",
            )
        self.url = normalize(self.url)
        self.sha256 = check_sha256(self.url, self.sha256)
        with cache_writes(self.url, self.root):
            self.root.mkdir(parents=True, exist_ok=True)
        _sweep(self.root)
        self.marker = _write_marker(self.root)
        if self._looked and self.marker is not None:  # the call gave up meanwhile
            _remove_quietly(self.marker)
        if isinstance(self._device, Exception):
            raise self._device
        self.device = self._device or _transfer_device(self.url)
        meta = None if self.force else self.entry.lookup(self.sha256)
        args = (self.url, self.sha256, self.extract, self.force, self.revalidate)
        marker = self.marker.name if self.marker else None
        return _Probe(args, marker, _Held.of(meta), self.manager.offline, self.device.type)

    def _agree_on_device(self, probes: Sequence[_Probe]) -> None:
        """One device type for every rank: where ranks see different accelerators (a node
        whose GPU is not visible), the CPU if the group has a backend for it."""
        kinds = [probe.device for probe in probes]
        if len(set(kinds)) == 1:
            return
        config = str(dist.get_backend_config())
        if _device_type(config, ()) != "cpu":
            raise DownloadError(
                self.url,
                f"the ranks would move the bytes on different devices ({', '.join(kinds)} by rank) "
                f"and the default group has no backend for the CPU (its backends: {config}); make "
                "every rank see the same accelerator, or add a CPU backend (cpu:gloo)",
            )
        self.device = torch.device("cpu")

    def _rebind(self) -> Optional[_Held]:
        """The copy this leader's folder holds once re-bound (hashed), as a plain call does."""
        return _Held.of(self.entry.rebind(self.sha256))

    def _held(self, sha256: Optional[str]) -> Optional[Metadata]:
        """The sidecar of this cache's verified copy, re-bound if the cache was copied."""
        return self.entry.lookup(sha256) or self.entry.rebind(sha256)

    def _look(self, probes: Sequence[_Probe]) -> list[int]:
        """The ranks whose marker is in this rank's cache folder."""
        return [
            rank
            for rank, probe in enumerate(probes)
            if probe.marker is not None and _exists(self.root / probe.marker)
        ]

    def _transfer(self, info: _Source, source: int, receivers: list[int], sender: Optional[_Sender]) -> None:
        """Send the file from `source` to `receivers`, each publishing its copy."""
        rank = dist.get_rank()
        receiver = _Receiver(self, info) if rank in receivers else None
        try:
            if rank == source or receiver is not None:
                logger.info(
                    "rank %d %s %s (%d bytes) over the process group",
                    rank,
                    "sends" if rank == source else "receives",
                    self.url,
                    info.size,
                )
            self._send(info.size, source, receivers, sender, receiver)
            self._step(
                receiver.publish if receiver else sender.check if sender else None,
                type(None),
                "publishing the received copy",
            )
        finally:
            if receiver is not None:
                receiver.close()

    def _send(
        self,
        size: int,
        source: int,
        receivers: list[int],
        sender: Optional[_Sender],
        receiver: Optional[_Receiver],
    ) -> None:
        """Each chunk goes from the source to each receiver (one rank per receiving
        folder: a node's ingress is one copy, whatever its number of ranks), then every
        rank of the default group joins a one-byte `all_reduce`: each wait is one chunk
        long and bounded by the group's timeout (a subgroup would get torch's default
        one), and no rank sits in one collective for the whole transfer. A receiver
        posts the next chunk's receive before it writes this one (two buffers), so the
        network and its disk overlap. Local failures are reported in the next step,
        never by leaving the others waiting."""
        rank = dist.get_rank()
        pieces = [(offset, min(CHUNK_BYTES, size - offset)) for offset in range(0, size, CHUNK_BYTES)]
        try:
            done = torch.zeros(1, dtype=torch.uint8, device=self.device)
            receiving = rank in receivers
            count = 2 if receiving else 1 if sender is not None else 0
            buffers = [
                torch.empty(min(CHUNK_BYTES, max(size, 1)), dtype=torch.uint8, device=self.device)
                for _ in range(count)
            ]
            posted = None
            if receiving and pieces:
                posted = dist.irecv(buffers[0][: pieces[0][1]], src=source)
            for index, (offset, length) in enumerate(pieces):
                chunk = buffers[index % len(buffers)][:length] if buffers else done
                if sender is not None:
                    sender.read(offset, chunk)
                    for work in [dist.isend(chunk, dst=other) for other in receivers]:
                        if work is not None:
                            work.wait()
                elif posted is not None:
                    posted.wait()
                dist.all_reduce(done)
                if receiving and index + 1 < len(pieces):
                    posted = dist.irecv(buffers[(index + 1) % 2][: pieces[index + 1][1]], src=source)
                if receiver is not None:
                    receiver.write(chunk)
        except RuntimeError as error:  # DistBackendError, a timeout, a closed connection, CUDA
            raise DownloadError(self.url, _group_failed(error)) from error

    def _extract(self, digest: str) -> Path:
        """A leader extracts its cache's copy through the ordinary path."""
        self._verified(digest)
        return self.plain(sha256=digest, force=False, revalidate=False)

    def _resolve(self, digest: str) -> Path:
        self._verified(digest)
        if not self.extract:
            return self.entry.final

        if not extracted(self.entry):
            raise DownloadError(self.url, f"the extracted folder {self.entry.extracted} went away meanwhile")
        return self.entry.extracted

    def _verified(self, digest: str) -> None:
        """This rank's cache holds the agreed bytes, or a clear error (never a fetch)."""
        if self._held(digest) is None:
            raise DownloadError(
                self.url,
                f"the verified copy (sha256 {digest}) in {self.root} was replaced or removed "
                "by another process during the call; call again",
            )


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
    """The rank that holds the file: fetched from the origin, or found in its cache."""

    def __init__(self, call: _Call) -> None:
        super().__init__()
        self.call = call
        self.fd: Optional[int] = None
        self.error: Optional[BaseException] = None

    @property
    def url(self) -> str:
        return self.call.url

    def prepare(self) -> _Source:
        with self._working():
            return self._prepare()

    def _prepare(self) -> _Source:
        call = self.call
        meta = None if call.force or call.revalidate else call._held(call.sha256)
        if meta is None:
            call.plain(extract=False)  # the one fetch from the origin, locked and atomic
            meta = call.entry.cached()
        # Never waited on: a FIFO renamed over the file opens at once and fails the check.
        fd = os.open(call.entry.final, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        self.fd = fd
        now = os.fstat(fd)
        if meta is None or not stat.S_ISREG(now.st_mode) or file_identity(now) != _identity(meta):
            raise DownloadError(call.url, f"{call.entry.final} was replaced during the call; call again")
        return _Source(
            meta["sha256"], meta["size"], meta.get("etag"), meta.get("last_modified"), float(meta["time"])
        )

    def read(self, offset: int, chunk: torch.Tensor) -> None:
        """Fill `chunk` with the file's bytes at `offset`; after a failure, leave it as is."""
        if self.error is not None or self.fd is None:
            return
        try:
            host = chunk if chunk.device.type == "cpu" else torch.empty_like(chunk, device="cpu")
            view = host.numpy().data
            done = 0
            while done < len(view):
                got = os.preadv(self.fd, [view[done:]], offset + done)
                if got == 0:
                    raise DownloadError(self.call.url, f"{self.call.entry.final} shrank while being sent")
                done += got
            if host is not chunk:
                chunk.copy_(host)
        except BaseException as error:
            self.error = error

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def _release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class _Receiver(_Owned):
    """A leader receiving the file into a private partial file in its cache folder."""

    def __init__(self, call: _Call, info: _Source) -> None:

        super().__init__()
        self.call = call
        self.info = info
        self.writes = partial(cache_writes, call.url, call.root)
        self.partial: Optional[Partial] = None
        self.error: Optional[BaseException] = None
        try:
            with self.writes():
                self.partial = Partial.create(call.entry.final)
            self.partial.validators = Validators(info.etag, info.last_modified)
        except BaseException as error:
            self.error = error

    def write(self, chunk: torch.Tensor) -> None:
        """Write and hash `chunk`; after a failure, drop it (the broadcasts go on)."""
        if self.error is not None or self.partial is None:
            return
        data = chunk.cpu().numpy().tobytes()
        try:
            with self.writes():
                write_all(self.partial.fd, [data], self.call.url, self.partial.name.path)
            self.partial.hasher.update(data)
            self.partial.offset += len(data)
        except BaseException as error:
            self.error = error

    @property
    def url(self) -> str:
        return self.call.url

    def publish(self) -> None:
        """Verify against the sender's sha256 (and the caller's), then publish atomically."""
        with self._working():
            self._publish()

    def _publish(self) -> None:
        call, partial_file = self.call, self.partial
        if self.error is not None:
            raise self.error
        assert partial_file is not None
        with self.writes():
            os.fsync(partial_file.fd)
            if self._closed:  # the call gave up (this fsync hung): publish nothing afterwards
                raise DownloadError(call.url, "the call was given up while this copy was written")
            fetched = partial_file.verified(call.url, self.info.sha256)
            if call.sha256 is not None and fetched.sha256 != call.sha256:
                raise ChecksumError(call.url, call.sha256, fetched.sha256)
            self.partial = None
            partial_file.close(keep=True)
            publish_fetched(call.entry, attrs.evolve(fetched, fetched=self.info.fetched))
        logger.info("published %s (%d bytes, sha256 %s)", call.entry.final, fetched.size, fetched.sha256)

    def _release(self) -> None:
        if self.partial is not None:  # not published: remove the partial file
            self.partial.close(keep=False)
            self.partial = None
