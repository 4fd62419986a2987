"""Rerun every benchmark, then regenerate the charts the docs show.

    python benchmarks/run_all.py            # full runs (a few minutes)
    python benchmarks/run_all.py --quick    # small data, for a smoke test
    python benchmarks/run_all.py --plot-only

Each benchmark writes ``benchmarks/results/<name>.json``; ``plot.py`` turns those into
``docs/img/bench_*.png`` and the README's speed paragraph, and the docs build puts the
tables on the benchmarks page. ``bench_parallel.py``, ``bench_matrix.py``, ``bench_config.py``,
``bench_cluster.py`` and ``bench_smallfiles.py`` are run on their own (see docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent

BENCHMARKS: dict[str, tuple[list[str], list[str]]] = {
    # name: (full-run arguments, --quick arguments)
    "bench_loader.py": ([], ["--quick"]),
    "bench_download.py": ([], ["--size-mb", "20", "--repeat", "1", "--hits", "500"]),
    "bench_resume.py": ([], ["--quick", "--repeats", "1"]),
}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Rerun the benchmarks and redraw the charts.")
    parser.add_argument("--quick", action="store_true", help="small data, one repeat")
    parser.add_argument("--plot-only", action="store_true", help="only redraw the charts")
    args = parser.parse_args(argv)
    if not args.plot_only:
        for script, (full, quick) in BENCHMARKS.items():
            command = [sys.executable, str(HERE / script), *(quick if args.quick else full)]
            print(f"== {' '.join(command[1:])}", flush=True)
            result = subprocess.run(command)
            if result.returncode != 0:
                print(f"{script} failed with exit status {result.returncode}", file=sys.stderr)
                return result.returncode
    print("== plot.py", flush=True)
    return subprocess.run([sys.executable, str(HERE / "plot.py")]).returncode


if __name__ == "__main__":
    raise SystemExit(main())
