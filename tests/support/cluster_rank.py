"""One rank of a real gloo group for the cluster-fetch tests and benchmark.

Run as ``python tests/support/cluster_rank.py SPEC_JSON`` (or forked: `forked_main`); the
spec names the rank, the group, the URL, this rank's cache folder and what to inject. The
rank writes its outcome as JSON to ``<out>/rank<N>.json``: the path and its sha256, or the
error's class and message. With ``calls`` (a list of overrides of the spec) it makes those
calls in turn in one group and writes the list of their outcomes.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import sys
import threading
import time
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist


def _inject(kind: str, spec: dict[str, Any], stack: ExitStack) -> None:
    """Patch this rank for one call; `stack` undoes it."""
    from framework.download import _cluster, _cluster_transfer

    def patch(target: Any, name: str, value: Any) -> None:
        stack.enter_context(mock.patch.object(target, name, value))

    if "chunk_bytes" in spec:  # many chunks from a small file
        patch(_cluster_transfer, "CHUNK_BYTES", spec["chunk_bytes"])
    if "backend_config" in spec:  # the group's backends as torch would report them
        patch(dist, "get_backend_config", lambda *args, **kwargs: spec["backend_config"])
    if kind == "cuda_node":  # this rank sees a GPU (others do not: a node whose driver broke)
        import torch

        patch(torch.cuda, "is_available", lambda: True)
        patch(torch.cuda, "current_device", lambda: 0)
    if kind == "enospc":  # this rank's disk is full: every cache write fails
        from framework.download import _pipeline

        def full(fd: int, buffers: Any) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        patch(_pipeline, "_writev", full)
        from framework.download.parallel import _engine

        patch(_engine, "_pwrite", lambda fd, data, offset: full(fd, [data]))
    elif kind in ("corrupt", "die", "slow", "stall"):
        receive = _cluster._Receiver.write

        def write(self: Any, chunk: Any) -> None:
            if kind == "die":  # a rank killed mid-transfer
                os._exit(7)
            if kind == "corrupt":  # a flipped bit on the way in
                chunk[0] ^= 1
            if kind == "slow":  # a slow disk or link: a quarter of the group's timeout a chunk
                time.sleep(spec["pg_timeout"] / 4)
            if kind == "stall" and not _stalled:  # a hung disk: until rank 0's call ended
                _stalled.append(
                    _wait_for(Path(spec["out"], f"rank0.done{spec['index']}"), 3 * spec["pg_timeout"])
                )
            receive(self, chunk)

        patch(_cluster._Receiver, "write", write)
    elif kind == "die_sending":  # the fetching rank killed as it sends its second piece
        move = _cluster_transfer.Transfer._move

        def dying(self: Any, restart: bool, offset: int, length: int) -> None:
            if length and offset:
                os._exit(8)
            move(self, restart, offset, length)

        patch(_cluster_transfer.Transfer, "_move", dying)
    elif kind == "slow_fsync":  # the publish step's fsync outlasts the call
        real_fsync = os.fsync

        def fsync(fd: int) -> None:
            if threading.current_thread().name == "framework-cluster-step":
                time.sleep(3)
            real_fsync(fd)

        patch(os, "fsync", fsync)
    elif kind in ("hang_probe", "hang_extract"):  # a hung disk inside a step, until another rank's call ended
        name = "_probe" if kind == "hang_probe" else "_extract"
        real = getattr(_cluster._Call, name)

        def hung(self: Any, *args: Any) -> Any:
            _hang(spec)
            return real(self, *args)

        patch(_cluster._Call, name, hung)
    elif kind == "hang_fsync":  # the publish step's fsync hangs (a hard NFS mount)
        real_fsync = os.fsync

        def hung_fsync(fd: int) -> None:
            if threading.current_thread().name == "framework-cluster-step":
                _hang(spec)
            real_fsync(fd)

        patch(os, "fsync", hung_fsync)
    elif kind == "fifo":  # a FIFO is renamed over the file this rank just published
        plain = _cluster._Call.plain

        def fifo_after(self: Any, **changes: Any) -> Any:
            path = plain(self, **changes)
            temp = self.entry.final.with_name(self.entry.final.name + ".fifo")
            os.mkfifo(temp)
            os.replace(temp, self.entry.final)
            return path

        patch(_cluster._Call, "plain", fifo_after)
    elif kind == "readonly":  # only this rank sees its cache folder read-only
        real_open, real_mkdir = os.open, os.mkdir

        def open_readonly(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            if flags & os.O_CREAT and str(path).startswith(spec["cache"]):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            return real_open(path, flags, *args, **kwargs)

        def mkdir_readonly(path: Any, *args: Any, **kwargs: Any) -> None:
            if str(path).startswith(spec["cache"]):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            real_mkdir(path, *args, **kwargs)

        patch(os, "open", open_readonly)
        patch(os, "mkdir", mkdir_readonly)
    elif kind == "die_at_publish":  # killed in the step after the transfer
        step, steps = _cluster._Call._step, []

        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            steps.append(args)
            if len(steps) == 5:  # probe, look, re-bind, fetch and send, publish
                os._exit(9)
            return step(self, *args, **kwargs)

        patch(_cluster._Call, "_step", counted)


_stalled: list[bool] = []  # whether the stall ended because rank 0's call had ended
_hangs: dict[int, str] = {}  # by call: "hanging", then how the hang ended


def _hang(spec: dict[str, Any]) -> None:
    """Hang like a hard NFS mount: until this rank's own call has ended (its outcome
    written), or three timeouts; once per call."""
    if spec["index"] in _hangs:
        return
    _hangs[spec["index"]] = "hanging"
    ended = _wait_for(Path(spec["out"], f"rank{spec['rank']}.done{spec['index']}"), 3 * spec["pg_timeout"])
    _hangs[spec["index"]] = "ended after the call" if ended else "timed out"


def _count_received(stack: ExitStack, received: list[int]) -> None:
    """Count the bytes this rank receives over the process group (broadcast or recv)."""
    for name in ("broadcast", "recv", "irecv"):
        real = getattr(dist, name)

        def counted(tensor: Any, *args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            src = kwargs.get("src", args[0] if args else None)
            if _name != "broadcast" or src != dist.get_rank():
                received.append(tensor.numel() * tensor.element_size())
            return _real(tensor, *args, **kwargs)

        stack.enter_context(mock.patch.object(dist, name, counted))


def _wait_for(path: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _app_files_survive(folder: Path) -> str:
    """After a failed call the application opens files (reusing descriptor numbers) and
    the call's threads end: its files must stay usable."""
    files = [open(folder / f"app{i}.log", "w") for i in range(30)]
    for thread in threading.enumerate():
        if thread.name == "framework-cluster-step":
            thread.join(30)
    bad = []
    for file in files:
        try:
            file.write("x")
            file.close()
        except OSError as error:
            bad.append(f"{file.name}: {error}")
    return "; ".join(bad) or "ok"


def main(spec: dict[str, Any]) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the test reads who sent what
    rank = spec["rank"]
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{spec['port']}",
        rank=rank,
        world_size=spec["world"],
        timeout=timedelta(seconds=spec.get("pg_timeout", 30)),
    )
    # Several calls in one group (each spec's overrides) save starting processes per scenario.
    results = []
    for index, overrides in enumerate(spec.get("calls", [{}])):
        results.append(_call({**spec, **overrides, "index": index}, rank))
        # Written at once (a later call may kill this rank), then the call's end is marked
        # (a stalled rank waits for rank 0's).
        Path(spec["out"], f"rank{rank}.json").write_text(
            json.dumps(results if "calls" in spec else results[0])
        )
        Path(spec["out"], f"rank{rank}.done{index}").touch()
    dist.destroy_process_group()


def _call(spec: dict[str, Any], rank: int) -> dict[str, Any]:
    from framework.download import DownloadManager

    spec = {**spec, **spec.get("per_rank", {}).get(str(rank), {})}  # a caller's per-rank bug
    if "caches" in spec:  # this call's own cache folders
        spec["cache"] = spec["caches"][rank]
    result: dict[str, Any] = {"rank": rank}
    received: list[int] = []
    with ExitStack() as stack:
        _inject(spec.get("inject", {}).get(str(rank), ""), spec, stack)
        _count_received(stack, received)
        manager = DownloadManager(
            spec["cache"],
            progress=False,
            backoff_factor=0.01,
            retries=spec.get("retries", 2),
            offline=spec.get("offline", False),
            connections=spec.get("connections"),
        )
        started = time.perf_counter()
        try:
            path = manager.cached_path(
                spec["url"],
                cache_dir=spec.get("cache_dir"),
                sha256=spec.get("sha256"),
                extract=spec.get("extract", False),
                force=spec.get("force", False),
                revalidate=spec.get("revalidate", False),
                distributed=spec.get("distributed", True),
            )
            result["path"] = str(path)
            if path.is_file():
                result["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        except Exception as error:
            result["error"] = type(error).__name__
            result["message"] = str(error)
        result["seconds"] = time.perf_counter() - started
    result["received_bytes"] = sum(received)
    if _stalled:
        result["stall_ended_by_rank0"] = _stalled[0]
    if spec["index"] in _hangs:  # how it stood when this call returned
        result["hang"] = _hangs[spec["index"]]
    if spec.get("inject", {}).get(str(rank)) == "slow_fsync":
        result["app_files"] = _app_files_survive(Path(spec["out"]))
    return result


def forked_main(spec: dict[str, Any], log: str, environ: dict[str, str]) -> None:
    """`main` in a process forked from the test forkserver (torch imported already), with
    the environment a fresh process would get and its output to `log`."""
    os.environ.clear()
    os.environ.update(environ)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    if "OMP_NUM_THREADS" in environ:  # read when torch was imported, in the forkserver
        torch.set_num_threads(int(environ["OMP_NUM_THREADS"]))
    main(spec)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
