"""The caller's global random streams (random, numpy, torch) stay the caller's: building,
iterating, collating and resuming neither reseed nor draw from them."""

from __future__ import annotations

import json
import random
from typing import Any

import numpy.random
import pytest
import torch

from framework.data.multiprocess import MultiProcessDataLoader
from framework.data.reader import DatasetReader
from tests.support.loader import CountingReader, RandomReader


def _loader(reader: DatasetReader | None = None, **options: Any) -> MultiProcessDataLoader:
    settings: dict[str, Any] = {"batch_size": 2, "quiet": True, "seed": 0}
    settings.update(options)
    return MultiProcessDataLoader(reader or CountingReader(40), settings.pop("data_path", "x"), **settings)



def _global_state() -> tuple[Any, ...]:
    return random.getstate(), torch.get_rng_state().tolist(), str(numpy.random.get_state())


@pytest.mark.parametrize("options", [{}, {"max_instances_in_memory": 8}])
def test_building_and_iterating_leaves_the_callers_rng_untouched(options: dict[str, Any]) -> None:
    # The loader seeds its own streams, never the global random/numpy/torch ones of this
    # process.
    random.seed(7)
    torch.manual_seed(7)
    numpy.random.seed(7)
    before = _global_state()
    loader = _loader(RandomReader(20), shuffle=True, **options)
    for _ in loader:
        pass
    assert len(list(loader.iter_instances())) == 20
    assert _global_state() == before


def test_lazy_resume_is_exact_while_the_training_loop_draws_from_random() -> None:
    # The reader draws from its own stream: the caller's draws between batches must change
    # neither the data nor a resumed run.
    def noise(draw: bool, state: dict[str, Any] | None = None, stop: int | None = None) -> Any:
        loader = _loader(RandomReader(24), max_instances_in_memory=8)
        if state is not None:
            loader.load_state_dict(state)
        out = []
        for index, batch in enumerate(loader):
            out.append(batch["noise"].tolist())
            if draw:
                random.random()
                torch.rand(())
            if index == stop:
                return out, loader.state_dict()
        return out, None

    quiet, _ = noise(draw=False)
    whole, _ = noise(draw=True)
    assert whole == quiet
    head, state = noise(draw=True, stop=4)
    tail, _ = noise(draw=True, state=json.loads(json.dumps(state)))
    assert head + tail == whole


class _Masking:
    """A random collator (as an MLM collator masks): draws from the global torch stream."""

    def __call__(self, instances: list[dict[str, Any]]) -> dict[str, Any]:
        from framework.data.collate import DefaultDataCollator

        batch = DefaultDataCollator()(instances)
        batch["mask"] = torch.rand(len(instances)) < 0.5
        return batch


@pytest.mark.parametrize("workers", [0, 2])
def test_eager_collation_uses_the_loaders_streams_not_the_callers(workers: int) -> None:
    # Eager mode collates in the main process: it drew from (and advanced) the caller's
    # torch stream, so the batches changed with the training loop's own draws.
    def run(training_draws: bool) -> list[list[bool]]:
        torch.manual_seed(123)
        loader = _loader(CountingReader(12), num_workers=workers, collate_fn=_Masking())
        before = torch.get_rng_state()
        masks = []
        for batch in loader:
            masks.append(batch["mask"].tolist())
            if training_draws:
                torch.rand(7)  # dropout, say
            else:
                assert torch.equal(before, torch.get_rng_state())
        return masks

    assert run(False) == run(True)
    # and a resumed epoch collates as the original did
    original = _loader(CountingReader(12), num_workers=workers, collate_fn=_Masking())
    it = iter(original)
    next(it)
    state = original.state_dict()
    rest = [batch["mask"].tolist() for batch in it]
    resumed = _loader(CountingReader(12), num_workers=workers, collate_fn=_Masking())
    resumed.load_state_dict(state)
    assert [batch["mask"].tolist() for batch in resumed] == rest
