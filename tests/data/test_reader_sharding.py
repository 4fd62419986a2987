"""DatasetReader sharding across workers and ranks (ported from AllenNLP's reader tests)."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from framework.data.reader import DatasetReader, DistributedInfo, WorkerInfo
from tests.support import ranks
from tests.support.loader import CountingReader, ShardingReader
from tests.support.ranks import ForgetfulListReader, ListReader

pytestmark = pytest.mark.timeout(30)


def read_shard(reader: DatasetReader, world: int, rank: int, workers: int, wid: int) -> list[int]:
    reader._set_distributed_info(DistributedInfo(world, rank) if world > 1 else None)
    reader._set_worker_info(WorkerInfo(workers, wid) if workers > 1 else None)
    return [instance["id"] for instance in reader.read("unused")]


SHAPES = list(itertools.product([1, 2, 3], [1, 2, 4]))


@pytest.mark.parametrize("world,workers", SHAPES)
@pytest.mark.parametrize("max_instances", [None, 1, 7, 25])
@pytest.mark.parametrize("reader_class", [CountingReader, ShardingReader])
def test_shards_are_disjoint_and_total_is_exact(
    reader_class: type[CountingReader], world: int, workers: int, max_instances: Any
) -> None:
    shards = [
        read_shard(reader_class(n=20, max_instances=max_instances), world, rank, workers, wid)
        for rank in range(world)
        for wid in range(workers)
    ]
    everything = [i for shard in shards for i in shard]
    assert len(everything) == len(set(everything)), "shards overlap"
    expected = 20 if max_instances is None else min(20, max_instances)
    # The shards hold exactly the first `expected` instances.
    assert sorted(everything) == list(range(expected))


class ByWorkerReader(DatasetReader):
    """Manual multiprocess sharding via get_worker_info(); distributed left automatic."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(manual_multiprocess_sharding=True, **kwargs)

    def _read(self, file_path: Any) -> Iterator[dict[str, int]]:
        info = self.get_worker_info()
        workers, wid = (info.num_workers, info.id) if info else (1, 0)
        for i in range(30):
            if (i // 2) % workers == wid:  # reads its own items of the rank-strided stream
                yield {"id": i}


def test_manual_multiprocess_sharding_with_automatic_distributed() -> None:
    seen = []
    for rank in range(2):
        for wid in range(3):
            seen += read_shard(ByWorkerReader(), 2, rank, 3, wid)
    assert sorted(seen) == list(range(30))


def test_shard_iterable_requires_both_manual_flags() -> None:
    class Half(DatasetReader):
        def __init__(self) -> None:
            super().__init__(manual_multiprocess_sharding=True)

        def _read(self, file_path: Any) -> Iterator[int]:
            yield from self.shard_iterable(range(3))

    with pytest.raises(ValueError, match="manual_distributed_sharding=True"):
        list(Half().read("x"))


def test_manual_flag_without_sharding_warns_about_duplicates() -> None:
    class Forgetful(DatasetReader):
        def __init__(self) -> None:
            super().__init__(manual_multiprocess_sharding=True)

        def _read(self, file_path: Any) -> Iterator[dict[str, int]]:
            for i in range(4):
                yield {"id": i}

    reader = Forgetful()
    reader._set_worker_info(WorkerInfo(2, 0))
    with pytest.warns(UserWarning, match="never called shard_iterable"):
        assert len(list(reader.read("x"))) == 4
    # A reader that shards itself via get_worker_info() does not warn.
    worker_reader = ByWorkerReader()
    worker_reader._set_worker_info(WorkerInfo(2, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(worker_reader.read("x"))


def test_apply_token_indexers_runs_in_read_only_outside_workers() -> None:
    calls: list[int] = []

    class Hooked(CountingReader):
        def apply_token_indexers(self, instance: Any) -> None:
            calls.append(instance["id"])

    reader = Hooked(n=3)
    list(reader.read("x"))
    assert calls == [0, 1, 2]
    reader._set_worker_info(WorkerInfo(1, 0))
    list(reader.read("x"))
    assert calls == [0, 1, 2]  # inside a worker the loader runs it in the main process


def test_reader_without_super_init_still_works() -> None:
    class NoInit(DatasetReader):
        def __init__(self) -> None:
            pass

        def _read(self, file_path: Any) -> Iterator[int]:
            yield from range(3)

    assert list(NoInit().read("x")) == [0, 1, 2]
    assert NoInit().get_worker_info() is None and NoInit().get_distributed_info() is None


def test_importing_the_base_modules_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys; import framework.data.reader, framework.data.sampler, "
        "framework.data.collate, framework.data.loader, framework.data; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- the sharding warning ----------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_reader_whose_read_returns_a_list_and_shards_does_not_warn() -> None:
    # A _read that returns a list runs at once: the "did it shard?" flags must be reset
    # before it runs, or a reader that did shard is warned about duplicates.
    reader = ListReader(12)
    reader._set_worker_info(WorkerInfo(2, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [x["id"] for x in reader.read("x")] == [0, 2, 4, 6, 8, 10]


@pytest.mark.timeout(120)
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
    assert caught[0].filename == ranks.__file__  # points at the reader's _read
    other_worker = ForgetfulListReader(8)
    other_worker._set_worker_info(WorkerInfo(2, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(other_worker.read("x"))  # worker 0 speaks for every worker
