"""Small files and big caches: ours vs `requests` + write + fsync + rename, in one run.

A server in its own process serves 4 KiB objects from memory on 127.0.0.1 (HTTP/1.1,
keep-alive, an ETag, counting GETs). Side by side, rows taking turns:

- cold 4 KiB misses: `DownloadManager.cached_path` (lock, hash, verify, fsync, atomic
  publish, sidecar) vs `requests.get` + write + fsync + rename (one `requests.Session`,
  so neither side pays a connection per file); median per file;
- verified hits: `cached_path(url, sha256=...)` on a cached file, median per call;
- a big cache: a 4 KiB miss in a folder of `--entries` unrelated names vs in an empty
  folder (the cache folder is never listed, so they should cost the same);
- bulk: `cached_paths` of `--files` small files (`max_workers=8`) vs a sequential
  loop of `cached_path` vs a `ThreadPoolExecutor(max_workers=8)` of `requests.get` +
  write + fsync + rename.

Run: ``python benchmarks/bench_smallfiles.py [--files 1000] [--entries 150000]``;
results go to ``benchmarks/results/smallfiles.json``. ``--quick`` is a smoke test.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import requests

from framework.download import DownloadManager

RESULTS = Path(__file__).parent / "results" / "smallfiles.json"
FORK = multiprocessing.get_context("fork")
SIZE = 4096
WORKERS = 8


def _serve(count: int, port: Any, gets: Any, ready: Any) -> None:
    """Serve `/f/<i>` for i < count: `SIZE` bytes each, with an ETag."""
    bodies = [hashlib.sha256(b"%d" % i).digest() * (SIZE // 32) for i in range(count)]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out at once, no delayed-ACK wait

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            with gets.get_lock():
                gets.value += 1
            body = bodies[int(self.path.rsplit("/", 1)[-1].split("-", 1)[0]) % count]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("ETag", f'"{hashlib.sha256(body).hexdigest()[:16]}"')
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            self.wfile.write(body)

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 128

    server = Server(("127.0.0.1", 0), Handler)
    port.value = server.server_address[1]
    ready.set()
    server.serve_forever()


def raw_copy(session: requests.Session, url: str, target: Path) -> Path:
    """What a user would write by hand: GET, write, fsync, rename into place."""
    answer = session.get(url, timeout=60)
    answer.raise_for_status()
    temp = target.with_name(target.name + ".tmp")
    with open(temp, "wb") as file:
        file.write(answer.content)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temp, target)
    return target


def per_file_ms(run: Callable[[str, Path], Any], urls: Sequence[str], folder: Path) -> list[float]:
    times = []
    for index, url in enumerate(urls):
        started = time.perf_counter()
        run(url, folder / f"raw-{index}")
        times.append((time.perf_counter() - started) * 1000)
    return times


def cold_misses(base: str, files: int, scratch: Path, tag: str) -> dict[str, Any]:
    """Cold 4 KiB misses, ours and the raw copy taking turns in blocks of 50 files."""
    ours_ms: list[float] = []
    raw_ms: list[float] = []
    manager = DownloadManager(scratch / f"{tag}-ours", progress=False)
    raw_folder = scratch / f"{tag}-raw"
    raw_folder.mkdir()
    with requests.Session() as session:
        for block in range(0, files, 50):
            urls = [f"{base}/f/{i}-{tag}" for i in range(block, min(files, block + 50))]
            ours_ms += per_file_ms(lambda url, _target: manager.cached_path(url), urls, raw_folder)
            raw_ms += per_file_ms(lambda url, target: raw_copy(session, url, target), urls, raw_folder)
    manager.close()
    ours, raw = statistics.median(ours_ms), statistics.median(raw_ms)
    return {"ours_ms": ours, "raw_ms": raw, "speed_vs_raw": raw / ours, "files": files}


def hits(base: str, scratch: Path, calls: int) -> dict[str, Any]:
    manager = DownloadManager(scratch / "hits", progress=False)
    url = f"{base}/f/0-hit"
    digest = hashlib.sha256(manager.cached_path(url).read_bytes()).hexdigest()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        manager.cached_path(url, sha256=digest)
        times.append((time.perf_counter() - started) * 1e6)
    return {"verified_hit_us": statistics.median(times), "calls": calls}


def big_cache(base: str, scratch: Path, entries: int, misses: int) -> dict[str, Any]:
    """A 4 KiB miss in a folder of `entries` unrelated names vs in an empty folder."""
    full, empty = scratch / "full", scratch / "empty"
    full.mkdir()
    empty.mkdir()
    for index in range(entries):
        os.close(os.open(full / f"{index:020x}-unrelated-{index}.bin", os.O_CREAT | os.O_WRONLY, 0o644))
    full_ms: list[float] = []
    empty_ms: list[float] = []
    managers = {
        name: DownloadManager(folder, progress=False) for name, folder in (("full", full), ("empty", empty))
    }
    for index in range(misses):  # taking turns
        for name, times in (("full", full_ms), ("empty", empty_ms)):
            url = f"{base}/f/{index}-big-{name}"
            started = time.perf_counter()
            managers[name].cached_path(url)
            times.append((time.perf_counter() - started) * 1000)
    return {
        "entries": entries,
        "misses": misses,
        "full_ms": statistics.median(full_ms),
        "empty_ms": statistics.median(empty_ms),
        "full_vs_empty": statistics.median(full_ms) / statistics.median(empty_ms),
    }


def bulk(base: str, files: int, scratch: Path, repeats: int) -> dict[str, Any]:
    """`files` small files: cached_paths vs a loop of cached_path vs a thread pool of
    requests; wall seconds, medians over `repeats` rounds taking turns."""
    seconds: dict[str, list[float]] = {"cached_paths": [], "loop": [], "requests_pool": []}
    for round_ in range(repeats):
        for name in seconds:
            urls = [f"{base}/f/{i}-bulk-{name}-{round_}" for i in range(files)]
            folder = scratch / f"bulk-{name}-{round_}"
            folder.mkdir()
            started = time.perf_counter()
            if name == "cached_paths":
                with DownloadManager(folder, progress=False) as manager:
                    manager.cached_paths(urls, max_workers=WORKERS)
            elif name == "loop":
                with DownloadManager(folder, progress=False) as manager:
                    for url in urls:
                        manager.cached_path(url)
            else:
                _requests_pool(urls, folder)
            seconds[name].append(time.perf_counter() - started)
            shutil.rmtree(folder)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    return {
        "files": files,
        "max_workers": WORKERS,
        "repeats": repeats,
        "seconds": medians,
        "cached_paths_vs_loop": medians["loop"] / medians["cached_paths"],
        "cached_paths_vs_requests_pool": medians["requests_pool"] / medians["cached_paths"],
    }


def _requests_pool(urls: Sequence[str], folder: Path) -> None:
    adapter = requests.adapters.HTTPAdapter(pool_maxsize=WORKERS)
    with requests.Session() as session:
        session.mount("http://", adapter)
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            list(pool.map(lambda pair: raw_copy(session, pair[1], folder / f"f{pair[0]}"), enumerate(urls)))


def main(argv: Sequence[str] = ()) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1000, help="cold misses per side, and the bulk set")
    parser.add_argument("--entries", type=int, default=150_000, help="names in the big cache folder")
    parser.add_argument("--repeats", type=int, default=3, help="bulk rounds (medians)")
    parser.add_argument("--quick", action="store_true", help="a smoke test: few files, a small folder")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(list(argv) or None)
    if args.quick:
        args.files, args.entries, args.repeats = 60, 2000, 1
    gets, port, ready = FORK.Value("q", 0), FORK.Value("i", 0), FORK.Event()
    server = FORK.Process(target=_serve, args=(max(args.files, 1000), port, gets, ready), daemon=True)
    server.start()
    ready.wait(30)
    base = f"http://127.0.0.1:{port.value}"
    scratch = Path(tempfile.mkdtemp(prefix="bench-smallfiles-", dir=os.environ.get("BENCH_DIR")))
    try:
        results: dict[str, Any] = {
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
            "file_bytes": SIZE,
            "cold": cold_misses(base, args.files, scratch, "cold"),
            "hits": hits(base, scratch, 2000),
            "big_cache": big_cache(base, scratch, args.entries, max(20, args.files // 10)),
            "bulk": bulk(base, args.files, scratch, args.repeats),
            "gets": gets.value,
        }
    finally:
        server.kill()
        shutil.rmtree(scratch, ignore_errors=True)
    results["targets_met"] = {
        "cold miss >= 0.8x raw": results["cold"]["speed_vs_raw"] >= 0.8,
        "verified hit < 100 us": results["hits"]["verified_hit_us"] < 100,
        "big cache within 1.2x": results["big_cache"]["full_vs_empty"] <= 1.2,
    }
    _report(results)
    if not args.quick:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return results


def _report(results: dict[str, Any]) -> None:
    cold, hit, big, many = results["cold"], results["hits"], results["big_cache"], results["bulk"]
    print(f"small files ({results['machine']}), {results['file_bytes']} B each, 127.0.0.1")
    print(
        f"cold miss, median per file: ours {cold['ours_ms']:.2f} ms, requests+fsync+rename "
        f"{cold['raw_ms']:.2f} ms -> ours at {cold['speed_vs_raw']:.2f}x its speed"
    )
    print(f"verified hit, median: {hit['verified_hit_us']:.1f} us")
    print(
        f"miss with {big['entries']:,} names in the folder {big['full_ms']:.2f} ms vs empty "
        f"{big['empty_ms']:.2f} ms -> {big['full_vs_empty']:.2f}x"
    )
    seconds = many["seconds"]
    print(
        f"{many['files']} files: cached_paths {seconds['cached_paths']:.2f} s, loop of cached_path "
        f"{seconds['loop']:.2f} s ({many['cached_paths_vs_loop']:.1f}x), requests pool "
        f"{seconds['requests_pool']:.2f} s ({many['cached_paths_vs_requests_pool']:.2f}x)"
    )
    met = results["targets_met"].items()
    print("targets: " + ", ".join(f"{name}: {'met' if ok else 'NOT met'}" for name, ok in met))


if __name__ == "__main__":
    main()
