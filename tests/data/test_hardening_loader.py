"""Loader semantics under hostile use (issue 9, part B): each test failed before its fix."""

from __future__ import annotations

import itertools
import json
import random
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hardening_helpers
import numpy.random
import pytest
import torch
import torch.multiprocessing as mp
from hardening_helpers import CASES, ForgetfulListReader, ListReader, empty_or_failing_rank
from loader_helpers import CountingReader, RandomReader, ShardingReader
from resume_helpers import SelfShardingReader

from framework.data.multiprocess import MultiProcessDataLoader
from framework.data.reader import DatasetReader, WorkerInfo

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
        # A reader's error is a WorkerError in every mode (0 or N workers): the same on every rank.
        assert outcomes[0]["error"] == ("ValueError" if empty else "WorkerError"), (name, outcomes)
        assert all(("no instances" if empty else "cannot open") in o["message"] for o in outcomes)
        victim = 2 if empty else 1
        for rank, outcome in enumerate(outcomes):
            if rank != victim:
                assert f"rank {victim}" in outcome["message"], (name, outcome)


# -- resume: refuse what would be silently wrong --------------------------------------


def _loader(reader: DatasetReader | None = None, **options: Any) -> MultiProcessDataLoader:
    settings: dict[str, Any] = {"batch_size": 2, "quiet": True, "seed": 0}
    settings.update(options)
    return MultiProcessDataLoader(reader or CountingReader(40), settings.pop("data_path", "x"), **settings)


def _ids(batches: Iterator[dict[str, Any]]) -> list[list[int]]:
    return [batch["id"].tolist() for batch in batches]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_lazy_state_saved_with_other_num_workers_resumes_the_rest(workers: int) -> None:
    # Issue 9: per_worker was empty for num_workers=0, so the check passed and the
    # workers replayed the pass from the start (12 duplicates out of 40); it was then
    # refused. Issue 11: another num_workers resumes, every instance left exactly once.
    saved = _loader(max_instances_in_memory=8)
    iterator = iter(saved)
    head = [i for batch in _ids(itertools.islice(iterator, 6)) for i in batch]
    state = json.loads(json.dumps(saved.state_dict()))
    other = _loader(max_instances_in_memory=8, num_workers=workers)
    other.load_state_dict(state)
    tail = [i for batch in _ids(iter(other)) for i in batch]
    assert sorted(head + tail) == list(range(40))
    same = _loader(max_instances_in_memory=8)
    same.load_state_dict(state)
    assert _ids(iter(same)) == _ids(iterator)  # a like-built loader still resumes exactly


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
    [({"version": 99}, r"format version 99.*reads version 2"), ({"version": None}, "format version None")],
)
def test_a_state_of_another_format_version_is_refused(change: dict[str, Any], message: str) -> None:
    state = {**_loader().state_dict(), **change}
    with pytest.raises(ValueError, match=message):
        _loader().load_state_dict(state)


def test_a_state_of_the_first_format_is_refused_clearly() -> None:
    # The issue-9 format: a "position" and the topology, no "version".
    old = {"position": {"epoch": 0, "seed": 1, "consumed": 3}, "lazy": False, "num_workers": 0}
    with pytest.raises(ValueError, match="format before resuming across topologies"):
        _loader().load_state_dict(old)


@pytest.mark.parametrize("state", [{}, {"position": {"epoch": 0}}, {"position": None}, [1, 2]])
def test_a_malformed_state_is_a_clear_error(state: Any) -> None:
    # Before: a bare KeyError/TypeError from deep inside.
    with pytest.raises(ValueError, match=r"expects what MultiProcessDataLoader\.state_dict"):
        _loader().load_state_dict(state)


# -- batches_per_epoch carry-over and checkpoints -------------------------------------


@pytest.mark.parametrize("stop", ["islice", "zip"])
@pytest.mark.parametrize("options", [{}, {"max_instances_in_memory": 4, "num_workers": 2}])
def test_carry_over_survives_a_consumer_that_stops_at_len(stop: str, options: dict[str, Any]) -> None:
    # Before: the epoch's generator was still suspended at its last batch, so when it
    # was collected it closed the carried-over pass: instances 6..9 never came.
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


@pytest.mark.parametrize(
    "options",
    [{}, {"max_instances_in_memory": 8}, {"max_instances_in_memory": 8, "num_workers": 2},
     {"batches_per_epoch": 5}, {"batches_per_epoch": 5, "max_instances_in_memory": 8}],
)
def test_state_after_an_early_break_describes_what_comes_next(options: dict[str, Any]) -> None:
    # Before: state_dict() still described the abandoned pass (3 batches in), so a
    # resumed run replayed its rest while the live loader had moved on.
    loader = _loader(shuffle=True, **options)
    for index, _ in enumerate(loader):
        if index == 2:
            break
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = _loader(shuffle=True, **options)
    resumed.load_state_dict(state)
    assert _ids(iter(resumed)) == _ids(iter(loader))
    loader.close()


# -- the caller's global random streams -------------------------------------------------


def _global_state() -> tuple[Any, ...]:
    return random.getstate(), torch.get_rng_state().tolist(), str(numpy.random.get_state())


@pytest.mark.parametrize("options", [{}, {"max_instances_in_memory": 8}])
def test_building_and_iterating_leaves_the_callers_rng_untouched(options: dict[str, Any]) -> None:
    # Before: the loader reseeded the global random/numpy/torch streams in this process.
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
    # Before: the reader shared the caller's stream, so the caller's draws between
    # batches changed the data, and a resumed run differed from an uninterrupted one.
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


# -- validation -------------------------------------------------------------------------


def test_a_sampler_batch_larger_than_max_instances_in_memory_is_refused() -> None:
    # Before: accepted; the sampler saw 4 instances at a time and made batches of 4
    # (or none with drop_last) instead of 8.
    from framework_plugins.samplers import BucketBatchSampler

    sampler = BucketBatchSampler(batch_size=8, sorting_keys=["tokens"], drop_last=True)
    with pytest.raises(ValueError, match=r"max_instances_in_memory \(4\).*batch size \(8\)"):
        _loader(batch_size=None, batch_sampler=sampler, max_instances_in_memory=4)


# -- the sharding warning -------------------------------------------------------------


def test_a_reader_whose_read_returns_a_list_and_shards_does_not_warn() -> None:
    # Before: read() reset the "did it shard?" flags after _read had already run (a
    # list is built at once), so a reader that did shard was warned about duplicates.
    reader = ListReader(12)
    reader._set_worker_info(WorkerInfo(2, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [x["id"] for x in reader.read("x")] == [0, 2, 4, 6, 8, 10]


def test_the_unsharded_warning_names_the_reader_once_per_process() -> None:
    reader = ForgetfulListReader(8)
    reader._set_worker_info(WorkerInfo(2, 0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):  # three epochs
            assert len(list(reader.read("x"))) == 8
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert len(messages) == 1, messages
    assert "ForgetfulListReader sets manual_multiprocess_sharding=True" in messages[0]
    assert caught[0].filename == hardening_helpers.__file__  # points at the reader's _read
    other_worker = ForgetfulListReader(8)
    other_worker._set_worker_info(WorkerInfo(2, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(other_worker.read("x"))  # worker 0 speaks for every worker


def test_every_test_named_in_the_failure_model_exists() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "concepts" / "loader.md"
    section = docs.read_text().split("## Failure model", 1)[1]
    named = re.findall(r"`(test_\w+\.py)::(test_\w+)", section)
    assert named
    tests = Path(__file__).resolve().parents[1]
    files = {path.name: path for path in tests.rglob("test_*.py")}
    missing = [f"{f}::{t}" for f, t in named if f not in files or f"def {t}(" not in files[f].read_text()]
    assert missing == []


def test_the_data_package_uses_dataclasses_not_attrs() -> None:
    # One way to write value classes in framework.data: the standard library's.
    package = Path(__file__).resolve().parents[2] / "framework" / "data"
    pattern = re.compile(r"^\s*(import attr|from attr)", re.M)
    users = [p.name for p in package.rglob("*.py") if pattern.search(p.read_text())]
    assert users == []


# -- second review ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [{}, {"num_workers": 2, "max_instances_in_memory": 8}, {"num_workers": 0, "max_instances_in_memory": 8},
     {"num_workers": 2, "max_instances_in_memory": 8, "persistent_workers": True}],
)
def test_a_script_that_ends_with_an_unfinished_iterator_exits_silently(options: dict[str, Any]) -> None:
    # The pass's generator holds the loader weakly; its cleanup at exit raised
    # ReferenceError ("Exception ignored in ...") once the loader was gone.
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import torch
        from framework.data.multiprocess import MultiProcessDataLoader
        from framework.data.reader import DatasetReader

        class Reader(DatasetReader):  # defined in __main__, torn down with it
            def _read(self, path):
                for i in range(40):
                    yield {{"x": torch.tensor([i])}}

        loader = MultiProcessDataLoader(Reader(), "x", batch_size=2, quiet=True, **{options!r})
        it = iter(loader)
        first = next(it)  # peek at a batch, then the script ends
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "ReferenceError" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr


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
