"""Seeded runs repeat exactly; state_dict()/load_state_dict() resume mid-epoch exactly."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

from framework.data.multiprocess import MultiProcessDataLoader
from framework.data.sampler import BatchSampler
from tests.support.loader import OwnShardRandomReader, RandomReader

pytestmark = pytest.mark.timeout(90)


def build(num_workers: int, lazy: Any, seed: Any = 7, sampler: bool = False,
          start_method: str = "fork", **kwargs: Any) -> MultiProcessDataLoader:
    options: dict[str, Any] = {"batch_size": 4, "shuffle": True}
    if sampler:
        options = {"batch_sampler": BatchSampler.by_name("bucket")(batch_size=4)}
    return MultiProcessDataLoader(
        RandomReader(40), "x", num_workers=num_workers, max_instances_in_memory=lazy,
        seed=seed, quiet=True, start_method=start_method, **options, **kwargs,
    )


def fingerprint(batches: Any) -> list[tuple[list[int], list[float]]]:
    return [(b["id"].tolist(), [round(x, 6) for x in b["noise"].tolist()]) for b in batches]


def epochs(data: MultiProcessDataLoader, count: int = 2) -> list[Any]:
    return [fingerprint(data) for _ in range(count)]


@pytest.mark.parametrize("num_workers,lazy,sampler", [
    (0, None, False), (2, None, True), (0, 8, True), (2, 8, False), (2, 8, True),
])
def test_same_seed_same_batches(num_workers: int, lazy: Any, sampler: bool) -> None:
    first = epochs(build(num_workers, lazy, sampler=sampler))
    second = epochs(build(num_workers, lazy, sampler=sampler))
    assert first == second
    assert first[0] != first[1]  # epochs differ (the epoch is part of the seed)
    other = epochs(build(num_workers, lazy, seed=8, sampler=sampler))
    assert other != first


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_spawned_workers_match_forked_ones(method: str) -> None:
    forked = epochs(build(2, 8), 1)
    other = epochs(build(2, 8, start_method=method), 1)
    assert forked == other


def test_order_is_round_robin_across_workers() -> None:
    data = MultiProcessDataLoader(
        RandomReader(16), "x", batch_size=2, num_workers=2, max_instances_in_memory=4,
        quiet=True, seed=1,
    )
    batches = [b["id"].tolist() for b in data]
    # worker 0 reads even ids and worker 1 odd ids; batches alternate between them
    assert [b[0] % 2 for b in batches] == [0, 1] * 4


def test_workers_are_seeded_per_worker() -> None:
    # Each worker draws only for its own records: with one seed for both (or a reader that
    # draws for every record before sharding drops the other's), their noise would agree.
    data = MultiProcessDataLoader(OwnShardRandomReader(16), "x", batch_size=2, num_workers=2,
                                  max_instances_in_memory=4, quiet=True, seed=3)
    noise = [b["noise"].tolist() for b in data]
    assert len(noise) == 8
    assert noise[0::2] != noise[1::2]  # worker 0's stream is not worker 1's


@pytest.mark.parametrize("lazy", [None, 8])
def test_no_workers_and_one_worker_give_the_same_batches(lazy: Any) -> None:
    # The main process reads with worker 0's seeds, so num_workers=0 and 1 agree, noise and all.
    def batches(workers: int) -> list[Any]:
        data = MultiProcessDataLoader(RandomReader(24), "x", batch_size=4, shuffle=True, seed=7,
                                      num_workers=workers, max_instances_in_memory=lazy, quiet=True)
        return [(b["id"].tolist(), b["noise"].tolist()) for _ in range(2) for b in data]

    assert batches(0) == batches(1)


@pytest.mark.parametrize("num_workers,lazy,sampler,k", [
    (0, None, False, 3), (2, None, True, 5), (0, 8, True, 4), (2, 8, False, 3),
    (2, 8, True, 6), (3, 6, False, 0),
])
def test_resume_mid_epoch_yields_exactly_the_next_batches(
    num_workers: int, lazy: Any, sampler: bool, k: int
) -> None:
    original = build(num_workers, lazy, sampler=sampler)
    list(original)  # one full epoch first: resuming must get the epoch number right too
    iterator = iter(original)
    before = fingerprint(itertools.islice(iterator, k))
    state = original.state_dict()
    rest = fingerprint(iterator)
    following = fingerprint(original)
    assert len(before) == k and rest

    restored = build(num_workers, lazy, sampler=sampler)
    restored.load_state_dict(state)
    assert fingerprint(restored) == rest
    assert fingerprint(restored) == following


def test_resume_with_batches_per_epoch() -> None:
    original = build(2, 8, batches_per_epoch=3)
    list(original)
    state = original.state_dict()
    expected = [fingerprint(original) for _ in range(3)]
    restored = build(2, 8, batches_per_epoch=3)
    restored.load_state_dict(state)
    assert [fingerprint(restored) for _ in range(3)] == expected


def test_resume_state_survives_torch_save(tmp_path: Any) -> None:
    original = build(2, 8)
    iterator = iter(original)
    next(iterator)
    torch.save(original.state_dict(), tmp_path / "state.pt")
    rest = fingerprint(iterator)
    restored = build(2, 8)
    restored.load_state_dict(torch.load(tmp_path / "state.pt"))
    assert fingerprint(restored) == rest


def test_resume_with_another_worker_count_yields_the_rest() -> None:
    original = build(2, 8)
    iterator = iter(original)
    head = fingerprint(itertools.islice(iterator, 3))
    state = original.state_dict()
    iterator.close()
    restored = build(3, 8)
    restored.load_state_dict(state)
    tail = fingerprint(restored)
    ids = [i for ids, _ in head + tail for i in ids]
    assert sorted(ids) == list(range(40))
