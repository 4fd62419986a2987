"""`examples/ddp_train.py` under torchrun (2 ranks, gloo, 2 loader workers each).

Every rank must see the same number of batches (or DDP would hang), and the data
must be fetched once although both ranks ask for it at the same time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
CORPUS = REPO_ROOT / "framework" / "examples" / "corpus.txt"


@pytest.mark.timeout(110)
def test_ddp_example_equal_batches_and_one_fetch(
    tmp_path: Path, http_server: tuple[str, list[str]]
) -> None:
    base, gets = http_server
    (tmp_path / "www" / "corpus.txt").write_bytes(CORPUS.read_bytes())
    url = f"{base}/corpus.txt"
    reports = tmp_path / "reports"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEWORK_")}
    env["FRAMEWORK_CACHE"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = "1"
    # 1001 instances over 2 ranks: 501 and 500, i.e. 51 and 50 batches of 10 unless the
    # loader evens them out, which DDP needs.
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(REPO_ROOT / "examples" / "ddp_train.py"), "--data", url, "--epochs", "1",
         "--batch-size", "10", "--max-instances", "1001", "--report-dir", str(reports)],
        capture_output=True, text=True, env=env, timeout=100, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    ranks = [json.loads((reports / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["batches_per_epoch"] == ranks[1]["batches_per_epoch"]
    assert ranks[0]["batches_per_epoch"][0] >= 50
    assert ranks[0]["data"] == ranks[1]["data"]
    assert Path(ranks[0]["data"]).read_bytes() == CORPUS.read_bytes()
    assert gets == ["/corpus.txt"], f"expected one fetch, the server saw {gets}"
