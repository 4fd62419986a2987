"""Resume is exactly once (issue 24): the states a new user takes (after `break`, after
an exception, soon after a resume, before the first batch) resume the rest of the
epoch, nothing twice and nothing lost."""

from __future__ import annotations

import itertools
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest
import torch

from framework.data._shards import Consumed
from framework.data.collate import DefaultDataCollator
from framework.data.multiprocess import MultiProcessDataLoader
from framework.data.reader import DatasetReader
from framework.data.sampler import BatchSampler
from framework.errors import WorkerError
from tests.support.loader import CountingReader, HookReader, make_instance
from tests.support.ranks import start_ranks
from tests.support.resume import (
    AHEAD_MODES,
    ahead_loader,
    guessing_bucket_loader,
    two_rank_cases,
)

pytestmark = pytest.mark.timeout(60)

N = 40

# eager (in this process and with workers) and lazy; "hook": the reader's
# apply_token_indexers makes the main process collate what workers send
MODES: dict[str, dict[str, Any]] = {
    "eager_0": {"num_workers": 0},
    "eager_2": {"num_workers": 2},
    "lazy_0": {"num_workers": 0, "max_instances_in_memory": 8},
    "lazy_2": {"num_workers": 2, "max_instances_in_memory": 8},
    "lazy_2_hook": {"num_workers": 2, "max_instances_in_memory": 8, "hook": True},
}


class Interrupting(DefaultDataCollator):
    """Collates as the default, but raises `error` once, at its `at`-th call (from 0)."""

    def __init__(self, at: int, error: BaseException) -> None:
        super().__init__()
        self.at = at
        self.error = error
        self.calls = 0

    def __call__(self, instances: list[Any]) -> Any:
        call, self.calls = self.calls, self.calls + 1
        if call == self.at:
            raise self.error
        return super().__call__(instances)


def build(mode: str, collate_fn: Optional[Any] = None, **extra: Any) -> MultiProcessDataLoader:
    options = dict(MODES[mode])
    reader = HookReader(N) if options.pop("hook", False) else CountingReader(N)
    if collate_fn is not None:
        options["collate_fn"] = collate_fn
    return MultiProcessDataLoader(
        reader, "x", batch_size=3, shuffle=True, quiet=True, seed=11, **options, **extra
    )


def ids(batches: Any) -> list[list[int]]:
    return [batch["id"].tolist() for batch in batches]


def resumed_from(mode: str, state: dict[str, Any], **extra: Any) -> list[list[int]]:
    loader = build(mode, **extra)
    loader.load_state_dict(json.loads(json.dumps(state)))
    return ids(loader)


# lazy_2 collates in its workers: no collator runs here to interrupt
@pytest.mark.parametrize("mode", [mode for mode in MODES if mode != "lazy_2"])
@pytest.mark.parametrize("error", [KeyboardInterrupt(), RuntimeError("boom")])
def test_an_exception_inside_next_leaves_the_state_in_the_pass_it_cut_short(
    mode: str, error: BaseException
) -> None:
    # An exception inside next() leaves the state in the pass it cut short: the rest of that
    # pass (9 of 14 batches) comes on resume, not silently skipped.
    uninterrupted = ids(build(mode))
    loader = build(mode, Interrupting(5, error))
    iterator = iter(loader)
    head = ids(itertools.islice(iterator, 3))
    with pytest.raises(KeyboardInterrupt if isinstance(error, KeyboardInterrupt) else WorkerError):
        for batch in iterator:  # held: the consumer still has the iterator
            head.append(batch["id"].tolist())
    assert 3 <= len(head) <= 5  # lazy_0 collates a chunk ahead
    state = loader.state_dict()
    assert head + resumed_from(mode, state) == uninterrupted
    # The live loader goes on where a restored one would.
    assert head + ids(loader) == uninterrupted


@pytest.mark.parametrize("mode", list(MODES))
def test_state_dict_after_break_describes_the_pass_cut_short(mode: str) -> None:
    # state_dict() after `break` describes the pass cut short, so resuming from it repeats
    # no batch taken before the break.
    uninterrupted = ids(build(mode))
    loader = build(mode)
    head = []
    for batch in loader:
        head.append(batch["id"].tolist())
        if len(head) == 4:
            break
    state = loader.state_dict()
    assert state["ranks"][0]["consumed"] == 4
    assert head + resumed_from(mode, state) == uninterrupted
    assert head + ids(loader) == uninterrupted  # the live loader agrees


@pytest.mark.parametrize("mode", ["eager_0", "lazy_2"])
def test_break_with_batches_per_epoch_resumes_the_rest_of_that_epoch(mode: str) -> None:
    uninterrupted = build(mode, batches_per_epoch=5)
    epochs = [ids(uninterrupted) for _ in range(3)]
    loader = build(mode, batches_per_epoch=5)
    head = []
    for batch in loader:
        head.append(batch["id"].tolist())
        if len(head) == 2:
            break
    state = loader.state_dict()
    restored = build(mode, batches_per_epoch=5)
    restored.load_state_dict(json.loads(json.dumps(state)))
    assert head + ids(restored) == epochs[0]
    assert ids(restored) == epochs[1]
    assert head + ids(loader) == epochs[0]
    assert ids(loader) == epochs[1]


@pytest.mark.parametrize("mode", list(MODES))
def test_a_state_saved_after_loading_and_before_a_batch_keeps_what_was_consumed(mode: str) -> None:
    # Before (eager): the loaded pass had no batches yet, so the state recorded nothing
    # as consumed, and another world size (which resumes from `consumed`) replayed the
    # whole epoch.
    loader = build(mode)
    iterator = iter(loader)
    head = ids(itertools.islice(iterator, 4))
    state = json.loads(json.dumps(loader.state_dict()))
    iterator.close()
    restored = build(mode)
    restored.load_state_dict(state)
    again = json.loads(json.dumps(restored.state_dict()))
    assert again["consumed"] == state["consumed"]
    assert again == state
    consumed = Consumed.from_dict(again["consumed"])
    assert sorted(i for i in range(N) if i in consumed) == sorted(i for batch in head for i in batch)


class SkippingReader(DatasetReader):
    """Shards its records with shard_iterable() and yields no instance for every third
    ("at most one instance per record")."""

    def __init__(self, n: int = N) -> None:
        super().__init__(manual_distributed_sharding=True, manual_multiprocess_sharding=True)
        self.n = n

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        for i in self.shard_iterable(range(self.n)):
            if i % 3:
                yield make_instance(i)


@pytest.mark.parametrize(("before", "after"), [(2, 0), (0, 3), (3, 2)])
def test_eager_resume_with_other_num_workers_and_a_reader_that_skips_records(before: int, after: int) -> None:
    # With a reader that skips records, the eager cache's order depends on num_workers:
    # resuming with another count must not take the exact path (instances twice, others
    # never).
    def loader(workers: int) -> MultiProcessDataLoader:
        return MultiProcessDataLoader(SkippingReader(), "x", batch_size=3, shuffle=True, quiet=True,
                                      seed=3, num_workers=workers)

    original = loader(before)
    iterator = iter(original)
    head = ids(itertools.islice(iterator, 4))
    state = json.loads(json.dumps(original.state_dict()))
    rest = ids(iterator)
    resumed = loader(after)
    resumed.load_state_dict(state)
    tail = ids(resumed)
    expected = [i for i in range(N) if i % 3]
    assert sorted(i for batch in head + tail for i in batch) == expected
    assert tail == rest  # the cache is in record order whatever num_workers


class TwoFieldReader(DatasetReader):
    """Field "a" is the longest in records below 16, field "b" above: a guess of the
    sorting key depends on which records it looks at."""

    def __init__(self, n: int = 64) -> None:
        super().__init__()
        self.n = n

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        for i in range(self.n):
            short, long_ = 1 + (i * 3) % 5, 20 + i % 4
            a, b = (long_, short) if i < 16 else (i % 4 + 1, 20 + (i * 3) % 5)
            yield {"id": i, "a": torch.arange(a), "b": torch.arange(b)}


def bucket_loader(workers: int, lazy: Optional[int], n: int = 64) -> MultiProcessDataLoader:
    sampler = BatchSampler.by_name("bucket")(batch_size=3, padding_noise=0.0)  # no sorting_keys
    return MultiProcessDataLoader(TwoFieldReader(n), "x", batch_sampler=sampler, num_workers=workers,
                                  max_instances_in_memory=lazy, quiet=True, seed=4)


@pytest.mark.parametrize("workers", [0, 2])
def test_lazy_resume_with_a_guessing_bucket_sampler_is_batch_for_batch(workers: int) -> None:
    # A worker guesses the sorting key from the first chunk of the pass, also when resumed:
    # a guess from the chunk it resumed in ("b", not "a") would batch that chunk differently
    # and drop the wrong batches.
    original = bucket_loader(workers, 8)
    iterator = iter(original)
    head = ids(itertools.islice(iterator, 7))
    state = json.loads(json.dumps(original.state_dict()))
    rest = ids(iterator)
    resumed = bucket_loader(workers, 8)
    resumed.load_state_dict(state)
    tail = ids(resumed)
    assert tail == rest
    assert sorted(i for batch in head + tail for i in batch) == list(range(64))


class CountedRecords:
    """Records 0..n-1 that opt into the seek hook, counting those iterated (`pulled`)."""

    __framework_seekable__ = True

    def __init__(self, n: int, pulled: list[int]) -> None:
        self.n = n
        self.next = 0
        self.pulled = pulled

    def __iter__(self) -> Iterator[int]:
        while self.next < self.n:
            self.next += 1
            self.pulled.append(self.next - 1)
            yield self.next - 1

    def tell(self) -> int:
        return self.next

    def seek(self, token: int) -> None:
        self.next = token


class SeekingReader(DatasetReader):
    def __init__(self, n: int = 200) -> None:
        super().__init__(manual_distributed_sharding=True, manual_multiprocess_sharding=True)
        self.n = n
        self.pulled: list[int] = []  # records iterated in this process

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        for i in self.shard_iterable(CountedRecords(self.n, self.pulled)):
            yield make_instance(i)


@pytest.mark.parametrize("taken", [0, 1, 3])
def test_a_state_saved_soon_after_a_resume_still_seeks(taken: int) -> None:
    # A slot that has not begun a chunk of its own since a resume in another split still
    # carries a seek token in `consumed`: without one, the next resume reads every record
    # from the start (for 50M lines, seconds to a first batch).
    def loader(workers: int, reader: Optional[SeekingReader] = None) -> MultiProcessDataLoader:
        return MultiProcessDataLoader(reader or SeekingReader(), "x", batch_size=4, shuffle=True, seed=0,
                                      num_workers=workers, max_instances_in_memory=8, quiet=True)

    first = loader(2)
    iterator = iter(first)
    head = ids(itertools.islice(iterator, 20))
    state = json.loads(json.dumps(first.state_dict()))
    iterator.close()
    middle = loader(3)
    middle.load_state_dict(state)
    iterator = iter(middle)
    head += ids(itertools.islice(iterator, taken))
    again = json.loads(json.dumps(middle.state_dict()))
    iterator.close()
    below = again["consumed"]["below"]
    assert again["consumed"]["token"] == below > 0
    reader = SeekingReader()
    last = loader(0, reader)
    last.load_state_dict(again)
    tail = ids(last)
    assert sorted(i for batch in head + tail for i in batch) == list(range(200))
    assert min(reader.pulled) == below  # sought there: no record before it was read
    assert len(reader.pulled) == 200 - below


def test_an_old_iterator_closed_late_does_not_take_the_place_of_a_loaded_state() -> None:
    loader = build("eager_0")
    stale = iter(loader)
    ids(itertools.islice(stale, 2))
    other = build("eager_0")
    iterator = iter(other)
    head = ids(itertools.islice(iterator, 5))
    state = json.loads(json.dumps(other.state_dict()))
    loader.load_state_dict(state)
    tail = ids(loader)  # the loaded pass, to its end
    stale.close()  # the pass from before load_state_dict() ends only now
    assert head + tail == ids(build("eager_0"))
    assert loader.state_dict()["epoch"] == 1  # what comes next is the next epoch, whole


# -- torch.distributed (gloo, 2 ranks) -----------------------------------------------------


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[int], list[dict[str, Any]]]:
    """One gloo group of 2 ranks for the three cases of `two_rank_cases` (one spawn, not
    three): the head taken here before "empty", and each rank's results."""
    out = tmp_path_factory.mktemp("two_ranks")
    loader = guessing_bucket_loader(7)
    iterator = iter(loader)
    head = [i for batch in ids(itertools.islice(iterator, 2)) for i in batch]  # 6 of 7 taken
    (out / "state.json").write_text(json.dumps(loader.state_dict()))
    iterator.close()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    start_ranks(two_rank_cases, (2, port, str(out)), 2)
    return head, [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.slow
@pytest.mark.timeout(120)  # the first one to run spawns the ranks
def test_eager_resume_where_a_rank_has_nothing_left_yields_an_empty_epoch(
    two_ranks: tuple[list[int], list[dict[str, Any]]],
) -> None:
    # A rank with nothing left resumes an empty epoch: the bucket sampler must not guess its
    # sorting keys from no instances.
    head, results = two_ranks
    tails = [result["empty"] for result in results]
    assert [] in tails
    assert sorted(head + [i for tail in tails for batch in tail for i in batch]) == list(range(7))


@pytest.mark.slow
@pytest.mark.timeout(120)  # the first one to run spawns the ranks
def test_a_rank_already_in_its_next_epoch_speaks_for_the_one_it_finished(
    two_ranks: tuple[list[int], list[dict[str, Any]]],
) -> None:
    # A rank already in its next epoch speaks for the one it finished: its next-epoch
    # position merged into epoch 0's state would resume 34 instances, not the 13 left.
    _, saved = two_ranks
    for name in AHEAD_MODES:
        states = [result["ahead"][name]["state"] for result in saved]
        assert states[0] == states[1]
        assert states[0]["epoch"] == 0
        resumed = ahead_loader(name)  # here: world size 1
        resumed.load_state_dict(states[0])
        head = [i for result in saved for batch in result["ahead"][name]["head"] for i in batch]
        tail = [i for batch in resumed for i in batch["id"].tolist()]
        assert sorted(head + tail) == list(range(49)), name


@pytest.mark.slow
@pytest.mark.timeout(120)  # the first one to run spawns the ranks
def test_ranks_calling_state_dict_at_different_batches_get_a_clear_error(
    two_ranks: tuple[list[int], list[dict[str, Any]]],
) -> None:
    # Ranks calling state_dict() at different batches get a clear error at once: a lazy
    # rank's per-batch collective meeting another's state_dict() one would wait for the
    # group timeout (30 min), and eager ranks would save a state of different steps.
    _, results = two_ranks
    for name in ("lazy", "eager"):
        for rank in range(2):
            assert results[rank]["step"][name] is not None, (name, rank)
            kind, message = results[rank]["step"][name]
            assert kind == "RanksOutOfStepError", (name, rank, message)
            assert "state_dict()" in message


class FailOnceReader(CountingReader):
    """Raises once, in whichever worker first reaches record 20 (`flag` marks it done)."""

    def __init__(self, flag: str) -> None:
        super().__init__(N)
        self.flag = flag

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        for i, instance in enumerate(super()._read(file_path)):
            if i == 20:
                try:
                    os.close(os.open(self.flag, os.O_CREAT | os.O_EXCL))
                except FileExistsError:
                    pass
                else:
                    raise RuntimeError("the reader broke once")
            yield instance


def test_a_worker_error_leaves_the_state_in_the_pass_it_cut_short(tmp_path: Path) -> None:
    def loader(reader: DatasetReader) -> MultiProcessDataLoader:
        return MultiProcessDataLoader(reader, "x", batch_size=3, shuffle=True, quiet=True, seed=11,
                                      num_workers=2, max_instances_in_memory=8)

    flag = str(tmp_path / "failed")
    failing = loader(FailOnceReader(flag))
    head: list[list[int]] = []
    with pytest.raises(WorkerError, match="broke once"):
        for batch in failing:
            head.append(batch["id"].tolist())
    uninterrupted = ids(loader(FailOnceReader(flag)))  # it broke already: now it never does
    state = json.loads(json.dumps(failing.state_dict()))
    resumed = loader(FailOnceReader(flag))
    resumed.load_state_dict(state)
    assert head + ids(resumed) == uninterrupted
    assert head + ids(failing) == uninterrupted  # the live loader goes on there too


def _loader(reader: DatasetReader | None = None, **options: Any) -> MultiProcessDataLoader:
    settings: dict[str, Any] = {"batch_size": 2, "quiet": True, "seed": 0}
    settings.update(options)
    return MultiProcessDataLoader(reader or CountingReader(40), settings.pop("data_path", "x"), **settings)


def _ids(batches: Iterator[dict[str, Any]]) -> list[list[int]]:
    return [batch["id"].tolist() for batch in batches]


# -- batches_per_epoch carry-over and checkpoints ----------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "options",
    [{}, {"max_instances_in_memory": 8}, {"max_instances_in_memory": 8, "num_workers": 2},
     {"batches_per_epoch": 5}, {"batches_per_epoch": 5, "max_instances_in_memory": 8}],
)
def test_state_after_an_early_break_describes_what_comes_next(options: dict[str, Any]) -> None:
    # After an early break the state describes what comes next, not the abandoned pass (3
    # batches in), so a resumed run does not replay its rest.
    loader = _loader(shuffle=True, **options)
    for index, _ in enumerate(loader):
        if index == 2:
            break
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = _loader(shuffle=True, **options)
    resumed.load_state_dict(state)
    assert _ids(iter(resumed)) == _ids(iter(loader))
    loader.close()
