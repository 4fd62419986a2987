"""A saved state is checked before it is used: its format version, its shape, and the
settings and topology it was saved under. What it cannot resume exactly is refused with an
error that names the cause."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from framework.data.multiprocess import MultiProcessDataLoader
from framework.data.reader import DatasetReader
from framework.data.sampler import BatchSampler
from tests.support.loader import CountingReader, ShardingReader
from tests.support.resume import SelfShardingReader


def _loader(reader: DatasetReader | None = None, **options: Any) -> MultiProcessDataLoader:
    settings: dict[str, Any] = {"batch_size": 2, "quiet": True, "seed": 0}
    settings.update(options)
    return MultiProcessDataLoader(reader or CountingReader(40), settings.pop("data_path", "x"), **settings)


def _ids(batches: Iterator[dict[str, Any]]) -> list[list[int]]:
    return [batch["id"].tolist() for batch in batches]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"batch_size": 4}, "batch_size"),
        ({"batch_size": None, "batch_sampler": "bucket"}, "batch_s"),
        ({"data_path": "y"}, "data_path"),
        ({"reader": "other"}, "reader"),
        ({"reader": "capped"}, "max_instances"),
        ({"max_instances_in_memory": 16}, "max_instances_in_memory"),
        ({"shuffle": True}, "shuffle"),
    ],
)
def test_a_state_from_another_topology_is_refused(change: dict[str, Any], field: str) -> None:
    from framework_plugins.samplers import BucketBatchSampler

    saved = _loader(max_instances_in_memory=8)
    iterator = iter(saved)
    next(iterator)
    state = saved.state_dict()
    options: dict[str, Any] = {"max_instances_in_memory": 8, **change}
    reader: DatasetReader = CountingReader(40)
    kind = options.pop("reader", None)
    if kind == "other":
        reader = ShardingReader(40)
    elif kind == "capped":
        reader = CountingReader(40, max_instances=30)
    if options.get("batch_sampler") == "bucket":
        options["batch_sampler"] = BucketBatchSampler(batch_size=2, sorting_keys=["tokens"])
    other = _loader(reader, **options)
    with pytest.raises(ValueError, match=field):
        other.load_state_dict(state)


@pytest.mark.parametrize(
    ("change", "message"),
    [({"version": 99}, r"format version 99.*reads version 4"), ({"version": None}, "format version None")],
)
def test_a_state_of_another_format_version_is_refused(change: dict[str, Any], message: str) -> None:
    state = {**_loader().state_dict(), **change}
    with pytest.raises(ValueError, match=message):
        _loader().load_state_dict(state)


def test_an_eager_state_of_version_2_resumes_and_a_lazy_one_is_refused() -> None:
    """Version 3 changed where lazy chunks end (they grow from one batch); an eager
    state names the same positions in both versions."""
    eager = _loader()
    iterator = iter(eager)
    seen = [next(iterator)["id"].tolist() for _ in range(3)]
    state = {**eager.state_dict(), "version": 2}
    resumed = _loader()
    resumed.load_state_dict(state)
    rest = [batch["id"].tolist() for batch in resumed]
    assert sorted(i for batch in seen + rest for i in batch) == list(range(40))
    lazy = _loader(max_instances_in_memory=8)
    next(iter(lazy))
    with pytest.raises(ValueError, match=r"earlier version of framework.*grow from one batch"):
        _loader(max_instances_in_memory=8).load_state_dict({**lazy.state_dict(), "version": 2})


@pytest.mark.parametrize("workers", [0, 2])
def test_a_lazy_state_of_version_3_resumes_exactly(workers: int) -> None:
    """Version 4 added whole streamed shards dealt to slots (a position's "deal");
    a lazy state of version 3 dealt records one by one, which a position without
    "deal" resumes as."""
    options: dict[str, Any] = {"max_instances_in_memory": 8, "shuffle": True, "num_workers": workers}
    whole = _ids(iter(_loader(**options)))
    cut = _loader(**options)
    iterator = iter(cut)
    seen = [next(iterator)["id"].tolist() for _ in range(5)]
    state = cut.state_dict()
    iterator.close()
    old = {**state, "version": 3, "ranks": [dict(rank) for rank in state["ranks"]]}
    for rank in old["ranks"]:
        assert rank.pop("deal") == 0 and "high" in rank
        del rank["high"]
    resumed = _loader(**options)
    resumed.load_state_dict(old)
    assert seen + _ids(iter(resumed)) == whole


def test_a_state_of_the_first_format_is_refused_clearly() -> None:
    # The issue-9 format: a "position" and the topology, no "version".
    old = {"position": {"epoch": 0, "seed": 1, "consumed": 3}, "lazy": False, "num_workers": 0}
    with pytest.raises(ValueError, match="format before resuming across topologies"):
        _loader().load_state_dict(old)


@pytest.mark.parametrize("state", [{}, {"position": {"epoch": 0}}, {"position": None}, [1, 2]])
def test_a_malformed_state_is_a_clear_error(state: Any) -> None:
    # A malformed state is a ValueError naming what is expected, not a bare
    # KeyError/TypeError from deep inside.
    with pytest.raises(ValueError, match=r"expects what MultiProcessDataLoader\.state_dict"):
        _loader().load_state_dict(state)


class _TwoLengths(DatasetReader):
    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        for i in range(8):
            yield {"id": i, "a": torch.zeros(i + 1), "b": torch.zeros(8 - i)}


def test_a_state_from_another_list_valued_sampler_setting_is_refused() -> None:
    # describe() kept only scalar settings: sorting_keys=["a"] resumed under ["b"] and
    # repeated and skipped instances silently.
    from framework_plugins.samplers import BucketBatchSampler

    def build(keys: Any) -> MultiProcessDataLoader:
        sampler = BucketBatchSampler(2, sorting_keys=keys, padding_noise=0.0, shuffle=False)
        return MultiProcessDataLoader(_TwoLengths(), "x", batch_sampler=sampler, quiet=True, seed=0)

    saved = build(["a"])
    it = iter(saved)
    next(it)
    state = saved.state_dict()
    with pytest.raises(ValueError, match="sorting_keys"):
        build(["b"]).load_state_dict(state)
    # A None is filled in on first use (guessed keys): a fresh loader guesses the same.
    guessed = build(None)
    it = iter(guessed)
    next(it)
    state = guessed.state_dict()
    rest = [batch["id"].tolist() for batch in it]
    resumed = build(None)
    resumed.load_state_dict(state)
    assert [batch["id"].tolist() for batch in resumed] == rest


@pytest.mark.parametrize("lazy", [None, 8])
def test_a_reader_that_shards_by_itself_refuses_another_num_workers(lazy: Any) -> None:
    # Such a reader picks each worker's instances (one file per worker): eager mode took a
    # state saved with 0 workers under 2 and repeated and skipped instances silently.
    # (A reader that shards with shard_iterable() resumes in another split: issue 11.)
    saved = _loader(SelfShardingReader(20), num_workers=0, max_instances_in_memory=lazy)
    it = iter(saved)
    next(it)
    state = saved.state_dict()
    with pytest.raises(ValueError, match="shards by itself"):
        _loader(SelfShardingReader(20), num_workers=2, max_instances_in_memory=lazy).load_state_dict(state)
    same = _loader(SelfShardingReader(20), num_workers=0, max_instances_in_memory=lazy)
    same.load_state_dict(state)
    assert _ids(iter(same)) == _ids(it)


def _bucket_state(saved_type: str) -> tuple[dict[str, Any], list[list[int]]]:
    """A state one batch into a bucket-sampled epoch, its sampler recorded as `saved_type`,
    and the batches it owes."""
    original = _bucket_loader()
    iterator = iter(original)
    next(iterator)
    state = original.state_dict()
    state["settings"]["batch_sampler"]["type"] = saved_type
    return state, _ids(iterator)


def _bucket_loader() -> MultiProcessDataLoader:
    sampler = BatchSampler.by_name("bucket")(batch_size=2, sorting_keys=["tokens"])
    return MultiProcessDataLoader(CountingReader(10), "unused", batch_sampler=sampler, quiet=True, seed=1)


def test_a_state_saved_before_the_samplers_moved_still_loads() -> None:
    # Before the move a bucket sampler's state recorded its class as
    # "framework_plugins.samplers.BucketBatchSampler", which now re-exports
    # framework.data.sampler's: the same class, so the state resumes.
    state, rest = _bucket_state("framework_plugins.samplers.BucketBatchSampler")
    resumed = _bucket_loader()
    resumed.load_state_dict(state)
    assert _ids(resumed) == rest


@pytest.mark.parametrize(
    "saved_type",
    [
        "tests.support.loader.BucketBatchSampler",  # imported, no such class there
        "no_such_package.samplers.BucketBatchSampler",  # not importable
        "framework.data.sampler.MaxTokensBatchSampler",  # another class
    ],
)
def test_a_state_whose_sampler_path_names_another_class_is_refused(saved_type: str) -> None:
    state, _ = _bucket_state(saved_type)
    with pytest.raises(ValueError, match="batch_sampler"):
        _bucket_loader().load_state_dict(state)


def test_a_moved_class_path_is_imported_only_through_the_config_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A module not imported yet that re-exports the class: resolving the recorded path
    # runs its code, so only where a config's dotted paths may be imported.
    (tmp_path / "old_home_of_samplers.py").write_text(
        "from pathlib import Path\n"
        "Path(__file__).with_name('imported').touch()\n"
        "from framework.data.sampler import BucketBatchSampler\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "old_home_of_samplers", raising=False)
    state, rest = _bucket_state("old_home_of_samplers.BucketBatchSampler")
    monkeypatch.setenv("FRAMEWORK_REGISTERED_TYPES_ONLY", "1")
    with pytest.raises(ValueError, match="batch_sampler"):
        _bucket_loader().load_state_dict(state)
    assert not (tmp_path / "imported").exists()
    monkeypatch.delenv("FRAMEWORK_REGISTERED_TYPES_ONLY")
    resumed = _bucket_loader()
    resumed.load_state_dict(state)
    assert (tmp_path / "imported").exists()
    assert _ids(resumed) == rest
    monkeypatch.delitem(sys.modules, "old_home_of_samplers")
