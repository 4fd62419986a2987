"""Charts and tables from the benchmark results, for the docs.

Reads ``benchmarks/results/loader.json`` (``bench_loader.py``) and
``benchmarks/results/download.json`` (``bench_download.py``) and writes
``docs/img/bench_loader.png`` and ``docs/img/bench_download.png``. The docs hook
(``docs/hooks.py``) calls `markdown_tables` to put the same figures, as tables,
on the benchmarks page. A result file that is missing is skipped.

Run: ``python benchmarks/plot.py`` (needs matplotlib, in the ``docs`` extra), or
``python benchmarks/run_all.py`` to rerun the benchmarks first.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
IMAGES = ROOT / "docs" / "img"

COLD_RUNS = (
    ("framework (sha256, fsync, atomic publish)", "cold_ours_s"),
    ("raw requests copy (no hash, no fsync)", "cold_raw_requests_s"),
    ("raw requests copy + sha256 + fsync", "cold_raw_requests_sha256_fsync_s"),
    ("local file copy + fsync (the disk's floor)", "floor_local_copy_fsync_s"),
    ("pooch.retrieve", "cold_pooch_s"),
)

OURS = "#1f77b4"
THEIRS = "#9e9e9e"
OTHER = "#ff7f0e"


def load(name: str, results_dir: Path = RESULTS) -> Optional[dict[str, Any]]:
    """The parsed ``results/<name>.json``, or None when it has not been written."""
    path = results_dir / f"{name}.json"
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


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


def _runs(section: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The (name, figures) entries of a loader section that hold batches_per_s."""
    return [
        (name, value)
        for name, value in section.items()
        if isinstance(value, Mapping) and "batches_per_s" in value
    ]


def _color(name: str) -> str:
    return OURS if name.startswith("ours") else THEIRS


def _bars(axis: Any, names: Sequence[str], values: Sequence[float], colors: Sequence[str],
          unit: str, log: bool = False) -> None:
    positions = range(len(names))
    bars = axis.barh(list(positions), list(values), color=list(colors))
    axis.set_yticks(list(positions))
    axis.set_yticklabels(list(names))
    axis.invert_yaxis()
    axis.set_xlabel(unit)
    if log:
        axis.set_xscale("log")
    for bar, value in zip(bars, values):
        axis.annotate(
            f" {value:,.1f}" if value < 100 else f" {value:,.0f}",
            (bar.get_width(), bar.get_y() + bar.get_height() / 2),
            va="center", fontsize=8,
        )
    axis.spines[["top", "right"]].set_visible(False)
    axis.margins(x=0.25)


def plot_loader(results: Mapping[str, Any], target: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heavy = results.get("cpu_heavy_reader", {})
    work_ms = heavy.get("work_cpu_ms", heavy.get("work_ms", 1.0)) if isinstance(heavy, Mapping) else 1.0
    panels = [
        (key, title)
        for key, title in (
            ("cheap_reader", "cheap reader (transfer-bound)"),
            ("cpu_heavy_reader", f"CPU-heavy reader (~{work_ms:g} ms of CPU an instance)"),
        )
        if key in results
    ]
    memory = results.get("lazy_memory")
    count = len(panels) + (1 if memory else 0)
    figure, axes = plt.subplots(count, 1, figsize=(7.5, 2.3 * count + 0.6), squeeze=False)
    for axis, (key, title) in zip(axes[:, 0], panels):
        runs = _runs(results[key])
        _bars(
            axis,
            [label(name) for name, _ in runs],
            [float(figures["batches_per_s"]) for _, figures in runs],
            [_color(name) for name, _ in runs],
            "batches/s (higher is better)",
        )
        axis.set_title(title, fontsize=10, loc="left")
    if memory:
        axis = axes[len(panels), 0]
        small, large = memory.get("small", {}), memory.get("large", {})
        names = [f"{memory.get('small_lines', '?')} lines", f"{memory.get('large_lines', '?')} lines"]
        metric = "peak_pss_mib" if "peak_pss_mib" in small else "peak_rss_mib"
        _bars(
            axis,
            names,
            [float(small.get(metric, 0)), float(large.get(metric, 0))],
            [OURS, OURS],
            f"peak {metric.split('_')[1].upper()}, MiB (main + workers)",
        )
        axis.set_title("lazy mode memory as the data grows 10x", fontsize=10, loc="left")
    machine = results.get("machine", {})
    if isinstance(machine, Mapping):
        machine = f"{machine.get('cpus', '?')} CPUs, torch {machine.get('torch', '?')}"
    figure.suptitle(
        f"Loader, batch size {results.get('batch_size', '?')} ({machine})", fontsize=11
    )
    figure.tight_layout()
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, dpi=110)
    plt.close(figure)
    return target


def plot_download(results: Mapping[str, Any], target: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 1, figsize=(7.5, 4.8))
    cold = [(name, key, OURS if key == "cold_ours_s" else OTHER if "pooch" in key else THEIRS)
            for name, key in COLD_RUNS]  # fmt: skip
    size_mb = float(results.get("size_bytes", 0)) / 2**20
    present = [(name, float(results[key]), color) for name, key, color in cold if key in results]
    _bars(
        axes[0],
        [name for name, _, _ in present],
        [size_mb / seconds if seconds else 0.0 for _, seconds, _ in present],
        [color for _, _, color in present],
        "MiB/s (higher is better)",
    )
    axes[0].set_title(f"cold download of {size_mb:.0f} MiB from 127.0.0.1", fontsize=10, loc="left")
    hits = [
        ("framework", results.get("hit_ours_us_median"), OURS),
        ("pooch", results.get("hit_pooch_us_median"), OTHER),
    ]
    hits_present = [(n, float(v), c) for n, v, c in hits if v is not None]
    _bars(
        axes[1],
        [n for n, _, _ in hits_present],
        [v for _, v, _ in hits_present],
        [c for _, _, c in hits_present],
        "microseconds per call, log scale (lower is better)",
        log=True,
    )
    axes[1].set_title("cache hit with a known sha256 (median)", fontsize=10, loc="left")
    figure.suptitle(f"Download manager ({results.get('machine', '')})", fontsize=11)
    figure.tight_layout()
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, dpi=110)
    plt.close(figure)
    return target


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
            for name, figures in _runs(section)
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
            return f"{value[0]} GET in each of {len(value)} runs" if value[0] == 1 else (
                f"{value[0]} GETs in each of {len(value)} runs"
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


def markdown_tables(results_dir: Path = RESULTS) -> dict[str, str]:
    """``{"loader": ..., "download": ...}`` markdown for the benchmarks page."""
    tables = {}
    for name, render in (("loader", loader_table), ("download", download_table)):
        results = load(name, results_dir)
        tables[name] = (
            render(results)
            if results is not None
            else f"*No results yet: run `python benchmarks/bench_{name}.py`.*"
        )
    return tables


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of result JSON files")
    parser.add_argument("--out", type=Path, default=IMAGES, help="folder for the PNG charts")
    args = parser.parse_args(argv)
    written = []
    loader = load("loader", args.results)
    if loader is not None:
        written.append(plot_loader(loader, args.out / "bench_loader.png"))
    download = load("download", args.results)
    if download is not None:
        written.append(plot_download(download, args.out / "bench_download.png"))
    if not written:
        print(f"no results in {args.results}: run the benchmarks first")
        return 1
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
