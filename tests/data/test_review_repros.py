"""Review reproducers for the loader restructuring (settings / pass / lease split).

Each test states a promise and fails while it is broken. Those marked "before the
restructuring too" fail at 1604d4f as well; the others passed there.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from framework.data.multiprocess import MultiProcessDataLoader
from framework.data.sampler import BatchSampler
from tests.support.loader import CountingReader

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore::framework.data.reader.UnshardedReadWarning"),
]


def ids(batches: Any) -> list[list[int]]:
    return [batch["id"].tolist() for batch in batches]


def loader(n: int = 6, **kwargs: Any) -> MultiProcessDataLoader:
    kwargs.setdefault("quiet", True)
    kwargs.setdefault("seed", 1)
    return MultiProcessDataLoader(CountingReader(n), "unused", **kwargs)


# -- saved states keep working ------------------------------------------------------------


def test_a_state_saved_before_the_samplers_moved_still_loads() -> None:
    """1604d4f saved a bucket sampler as "framework_plugins.samplers.BucketBatchSampler"
    (its class lived there); the class now lives in framework.data.sampler, and the
    saved type name no longer matches: ResumeError, whose advice (build the loader with
    the old type) cannot be followed, as that name is now an alias of the new class."""

    def build() -> MultiProcessDataLoader:
        sampler = BatchSampler.by_name("bucket")(batch_size=2, sorting_keys=["tokens"])
        return MultiProcessDataLoader(CountingReader(10), "unused", batch_sampler=sampler, quiet=True, seed=1)

    original = build()
    iterator = iter(original)
    next(iterator)
    state = original.state_dict()
    rest = ids(iterator)
    # what 1604d4f wrote for the same sampler (observed by running it there)
    state["settings"]["batch_sampler"]["type"] = "framework_plugins.samplers.BucketBatchSampler"
    resumed = build()
    resumed.load_state_dict(state)
    assert ids(resumed) == rest


# -- public settings assigned after construction ------------------------------------------
# The loader still exposes every setting as a plain writable attribute, but the passes
# and the saved state now read a snapshot (`LoaderSettings`) taken in __init__, while
# __len__/__iter__ still read the attributes: an assignment is half honoured.


def test_batches_per_epoch_set_after_construction_counts_loop_epochs_in_the_state() -> None:
    data = loader(batch_size=2, max_instances_in_memory=4)
    data.batches_per_epoch = 2
    epochs = [ids(data) for _ in range(2)]
    assert [len(epoch) for epoch in epochs] == [2, 2]  # __iter__ honours the new value...
    # ...but the state computes loop_epoch from the snapshot (None): the pass epoch (1),
    # not the two training-loop epochs that ended.
    assert data.state_dict()["loop_epoch"] == 2


def _new_collator(instances: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": torch.tensor([instance["id"] * 100 for instance in instances])}


@pytest.mark.parametrize("setting", ["collate_fn", "reader", "num_workers", "data_path"])
def test_a_setting_assigned_after_construction_takes_effect(setting: str) -> None:
    data = loader(batch_size=2, max_instances_in_memory=4)
    if setting == "collate_fn":
        data.collate_fn = _new_collator
        assert ids(data) == [[0, 100], [200, 300], [400, 500]]
    elif setting == "reader":
        data.reader = CountingReader(4)
        assert ids(data) == [[0, 1], [2, 3]]
    elif setting == "num_workers":
        data.num_workers = 2
        assert data.state_dict()["num_workers"] == 2
    else:
        data.data_path = "other"
        assert data.state_dict()["settings"]["data_path"] == "other"


def test_a_copy_of_the_loader_has_its_own_target_device() -> None:
    data = loader(batch_size=2)
    other = copy.copy(data)
    other.set_target_device("cpu")
    # the shallow copy shares the settings object, so the original moves too
    assert data.cuda_device is None


# -- set_target_device while a pass holds workers (before the restructuring too) ----------


def test_set_target_device_between_epochs_keeps_the_carried_pass() -> None:
    data = loader(n=20, batch_size=2, num_workers=2, max_instances_in_memory=4, batches_per_epoch=3)
    first = ids(data)
    data.set_target_device("cpu")
    # WorkerError "the loader was closed (close() from another thread)": the device
    # change shut down the pool the carried-over pass still reads from
    second = ids(data)
    assert len(second) == 3
    assert not set(map(tuple, first)) & set(map(tuple, second))


def test_set_target_device_mid_pass_keeps_the_live_iterator() -> None:
    data = loader(n=20, batch_size=2, num_workers=2, max_instances_in_memory=4)
    iterator = iter(data)
    taken = [next(iterator)["id"].tolist()]
    data.set_target_device("cpu")
    taken += ids(iterator)
    assert sorted(i for batch in taken for i in batch) == list(range(20))


# -- two iterators at once with batches_per_epoch (before the restructuring too) ---------


def test_a_second_iterator_with_batches_per_epoch_yields_a_whole_epoch() -> None:
    data = loader(n=20, batch_size=2, batches_per_epoch=3)
    first = iter(data)
    next(first)
    # "every iter() yields exactly batches_per_epoch batches": the second iterator
    # starts from the first one's count (shared epoch_batches) and yields 2
    assert len(ids(data)) == 3
