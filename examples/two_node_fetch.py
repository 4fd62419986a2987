"""Two "nodes" on one machine, one fetch from the origin: ``framework run`` under torchrun.

    python examples/two_node_fetch.py

This script plays the cluster: it serves a data file from a local HTTP server (the
origin, counting its GETs) and starts two torchrun launches, as two nodes would:

    FRAMEWORK_CACHE=<tmp>/node0 torchrun --nnodes 2 --node-rank 0 --nproc-per-node 2 \\
        --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:<port> --rdzv-id <id> \\
        -m framework run --json -o '{"data_path": "http://127.0.0.1:<port>/corpus.txt"}'
    FRAMEWORK_CACHE=<tmp>/node1 torchrun --nnodes 2 --node-rank 1 ...   (the same)

Each launch has its own cache folder, as nodes with local disks do. ``framework run``
joins the job's process group and calls ``cached_path(data_path, distributed=True)``:
rank 0 fetches the file from the origin, node 1's first rank receives the bytes over
the process group, and both caches end up holding a verified copy. The script checks
that the origin answered exactly one GET and that both caches hold the same bytes, and
exits 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
CORPUS = REPO_ROOT / "framework" / "examples" / "corpus.txt"


class Origin(ThreadingHTTPServer):
    """Serves one file on 127.0.0.1 and counts the GETs."""

    daemon_threads = True

    def __init__(self, data: bytes) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.data = data
        self.gets = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/corpus.txt"


class _Handler(BaseHTTPRequestHandler):
    server: Origin

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.gets += 1
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.server.data)))
        self.send_header("ETag", '"' + hashlib.sha256(self.server.data).hexdigest()[:16] + '"')
        self.end_headers()
        self.wfile.write(self.server.data)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def launch(
    node_rank: int, cache: Path, url: str, rdzv_port: int, args: argparse.Namespace
) -> subprocess.Popen[str]:
    """One node's torchrun, with the node's own cache folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRAMEWORK_", "TORCHELASTIC_"))}
    env.update(FRAMEWORK_CACHE=str(cache), OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    override = {"data_path": url, "epochs": 1, "data_loader": {"num_workers": args.num_workers}}
    command = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "2", "--node-rank", str(node_rank), "--nproc-per-node", str(args.nproc_per_node),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{rdzv_port}", "--rdzv-id", "two-node-fetch",
        "-m", "framework", "run", "--json", "--no-progress", "-o", json.dumps(override),
    ]  # fmt: skip
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where the node caches go (default: a temp dir)"
    )
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--num-workers", type=int, default=1, help="loader workers per rank")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before the launches are killed")
    args = parser.parse_args()

    data = CORPUS.read_bytes()
    origin = Origin(data)
    threading.Thread(target=origin.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="two-node-fetch-"))
    caches = [workdir / "node0", workdir / "node1"]
    rdzv_port = free_port()
    launches = [launch(node, cache, origin.url, rdzv_port, args) for node, cache in enumerate(caches)]
    outputs = []
    try:
        for proc in launches:
            outputs.append(proc.communicate(timeout=args.timeout)[0])
    except subprocess.TimeoutExpired:
        for proc in launches:
            proc.kill()
            proc.communicate()
        print(f"the launches did not finish within {args.timeout:g}s", file=sys.stderr)
        return 1
    finally:
        origin.shutdown()
    for node, (proc, output) in enumerate(zip(launches, outputs)):
        if proc.returncode != 0:
            print(f"node {node} failed (exit {proc.returncode}):\n{output}", file=sys.stderr)
            return 1
    digest = hashlib.sha256(data).hexdigest()
    held = {}
    for cache in caches:
        files = [p for p in cache.glob("*-corpus.txt") if p.is_file()]
        held[str(cache)] = [hashlib.sha256(p.read_bytes()).hexdigest() == digest for p in files]
    print(json.dumps({"origin_gets": origin.gets, "caches": held}, indent=2))
    if origin.gets != 1 or any(found != [True] for found in held.values()):
        print("expected one GET and one verified copy in each node's cache", file=sys.stderr)
        return 1
    print(f"ok: {len(caches)} nodes x {args.nproc_per_node} ranks, one GET from the origin")
    return 0


if __name__ == "__main__":
    sys.exit(main())
