"""`examples/ddp_train.py` under torchrun (2 ranks, gloo, 2 loader workers each).

Every rank must see the same number of batches (or DDP would hang), and the data
must be fetched once although both ranks ask for it at the same time.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CORPUS = REPO_ROOT / "framework" / "examples" / "corpus.txt"


class _CountingHandler(http.server.SimpleHTTPRequestHandler):
    gets: list[str]

    def do_GET(self) -> None:
        self.gets.append(self.path)
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def corpus_server(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    root = tmp_path / "www"
    root.mkdir()
    (root / "corpus.txt").write_bytes(CORPUS.read_bytes())
    gets: list[str] = []
    handler = functools.partial(
        type("Handler", (_CountingHandler,), {"gets": gets}), directory=str(root)
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/corpus.txt", gets
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.timeout(110)
def test_ddp_example_equal_batches_and_one_fetch(
    tmp_path: Path, corpus_server: tuple[str, list[str]]
) -> None:
    url, gets = corpus_server
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
