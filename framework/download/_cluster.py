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
   while the origin fetch still arrives (`_cluster_transfer`: a piece per heartbeat of
   the fetching step, from the prefix of the download already hashed, point to point to
   each receiving leader: one copy per folder whatever its number of ranks; the tensors
   live on the device the group has a backend for, see `_device_type`) and publishes
   them like a download: a private partial file hashed while written, checked against
   the sender's sha256 (and the caller's), fsynced, the sidecar, then `os.replace`.
   Partial files of dead receivers are swept by every later call.
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
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

import torch
import torch.distributed as dist

from framework.download._cache import Entry, Metadata
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
from framework.download._cluster_transfer import CHUNK_BYTES, Transfer, _Receiver, _Sender
from framework.download._collective import POLL_S as POLL_S
from framework.download._collective import _Collective
from framework.download._collective import _decode as _decode
from framework.download._collective import _encode as _encode
from framework.download._partial import partial_bytes
from framework.errors import DownloadError, InvalidArgumentError

if TYPE_CHECKING:
    from framework.download.manager import DownloadManager

__all__ = ["CHUNK_BYTES", "POLL_S", "cluster_cached_path"]


logger = logging.getLogger("framework.download")

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
            digest = self._send(from_origin, source, leaders, held)
        assert digest is not None
        if self.extract:
            self._step(
                partial(self._extract, digest) if leader_of[rank] == rank else None,
                (Path, type(None)),
                "extracting the archive",
            )
        path: list[Path] = self._step(partial(self._resolve, digest), Path, "checking its copy")
        return path[rank]

    def _send(
        self, from_origin: bool, source: int, leaders: list[int], held: dict[int, Optional[_Held]]
    ) -> str:
        """Get the file to `source` and from there to the leaders that need it, as it
        arrives (see `_cluster_transfer`); its sha256. A leader holding some copy, when
        the one fetched may be the same version, gets the bytes once that is known."""
        rank = dist.get_rank()
        expected = self.sha256 if from_origin else _digest(held[source])
        early: list[int] = []
        late: list[int] = []
        for leader in leaders:
            holds_it = expected is not None and _digest(held[leader]) == expected
            if leader == source or (holds_it and not self.force):
                continue
            maybe_same = not self.force and expected is None and held[leader] is not None
            (late if maybe_same else early).append(leader)
        sender = _Sender(self) if rank == source else None
        try:
            what = "fetching the file" if from_origin else "opening its cached copy"
            info: _Source = self._transfer(source, early, sender, what)
            late = [leader for leader in late if _digest(held[leader]) != info.sha256]
            if late:
                self._transfer(source, late, sender, "sending the file", info)
        finally:
            if sender is not None:
                sender.close()
        return info.sha256

    def _transfer(
        self,
        source: int,
        receivers: list[int],
        sender: Optional[_Sender],
        what: str,
        info: Optional[_Source] = None,
    ) -> _Source:
        """One step: the sender gets the file ready (fetches it; not again once `info`
        says what it is) while its bytes go to `receivers`, which then publish their
        copies; what the sender says of the file."""
        rank = dist.get_rank()
        receiver = _Receiver(self) if rank in receivers else None
        try:
            if receivers and (rank == source or receiver is not None):
                logger.info(
                    "rank %d %s %s over the process group (%s)",
                    rank,
                    "sends" if rank == source else "receives",
                    self.url,
                    f"to ranks {receivers}" if rank == source else f"from rank {source}",
                )
            transfer = Transfer(self, source, receivers, sender, receiver)
            progress = partial(partial_bytes, self.entry.final)
            work = sender.prepare if sender is not None and info is None else None
            outcomes = self._step(work, (_Source, type(None)), what, progress, rounds=transfer)
            info = info or outcomes[source]
            assert info is not None
            self._step(
                partial(receiver.publish, info) if receiver else sender.check if sender else None,
                type(None),
                "publishing the received copy",
            )
        finally:
            if receiver is not None:
                receiver.close()
        return info

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
