"""One fetch per cluster: ``cached_path(distributed=True)`` vs each node fetching alone.

4 ranks (separate processes, a real gloo group on 127.0.0.1) as 2 "nodes" with
node-local caches (ranks 0-1 share one folder, ranks 2-3 another). The origin is a
local HTTP server in its own process, unpaced (``0``) or paced to a rate in MiB/s for
all its connections together (``--pace link``: one uplink, e.g. an object store's
egress or the site's WAN link) or for each connection (``--pace connection``). The
origin shares the CPUs with the ranks: time it lost the CPU for is made up, up to 50 ms
at a time, as a link on another machine would (every row alike).

- **single**: one process calls plain ``cached_path`` once: one origin fetch, nothing
  else (the floor for the cluster call's wall time on an unpaced origin).
- **independent**: every rank calls plain ``cached_path`` on its node's cache: the lock
  makes one fetch per node, so the origin sends the object once per node.
- **cluster**: every rank calls ``cached_path(..., distributed=True)``: rank 0 fetches,
  node 1's first rank receives the bytes over the process group as they arrive.

For each origin rate the rows take turns, ``--repeats`` times. Reported: median wall
time (from a barrier after the group is up to the last rank's return), the bytes and
GETs the origin served per call, and the ratios. Not part of ``run_all.py``; it prints
its figures and writes ``benchmarks/results/cluster.json``.

    python benchmarks/bench_cluster.py [--size-mib 256] [--rates 0 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
FORK = multiprocessing.get_context("fork")
RESULTS = Path(__file__).resolve().parent / "results" / "cluster.json"
MODES = ("single", "independent", "cluster")
CATCH_UP_S = 0.05


def _serve(path: str, port: Any, ready: Any, per_connection: bool) -> None:
    """Serve `path` at `/<call>?rate=<MiB/s>`, paced to that rate (0: unpaced) for all
    connections together (a shared link) or for each connection; `/stats` answers the
    bytes and GETs served per call."""
    size = os.path.getsize(path)
    link = threading.Lock()
    link_free = [0.0]  # when the shared link is next free
    stats: dict[str, list[int]] = {}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            call, _, query = self.path.lstrip("/").partition("?rate=")
            if call == "stats":
                body = json.dumps(stats).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            counts = stats.setdefault(call, [0, 0])
            counts[1] += 1
            pace = float(query or 0) * (1 << 20)
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.send_header("ETag", f'"{size}"')
            self.end_headers()
            began, done = time.perf_counter(), 0
            with open(path, "rb") as file:
                while done < size:
                    count = min(1 << 20, size - done)
                    if pace and per_connection:
                        time.sleep(max(0.0, began + (done + count) / pace - time.perf_counter()))
                    elif pace:
                        with link:  # reserve the link for this chunk
                            # Time this process lost the CPU for (it shares the machine with
                            # the ranks) is made up, up to `CATCH_UP_S`: the link's own pace.
                            due = max(link_free[0], time.perf_counter() - CATCH_UP_S) + count / pace
                            link_free[0] = due
                        time.sleep(max(0.0, due - time.perf_counter()))
                    count = self.connection.sendfile(file, done, count)
                    done += count
                    counts[0] += count

    ThreadingHTTPServer.request_queue_size = 128
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    port.value = server.server_address[1]
    ready.set()
    server.serve_forever()


def rank_main(spec: dict[str, Any]) -> None:
    """One rank: join the group once, then make each call in turn (all ranks start it
    after a barrier; a rank with no cache folder for it sits it out), timing each."""
    import torch.distributed as dist

    from framework.download import DownloadManager

    rank = spec["rank"]
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{spec['port']}",
        rank=rank,
        world_size=spec["world"],
        timeout=timedelta(seconds=300),
    )
    times = []
    for call in spec["calls"]:
        dist.barrier()
        started = time.time()
        cache = call["caches"][rank]
        if cache is not None:
            DownloadManager(cache, progress=False).cached_path(call["url"], distributed=call["distributed"])
        times.append((started, time.time()) if cache is not None else None)
        dist.barrier()
        if rank == 0:  # the page cache stays as free for every call
            shutil.rmtree(Path(call["caches"][0]).parent)
    dist.barrier()
    Path(spec["out"], f"rank{rank}.json").write_text(json.dumps(times))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def plan(args: argparse.Namespace, base: str, workdir: Path) -> list[dict[str, Any]]:
    """Every call, each with its own URL and cache folders: for each origin rate, the
    modes take turns `args.repeats` times."""
    world = args.nodes * args.ranks_per_node
    calls = []
    for mib in args.rates:
        for round_ in range(args.repeats):
            for mode in MODES:
                name = f"{mib:g}-{mode}-{round_}"
                folders = [
                    str(workdir / name / f"node{rank // args.ranks_per_node}") for rank in range(world)
                ]
                caches = [folders[0]] + [None] * (world - 1) if mode == "single" else folders
                url = f"{base}/{name}?rate={mib:g}"
                calls.append({"name": name, "mib": mib, "mode": mode, "url": url, "caches": caches})
                calls[-1]["distributed"] = mode == "cluster"
    return calls


def measure(args: argparse.Namespace, base: str, workdir: Path) -> dict[str, Any]:
    """Run the plan in one group of ranks; the medians and ratios per origin rate."""
    calls = plan(args, base, workdir)
    world = args.nodes * args.ranks_per_node
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEWORK_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = "1"
    port = free_port()
    procs = []
    for rank in range(world):
        spec = {"rank": rank, "world": world, "port": port, "calls": calls, "out": str(workdir)}
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank-spec", json.dumps(spec)], env=env))
    for proc in procs:
        if proc.wait(timeout=3600) != 0:
            raise SystemExit(f"a rank failed (exit {proc.returncode})")
    times = [json.loads((workdir / f"rank{rank}.json").read_text()) for rank in range(world)]
    with urllib.request.urlopen(f"{base}/stats") as answer:
        stats = json.loads(answer.read())
    results: dict[str, Any] = {}
    for mib in args.rates:
        row: dict[str, Any] = {}
        for mode in MODES:
            walls, traffic = [], []
            for index, call in enumerate(calls):
                if call["mib"] == mib and call["mode"] == mode:
                    spans = [span[index] for span in times if span[index] is not None]
                    walls.append(max(end for _, end in spans) - min(start for start, _ in spans))
                    traffic.append(stats.get(call["name"], [0, 0]))
            row[mode] = {
                "wall_s": round(statistics.median(walls), 2),
                "runs_s": [round(wall, 2) for wall in walls],
                "origin_mib": round(statistics.median(sent for sent, _ in traffic) / (1 << 20), 1),
                "gets": statistics.median(gets for _, gets in traffic),
            }
        cluster = row["cluster"]["wall_s"]
        row["cluster_vs_independent"] = round(cluster / row["independent"]["wall_s"], 2)
        row["cluster_vs_single"] = round(cluster / row["single"]["wall_s"], 2)
        faster = min(row["independent"]["wall_s"], row["single"]["wall_s"])
        row["cluster_vs_faster"] = round(cluster / faster, 2)
        results["unpaced" if not mib else f"{mib:g} MiB/s"] = row
    return results


def report(args: argparse.Namespace, results: dict[str, Any]) -> None:
    print(
        f"{args.nodes} nodes x {args.ranks_per_node} ranks, node-local caches, a {args.size_mib} MiB "
        f"object, origin paced per {args.pace}; median of {args.repeats}, rows taking turns; "
        f"{os.cpu_count()} CPUs"
    )
    print(f"{'origin':<12} {'mode':<12} {'wall (s)':>9} {'origin MiB':>11} {'GETs':>5}")
    for origin, row in results.items():
        for mode in MODES:
            one = row[mode]
            print(
                f"{origin:<12} {mode:<12} {one['wall_s']:>9.2f} {one['origin_mib']:>11.1f} {one['gets']:>5}"
            )
        print(
            f"{origin:<12} cluster / independent {row['cluster_vs_independent']:.2f}, / single "
            f"{row['cluster_vs_single']:.2f}, / the faster {row['cluster_vs_faster']:.2f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument(
        "--rates", type=float, nargs="+", default=[0.0, 64.0], help="the origin's paces, MiB/s (0: unpaced)"
    )
    parser.add_argument("--pace", choices=["link", "connection"], default="link")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--ranks-per-node", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
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
        port, ready = FORK.Value("i", 0), FORK.Event()
        server = FORK.Process(
            target=_serve, args=(str(source), port, ready, args.pace == "connection"), daemon=True
        )
        server.start()
        ready.wait(30)
        try:
            results = measure(args, f"http://127.0.0.1:{port.value}", workdir)
        finally:
            server.terminate()
    report(args, results)
    setup = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "size_mib": args.size_mib,
        "pace": args.pace,
        "nodes": args.nodes,
        "ranks_per_node": args.ranks_per_node,
        "repeats": args.repeats,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({**setup, **results}, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
