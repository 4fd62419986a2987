"""Loader semantics under hostile use (issue 9, part B): each test failed before its fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.multiprocessing as mp
from hardening_helpers import CASES, empty_or_failing_rank

pytestmark = pytest.mark.timeout(120)


def test_an_empty_or_failing_rank_ends_the_epoch_on_every_rank(free_port: int, tmp_path: Path) -> None:
    # Before: the empty (or failing) rank raised on its own and the others waited in
    # the even_batches all_reduce until the process group's timeout.
    world = 3
    mp.spawn(empty_or_failing_rank, args=(world, free_port, str(tmp_path)), nprocs=world, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for name in CASES:
        outcomes = [result[name] for result in ranks]
        assert all("error" in outcome for outcome in outcomes), (name, outcomes)
        assert len({outcome["error"] for outcome in outcomes}) == 1, (name, outcomes)
        empty = name.startswith(("eager", "lazy"))
        # From a worker the reader's error may arrive as a WorkerError: the same on every rank.
        assert outcomes[0]["error"] in (("ValueError",) if empty else ("FileNotFoundError", "WorkerError"))
        assert all(("no instances" if empty else "cannot open") in o["message"] for o in outcomes)
        victim = 2 if empty else 1
        for rank, outcome in enumerate(outcomes):
            if rank != victim:
                assert f"rank {victim}" in outcome["message"], (name, outcome)
