"""Every random draw inside the loader comes from a seeded stream of the loader's own
(issue 24): random collators (masking), readers that augment and an overridden
`apply_token_indexers` give, resumed with the same topology, the very batches of an
uninterrupted run, and iterating never moves the caller's random/numpy/torch streams."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from typing import Any, Optional

import numpy
import pytest
import torch

from framework.data.collate import DefaultDataCollator
from framework.data.multiprocess import MultiProcessDataLoader
from framework.data.reader import DatasetReader
from framework.data.sampler import BatchSampler
from tests.support.loader import RandomReader, make_instance

pytestmark = pytest.mark.timeout(60)


class Masking(DefaultDataCollator):
    """Masks as an MLM collator does: one draw from each of torch, random and numpy."""

    def __call__(self, instances: list[Any]) -> Any:
        batch = super().__call__(instances)
        batch["mask"] = (torch.rand(len(instances)) < 0.5).tolist()
        batch["coin"] = [random.random() + numpy.random.random() for _ in instances]
        return batch


class AugmentingHook(DatasetReader):
    """Augments in `apply_token_indexers` (the main-process hook), and in `_read`."""

    def __init__(self, n: int = 40) -> None:
        super().__init__()
        self.n = n

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        for i in range(self.n):
            instance = make_instance(i)
            instance["noise"] = float(torch.rand(()))
            yield instance

    def apply_token_indexers(self, instance: Any) -> None:
        instance["jitter"] = random.random() + float(torch.rand(())) + numpy.random.random()


def _global_state() -> tuple[Any, ...]:
    return random.getstate(), torch.get_rng_state().tolist(), str(numpy.random.get_state())


def _loader(reader: DatasetReader, workers: int, lazy: Optional[int], sampler: bool,
            seed: Optional[int] = 3) -> MultiProcessDataLoader:
    options: dict[str, Any] = (
        {"batch_sampler": BatchSampler.by_name("bucket")(batch_size=3, sorting_keys=["tokens"])}
        if sampler else {"batch_size": 3, "shuffle": True}
    )
    return MultiProcessDataLoader(reader, "x", num_workers=workers, max_instances_in_memory=lazy,
                                  collate_fn=Masking(), quiet=True, seed=seed, **options)


def _plain(batch: dict[str, Any]) -> dict[str, Any]:
    return {key: value.tolist() if isinstance(value, torch.Tensor) else value
            for key, value in batch.items() if key != "text"}


CASES = [
    (reader, workers, lazy, sampler)
    for reader in ("random", "hook")
    for workers, lazy in ((0, 8), (2, 8), (0, None), (2, None))
    for sampler in (False, True)
]


@pytest.mark.parametrize(("reader", "workers", "lazy", "sampler"), CASES)
def test_random_draws_resume_batch_for_batch(reader: str, workers: int, lazy: Optional[int],
                                             sampler: bool) -> None:
    # A masking collator draws from its own stream: drawing from the reader's (lazy: a
    # resumed chunk collates fewer batches before the cut) or the training loop's (a reader
    # overriding apply_token_indexers, eager with workers) would not resume batch for batch.
    def make() -> MultiProcessDataLoader:
        return _loader(RandomReader(40) if reader == "random" else AugmentingHook(40),
                       workers, lazy, sampler)

    uninterrupted = [_plain(batch) for batch in make()]
    original = make()
    iterator = iter(original)
    head = [_plain(batch) for batch in itertools.islice(iterator, 5)]
    state = json.loads(json.dumps(original.state_dict()))
    iterator.close()
    resumed = make()
    resumed.load_state_dict(state)
    assert head + [_plain(batch) for batch in resumed] == uninterrupted


@pytest.mark.parametrize(("workers", "lazy"), [(0, 8), (2, 8), (0, None), (2, None)])
@pytest.mark.parametrize("seed", [3, None])
def test_iterating_never_moves_the_callers_streams(workers: int, lazy: Optional[int],
                                                   seed: Optional[int]) -> None:
    # The hook and the collator draw from the loader's streams, not the caller's (in the main
    # process), and an unseeded loader does not take each epoch's seed from `random`.
    random.seed(7)
    torch.manual_seed(7)
    numpy.random.seed(7)
    before = _global_state()
    loader = _loader(AugmentingHook(20), workers, lazy, sampler=False, seed=seed)
    for _ in range(2):
        for _ in loader:
            pass
    assert _global_state() == before


@pytest.mark.parametrize(("workers", "lazy"), [(0, 8), (2, 8), (0, None), (2, None)])
def test_the_training_loops_draws_do_not_change_the_batches(workers: int, lazy: Optional[int]) -> None:
    def run(draw: bool) -> list[dict[str, Any]]:
        out = []
        for batch in _loader(AugmentingHook(20), workers, lazy, sampler=False):
            out.append(_plain(batch))
            if draw:
                random.random()
                torch.rand(3)
                numpy.random.random()
        return out

    assert run(False) == run(True)


@pytest.mark.parametrize("lazy", [8, None])
def test_no_workers_and_one_worker_give_the_same_random_batches(lazy: Optional[int]) -> None:
    # The hook runs after the sampler, per batch (lazy) or once per instance (eager),
    # in the same seeded streams wherever it runs.
    def run(workers: int) -> list[dict[str, Any]]:
        return [_plain(batch) for batch in _loader(AugmentingHook(20), workers, lazy, sampler=True)]

    assert run(0) == run(1)


class _Tally(DatasetReader):
    """Counts the instances it has made (read in this process: num_workers=0)."""

    def __init__(self) -> None:
        super().__init__()
        self.made = 0

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        for i in range(64):
            self.made += 1
            yield make_instance(i)


@pytest.mark.parametrize("seed", [3, None])
def test_the_first_batch_without_workers_reads_only_what_it_needs(seed: Optional[int]) -> None:
    # The loader's own streams are swapped in once per chunk's worth of batches; the
    # first swap made the whole chunk (32 instances here) before the first batch came.
    # Now an unseeded loader has those streams too, so this held for every loader.
    reader = _Tally()
    loader = MultiProcessDataLoader(reader, "x", batch_size=2, max_instances_in_memory=32,
                                    quiet=True, seed=seed)
    iterator = iter(loader)
    next(iterator)
    assert reader.made == 2
    iterator.close()
