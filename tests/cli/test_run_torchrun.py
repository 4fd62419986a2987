"""`framework run` under torchrun (2 ranks, gloo): one summary, the job's, from rank 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from framework.cli._summary import combined, print_summary

REPO_ROOT = Path(__file__).resolve().parents[2]


def torchrun(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"x": float(i)}) + "\n" for i in range(40)), encoding="utf-8")
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps({"dataset_reader": "jsonl", "data_path": "data.jsonl", "data_loader": {"batch_size": 5}}),
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEWORK_")}
    env["FRAMEWORK_CACHE"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "framework", "run", str(config), "--no-progress", *args],
        capture_output=True, text=True, env=env, timeout=100, cwd=tmp_path,
    )  # fmt: skip


@pytest.mark.timeout(110)
def test_one_summary_with_the_job_totals(tmp_path: Path) -> None:
    result = torchrun(tmp_path, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    # One JSON object, not one per rank: the text form takes the same gate (`_job_summary`),
    # and its lines are checked below without a launch.
    summary = json.loads(result.stdout)
    assert summary["ranks"] == 2
    assert [each["instances"] for each in summary["per_rank"]] == [20, 20]
    assert summary["instances"] == 40 and summary["batches"] == 8


def rank_summary(instances: int, seconds: float, first: float, main_mib: float) -> dict[str, object]:
    return {
        "config": "c.json",
        "data_path": "/d",
        "cached_at": "/d",
        "epochs": 1,
        "instances": instances,
        "batches": instances // 5,
        "seconds": seconds,
        "instances_per_s": instances / seconds,
        "batches_per_s": instances / 5 / seconds,
        "time_to_first_batch_s": first,
        "peak_memory": {"main_mib": main_mib, "largest_worker_mib": 0.0},
    }


def test_the_job_sums_counts_and_takes_the_slowest_rank(capsys: pytest.CaptureFixture[str]) -> None:
    job = combined([rank_summary(30, 2.0, 0.1, 100.0), rank_summary(20, 4.0, 0.3, 80.0)])
    assert (job["instances"], job["batches"], job["seconds"]) == (50, 10, 4.0)
    assert (job["instances_per_s"], job["batches_per_s"]) == (12.5, 2.5)
    assert job["time_to_first_batch_s"] == 0.3
    assert job["peak_memory"] == {"main_mib": 100.0, "largest_worker_mib": 0.0}
    assert [each["instances"] for each in job["per_rank"]] == [30, 20]
    print_summary(job)
    out = capsys.readouterr().out
    assert "ranks        2 (counts summed" in out and "instances per rank: 30, 20" in out
