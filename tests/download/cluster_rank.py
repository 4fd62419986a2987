"""One rank of a real gloo group for the cluster-fetch tests and benchmark.

Run as ``python cluster_rank.py SPEC_JSON``; the spec names the rank, the group, the URL,
this rank's cache folder and what to inject. The rank writes its outcome as JSON to
``<out>/rank<N>.json``: the path and its sha256, or the error's class and message.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist


def _inject(kind: str) -> None:
    if kind == "enospc":  # this rank's disk is full: every cache write fails
        from framework.download import _pipeline

        def full(fd: int, buffers: Any) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        _pipeline._writev = full  # type: ignore[assignment]
        from framework.download import _parallel

        _parallel._pwrite = lambda fd, data, offset: full(fd, [data])  # type: ignore[assignment]
    elif kind in ("corrupt", "die"):  # a flipped bit on the way in; a rank killed mid-transfer
        from framework.download import _cluster

        receive = _cluster._Receiver.write

        def write(self: Any, chunk: Any) -> None:
            if kind == "die":
                os._exit(7)
            chunk[0] ^= 1
            receive(self, chunk)

        _cluster._Receiver.write = write  # type: ignore[method-assign]


def main(spec: dict[str, Any]) -> None:
    from framework.download import DownloadManager

    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the test reads who sent what
    rank = spec["rank"]
    spec = {**spec, **spec.get("per_rank", {}).get(str(rank), {})}  # a caller's per-rank bug
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{spec['port']}",
        rank=rank,
        world_size=spec["world"],
        timeout=timedelta(seconds=spec.get("pg_timeout", 30)),
    )
    _inject(spec.get("inject", {}).get(str(rank), ""))
    manager = DownloadManager(
        spec["cache"], progress=False, backoff_factor=0.01, retries=spec.get("retries", 2)
    )
    result: dict[str, Any] = {"rank": rank}
    started = time.perf_counter()
    try:
        path = manager.cached_path(
            spec["url"],
            sha256=spec.get("sha256"),
            extract=spec.get("extract", False),
            distributed=spec.get("distributed", True),
        )
        result["path"] = str(path)
        if path.is_file():
            result["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    except Exception as error:
        result["error"] = type(error).__name__
        result["message"] = str(error)
    result["seconds"] = time.perf_counter() - started
    Path(spec["out"], f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
