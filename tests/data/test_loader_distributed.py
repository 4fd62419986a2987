"""Real torch.distributed (gloo) groups of 2 and 3 ranks, each loader with 2 workers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.loader import distributed_rank, flat
from tests.support.ranks import CASES, empty_or_failing_rank, start_ranks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(100)]


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_read_disjoint_shards_and_yield_equal_batches(
    world: int, free_port: int, tmp_path: Path
) -> None:
    start_ranks(distributed_rank, (world, free_port, str(tmp_path)), world)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for name in ("lazy_even", "lazy_uneven", "eager_even", "eager_uneven", "sharding_reader"):
        per_rank = [flat(result[name]) for result in ranks]
        everything = flat(per_rank)
        assert len(everything) == len(set(everything)), f"{name}: ranks overlap"
        counts = [len(result[name]) for result in ranks]
        if name.endswith("uneven") or name == "sharding_reader":
            assert sorted(everything) == list(range(50)), name  # nothing lost
        else:
            assert len(set(counts)) == 1, f"{name}: ranks yield {counts} batches"
    # 50 instances over 3 ranks do not split evenly: the option is what evens them out.
    if world == 3:
        assert len({len(r["lazy_uneven"]) for r in ranks}) > 1
        assert len({len(r["eager_uneven"]) for r in ranks}) > 1


@pytest.mark.timeout(120)
def test_an_empty_or_failing_rank_ends_the_epoch_on_every_rank(free_port: int, tmp_path: Path) -> None:
    # An empty (or failing) rank must end the epoch on every rank: raising on its own would
    # leave the others waiting in the even_batches all_reduce until the group's timeout.
    world = 3
    start_ranks(empty_or_failing_rank, (world, free_port, str(tmp_path)), world)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for name in CASES:
        outcomes = [result[name] for result in ranks]
        assert all("error" in outcome for outcome in outcomes), (name, outcomes)
        assert len({outcome["error"] for outcome in outcomes}) == 1, (name, outcomes)
        empty = name.startswith(("eager", "lazy"))
        # A reader's error is a WorkerError in every mode (0 or N workers): the same on every rank.
        assert outcomes[0]["error"] == ("ValueError" if empty else "WorkerError"), (name, outcomes)
        assert all(("no instances" if empty else "cannot open") in o["message"] for o in outcomes)
        victim = 2 if empty else 1
        for rank, outcome in enumerate(outcomes):
            if rank != victim:
                assert f"rank {victim}" in outcome["message"], (name, outcome)
