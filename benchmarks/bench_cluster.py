"""One fetch per cluster: ``cached_path(distributed=True)`` vs every node fetching alone.

4 ranks (separate processes, a real gloo group on 127.0.0.1) as 2 "nodes" with
node-local caches (ranks 0-1 share one folder, ranks 2-3 another). The origin is a
local HTTP server in its own process, paced to ``--rate-mib`` MiB/s for all its
connections together (``--pace link``: one uplink, e.g. an object store's egress or the
site's WAN link) or for each connection (``--pace connection``: a per-client cap).

- **independent**: every rank calls plain ``cached_path`` on its node's cache: the lock
  makes one fetch per node, so the origin sends the object once per node.
- **cluster**: every rank calls ``cached_path(..., distributed=True)``: rank 0 fetches,
  node 1's first rank receives the bytes over the process group.

Reported: wall time (from a barrier after the group is up to the last rank's return) and
the bytes the origin sent. Not part of ``run_all.py``; it prints its figures and writes
``benchmarks/results/cluster.json``.

    python benchmarks/bench_cluster.py [--size-mib 256] [--rate-mib 64] [--pace link]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
FORK = multiprocessing.get_context("fork")
RESULTS = Path(__file__).resolve().parent / "results" / "cluster.json"


def _serve(path: str, port: Any, sent: Any, gets: Any, ready: Any, rate: float, per_connection: bool) -> None:
    """Serve `path`, paced to `rate` bytes/s for all connections together (a shared
    link) or for each connection."""
    size = os.path.getsize(path)
    link = threading.Lock()
    link_free = [0.0]  # when the shared link is next free

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            with gets.get_lock():
                gets.value += 1
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.send_header("ETag", f'"{size}"')
            self.end_headers()
            began, done = time.perf_counter(), 0
            with open(path, "rb") as file:
                while done < size:
                    count = min(1 << 20, size - done)
                    if per_connection:
                        due = began + (done + count) / rate
                    else:
                        with link:  # reserve the link for this chunk
                            due = max(link_free[0], time.perf_counter()) + count / rate
                            link_free[0] = due
                    time.sleep(max(0.0, due - time.perf_counter()))
                    count = self.connection.sendfile(file, done, count)
                    done += count
                    with sent.get_lock():
                        sent.value += count

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    port.value = server.server_address[1]
    ready.set()
    server.serve_forever()


def rank_main(spec: dict[str, Any]) -> None:
    """One rank: join the group, wait for all, time one cached_path call."""
    import torch.distributed as dist

    from framework.download import DownloadManager

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{spec['port']}",
        rank=spec["rank"],
        world_size=spec["world"],
        timeout=timedelta(seconds=300),
    )
    manager = DownloadManager(spec["cache"], progress=False)
    dist.barrier()
    started = time.time()
    manager.cached_path(spec["url"], distributed=spec["distributed"])
    finished = time.time()
    Path(spec["out"]).write_text(json.dumps({"started": started, "finished": finished}))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def run(mode: str, url: str, workdir: Path, world: int, ranks_per_node: int) -> float:
    """Wall time of one call on every rank, fresh node-local caches."""
    folder = workdir / mode
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEWORK_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = "1"
    procs = []
    for rank in range(world):
        spec = {
            "rank": rank,
            "world": world,
            "port": port,
            "url": url,
            "cache": str(folder / f"node{rank // ranks_per_node}"),
            "distributed": mode == "cluster",
            "out": str(folder / f"rank{rank}.json"),
        }
        folder.mkdir(parents=True, exist_ok=True)
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank-spec", json.dumps(spec)], env=env))
    for proc in procs:
        if proc.wait(timeout=600) != 0:
            raise SystemExit(f"{mode}: a rank failed (exit {proc.returncode})")
    times = [json.loads((folder / f"rank{rank}.json").read_text()) for rank in range(world)]
    return max(t["finished"] for t in times) - min(t["started"] for t in times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--rate-mib", type=float, default=64.0, help="the origin's pace, MiB/s")
    parser.add_argument("--pace", choices=["link", "connection"], default="link")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--ranks-per-node", type=int, default=2)
    parser.add_argument("--rank-spec", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_spec:
        rank_main(json.loads(args.rank_spec))
        return 0

    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as temp:
        workdir = Path(temp)
        source = workdir / "object.bin"
        with open(source, "wb") as file:
            for _ in range(args.size_mib):
                file.write(os.urandom(1 << 20))
        port, sent, gets, ready = FORK.Value("i", 0), FORK.Value("q", 0), FORK.Value("i", 0), FORK.Event()
        rate = args.rate_mib * (1 << 20)
        server = FORK.Process(
            target=_serve,
            args=(str(source), port, sent, gets, ready, rate, args.pace == "connection"),
            daemon=True,
        )
        server.start()
        ready.wait(30)
        url = f"http://127.0.0.1:{port.value}/object.bin"
        world = args.nodes * args.ranks_per_node
        results = {}
        try:
            for mode in ("independent", "cluster"):
                sent.value, gets.value = 0, 0
                wall = run(mode, url, workdir, world, args.ranks_per_node)
                results[mode] = {
                    "wall_s": round(wall, 2),
                    "origin_mib": round(sent.value / (1 << 20), 1),
                    "gets": gets.value,
                }
        finally:
            server.terminate()
    print(
        f"{args.nodes} nodes x {args.ranks_per_node} ranks, node-local caches, a {args.size_mib} MiB object, "
        f"origin paced to {args.rate_mib:g} MiB/s per {args.pace}; {os.cpu_count()} CPUs"
    )
    print(f"{'':<12} {'wall (s)':>9} {'origin MiB':>11} {'GETs':>5}")
    for mode, row in results.items():
        print(f"{mode:<12} {row['wall_s']:>9.2f} {row['origin_mib']:>11.1f} {row['gets']:>5}")
    print(json.dumps(results))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    setup = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "size_mib": args.size_mib,
        "rate_mib": args.rate_mib,
        "pace": args.pace,
        "nodes": args.nodes,
        "ranks_per_node": args.ranks_per_node,
    }
    RESULTS.write_text(json.dumps({**setup, **results}, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
