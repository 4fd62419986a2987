"""The example third-party plugin package, pip-installed into a temp target and used
through the real command line: `framework plugins`, `framework download`, `framework run`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE = REPO_ROOT / "examples" / "framework-example-plugin"
CONFIG = PACKAGE / "framework_example_plugin" / "squares.json"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("example-plugin") / "site"
    build = tmp_path_factory.mktemp("example-plugin-src")
    # build from a copy: building in place would leave build/ and *.egg-info in examples/
    shutil.copytree(PACKAGE, build / PACKAGE.name, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(build / PACKAGE.name)],
        check=True, timeout=100,
    )  # fmt: skip
    return target


def framework(site: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEWORK_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO_ROOT)])
    env["FRAMEWORK_CACHE"] = str(tmp_path / "cache")
    return subprocess.run(
        [sys.executable, "-m", "framework", *args],
        capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path,
    )  # fmt: skip


@pytest.mark.timeout(110)
def test_plugins_lists_the_reader_and_the_backend(site: Path, tmp_path: Path) -> None:
    result = framework(site, tmp_path, "plugins", "--json")
    assert result.returncode == 0, result.stderr
    listing = json.loads(result.stdout)
    rows = {(row["base"], row["name"]): row for row in listing["components"]}
    assert rows[("DatasetReader", "squares")]["provider"] == "framework-example-plugin 0.1.0"
    assert rows[("DownloadBackend", "numbers")]["target"] == (
        "framework_example_plugin.backend:NumbersBackend"
    )
    assert listing["failed_plugins"] == {}


@pytest.mark.timeout(110)
def test_download_through_the_new_scheme(site: Path, tmp_path: Path) -> None:
    result = framework(site, tmp_path, "download", "numbers://5", "--no-progress")
    assert result.returncode == 0, result.stderr
    path = Path(result.stdout.strip().splitlines()[-1])
    assert path.is_relative_to(tmp_path / "cache")
    assert path.read_text() == "0\n1\n2\n3\n4\n"


@pytest.mark.timeout(110)
def test_run_reads_the_plugin_data_with_the_plugin_reader(site: Path, tmp_path: Path) -> None:
    result = framework(site, tmp_path, "run", str(CONFIG), "--json", "--no-progress")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["instances"] == 2 * 10000
    assert summary["batches"] == 2 * 100
    assert Path(summary["cached_at"]).is_relative_to(tmp_path / "cache")


@pytest.mark.timeout(110)
def test_without_the_plugin_its_reader_is_unknown(tmp_path: Path) -> None:
    result = framework(tmp_path / "no-site", tmp_path, "run", str(CONFIG), "--no-progress")
    assert result.returncode == 2
    assert "dataset_reader.type" in result.stderr and "squares" in result.stderr
