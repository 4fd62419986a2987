"""Fetch CPU benchmark: the client's CPU seconds per MiB fetched, ours against a plain
streamed copy, over the paced link, HTTP and S3, in one run.

A loader that streams its shards fetches them on the cores its workers read on, so
every CPU second a fetch spends is taken from reading. Wall time on this 2-core rig
mixes in the servers' and the proxy's CPU; the client's own CPU time (user + system, all
its threads) does not. The link is ``rig.PACED`` (16 MiB/s per connection, 128 MiB/s in
total, 20 ms to the first byte), in front of a stock threaded HTTP server and of moto's
S3 server, each in its own process. Rows take turns, each fetching the same objects
cold into a fresh folder:

- ours, ``DownloadManager.cached_path`` with its defaults (the adaptive ramp), and with
  ``connections=1`` (one stream: what a loader's shards fetched ahead mostly are);
- HTTP: ``requests`` streaming ``iter_content(1 MiB)`` with sha256, write, fsync and
  rename (what ours does, without locks or sidecars);
- S3: boto3's ``download_file`` (s3transfer, its defaults).

    python benchmarks/bench_fetch_cpu.py                  # 8 objects of 8 MiB, 5 turns
    python benchmarks/bench_fetch_cpu.py --mib 1 --objects 32

Results go to ``benchmarks/results/fetch_cpu.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

RESULTS = Path(__file__).resolve().parent / "results" / "fetch_cpu.json"
BUCKET = "bench"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=8)
    parser.add_argument("--mib", type=float, default=8.0, help="each object's size")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import boto3
    import requests
    from rig import FORK, MIB, PACED, free_port, proxy, serve_http, serve_moto, wait_port

    from framework.download import DownloadManager

    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
    )
    work = Path(tempfile.mkdtemp(prefix="bench-fetch-cpu-"))
    served = work / "served"
    served.mkdir()
    size = int(args.mib * MIB)
    names = [f"object-{index}" for index in range(args.objects)]
    for name in names:
        (served / name).write_bytes(os.urandom(size))
    ports = [free_port() for _ in range(4)]
    http_port, moto_port, http_proxy, moto_proxy = ports
    procs = [
        FORK.Process(target=serve_http, args=(str(served), http_port, True), daemon=True),
        FORK.Process(target=serve_moto, args=(moto_port,), daemon=True),
        FORK.Process(target=proxy, args=(http_proxy, http_port, PACED), daemon=True),
        FORK.Process(target=proxy, args=(moto_proxy, moto_port, PACED), daemon=True),
    ]
    for proc in procs:
        proc.start()
    try:
        for port in ports:
            wait_port(port)
        origin = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{moto_port}")
        origin.create_bucket(Bucket=BUCKET)
        for name in names:
            origin.upload_file(str(served / name), BUCKET, name)
            requests.get(f"http://127.0.0.1:{http_port}/{name}").close()  # read into the server's memory
        os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{moto_proxy}"
        session = requests.Session()
        client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{moto_proxy}")

        def plain_http(name: str, folder: Path) -> None:
            digest, final = hashlib.sha256(), folder / name
            partial = folder / f"{name}.part"
            with session.get(f"http://127.0.0.1:{http_proxy}/{name}", stream=True) as answer:
                answer.raise_for_status()
                with open(partial, "wb") as file:
                    for chunk in answer.iter_content(MIB):
                        digest.update(chunk)
                        file.write(chunk)
                    file.flush()
                    os.fsync(file.fileno())
            os.rename(partial, final)

        def ours(url: str, **options: int) -> Callable[[str, Path], None]:
            def fetch(name: str, folder: Path) -> None:
                DownloadManager(folder, progress=False, **options).cached_path(url + name)

            return fetch

        http, s3 = f"http://127.0.0.1:{http_proxy}/", f"s3://{BUCKET}/"
        rows: dict[str, Callable[[str, Path], None]] = {
            "http ours": ours(http),
            "http ours, connections=1": ours(http, connections=1),
            "http requests": plain_http,
            "s3 ours": ours(s3),
            "s3 ours, connections=1": ours(s3, connections=1),
            "s3 boto3 download_file": lambda name, folder: client.download_file(
                BUCKET, name, str(folder / name)
            ),
        }
        figures: dict[str, list[tuple[float, float]]] = {row: [] for row in rows}
        for _ in range(args.turns):
            for row, fetch in rows.items():
                folder = Path(tempfile.mkdtemp(dir=work))
                cpu, wall = time.process_time(), time.perf_counter()
                for name in names:
                    fetch(name, folder)
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                mib = args.objects * size / MIB
                figures[row].append((cpu * 1000 / mib, mib / wall))
                shutil.rmtree(folder)
    finally:
        for proc in procs:
            proc.kill()
        shutil.rmtree(work, ignore_errors=True)

    medians = {
        row: {
            "cpu_ms_per_mib": statistics.median(cpu for cpu, _ in runs),
            "mib_per_s": statistics.median(rate for _, rate in runs),
        }
        for row, runs in figures.items()
    }
    print(
        f"{args.objects} objects of {args.mib:g} MiB over the paced link; client CPU (user + system, "
        f"all threads) per MiB, median of {args.turns}"
    )
    print(f"{'row':28} {'CPU ms/MiB':>10} {'MiB/s':>7} {'CPU vs plain':>13}")
    for row, figure in medians.items():
        plain = medians["http requests" if row.startswith("http") else "s3 boto3 download_file"]
        ratio = figure["cpu_ms_per_mib"] / plain["cpu_ms_per_mib"]
        print(f"{row:28} {figure['cpu_ms_per_mib']:10.2f} {figure['mib_per_s']:7.1f} {ratio:12.2f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}",
                "objects": args.objects,
                "object_mib": args.mib,
                "turns": args.turns,
                "rows": medians,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
