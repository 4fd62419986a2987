"""Where a resume cannot be exact, it is refused with an error naming the cause, never
resumed silently wrong (issue 24): a reader whose order changes from run to run is
caught by a digest of the instances at the saved positions; a reader may also declare
itself non-deterministic."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from framework.data._shards import digest_of
from framework.data.multiprocess import MultiProcessDataLoader
from framework.data.reader import DatasetReader
from framework.errors import WorkerError
from tests.support.loader import CountingReader, RandomReader, make_instance

pytestmark = pytest.mark.timeout(60)

N = 40


class RotatingReader(DatasetReader):
    """Its order changes with every read(): rotated by how often it was read (a counter
    in a file), as a reader iterating a directory listing or a set may change order
    from run to run."""

    def __init__(self, counter: Path) -> None:
        super().__init__()
        self.counter = counter

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        path = self.counter
        calls = int(path.read_text() or "0") + 1
        path.write_text(str(calls))
        for i in range(N):
            yield make_instance((i + 7 * calls) % N)


class DeclaredReader(CountingReader):
    deterministic = False


def _loader(reader: DatasetReader, path: str, workers: int, lazy: Optional[int]) -> MultiProcessDataLoader:
    return MultiProcessDataLoader(reader, path, batch_size=3, shuffle=True, num_workers=workers,
                                  max_instances_in_memory=lazy, quiet=True, seed=0)


def _save(loader: MultiProcessDataLoader, batches: int = 4) -> dict[str, Any]:
    iterator = iter(loader)
    list(itertools.islice(iterator, batches))
    state = json.loads(json.dumps(loader.state_dict()))
    iterator.close()
    return state


SAME = [(0, 8, 0), (2, 8, 2), (0, None, 0), (2, None, 2), (0, None, 1)]
OTHER = [(2, 8, 3), (2, None, 3), (0, None, 2)]


@pytest.mark.parametrize(("workers", "lazy", "after"), SAME)
def test_a_reader_whose_order_changed_is_refused(tmp_path: Path, workers: int, lazy: Optional[int],
                                                 after: int) -> None:
    # A reader whose order changed is refused: its saved positions would resume over other
    # instances, some of the epoch twice, some never.
    counter = tmp_path / "calls"
    counter.write_text("0")
    state = _save(_loader(RotatingReader(counter), "x", workers, lazy))
    with pytest.raises(Exception, match="not deterministic") as caught:
        resumed = _loader(RotatingReader(counter), "x", after, lazy)
        resumed.load_state_dict(state)
        list(resumed)  # lazy: found when the resumed slot reads its first chunk
    error = caught.value
    message = str(error) + str(error.__cause__)
    assert "start the epoch afresh" in message


@pytest.mark.parametrize("reader", [CountingReader, RandomReader])
@pytest.mark.parametrize(("workers", "lazy", "after"), SAME + OTHER)
def test_a_deterministic_reader_resumes_with_the_checks_on(
    reader: type[DatasetReader], workers: int, lazy: Optional[int], after: int
) -> None:
    # No refusal in vain: RandomReader's instances carry draws of the worker's streams,
    # which differ under another num_workers (the checks compare the same split only).
    head_loader = _loader(reader(N), "x", workers, lazy)
    iterator = iter(head_loader)
    head = [i for batch in itertools.islice(iterator, 4) for i in batch["id"].tolist()]
    state = json.loads(json.dumps(head_loader.state_dict()))
    iterator.close()
    assert "not deterministic" not in json.dumps(state)
    resumed = _loader(reader(N), "x", after, lazy)
    resumed.load_state_dict(state)
    assert sorted(head + [i for batch in resumed for i in batch["id"].tolist()]) == list(range(N))


@pytest.mark.parametrize(("workers", "lazy"), [(0, 8), (2, None)])
def test_a_reader_that_declares_itself_non_deterministic_is_refused(
    workers: int, lazy: Optional[int]
) -> None:
    state = _save(_loader(DeclaredReader(N), "x", workers, lazy))
    with pytest.raises(ValueError, match=r"DeclaredReader declares deterministic = False"):
        _loader(DeclaredReader(N), "x", workers, lazy).load_state_dict(state)


def test_the_digest_is_the_same_in_another_process_whatever_the_hash_seed() -> None:
    # Sets of strings iterate in another order under another PYTHONHASHSEED: the digest
    # must not see that (a resumed job is another process), or it would refuse in vain.
    import torch

    instance = {"tags": {"a", "b", "c", "d", "e", "f", "g"}, "f": 1.5, "t": ("x", None)}
    code = (
        "from framework.data._shards import digest_of; "
        "print(digest_of({'f': 1.5, 't': ('x', None), 'tags': {'g', 'f', 'e', 'd', 'c', 'b', 'a'}}))"
    )
    outputs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONHASHSEED": seed}).stdout.strip()
        for seed in ("1", "2")
    }
    assert outputs == {digest_of(instance)}
    assert digest_of({**instance, "f": 1.25}) != digest_of(instance)
    assert digest_of({"ids": torch.arange(4)}) == digest_of({"ids": torch.arange(4)})
    assert digest_of({"ids": torch.arange(1, 5)}) != digest_of({"ids": torch.arange(4)})


def test_the_digest_reads_dataclasses_and_ignores_handles() -> None:
    # A handle the hook attached (a tokenizer, a vocabulary object) may hold run-dependent
    # state (caches, ids): it counts by type, so it never makes a resume refuse in vain.
    from dataclasses import dataclass

    @dataclass
    class Span:
        start: int
        end: int

    class Handle:
        def __init__(self) -> None:
            self.opened_at = id(self)

    assert digest_of({"span": Span(1, 2)}) != digest_of({"span": Span(1, 3)})
    assert digest_of({"tok": Handle(), "x": 1}) == digest_of({"tok": Handle(), "x": 1})


def test_every_refusal_is_a_resume_error_naming_its_reason(tmp_path: Path) -> None:
    # One exception for every refusal, a ValueError as before, with a field to branch on.
    from framework.errors import ResumeError, WorkerError

    def refused(loader: MultiProcessDataLoader, state: Any) -> ResumeError:
        with pytest.raises((ResumeError, WorkerError)) as caught:
            loader.load_state_dict(state)
            list(loader)
        error = caught.value
        error = error if isinstance(error, ResumeError) else error.__cause__
        assert isinstance(error, ResumeError) and isinstance(error, ValueError)
        return error

    state = _save(_loader(CountingReader(N), "x", 0, None))
    assert refused(_loader(CountingReader(N), "x", 0, None), {"x": 1}).reason == "malformed"
    other = MultiProcessDataLoader(CountingReader(N), "x", batch_size=4, shuffle=True, quiet=True, seed=0)
    assert refused(other, state).reason == "settings_differ"
    declared = _save(_loader(DeclaredReader(N), "x", 0, None))
    assert refused(_loader(DeclaredReader(N), "x", 0, None), declared).reason == "not_deterministic"
    counter = tmp_path / "calls"
    counter.write_text("0")
    rotating = _save(_loader(RotatingReader(counter), "x", 2, 8), batches=2)
    assert refused(_loader(RotatingReader(counter), "x", 2, 8), rotating).reason == "not_deterministic"

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"tokens": [i] * (i % 3 + 1), "id": i}) + "\n" for i in range(N)))
    reader = DatasetReader.by_name("jsonl")
    saved = _save(_loader(reader(), str(data), 0, 8))
    data.write_text(data.read_text().replace('"id": 1}', '"id": 9}', 1))  # same size, other content
    error = refused(_loader(reader(), str(data), 0, 8), saved)
    assert error.reason == "files_changed" and str(data) in str(error)
    import pickle

    again = pickle.loads(pickle.dumps(error))
    assert (type(again), again.reason, str(again)) == (ResumeError, "files_changed", str(error))


def ids(batch: Any) -> list[int]:
    return list(batch["id"].tolist())


class SwappingReader(DatasetReader):
    """Records 0..N-1 in order, except that two of them trade places when `swap` is
    set: a reader whose order changed between the run that saved and the run that
    resumes (a directory listing, a set) while its first records stayed put."""

    swap: Optional[tuple[int, int]] = None

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        order = list(range(N))
        if SwappingReader.swap is not None:
            a, b = SwappingReader.swap
            order[a], order[b] = order[b], order[a]
        for i in order:
            yield make_instance(i)


@pytest.fixture
def swapping() -> Iterator[type[SwappingReader]]:
    SwappingReader.swap = None
    yield SwappingReader
    SwappingReader.swap = None


@pytest.mark.xfail(
    strict=True,
    reason="only the first instance of the resumed chunk (lazy) and 16 sampled "
    "instances of the cache (eager) are digested: a reorder elsewhere resumes wrong",
)
@pytest.mark.parametrize(
    ("lazy", "swap", "taken"),
    [(False, (3, 4), 2), (True, (1, 2), 1)],
    ids=["eager", "lazy"],
)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_reader_whose_order_changed_past_the_sampled_places_is_refused(
    swapping: type[SwappingReader], lazy: bool, swap: tuple[int, int], taken: int, num_workers: int
) -> None:
    # The failure model promises: a reader whose order changes from run to run is
    # refused, never resumed wrong. Here it resumed with one instance twice, one never.
    options: dict[str, Any] = {"max_instances_in_memory": 8} if lazy else {}

    def build() -> MultiProcessDataLoader:
        return MultiProcessDataLoader(
            swapping(), "x", batch_size=2, num_workers=num_workers, quiet=True, seed=0, **options
        )

    loader = build()
    iterator = iter(loader)
    head = [ids(next(iterator)) for _ in range(taken)]
    state = json.loads(json.dumps(loader.state_dict()))
    iterator.close()
    loader.close()

    swapping.swap = swap  # the next run reads another order
    resumed = build()
    try:
        resumed.load_state_dict(state)
        rest = [ids(batch) for batch in resumed]
    except (ValueError, WorkerError):  # a clear refusal
        return
    finally:
        resumed.close()
    seen = [i for batch in head + rest for i in batch]
    assert sorted(seen) == list(range(N)), "resumed wrong: neither refused nor exact"


@pytest.mark.parametrize(
    ("change", "setting"),
    [({"batch_size": 3}, "batch_size"), ({"shuffle": True}, "shuffle"), ({"drop_last": True}, "drop_last")],
)
def test_a_state_with_another_setting_is_refused_without_calling_it_mangled(
    change: dict[str, Any], setting: str
) -> None:
    # The refusal names the setting; before, it was wrapped in "this state lacks or
    # mangles a part ... pass the loader's own state_dict()", which it is not.
    from tests.support.loader import CountingReader

    def build(**options: Any) -> MultiProcessDataLoader:
        return MultiProcessDataLoader(
            CountingReader(10), "x", **{"batch_size": 2, "quiet": True, "seed": 0, **options}
        )

    state = json.loads(json.dumps(build().state_dict()))
    with pytest.raises(ValueError, match=f"saved by a loader with {setting}=") as raised:
        build(**change).load_state_dict(state)
    assert "mangles" not in str(raised.value)
