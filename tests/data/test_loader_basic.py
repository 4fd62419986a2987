"""MultiProcessDataLoader parity with AllenNLP: validation, eager/lazy, len, carry-over."""

from __future__ import annotations

import bisect
import copy
import itertools
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from framework.data.collate import DataCollator
from framework.data.loader import DataLoader
from framework.data.multiprocess import MultiProcessDataLoader
from framework.data.reader import DatasetReader, UnshardedReadWarning
from framework.data.sampler import BatchSampler
from framework.errors import WorkerError
from tests.support.loader import (
    CountingReader,
    HookReader,
    LeakyReader,
    PidCollator,
    ShardingReader,
    flat,
)

pytestmark = pytest.mark.timeout(60)


def ids(batches: Any) -> list[list[int]]:
    return [batch["id"].tolist() for batch in batches]


def loader(n: int = 20, **kwargs: Any) -> MultiProcessDataLoader:
    kwargs.setdefault("quiet", True)
    return MultiProcessDataLoader(CountingReader(n), "unused", **kwargs)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"batch_size": 2, "num_workers": -1}, "num_workers"),
        ({"batch_size": 0}, "batch_size must be at least 1"),
        ({}, "batch_size is required"),
        ({"batch_size": 2, "batch_sampler": "bucket"}, "mutually exclusive with batch_size"),
        ({"drop_last": True, "batch_sampler": "bucket"}, "mutually exclusive with drop_last"),
        ({"shuffle": True, "batch_sampler": "bucket"}, "mutually exclusive with shuffle"),
        ({"batch_size": 2, "batches_per_epoch": 0}, "batches_per_epoch"),
        ({"batch_size": 4, "max_instances_in_memory": 2}, "at least batch_size"),
        ({"batch_size": 2, "start_method": "teleport"}, "start_method"),
        ({"batch_size": 2, "persistent_workers": True}, "num_workers > 0"),
        ({"batch_size": 2, "transfer": "carrier pigeon"}, "transfer"),
    ],
)
def test_bad_parameters_say_what_to_change(kwargs: dict[str, Any], message: str) -> None:
    if kwargs.get("batch_sampler") == "bucket":
        kwargs["batch_sampler"] = BatchSampler.by_name("bucket")(batch_size=2)
    with pytest.raises(ValueError, match=message):
        loader(**kwargs)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("lazy", [None, 6])
def test_every_instance_once_in_reader_order(num_workers: int, lazy: Any) -> None:
    data = loader(21, batch_size=4, num_workers=num_workers, max_instances_in_memory=lazy)
    batches = ids(data)
    assert sorted(flat(batches)) == list(range(21))
    if lazy is None or num_workers == 0:
        assert batches[0] == [0, 1, 2, 3]  # eager keeps the reader's order
    assert all(len(b) == 4 for b in batches[:-2])


def test_batches_hold_collated_fields() -> None:
    batch = next(iter(loader(10, batch_size=3)))
    assert torch.equal(batch["tokens"], torch.tensor([[0, 0, 0], [0, 1, 0], [0, 1, 2]]))
    assert batch["text"] == ["item 0", "item 1", "item 2"]


class CountedReader(CountingReader):
    """Appends a line to `log` each time a process starts reading."""

    def __init__(self, log: str, n: int = 10) -> None:
        super().__init__(n)
        self.log = log

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        with open(self.log, "a") as handle:
            handle.write(f"{os.getpid()}\n")
        yield from super()._read(file_path)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_eager_reads_once_and_caches(tmp_path: Any, num_workers: int) -> None:
    log = tmp_path / "reads"
    data = MultiProcessDataLoader(
        CountedReader(str(log)), "x", batch_size=3, num_workers=num_workers, quiet=True
    )
    first, second = ids(data), ids(data)
    assert sorted(flat(first)) == sorted(flat(second)) == list(range(10))
    assert len(log.read_text().split()) == max(1, num_workers)  # no re-read in epoch 2
    assert len(list(data.iter_instances())) == 10


def test_lazy_reads_every_epoch(tmp_path: Any) -> None:
    log = tmp_path / "reads"
    data = MultiProcessDataLoader(
        CountedReader(str(log)),
        "x",
        batch_size=3,
        num_workers=2,
        max_instances_in_memory=3,
        quiet=True,
    )
    for _ in range(2):
        assert sorted(flat(ids(data))) == list(range(10))
    assert len(log.read_text().split()) == 4


def test_len_eager_and_drop_last() -> None:
    assert len(loader(10, batch_size=3)) == 4 == len(list(loader(10, batch_size=3)))
    dropped = loader(10, batch_size=3, drop_last=True)
    assert len(dropped) == 3 == len(list(dropped))
    sampler = BatchSampler.by_name("bucket")(batch_size=4, sorting_keys=["tokens"])
    assert len(loader(10, batch_sampler=sampler)) == 3


def test_len_lazy_needs_batches_per_epoch() -> None:
    with pytest.raises(TypeError, match="batches_per_epoch"):
        len(loader(10, batch_size=2, max_instances_in_memory=4))
    assert len(loader(10, batch_size=2, max_instances_in_memory=4, batches_per_epoch=3)) == 3


@pytest.mark.parametrize("num_workers,lazy", [(0, None), (0, 4), (2, 4)])
def test_batches_per_epoch_carries_over(num_workers: int, lazy: Any) -> None:
    data = loader(
        10, batch_size=2, batches_per_epoch=3, num_workers=num_workers, max_instances_in_memory=lazy, seed=0
    )
    reference = ids(loader(10, batch_size=2, num_workers=num_workers, max_instances_in_memory=lazy, seed=0))
    epochs = [ids(data) for _ in range(3)]
    assert all(len(epoch) == 3 for epoch in epochs)
    flat = [b for epoch in epochs for b in epoch]
    n = len(reference)
    assert 3 < n < 9
    assert flat[:n] == reference  # one full pass, spread across epochs
    assert flat[n:] == reference[: 9 - n]  # then a fresh pass (unshuffled: same batches)


def test_batches_per_epoch_on_data_without_batches_is_an_error() -> None:
    data = loader(3, batch_size=4, drop_last=True, batches_per_epoch=2, max_instances_in_memory=4)
    with pytest.raises(ValueError, match="yields no batches"):
        list(data)


def test_shuffle_changes_order_keeps_instances() -> None:
    plain = flat(ids(loader(30, batch_size=5)))
    shuffled = flat(ids(loader(30, batch_size=5, shuffle=True, seed=1)))
    assert plain != shuffled and sorted(shuffled) == plain


def test_lazy_sampler_is_applied_per_chunk() -> None:
    sampler = BatchSampler.by_name("bucket")(batch_size=2, sorting_keys=["tokens"])
    data = loader(20, batch_sampler=sampler, max_instances_in_memory=6)
    batches = ids(data)
    assert sorted(flat(batches)) == list(range(20))
    starts = [0, 2, 6, 12, 18]  # chunks of one batch, then twice as many, up to 6
    for batch in batches:
        assert len({bisect.bisect_right(starts, i) for i in batch}) == 1  # never mixes two chunks


class _Tally(CountingReader):
    """Counts the instances it has read (in this process)."""

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        self.read = 0
        for instance in super()._read(file_path):
            self.read += 1
            yield instance


@pytest.mark.parametrize("sampled", [False, True], ids=["shuffle", "sampler"])
def test_a_lazy_pass_batches_after_reading_one_batch_not_a_whole_chunk(sampled: bool) -> None:
    """A shuffle and a sampler each need a whole chunk: the first chunk of a pass holds
    one batch, so the first batch comes after 8 instances are read, not 1,000; the
    chunks then double, and every instance still comes once."""
    reader = _Tally(3000)
    options: dict[str, Any] = {"batch_size": 8, "shuffle": True}
    if sampled:
        options = {"batch_sampler": BatchSampler.by_name("bucket")(batch_size=8, sorting_keys=["tokens"])}
    data = MultiProcessDataLoader(reader, "x", max_instances_in_memory=1000, quiet=True, **options)
    batches = iter(data)
    first = next(batches)
    assert reader.read <= 8 + 1, reader.read  # the chunk's 8, and the next one's first
    assert len(first["id"]) == 8
    seen = first["id"].tolist() + flat(batch["id"].tolist() for batch in batches)
    assert sorted(seen) == list(range(3000))


def test_iter_instances_is_a_generator_with_hooks_applied() -> None:
    data = MultiProcessDataLoader(HookReader(6), "x", batch_size=2, num_workers=2, quiet=True)
    instances = data.iter_instances()
    assert isinstance(instances, Iterator)
    got = list(instances)
    assert [x["id"] for x in got] == list(range(6))
    assert all(x["hook_pid"] == os.getpid() for x in got)


def test_hook_reader_batches_in_the_main_process() -> None:
    data = MultiProcessDataLoader(
        HookReader(12), "x", batch_size=4, num_workers=2, max_instances_in_memory=4, quiet=True
    )
    batches = list(data)
    assert sorted(flat(b["id"].tolist() for b in batches)) == list(range(12))
    assert all(b["indexed"][:, 0].tolist() == [100] * len(b["id"]) for b in batches)
    assert all(b["hook_pid"].tolist() == [os.getpid()] * len(b["id"]) for b in batches)


def test_plain_reader_batches_in_the_workers() -> None:
    data = MultiProcessDataLoader(
        CountingReader(12),
        "x",
        batch_size=4,
        num_workers=2,
        max_instances_in_memory=4,
        quiet=True,
        collate_fn=PidCollator(),
    )
    pids = {batch["pid"] for batch in data}
    assert len(pids) == 2 and os.getpid() not in pids


def test_unpicklable_object_from_a_worker_points_to_apply_token_indexers() -> None:
    data = MultiProcessDataLoader(
        LeakyReader(8), "x", batch_size=4, num_workers=2, max_instances_in_memory=4, quiet=True
    )
    with pytest.raises(WorkerError, match=r"field 'vocab'.*apply_token_indexers") as info:
        list(data)
    assert "Traceback from the worker" in str(info.value)


def test_quiet_controls_progress_bars(capfd: Any) -> None:
    list(loader(8, batch_size=4, num_workers=2, quiet=False))
    assert "loading instances" in capfd.readouterr().err
    list(loader(8, batch_size=4, num_workers=2, quiet=True))
    list(loader(8, batch_size=4, num_workers=2, quiet=True, max_instances_in_memory=4))
    assert capfd.readouterr().err == ""
    list(loader(8, batch_size=4, num_workers=2, quiet=False, max_instances_in_memory=4))
    assert "worker 1" in capfd.readouterr().err


def test_set_target_device_moves_batches() -> None:
    data = loader(4, batch_size=2)
    data.set_target_device("cpu")
    assert all(b["tokens"].device == torch.device("cpu") for b in data)


def test_from_config_builds_the_whole_loader() -> None:
    # The fresh_registry fixture (tests/conftest.py) drops these registrations afterwards.
    DatasetReader.register("counting-test")(CountingReader)

    @DataCollator.register("pid-test")
    class Registered(DataCollator):
        def __call__(self, instances: list[Any]) -> Any:
            return PidCollator()(instances)

    data = DataLoader.from_config(
        {
            "reader": {"type": "counting-test", "n": 6},
            "data_path": "x",
            "batch_size": 2,
            "quiet": True,
            "batch_sampler": None,
            "collate_fn": {"type": "pid-test"},
        }
    )
    assert isinstance(data, MultiProcessDataLoader)
    assert isinstance(data.collate_fn, Registered)
    assert [b["id"].tolist() for b in data] == [[0, 1], [2, 3], [4, 5]]
    bucketed = DataLoader.from_config(
        {
            "type": "multiprocess",
            "reader": {"type": "counting-test", "n": 6},
            "data_path": "x",
            "batch_sampler": {"type": "bucket", "batch_size": 3, "sorting_keys": ["tokens"]},
            "quiet": True,
        }
    )
    assert len(bucketed) == 2


def test_pin_memory_without_cuda_warns_and_still_loads() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: pinning happens")
    with pytest.warns(UserWarning, match="pin_memory"):
        data = loader(4, batch_size=2, pin_memory=True)
    assert len(list(data)) == 2


def test_progress_bars_work_with_spawned_workers(capfd: Any) -> None:
    data = loader(
        8, batch_size=4, num_workers=2, quiet=False, start_method="spawn", max_instances_in_memory=4
    )
    assert len(list(data)) == 2
    assert "worker" in capfd.readouterr().err


@pytest.mark.parametrize(
    "options",
    [
        {"max_instances_in_memory": 10, "num_workers": 2},
        {"num_workers": 2},
        # Lazy only: an eager loader reads in the main process, whatever the start method.
        {"max_instances_in_memory": 10, "num_workers": 2, "start_method": "spawn"},
        {"max_instances_in_memory": 10, "num_workers": 0},
        {"num_workers": 0},
    ],
    ids=str,
)
def test_manual_sharding_reader_every_mode(options: dict[str, Any]) -> None:
    data = MultiProcessDataLoader(ShardingReader(30), "x", batch_size=1, quiet=True, **options)
    if options.get("max_instances_in_memory") is None:
        assert data._instances is not None  # eager mode reads at construction
    spawn = options.get("start_method") == "spawn"
    # Spawned workers start an interpreter each pass: one epoch proves they shard alike,
    # the forked modes prove every epoch does, and iter_instances takes the same workers.
    if not spawn:
        instances = data.iter_instances()
        assert not isinstance(instances, (list, tuple))
        assert sorted(x["id"] for x in instances) == list(range(30))
    for _ in range(1 if spawn else 2):
        ids = flat(batch["id"].tolist() for batch in data)
        assert sorted(ids) == list(range(30))  # each once, every epoch


def _loader(reader: DatasetReader | None = None, **options: Any) -> MultiProcessDataLoader:
    settings: dict[str, Any] = {"batch_size": 2, "quiet": True, "seed": 0}
    settings.update(options)
    return MultiProcessDataLoader(reader or CountingReader(40), settings.pop("data_path", "x"), **settings)


# -- batches_per_epoch carry-over and checkpoints ----------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stop", ["islice", "zip"])
@pytest.mark.parametrize("options", [{}, {"max_instances_in_memory": 4, "num_workers": 2}])
def test_carry_over_survives_a_consumer_that_stops_at_len(stop: str, options: dict[str, Any]) -> None:
    # The epoch's generator, suspended at its last batch, must not close the carried-over
    # pass when it is collected: instances 6..9 come next epoch.
    loader = _loader(CountingReader(10), batch_size=3, batches_per_epoch=2, **options)
    seen: list[int] = []
    for _ in range(3):
        if stop == "islice":
            batches = list(itertools.islice(loader, len(loader)))
        else:
            batches = [batch for _, batch in zip(range(len(loader)), loader)]
        seen += [i for batch in batches for i in batch["id"].tolist()]
    assert sorted(seen[:10]) == list(range(10)), seen  # the first pass, every instance once
    loader.close()


def test_a_second_iterator_with_batches_per_epoch_yields_a_whole_epoch() -> None:
    # Each iterator counts its own batches: a second one yields a whole epoch, not the rest
    # of the first one's count.
    data = loader(batch_size=2, batches_per_epoch=3, seed=1)
    first = iter(data)
    next(first)
    assert len(ids(data)) == 3
    assert len(ids(first)) == 2  # the first one still ends its own epoch


# -- settings assigned after construction -------------------------------------------------


def _new_collator(instances: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": torch.tensor([instance["id"] * 100 for instance in instances])}


@pytest.mark.parametrize("setting", ["collate_fn", "reader", "num_workers", "data_path"])
def test_a_setting_assigned_after_construction_takes_effect(setting: str) -> None:
    # The passes and the state read the live settings, not a copy taken in __init__.
    data = loader(6, batch_size=2, max_instances_in_memory=4, seed=1)
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


def test_a_batch_setting_assigned_after_construction_batches_the_cache_anew() -> None:
    data = loader(6, batch_size=2, seed=1)
    assert ids(data) == [[0, 1], [2, 3], [4, 5]]
    data.batch_size = 3
    assert len(data) == 2
    assert ids(data) == [[0, 1, 2], [3, 4, 5]]
    assert data.state_dict()["settings"]["batch_size"] == 3


def test_a_copy_of_the_loader_has_its_own_settings() -> None:
    # A copy owns its settings: changing the copy leaves the original as it was.
    data = loader(6, batch_size=2, seed=1)
    other = copy.copy(data)
    other.set_target_device("cpu")
    other.batches_per_epoch = 1
    assert data.cuda_device is None and data.batches_per_epoch is None
    assert ids(data) == [[0, 1], [2, 3], [4, 5]]
    assert ids(other) == [[0, 1]]


@pytest.mark.parametrize(
    "options", [{}, {"max_instances_in_memory": 4}, {"max_instances_in_memory": 4, "num_workers": 2}]
)
def test_a_copy_after_a_carried_over_epoch_yields_the_same_next_epoch(options: dict[str, Any]) -> None:
    data = loader(batch_size=2, batches_per_epoch=3, seed=1, **options)
    ids(data)  # the rest of the pass carries over
    other = copy.copy(data)
    assert ids(other) == ids(data)
    assert other.state_dict()["loop_epoch"] == data.state_dict()["loop_epoch"] == 2


# -- validation --------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_sampler_batch_larger_than_max_instances_in_memory_is_refused() -> None:
    # A sampler batch larger than max_instances_in_memory is refused: the sampler would see
    # 4 instances at a time and make batches of 4 (or none with drop_last) instead of 8.
    from framework_plugins.samplers import BucketBatchSampler

    sampler = BucketBatchSampler(batch_size=8, sorting_keys=["tokens"], drop_last=True)
    with pytest.raises(ValueError, match=r"max_instances_in_memory \(4\).*batch size \(8\)"):
        _loader(batch_size=None, batch_sampler=sampler, max_instances_in_memory=4)


def unsharded_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, UnshardedReadWarning)]


@pytest.mark.parametrize("lazy", [None, 10], ids=["eager", "lazy"])
def test_workers_that_all_parse_every_record_warn_once_per_reader_class(lazy: Any) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # as a script runs: once per location
        for _ in range(2):  # two loaders of one reader class, two epochs each
            data = loader(batch_size=2, num_workers=2, max_instances_in_memory=lazy)
            for _ in range(2):
                assert sorted(flat(ids(data))) == list(range(20))
    [message] = unsharded_warnings(caught)  # once, not once per epoch or per loader
    assert "CountingReader does not shard by worker" in message
    assert "shard_iterable" in message and "manual_multiprocess_sharding=True" in message
    assert ("lazy mode" in message) == (lazy is None)
    assert caught[0].filename == CountingReader._read.__code__.co_filename  # the fix goes there


def test_the_unsharded_advice_to_a_reader_that_shards_by_rank_never_shards_by_rank_twice() -> None:
    reader = CountingReader(20, manual_distributed_sharding=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = MultiProcessDataLoader(
            reader, "x", batch_size=2, num_workers=2, max_instances_in_memory=4, quiet=True
        )
        assert sorted(flat(ids(data))) == list(range(20))
    [message] = unsharded_warnings(caught)
    assert "CountingReader shards by rank (manual_distributed_sharding=True) but not by worker" in message
    assert "get_worker_info()" in message and "manual_multiprocess_sharding=True" in message
    # shard_iterable() shards by rank and worker: named only as what not to use
    assert "not self.shard_iterable(...), which would shard by rank a second time" in message
    assert "manual_distributed_sharding=True and" not in message


@pytest.mark.parametrize(
    "make",
    [
        lambda: MultiProcessDataLoader(ShardingReader(20), "x", batch_size=2, num_workers=2, quiet=True),
        lambda: loader(batch_size=2, num_workers=0),
        lambda: loader(batch_size=2, num_workers=1),
    ],
    ids=["sharding-reader", "no-workers", "one-worker"],
)
def test_no_unsharded_warning_when_no_record_is_parsed_twice(make: Any) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = make()
        assert sorted(flat(ids(data))) == list(range(20))
    assert unsharded_warnings(caught) == []


@pytest.mark.parametrize("lazy", [None, 4], ids=["eager", "lazy"])
@pytest.mark.parametrize(
    ("name", "value"), [("batch_size", 3), ("shuffle", True), ("data_path", "other"), ("drop_last", True)]
)
def test_a_setting_that_shapes_the_epoch_is_refused_mid_epoch(lazy: Any, name: str, value: Any) -> None:
    # The epoch under way was batched with the old value: a state saved after the change
    # would pair its position with the new value and resume skipping instances.
    data = loader(12, batch_size=2, max_instances_in_memory=lazy)
    iterator = iter(data)
    first = next(iterator)["id"].tolist()
    with pytest.raises(ValueError, match=f"{name} cannot change in the middle of an epoch"):
        setattr(data, name, value)
    rest = [i for batch in iterator for i in batch["id"].tolist()]
    assert first + rest == list(range(12))  # the epoch goes on as it began
    resumed = loader(12, batch_size=2, max_instances_in_memory=lazy)
    cut = iter(data)
    next(cut)
    cut.close()  # the rest of a cut pass waits for the next iter(): still mid-epoch
    with pytest.raises(ValueError, match="middle of an epoch"):
        setattr(data, name, value)
    resumed.load_state_dict(data.state_dict())
    assert len(flat(ids(resumed))) == 10
    list(data)  # the epoch's rest, to its end: now it may change
    setattr(data, name, value)
    assert getattr(data, name) == value


def test_a_setting_that_does_not_shape_the_epoch_may_change_mid_epoch() -> None:
    data = loader(12, batch_size=2)
    iterator = iter(data)
    next(iterator)
    data.quiet = False
    data.quiet = True
    assert len(flat(ids(iterator))) == 10


class _LinesReader(DatasetReader):
    """Reads the numbers in a file; shards by itself."""

    def __init__(self) -> None:
        super().__init__(manual_multiprocess_sharding=True, manual_distributed_sharding=True)

    def _read(self, file_path: Any) -> Iterator[dict[str, float]]:
        yield from self.shard_iterable({"x": float(n)} for n in Path(file_path).read_text().split())


@pytest.mark.parametrize("mode", ["lazy_persistent_workers", "eager"])
def test_a_data_path_assigned_between_epochs_is_read(tmp_path: Path, mode: str) -> None:
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text(" ".join(str(n) for n in range(8)))
    second.write_text(" ".join(str(100 + n) for n in range(8)))
    lazy = mode.startswith("lazy")
    loader = MultiProcessDataLoader(
        _LinesReader(),
        str(first),
        batch_size=4,
        num_workers=2,
        quiet=True,
        max_instances_in_memory=8 if lazy else None,
        persistent_workers=lazy,
    )
    try:
        assert sorted(float(x) for batch in loader for x in batch["x"]) == [float(n) for n in range(8)]
        loader.data_path = str(second)  # between epochs: allowed
        assert loader.state_dict()["settings"]["data_path"] == str(second)
        got = sorted(float(x) for batch in loader for x in batch["x"])
        assert got == [float(100 + n) for n in range(8)]
    finally:
        loader.close()


def _tagging_collate(instances: list[dict[str, Any]]) -> dict[str, Any]:
    import torch

    return {"x": torch.tensor([i["x"] for i in instances]), "tag": torch.ones(len(instances))}


def test_a_collate_fn_assigned_between_epochs_reaches_persistent_workers(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text(" ".join(str(n) for n in range(8)))
    loader = MultiProcessDataLoader(
        _LinesReader(), str(path), batch_size=4, num_workers=2, quiet=True, max_instances_in_memory=8,
        persistent_workers=True,
    )  # fmt: skip
    try:
        assert all("tag" not in batch for batch in loader)
        loader.collate_fn = _tagging_collate
        assert all("tag" in batch for batch in loader)
    finally:
        loader.close()
