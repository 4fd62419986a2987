"""Streaming benchmark: a sharded jsonl.gz dataset read by the loader while its shards
arrive over a paced link, side by side with the same shards on local disk and with the
streaming libraries a team would pick instead, in one run.

The link is the parallel-fetch benchmark's (``rig.PACED``: 16 MiB/s per connection,
128 MiB/s in total, 20 ms before each answer's first byte), a pacing TCP proxy in front
of a stock threaded HTTP server serving a folder and of moto's S3 server, each in its
own process on 127.0.0.1; the proxies count the bytes they send back (the server side),
and the CPU time the servers and proxies use is recorded per run (they share the cores
with the loaders).
Every row reads the same records (``{"id", "text"}``, about 1 KiB of words each) with 2
workers, batch size 64, shuffled, cold (a fresh cache folder each run):

- ours, the ``"jsonl"`` reader in lazy mode (``max_instances_in_memory=1024``) over a
  glob of the local files (read in place); over HTTP by a brace range; over S3 by a glob (a listing);
  over HTTP with ``cache_limit`` at a quarter of the dataset. The HTTP rows run two
  epochs (the second: what a budget costs once the first has filled the cache);
- the fetch of one shard alone (``DownloadManager.cached_path``), for the first batch's
  reference: one shard's fetch + a local fresh first batch;
- webdataset over HTTP (the shards converted to ``.tar.gz`` of one ``.json`` member a
  record; ``WebDataset(urls, shardshuffle=100).shuffle(1000)``, ``WebLoader``);
- litdata over S3 (``optimize(chunk_bytes="64MB")`` as its README shows,
  ``StreamingDataset(shuffle=True, batch_decode="all")``, ``StreamingDataLoader``; its S3
  client, obstore, is allowed the plain-http endpoint). With the default
  ``batch_decode="auto"`` (windows of 256 text items) litdata reads the whole chunk file
  again for every window, which makes a pass quadratic in the chunk's items (over 90 s
  for 67,000 records here);
- MosaicML streaming over S3 (``MDSWriter`` with zstd as its README shows,
  ``StreamingDataset(shuffle=True, batch_size=64)`` with its default ``predownload``,
  torch's ``DataLoader``), run by the interpreter of ``--mds-python`` (a venv of its own:
  ``import streaming`` needs a torchvision built for the installed torch).

A tool that is not installed is skipped, saying why. Conversions are timed once, the
upload of their output to the servers is not (ours needs neither). The rows take turns
(one run of each per repeat, in a new seeded order each time), so that the machine's
drift weighs on every row alike; printed: medians, and the ratios of medians the issue
sets targets for.

    python benchmarks/bench_stream.py                         # 32 x 1 MiB, 3 repeats
    python benchmarks/bench_stream.py --shards 256 --shard-mib 8   # the 2 GiB of the issue
    python benchmarks/bench_stream.py --quick                 # a smoke test, writes nothing
    python benchmarks/bench_stream.py --only http --prefetch 8 --out /tmp/s.json  # a deeper prefetch

Results go to ``benchmarks/results/stream.json``.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import multiprocessing
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Callable

RESULTS = Path(__file__).resolve().parent / "results" / "stream.json"
BATCH = 64
CHUNK = 1024  # max_instances_in_memory
WORKERS = 2
BUCKET = "bench"
DEFAULT_MDS_PYTHON = Path(__file__).resolve().parent.parent / ".venv-mds" / "bin" / "python"


# ---------------------------------------------------------------------------- the data


def make_shards(folder: Path, shards: int, shard_bytes: int, seed: int = 0) -> int:
    """Write `shards` files ``train-NNNNN.jsonl.gz`` of about `shard_bytes` each (gzip
    level 6, about 2.6x); returns the number of records."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choices(letters, k=rng.randint(2, 9))) for _ in range(8000)]
    texts = [" ".join(rng.choices(words, k=rng.randint(100, 200))) for _ in range(16384)]
    folder.mkdir(parents=True, exist_ok=True)
    count = 0
    for index in range(shards):
        buffer = io.BytesIO()
        with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=6, mtime=0) as out:
            while buffer.tell() < shard_bytes:
                lines = []
                for _ in range(64):
                    lines.append(json.dumps({"id": count, "text": texts[rng.randrange(len(texts))]}) + "\n")
                    count += 1
                out.write("".join(lines).encode())
        (folder / f"train-{index:05d}.jsonl.gz").write_bytes(buffer.getvalue())
    return count


def records(paths: Iterable[Path]) -> Iterable[dict[str, Any]]:
    for path in paths:
        with gzip.open(path, "rt", encoding="utf-8") as lines:
            for line in lines:
                yield json.loads(line)


def to_webdataset(paths: list[Path], folder: Path) -> None:
    import webdataset as wds

    folder.mkdir(parents=True, exist_ok=True)
    for path in paths:
        name = path.name.replace(".jsonl.gz", ".tar.gz")
        with wds.TarWriter(str(folder / name)) as sink:
            for record in records([path]):
                sink.write({"__key__": f"{record['id']:09d}", "json": record})


def _litdata_records(path: str) -> Iterable[dict[str, Any]]:
    yield from records([Path(path)])


def to_litdata(paths: list[Path], folder: Path) -> None:
    import litdata

    litdata.optimize(
        fn=_litdata_records,
        inputs=[str(path) for path in paths],
        output_dir=str(folder),
        chunk_bytes="64MB",
        num_workers=WORKERS,
        verbose=False,
    )
    # optimize() sets the start method to spawn for the whole process: back to the default.
    multiprocessing.set_start_method("fork", force=True)


def the_record(sample: tuple[Any, ...]) -> Any:
    return sample[0]


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


# ------------------------------------------------------------------------- one run


class Servers:
    """The proxies' byte counters and the CPU time the servers and proxies have used
    (they share the machine's cores with the loaders)."""

    def __init__(self, counters: list[Any], pids: list[int]) -> None:
        self.counters = counters
        self.pids = pids

    def sent(self) -> int:
        return sum(int(counter[3]) for counter in self.counters)

    def cpu_s(self) -> float:
        ticks = 0
        for pid in self.pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
        return ticks / os.sysconf("SC_CLK_TCK")


class Run:
    """One row's run: seconds to the first batch (from building the loader), then per
    epoch its seconds, instances, the bytes the servers sent and the CPU seconds the
    servers and proxies used meanwhile."""

    def __init__(self, servers: Servers) -> None:
        self.servers = servers
        self.first_batch_s = 0.0
        self.epochs: list[dict[str, float]] = []

    def measure(self, make: Callable[[], Iterable[Any]], epochs: int, size: Callable[[Any], int]) -> Run:
        started = time.perf_counter()
        loader = make()
        for epoch in range(epochs):
            before, cpu = self.servers.sent(), self.servers.cpu_s()
            if epoch:
                started = time.perf_counter()
            instances = 0
            for batch in loader:
                if not instances and not epoch:
                    self.first_batch_s = time.perf_counter() - started
                instances += size(batch)
            self.epochs.append(
                {
                    "seconds": time.perf_counter() - started,
                    "instances": instances,
                    "fetched_bytes": self.servers.sent() - before,
                    "server_cpu_s": self.servers.cpu_s() - cpu,
                }
            )
        del loader
        return self


def batch_size_of(batch: Any) -> int:
    ids = batch["id"] if isinstance(batch, dict) else batch[0]
    return len(ids)


# -------------------------------------------------------------------- the MDS child


def mds_child(argv: list[str]) -> None:
    """Runs in the MosaicML venv: ``convert SRC OUT`` (prints the seconds) or ``read
    REMOTE LOCAL`` (prints the run's figures); the last line printed is JSON."""
    import torch
    from streaming import MDSWriter, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    if argv[0] == "convert":
        started = time.perf_counter()
        columns = {"id": "int", "text": "str"}
        paths = sorted(Path(argv[1]).glob("*.jsonl.gz"))
        with MDSWriter(out=argv[2], columns=columns, compression="zstd") as out:
            for record in records(paths):
                out.write(record)
        print(json.dumps({"seconds": time.perf_counter() - started}))
        return
    clean_stale_shared_memory()
    started = time.perf_counter()
    dataset = StreamingDataset(remote=argv[1], local=argv[2], shuffle=True, batch_size=BATCH)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)
    first, instances = 0.0, 0
    for batch in loader:
        if not instances:
            first = time.perf_counter() - started
        instances += len(batch["id"])
    print(
        json.dumps({"first_batch_s": first, "seconds": time.perf_counter() - started, "instances": instances})
    )


def run_mds(python: str, *args: str) -> dict[str, Any]:
    done = subprocess.run([python, __file__, "--mds-child", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"MosaicML streaming failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------- main


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--mds-child":
        mds_child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--shard-mib", type=float, default=1.0, help="each shard's compressed size")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prefetch", type=int, default=2, help="our loader's prefetch (its default: 2)")
    parser.add_argument(
        "--quick", action="store_true", help="16 shards of 128 KiB, one repeat, writes nothing"
    )
    parser.add_argument("--only", default="", help="comma-separated rows to run (default: all)")
    parser.add_argument(
        "--mds-python", default=str(DEFAULT_MDS_PYTHON), help="a Python with mosaicml-streaming"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.shards, args.shard_mib, args.repeats = 16, 0.125, 1
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from rig import FORK, MIB, PACED, free_port, proxy, serve_http, serve_moto, wait_port

    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
    )
    work = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    data = work / "served"
    started = time.perf_counter()
    count = make_shards(data, args.shards, int(args.shard_mib * MIB))
    paths = sorted(data.glob("*.jsonl.gz"))
    dataset_bytes = sum(path.stat().st_size for path in paths)
    print(
        f"{args.shards} shards, {dataset_bytes / MIB:.0f} MiB of jsonl.gz, {count:,} records "
        f"(made in {time.perf_counter() - started:.0f} s); link {PACED.total / MIB:.0f} MiB/s, "
        f"{PACED.per_connection / MIB:.0f} MiB/s a connection, {PACED.first_byte_s * 1000:.0f} ms "
        f"to the first byte; {WORKERS} workers, batch {BATCH}; median of {args.repeats}",
        flush=True,
    )

    http_port, moto_port, http_proxy, moto_proxy = (free_port() for _ in range(4))
    http_counts, moto_counts = FORK.Array("q", 4, lock=False), FORK.Array("q", 4, lock=False)
    procs = [
        FORK.Process(target=serve_http, args=(str(data), http_port, True), daemon=True),
        FORK.Process(target=serve_moto, args=(moto_port,), daemon=True),
        FORK.Process(target=proxy, args=(http_proxy, http_port, PACED, http_counts), daemon=True),
        FORK.Process(target=proxy, args=(moto_proxy, moto_port, PACED, moto_counts), daemon=True),
    ]
    for proc in procs:
        proc.start()
    for port in (http_port, moto_port, http_proxy, moto_proxy):
        wait_port(port)
    try:
        run_all(args, work, data, paths, count, dataset_bytes, http_port, moto_port, http_proxy, moto_proxy,
                Servers([http_counts, moto_counts], [proc.pid for proc in procs]))  # fmt: skip
    finally:
        for proc in procs:
            proc.kill()
        shutil.rmtree(work, ignore_errors=True)


def upload(client: Any, folder: Path, prefix: str) -> None:
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(folder).as_posix()}")


def run_all(
    args: argparse.Namespace, work: Path, data: Path, paths: list[Path], count: int, dataset_bytes: int,
    http_port: int, moto_port: int, http_proxy: int, moto_proxy: int, servers: Servers,
) -> None:  # fmt: skip
    import boto3
    import requests
    import torch
    from framework_plugins.readers import JsonlReader
    from rig import MIB, PACED

    from framework.data.multiprocess import MultiProcessDataLoader
    from framework.download import DownloadManager

    torch.set_num_threads(1)
    s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{moto_port}")
    s3.create_bucket(Bucket=BUCKET)
    upload(s3, data, "train")
    os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{moto_proxy}"  # ours reads S3 through the link

    skipped: dict[str, str] = {}
    conversions: dict[str, dict[str, float]] = {}
    wanted = [name for name in args.only.split(",") if name]

    def want(name: str) -> bool:
        return not wanted or name in wanted

    def convert(name: str, make: Callable[[Path], None], out: Path) -> bool:
        """Time `make(out)`, a peer's conversion; False (skipped) without its package."""
        started = time.perf_counter()
        try:
            make(out)
        except ImportError as error:
            skipped[name] = f"not installed ({error})"
            return False
        conversions[name] = {"seconds": time.perf_counter() - started, "bytes": folder_bytes(out)}
        return True

    if want("webdataset"):
        convert("webdataset", lambda out: to_webdataset(paths, out), data / "wds")
    if want("litdata") and convert("litdata", lambda out: to_litdata(paths, out), work / "litdata"):
        upload(s3, work / "litdata", "litdata")
    if want("mosaicml"):
        if not Path(args.mds_python).exists():
            skipped["mosaicml"] = f"no Python with mosaicml-streaming at {args.mds_python} (--mds-python)"
        else:
            try:
                converted = run_mds(args.mds_python, "convert", str(data), str(work / "mds"))
                conversions["mosaicml"] = {
                    "seconds": converted["seconds"],
                    "bytes": folder_bytes(work / "mds"),
                }
                upload(s3, work / "mds", "mds")
            except RuntimeError as error:
                skipped["mosaicml"] = str(error).splitlines()[-1]
    for name, why in skipped.items():
        print(f"skipped {name}: {why}", flush=True)
    for name, figures in conversions.items():
        print(f"conversion, {name}: {figures['seconds']:.1f} s, {figures['bytes'] / MIB:.0f} MiB", flush=True)
    # The HTTP server reads each file at its first GET: not part of any run.
    for path in sorted(data.rglob("*.gz")):
        requests.get(f"http://127.0.0.1:{http_port}/{path.relative_to(data).as_posix()}").close()

    def fresh() -> str:
        return tempfile.mkdtemp(dir=work, prefix="cache-")

    http_spec = f"http://127.0.0.1:{http_proxy}/train-{{00000..{args.shards - 1:05d}}}.jsonl.gz"

    def ours(data_path: Any, **options: Any) -> Callable[[], Iterable[Any]]:
        return lambda: MultiProcessDataLoader(
            JsonlReader(), data_path, batch_size=BATCH, shuffle=True, num_workers=WORKERS,
            max_instances_in_memory=CHUNK, quiet=True, seed=1, prefetch=args.prefetch, **options,
        )  # fmt: skip

    def webdataset_loader() -> Iterable[Any]:
        import webdataset as wds

        urls = f"http://127.0.0.1:{http_proxy}/wds/train-{{00000..{args.shards - 1:05d}}}.tar.gz"
        dataset = wds.WebDataset(urls, shardshuffle=100).shuffle(1000).decode().to_tuple("json")
        dataset = dataset.map(the_record).batched(BATCH)
        return wds.WebLoader(dataset, batch_size=None, num_workers=WORKERS)

    def litdata_loader() -> Iterable[Any]:
        import litdata
        from litdata.streaming import downloader

        # obstore, litdata's S3 client, refuses a plain-http endpoint unless told
        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"

        dataset = litdata.StreamingDataset(
            f"s3://{BUCKET}/litdata", cache_dir=fresh(), shuffle=True, batch_decode="all",
            storage_options={"endpoint_url": f"http://127.0.0.1:{moto_proxy}"},
        )  # fmt: skip
        return litdata.StreamingDataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)

    limit = dataset_bytes // 4
    rows: dict[str, Callable[[], Run]] = {
        # A local glob: the same shards read in place, dealt whole as the streamed ones.
        "local": lambda: Run(servers).measure(ours(str(data / "train-*.jsonl.gz")), 1, batch_size_of),
        "http": lambda: Run(servers).measure(ours(http_spec, cache_dir=fresh()), 2, batch_size_of),
        "s3": lambda: Run(servers).measure(
            ours(f"s3://{BUCKET}/train/*.jsonl.gz", cache_dir=fresh()), 1, batch_size_of
        ),
        "http_limited": lambda: Run(servers).measure(
            ours(http_spec, cache_dir=fresh(), cache_limit=limit), 2, batch_size_of
        ),
    }
    if "webdataset" in conversions:
        rows["webdataset"] = lambda: Run(servers).measure(webdataset_loader, 1, batch_size_of)
    if "litdata" in conversions:
        rows["litdata"] = lambda: Run(servers).measure(litdata_loader, 1, batch_size_of)

    def mosaicml() -> Run:
        run = Run(servers)
        before, cpu = servers.sent(), servers.cpu_s()
        figures = run_mds(args.mds_python, "read", f"s3://{BUCKET}/mds", fresh())
        run.first_batch_s = figures["first_batch_s"]
        run.epochs.append({"seconds": figures["seconds"], "instances": figures["instances"],
                           "fetched_bytes": servers.sent() - before,
                           "server_cpu_s": servers.cpu_s() - cpu})  # fmt: skip
        return run

    if "mosaicml" in conversions:
        os.environ["S3_ENDPOINT_URL"] = f"http://127.0.0.1:{moto_proxy}"  # MDS's own variable
        rows["mosaicml"] = mosaicml
    rows = {name: run for name, run in rows.items() if want(name) or name in ("local", "http")}

    def one_shard(url: str) -> float:
        started = time.perf_counter()
        with DownloadManager(fresh(), progress=False) as manager:
            manager.cached_path(url)
        return time.perf_counter() - started

    shard_urls = {
        "http": f"http://127.0.0.1:{http_proxy}/{paths[0].name}",
        "s3": f"s3://{BUCKET}/train/{paths[0].name}",
    }
    runs: dict[str, list[Run]] = {name: [] for name in rows}
    shard_fetches: dict[str, list[float]] = {name: [] for name in shard_urls}
    for turn in range(args.repeats):
        order = list(rows.items())
        random.Random(turn).shuffle(order)
        for name, run in order:
            runs[name].append(run())
            figures = runs[name][-1]
            epochs = ", ".join(
                f"{e['seconds']:.2f} s ({e['instances']:,.0f}, {e['fetched_bytes'] / MIB:.0f} MiB)"
                for e in figures.epochs
            )
            print(
                f"  turn {turn + 1} {name}: first batch {figures.first_batch_s:.2f} s, epochs {epochs}",
                flush=True,
            )
            for folder in work.glob("cache-*"):
                shutil.rmtree(folder, ignore_errors=True)
        for name, url in shard_urls.items():
            shard_fetches[name].append(one_shard(url))
    report(args, runs, conversions, skipped, shard_fetches, count, dataset_bytes, limit, PACED.total / MIB)


def report(
    args: argparse.Namespace, runs: dict[str, list[Run]], conversions: dict[str, dict[str, float]],
    skipped: dict[str, str], shard_fetches: dict[str, list[float]], count: int, dataset_bytes: int,
    limit: int, link_mib_s: float,
) -> None:  # fmt: skip
    mib = dataset_bytes / 2**20

    def median(name: str, what: Callable[[Run], float]) -> float:
        return statistics.median(what(run) for run in runs[name])

    def epoch_median(name: str, epoch: int, key: str) -> float:
        return statistics.median(run.epochs[epoch][key] for run in runs[name])

    rows: dict[str, dict[str, Any]] = {}
    for name in runs:
        row: dict[str, Any] = {"first_batch_s": median(name, lambda run: run.first_batch_s)}
        for epoch in range(len(runs[name][0].epochs)):
            seconds = epoch_median(name, epoch, "seconds")
            moved = conversions[name]["bytes"] if name in conversions else dataset_bytes
            row[f"epoch{epoch + 1}"] = {
                "seconds": seconds,
                "instances_per_s": epoch_median(name, epoch, "instances") / seconds,
                "mib_per_s": moved / 2**20 / seconds,
                "fetched_mib": epoch_median(name, epoch, "fetched_bytes") / 2**20,
                "instances": epoch_median(name, epoch, "instances"),
                "server_cpu_s": epoch_median(name, epoch, "server_cpu_s"),
            }
        rows[name] = row
    one_shard_s = {name: statistics.median(times) for name, times in shard_fetches.items()}
    local = rows["local"]["epoch1"]
    ratios: dict[str, float] = {}
    for name in ("http", "s3"):
        if name in rows:
            ratios[f"{name}_vs_min_link_local"] = (mib / rows[name]["epoch1"]["seconds"]) / min(
                link_mib_s, local["mib_per_s"]
            )
            ratios[f"{name}_first_batch_vs_shard_plus_local"] = rows[name]["first_batch_s"] / (
                one_shard_s[name] + rows["local"]["first_batch_s"]
            )
    if "http_limited" in rows:
        for epoch in ("epoch1", "epoch2"):
            ratios[f"limited_vs_unlimited_{epoch}"] = (
                rows["http"][epoch]["seconds"] / rows["http_limited"][epoch]["seconds"]
            )
        ratios["limited_epoch2_fetched_share"] = rows["http_limited"]["epoch2"]["fetched_mib"] / mib
    for name in ("webdataset", "litdata", "mosaicml"):
        if name in rows:
            ratios[f"throughput_vs_{name}"] = (
                rows["http"]["epoch1"]["instances_per_s"] / rows[name]["epoch1"]["instances_per_s"]
            )
            ratios[f"first_batch_vs_{name}"] = rows[name]["first_batch_s"] / rows["http"]["first_batch_s"]
    print(f"{'row':<14} {'first batch':>11} {'epoch 1':>9} {'inst/s':>9} {'MiB/s':>7} {'fetched':>9}"
          f" {'server CPU':>10} {'epoch 2':>9} {'fetched':>9}")  # fmt: skip
    for name, row in rows.items():
        first, second = row["epoch1"], row.get("epoch2")
        line = (
            f"{name:<14} {row['first_batch_s']:>9.2f} s {first['seconds']:>7.2f} s "
            f"{first['instances_per_s']:>9,.0f} {first['mib_per_s']:>7.1f} {first['fetched_mib']:>5.0f} MiB"
            f" {first['server_cpu_s']:>8.1f} s"
        )
        if second:
            line += f" {second['seconds']:>7.2f} s {second['fetched_mib']:>5.0f} MiB"
        print(line)
    print(
        f"one shard's fetch: HTTP {one_shard_s['http']:.3f} s, S3 {one_shard_s['s3']:.3f} s; "
        f"cache_limit {limit / 2**20:.1f} MiB (a quarter)"
    )
    for key, value in ratios.items():
        print(f"{key}: {value:.2f}")
    if args.quick:
        return
    results = {
        "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}",
        "shards": args.shards, "shard_mib": args.shard_mib, "dataset_mib": round(mib, 1),
        "records": count, "batch_size": BATCH, "num_workers": WORKERS, "max_instances_in_memory": CHUNK,
        "repeats": args.repeats, "prefetch": args.prefetch, "link_mib_s": link_mib_s,
        "cache_limit_mib": round(limit / 2**20, 1),
        "one_shard_fetch_s": one_shard_s, "rows": rows, "ratios": ratios,
        "conversions": conversions, "skipped": skipped,
    }  # fmt: skip
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
