"""The markdown tables of the benchmarks page, one per results file, and the labels
the charts share: ``plot.py`` loads this module (both are loaded by file path) and
puts each table at its marker."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

COLD_RUNS = (
    ("framework (sha256, fsync, atomic publish)", "cold_ours_s"),
    ("raw requests copy (no hash, no fsync)", "cold_raw_requests_s"),
    ("raw requests copy + sha256 + fsync", "cold_raw_requests_sha256_fsync_s"),
    ("local file copy + fsync (the disk's floor)", "floor_local_copy_fsync_s"),
    ("pooch.retrieve", "cold_pooch_s"),
)


def label(key: str) -> str:
    """``"ours_2_shared_memory"`` -> ``"framework, 2 workers, shared memory"``."""
    parts = key.split("_")
    who = {"ours": "framework", "torch": "torch DataLoader"}.get(parts[0], parts[0])
    text = who
    if len(parts) > 1 and parts[1].isdigit():
        text += f", {parts[1]} worker{'s' if parts[1] != '1' else ''}"
        parts = parts[2:]
    else:
        parts = parts[1:]
    if parts:
        text += ", " + " ".join(parts)
    return text


def runs(section: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The (name, figures) entries of a loader section that hold batches_per_s."""
    return [
        (name, value)
        for name, value in section.items()
        if isinstance(value, Mapping) and "batches_per_s" in value
    ]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def loader_table(results: Mapping[str, Any]) -> str:
    parts = []
    for key, title in (("cheap_reader", "Cheap reader"), ("cpu_heavy_reader", "CPU-heavy reader")):
        section = results.get(key)
        if not isinstance(section, Mapping):
            continue
        rows = [
            [label(name), f"{figures['batches_per_s']:,.0f}",
             f"{figures.get('first_batch_s', float('nan')) * 1000:,.0f} ms"]
            for name, figures in runs(section)
        ]  # fmt: skip
        parts.append(f"**{title}** ({section.get('lines', '?')} lines)\n")
        parts.append(_table(["loader", "batches/s", "first batch"], rows))
        ratios = section.get("ratios", {})
        if ratios:
            parts.append("")
            parts.append(
                "Ratios: " + ", ".join(f"{k.replace('_', ' ')} **{v:.2f}x**" for k, v in ratios.items())
            )
        parts.append("")
    memory = results.get("lazy_memory")
    if isinstance(memory, Mapping):
        small, large = memory.get("small", {}), memory.get("large", {})
        rows = [
            [f"{memory.get(f'{size}_lines', '?')} lines",
             f"{figures.get('peak_pss_mib', float('nan')):,.0f}",
             f"{figures.get('peak_rss_mib', float('nan')):,.0f}"]
            for size, figures in (("small", small), ("large", large))
        ]  # fmt: skip
        parts.append("**Lazy mode memory** (main process and workers together)\n")
        parts.append(_table(["data", "peak PSS, MiB", "peak RSS, MiB"], rows))
        if "pss_growth" in memory:
            parts.append("")
            parts.append(
                f"Growth for 10x the data: PSS {memory['pss_growth'] * 100:+.0f}%, "
                f"RSS {memory.get('rss_growth', float('nan')) * 100:+.0f}%."
            )
    return "\n".join(parts)


def _gets(value: Any) -> str:
    if isinstance(value, list):
        if value and all(v == value[0] for v in value):
            return (
                f"{value[0]} GET in each of {len(value)} runs"
                if value[0] == 1
                else (f"{value[0]} GETs in each of {len(value)} runs")
            )
        return f"{', '.join(map(str, value))} GETs in {len(value)} runs"
    return f"{value} GET{'s' if value != 1 else ''}"


def download_table(results: Mapping[str, Any]) -> str:
    size_mb = float(results.get("size_bytes", 0)) / 2**20
    rows = []
    for name, key in COLD_RUNS:
        if key in results:
            seconds = float(results[key])
            rows.append([name, f"{seconds:.3f} s", f"{size_mb / seconds:,.0f} MiB/s"])
    parts = [f"**Cold download** ({size_mb:.0f} MiB from 127.0.0.1, median)\n",
             _table(["client", "time", "speed"], rows), ""]  # fmt: skip
    if "hit_ours_us_median" in results:
        parts.append("**Cache hit** with a known sha256, median per call\n")
        hit_rows = [["framework", f"{results['hit_ours_us_median']:,.1f} µs"]]
        if "hit_pooch_us_median" in results:
            hit_rows.append(["pooch", f"{results['hit_pooch_us_median']:,.0f} µs"])
        parts.append(_table(["client", "time"], hit_rows))
        parts.append("")
    if "race_processes" in results:
        parts.append(
            f"**{results['race_processes']} racing processes**: the server saw "
            f"{_gets(results.get('race_gets', '?'))}; wall time "
            f"{results.get('race_wall_vs_one_download', float('nan')):.2f}x one download."
        )
        parts.append("")
    link = results.get("link")
    if isinstance(link, Mapping):
        parts.append(
            f"**Over a {link['gbps']:g} Gbit/s link** (the server paces the body): ours "
            f"{link['cold_ours_s']:.3f} s, raw requests copy {link['cold_raw_requests_s']:.3f} s: "
            f"ours at {link['cold_speed_vs_raw']:.2f}x the raw copy's speed. On loopback the "
            "sha256 and the fsync, not the network, set our pace."
        )
        parts.append("")
    targets = results.get("targets_met")
    if isinstance(targets, Mapping):
        met = ", ".join(f"{name}: {'met' if ok else '**not met**'}" for name, ok in targets.items())
        parts.append(f"Targets: {met}.")
    return "\n".join(parts)


def row(results: Mapping[str, Any], protocol: str, starts: str) -> Optional[Mapping[str, Any]]:
    """The first paced row of `protocol` whose tool name starts with `starts`."""
    for row in results.get("paced", []):
        if row["protocol"] == protocol and row["tool"].startswith(starts):
            return row  # type: ignore[no-any-return]
    return None


def parallel_table(results: Mapping[str, Any]) -> str:
    link = results.get("link_mib_s", 128)
    rows = [
        [row["protocol"], row["tool"], f"{row['seconds']:.2f}", f"{row['share']:.2f}",
         f"{row['vs_calibration']:.2f}"]
        for row in results.get("paced", [])
    ]  # fmt: skip
    parts = [
        f"**Paced link**: a {results.get('size_mib', '?')} MiB object, median of "
        f"{results.get('repeats', '?')} runs\n",
        _table(["protocol", "tool", "seconds", "share of the link", "vs calibration"], rows),
        "",
    ]
    ratios = []
    for protocol, other in (("HTTP", "aria2c"), ("S3", "boto3 download_file")):
        ours, theirs = row(results, protocol, "ours, default ("), row(results, protocol, other)
        single = row(results, protocol, "ours, connections=1")
        if ours and theirs:
            ratios.append(f"{protocol}: {theirs['seconds'] / ours['seconds']:.2f}x {other}")
        if ours and single:
            ratios.append(f"{protocol}: {single['seconds'] / ours['seconds']:.1f}x one stream")
    if ratios:
        parts += ["Ratios (time over ours with its defaults): " + "; ".join(ratios) + ".", ""]
    unpaced = results.get("unpaced_s")
    if isinstance(unpaced, Mapping) and "default" in unpaced:
        parts += [
            f"**Unpaced loopback** (straight to the HTTP server, cold): defaults "
            f"{unpaced['default']:.3f} s, `connections=1` {unpaced['1']:.3f} s.",
            "",
        ]
    memory = results.get("memory")
    if isinstance(memory, Mapping) and memory.get("seconds"):
        share = memory["size_mib"] / memory["seconds"] / link
        parts += [
            f"**{memory['size_mib'] // 1024} GiB over HTTP** (defaults, one run): "
            f"{memory['seconds']:.2f} s, {share:.2f} of the link; the fetching process's peak "
            f"RSS grew {memory['peak_rss_growth_mib']:.1f} MiB.",
            "",
        ]
    return "\n".join(parts)


def resume_table(results: Mapping[str, Any]) -> str:
    rows = []
    for key, name in (
        ("framework", "framework (seeks to the byte offset)"),
        ("torchdata", "torchdata `StatefulDataLoader`, an `IterableDataset` without a state of its own"),
    ):
        figures = results.get(key)
        if isinstance(figures, Mapping):
            ratio = figures["ratio"]
            rows.append(
                [
                    name,
                    f"{figures['fresh_s']:.3f} s",
                    f"{figures['resumed_s']:.3f} s",
                    f"{ratio:.2f}x" if ratio < 10 else f"{ratio:.0f}x",
                ]
            )
    return "\n".join([
        f"{results.get('lines', '?'):,} lines, batch size {results.get('batch_size', '?')}, "
        f"{results.get('num_workers', '?')} workers; the state is "
        f"{results.get('state_bytes', 0) / 1000:.1f} KB of JSON ({results.get('machine', '')}).\n",
        _table(["loader", "fresh first batch", "resumed at 90%", "ratio"], rows),
    ])  # fmt: skip


def config_table(results: Mapping[str, Any]) -> str:
    repeats, runs = results.get("repeats", "?"), results.get("cli_runs", "?")
    rows = [
        ["`validate()`, first call (imports the components)", results["validate_first_call_ms"]],
        [f"`validate()`, median of {repeats}", results["validate_ms"]],
        [f"`validate()` with 10 errors, median of {repeats}", results["validate_10_errors_ms"]],
        [f"`framework config validate` (wall), median of {runs}", results["cli_validate_ms"]],
        [f"`framework --version` (start-up alone), median of {runs}", results["cli_startup_ms"]],
        [f"`python -c 'import torch'`, median of {runs}", results["import_torch_ms"]],
    ]
    load = results.get("load_average", [])
    return "\n".join([
        f"{results.get('components', '?'):,} components, {results.get('config_kib', '?')} KiB of JSON "
        f"({results.get('machine', '')}; load average {load[0] if load else '?'} at the end).\n",
        _table(["what", "ms"], [[what, f"{ms:,.1f}"] for what, ms in rows]),
    ])  # fmt: skip


CLUSTER_MODES = ("single", "independent", "cluster")


def cluster_origins(results: Mapping[str, Any]) -> dict[str, Any]:
    """The result rows by origin pace ("unpaced", "64 MiB/s")."""
    return {key: row for key, row in results.items() if isinstance(row, dict) and "cluster" in row}


def cluster_table(results: Mapping[str, Any]) -> str:
    rows = []
    for origin, row in cluster_origins(results).items():
        for mode in CLUSTER_MODES:
            one = row[mode]
            ratio = f"{row['cluster_vs_independent']:.2f}" if mode == "cluster" else ""
            rows.append(
                [origin, mode, f"{one['wall_s']:.2f}", f"{one['origin_mib']:.0f}", str(one["gets"]), ratio]
            )
    return "\n".join([
        f"{results.get('nodes', '?')} nodes x {results.get('ranks_per_node', '?')} ranks, a "
        f"{results.get('size_mib', '?')} MiB object, origin paced per {results.get('pace', '?')}; median "
        f"of {results.get('repeats', '?')}, the rows taking turns ({results.get('machine', '')}).\n",
        _table(["origin", "mode", "wall (s)", "origin MiB", "GETs", "cluster / independent"], rows),
    ])  # fmt: skip


def smallfiles_table(results: Mapping[str, Any]) -> str:
    cold, hits, big, bulk = results["cold"], results["hits"], results["big_cache"], results["bulk"]
    seconds = bulk["seconds"]
    rows = [
        [f"cold {results['file_bytes'] // 1024} KiB miss, median per file ({cold['files']:,} files)",
         f"{cold['ours_ms']:.2f} ms", f"{cold['raw_ms']:.2f} ms (`requests.get` + write + fsync + rename)",
         f"{cold['speed_vs_raw']:.2f}x the speed"],
        ["verified hit (`sha256=` given), median per call", f"{hits['verified_hit_us']:.0f} µs", "", ""],
        [f"miss with {big['entries']:,} names in the folder, median", f"{big['full_ms']:.2f} ms",
         f"{big['empty_ms']:.2f} ms (ours, empty folder)", f"{big['full_vs_empty']:.2f}x the time"],
        [f"{bulk['files']:,} files, `cached_paths(max_workers={bulk['max_workers']})`",
         f"{seconds['cached_paths']:.2f} s", f"{seconds['loop']:.2f} s (a loop of `cached_path`)",
         f"{bulk['cached_paths_vs_loop']:.1f}x as fast"],
        [f"{bulk['files']:,} files, `cached_paths(max_workers={bulk['max_workers']})`",
         f"{seconds['cached_paths']:.2f} s",
         f"{seconds['requests_pool']:.2f} s (a pool of {bulk['max_workers']} threads: requests + fsync)",
         f"{bulk['cached_paths_vs_requests_pool']:.2f}x as fast"],
    ]  # fmt: skip
    parts = [
        f"Side by side in one run on 127.0.0.1 ({results.get('machine', '')}); the server answered "
        f"{results.get('gets', '?'):,} GETs.\n",
        _table(["what", "ours", "compared with", "ratio"], rows),
    ]
    targets = results.get("targets_met")
    if isinstance(targets, Mapping):
        met = ", ".join(f"{name}: {'met' if ok else '**not met**'}" for name, ok in targets.items())
        parts += ["", f"Targets: {met}."]
    return "\n".join(parts)


MATRIX_SERVERS = {
    "paced": "paced link",
    "work": "50 ms work per request",
    "limit503": "4 connections, 503 beyond",
    "limit429": "4 connections, 429 beyond",
    "far": "far (100 ms, 4 MiB/s)",
    "loopback": "loopback, unpaced",
}


def _matrix_time(row: Mapping[str, Any]) -> str:
    runs = len(row["runs"]) + len(row["failures"])
    if row["seconds"] is None:
        return f"failed ({len(row['failures'])} of {runs})"
    failed = f" ({len(row['failures'])} of {runs} failed)" if row["failures"] else ""
    return f"{row['seconds']:.2f}{failed}"


def _runs(count: Any) -> str:
    return "1 run" if count == 1 else f"{count} runs"


def matrix_table(results: Mapping[str, Any]) -> str:
    """One table per origin: each cell's median seconds per tool and ours against the
    best other tool (its time / ours), bold below the flag."""
    cells = results.get("cells", [])
    parts = [
        f"A {results.get('size_mib', '?')} MiB object, median of {_runs(results.get('repeats', '?'))}, "
        f"the rows taking turns ({results.get('machine', '')}). Seconds; *ours vs best* is the best "
        "other tool's time over ours (a speed), **bold** below 0.9x.\n"
    ]
    flagged = []
    for origin in ("S3", "HTTP"):
        tools = list(dict.fromkeys(
            row["tool"] for cell in cells for row in cell["tools"] if row["origin"] == origin
        ))  # fmt: skip
        rows = []
        for cell in cells:
            by_tool = {row["tool"]: row for row in cell["tools"] if row["origin"] == origin}
            ratio = cell.get("ratios", {}).get(origin)
            shown = "-"
            if ratio and ratio["speed"] is None:
                shown = f"**ours failed** ({ratio['best_other']} did not)"
                flagged.append(
                    f"{origin} {MATRIX_SERVERS.get(cell['server'], cell['server'])}, {cell['state']}"
                )
            elif ratio:
                shown = f"{ratio['speed']:.2f}x {ratio['best_other']}"
                if ratio["flag"]:
                    shown = f"**{ratio['speed']:.2f}x** {ratio['best_other']}"
                    flagged.append(
                        f"{origin} {MATRIX_SERVERS.get(cell['server'], cell['server'])}, {cell['state']}"
                    )
            rows.append(
                [MATRIX_SERVERS.get(cell["server"], cell["server"]), cell["state"]]
                + [_matrix_time(by_tool[tool]) if tool in by_tool else "-" for tool in tools]
                + [shown]
            )
        parts += [f"**{origin}**\n", _table(["server", "machine", *tools, "ours vs best"], rows), ""]
    skipped = results.get("skipped", [])
    if skipped:
        parts.append(f"Not installed, so not run: {', '.join(f'`{name}`' for name in skipped)}.")
    parts.append(f"Below 0.9x: {'; '.join(flagged)}." if flagged else "No cell below 0.9x.")
    return "\n".join(parts)


def first_batch_table(results: Mapping[str, Any]) -> str:
    rows = [
        [
            f"`{name}`",
            f"{row['first_batch_s']:.3f}",
            f"{row['first_batch_vs_torch']:.2f}x",
            f"{row['batches_per_s']:.1f}",
            f"{row['throughput_vs_torch']:.2f}x",
        ]
        for name, row in results["rows"].items()
    ]
    return "\n".join([
        f"{results['instances']:,} instances at 1 ms each, batch size {results['batch_size']}, "
        f"max_instances_in_memory={results['max_instances_in_memory']}, medians of "
        f"{results['repeats']} ({results['machine']}).\n",
        _table(["loader", "first batch (s)", "vs torch", "batches/s", "vs torch"], rows),
    ])  # fmt: skip


STREAM_ROWS = {
    "local": "framework, the shards on local disk (a glob, read in place)",
    "http": "framework, HTTP (a brace range)",
    "s3": "framework, S3 (a glob)",
    "http_limited": "framework, HTTP, `cache_limit` a quarter of the dataset",
    "webdataset": "webdataset, HTTP (`.tar.gz` shards)",
    "litdata": "litdata, S3 (optimized)",
    "mosaicml": "MosaicML streaming, S3 (MDS, zstd)",
}
# (ratio key, what it compares, the target, whether higher is better)
STREAM_TARGETS = (
    ("http_vs_min_link_local", "HTTP throughput / the lesser of the link and the local rate", 0.9, True),
    ("s3_vs_min_link_local", "S3 throughput / the lesser of the link and the local rate", 0.9, True),
    ("http_first_batch_vs_shard_plus_local", "HTTP first batch / (one shard's fetch + local first batch)",
     1.5, False),
    ("s3_first_batch_vs_shard_plus_local", "S3 first batch / (one shard's fetch + local first batch)",
     1.5, False),
    ("limited_vs_unlimited_epoch1", "throughput with the budget / without, epoch 1", 0.9, True),
    ("limited_vs_unlimited_epoch2", "throughput with the budget / without, epoch 2", 0.9, True),
    ("limited_epoch2_fetched_share", "bytes fetched in epoch 2 with the budget / the dataset", 0.8, False),
    ("throughput_vs_webdataset", "HTTP throughput / webdataset's", 1.0, True),
    ("first_batch_vs_webdataset", "webdataset's first batch / HTTP first batch", 1.0, True),
    ("throughput_vs_litdata", "HTTP throughput / litdata's", 1.0, True),
    ("first_batch_vs_litdata", "litdata's first batch / HTTP first batch", 1.0, True),
    ("throughput_vs_mosaicml", "HTTP throughput / MosaicML streaming's", 1.0, True),
    ("first_batch_vs_mosaicml", "MosaicML streaming's first batch / HTTP first batch", 1.0, True),
)  # fmt: skip


def stream_table(results: Mapping[str, Any]) -> str:
    rows = []
    for name, figures in results["rows"].items():
        first, second = figures["epoch1"], figures.get("epoch2")
        rows.append([
            STREAM_ROWS.get(name, name), f"{figures['first_batch_s']:.2f}", f"{first['seconds']:.2f}",
            f"{first['instances_per_s']:,.0f}", f"{first['mib_per_s']:.1f}", f"{first['fetched_mib']:.0f}",
            f"{first['server_cpu_s']:.1f}" if "server_cpu_s" in first else "",
            f"{second['seconds']:.2f}" if second else "", f"{second['fetched_mib']:.0f}" if second else "",
        ])  # fmt: skip
    parts = [
        f"**{results['shards']} shards x {results['shard_mib']:g} MiB** ({results['dataset_mib']:.0f} MiB of "
        f"jsonl.gz, {results['records']:,} records), {results['num_workers']} workers, batch size "
        f"{results['batch_size']}, a {results['link_mib_s']:.0f} MiB/s link; medians of "
        f"{results['repeats']} ({results['machine']}).\n",
        _table(["loader", "first batch (s)", "epoch 1 (s)", "instances/s", "MiB/s", "fetched (MiB)",
                "server CPU (s)", "epoch 2 (s)", "fetched (MiB)"], rows),
        "",
        f"One shard's fetch alone: HTTP {results['one_shard_fetch_s']['http']:.3f} s, S3 "
        f"{results['one_shard_fetch_s']['s3']:.3f} s; the budget: "
        f"{results['cache_limit_mib']:.1f} MiB. MiB/s counts what each row moved (its converted "
        "shards for the other tools); *fetched* is what the servers sent during the epoch; *server CPU* "
        "the CPU time the servers and the link's proxies used meanwhile, on the same cores as the loader.",
        "",
    ]  # fmt: skip
    conversions = results.get("conversions", {})
    if conversions:
        converted = [["framework (none: the shards as they are)", "0", f"{results['dataset_mib']:.0f}"]]
        converted += [
            [name, f"{figures['seconds']:.1f}", f"{figures['bytes'] / 2**20:.0f}"]
            for name, figures in conversions.items()
        ]
        parts += [_table(["conversion", "seconds", "MiB"], converted), ""]
    ratios = results.get("ratios", {})
    checks = []
    for key, what, target, higher in STREAM_TARGETS:
        if key in ratios:
            value = ratios[key]
            met = value >= target if higher else value <= target
            bound = ">=" if higher else "<="
            checks.append([what, f"{value:.2f}", f"{bound} {target:g}", "met" if met else "**not met**"])
    if checks:
        parts += [_table(["ratio", "measured", "target", ""], checks), ""]
    for name, why in results.get("skipped", {}).items():
        parts.append(f"Not run: {name}, {why}.")
    return "\n".join(parts).rstrip("\n")


def fetch_cpu_table(results: Mapping[str, Any]) -> str:
    rows, figures = [], results["rows"]
    for name, figure in figures.items():
        plain = figures["http requests" if name.startswith("http") else "s3 boto3 download_file"]
        rows.append([
            name, f"{figure['cpu_ms_per_mib']:.2f}", f"{figure['mib_per_s']:.1f}",
            f"{figure['cpu_ms_per_mib'] / plain['cpu_ms_per_mib']:.2f}x",
        ])  # fmt: skip
    return "\n".join([
        f"**{results['objects']} objects x {results['object_mib']:g} MiB** over the paced link, medians of "
        f"{results['turns']} ({results['machine']}).\n",
        _table(["client", "CPU ms per MiB", "MiB/s", "CPU vs the plain copy"], rows),
    ])  # fmt: skip
