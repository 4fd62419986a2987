"""Config check benchmark: `validate` of a run config with 1,000 nested components.

The run config's reader is a composite of 1,000 named readers (``text``, ``jsonl``
and ``csv`` in turn, each with a few keys), plus the loader and its sampler:

    python benchmarks/bench_config.py              # prints and writes results/config.json
    python benchmarks/bench_config.py --repeats 21

In process: the median of `--repeats` calls of `framework.config.validate` after
one warm-up call (the first call imports the component modules, torch among them;
it is printed too). Command line: the median wall time of `framework config
validate`, of `framework --version` (start-up alone) and of ``python -c "import
torch"``: reading the loader's signature imports its module, and so torch.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from framework.data import DatasetReader

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "config.json"
COMPONENTS = 1000


class CompositeReader(DatasetReader):
    """Reads with each of its named readers in turn."""

    def __init__(self, readers: dict[str, DatasetReader], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.readers = readers

    def _read(self, file_path: Any) -> Iterator[Any]:
        for reader in self.readers.values():
            yield from reader.read(file_path)


def big_config(components: int = COMPONENTS) -> dict[str, Any]:
    kinds = [
        {"type": "text", "lowercase": True, "max_tokens": 64, "num_buckets": 5000},
        {"type": "jsonl", "fields": ["text", "label"], "max_instances": 100},
        {"type": "csv", "fields": ["a", "b"], "field_types": {"b": "int"}, "delimiter": ","},
    ]
    readers = {f"reader_{i}": dict(kinds[i % len(kinds)]) for i in range(components)}
    return {
        "dataset_reader": {"type": "bench_config:CompositeReader", "readers": readers},
        "data_path": "corpus.txt",
        "data_loader": {"batch_sampler": {"type": "bucket", "batch_size": 32}, "num_workers": 2},
        "epochs": 1,
    }


def median_seconds(function: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))  # so that "bench_config:CompositeReader" imports

    from framework.config import validate

    config = big_config()
    start = time.perf_counter()
    errors = validate(config)
    cold = time.perf_counter() - start
    assert errors == [], errors
    warm = median_seconds(lambda: validate(config), args.repeats)
    broken = json.loads(json.dumps(config))
    for name in list(broken["dataset_reader"]["readers"])[::100]:  # 10 errors spread out
        broken["dataset_reader"]["readers"][name]["max_instances"] = "many"
    assert len(validate(broken)) == 10
    with_errors = median_seconds(lambda: validate(broken), args.repeats)

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
    }
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "big.json"
        path.write_text(json.dumps(config), encoding="utf-8")
        command = [sys.executable, "-m", "framework", "config", "validate", str(path)]
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        cli_runs = max(3, args.repeats // 3)
        cli = median_seconds(
            lambda: subprocess.run(command, capture_output=True, env=env, timeout=120), cli_runs
        )
        version = [sys.executable, "-m", "framework", "--version"]
        startup = median_seconds(
            lambda: subprocess.run(version, capture_output=True, env=env, timeout=120), cli_runs
        )
        torch_only = [sys.executable, "-c", "import torch"]
        torch_import = median_seconds(
            lambda: subprocess.run(torch_only, capture_output=True, timeout=120), cli_runs
        )

    components = COMPONENTS + 3  # the readers, the composite, the loader and its sampler
    print(f"config: {components} components ({len(json.dumps(config)) // 1024} KiB of JSON)")
    print(f"validate(), first call (imports the components): {cold * 1000:8.1f} ms")
    print(f"validate(), median of {args.repeats}:                  {warm * 1000:8.1f} ms")
    print(f"validate() with 10 errors, median of {args.repeats}:   {with_errors * 1000:8.1f} ms")
    print(f"framework config validate (wall), median of {cli_runs}: {cli * 1000:8.1f} ms")
    print(f"framework --version (start-up alone), median of {cli_runs}: {startup * 1000:8.1f} ms")
    print(f"python -c 'import torch', median of {cli_runs}: {torch_import * 1000:8.1f} ms")
    results = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_average": [round(value, 2) for value in os.getloadavg()],
        "components": components,
        "config_kib": len(json.dumps(config)) // 1024,
        "repeats": args.repeats,
        "cli_runs": cli_runs,
        "validate_first_call_ms": round(cold * 1000, 1),
        "validate_ms": round(warm * 1000, 1),
        "validate_10_errors_ms": round(with_errors * 1000, 1),
        "cli_validate_ms": round(cli * 1000, 1),
        "cli_startup_ms": round(startup * 1000, 1),
        "import_torch_ms": round(torch_import * 1000, 1),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
