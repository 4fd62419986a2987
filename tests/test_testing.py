"""`framework.testing`: the helpers catch what they promise to catch."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from framework import DatasetReader, DownloadBackend, DownloadManager, Registrable
from framework.errors import DownloadError
from framework.registry import get_registry
from framework.testing import MemoryBackend, assert_reader_shards_exactly_once, fresh_registry, read_shards


class LineReader(DatasetReader):
    def _read(self, file_path: Any) -> Iterator[dict[str, str]]:
        with open(file_path, encoding="utf-8") as lines:
            for line in lines:
                yield {"line": line.rstrip("\n")}


class EveryShardReadsAll(DatasetReader):
    """Claims to shard by itself, then does not: every worker yields everything."""

    def __init__(self) -> None:
        super().__init__(manual_multiprocess_sharding=True, manual_distributed_sharding=True)

    def _read(self, file_path: Any) -> Iterator[dict[str, int]]:
        yield from ({"i": i} for i in range(5))


@pytest.fixture
def lines(tmp_path: Path) -> str:
    path = tmp_path / "lines.txt"
    path.write_text("".join(f"line {i}\n" for i in range(11)))
    return str(path)


def test_shard_check_passes_a_sharding_reader_and_returns_the_instances(lines: str) -> None:
    instances = assert_reader_shards_exactly_once(LineReader(), lines)
    assert [i["line"] for i in instances] == [f"line {i}" for i in range(11)]


@pytest.mark.filterwarnings("ignore:EveryShardReadsAll sets manual")
def test_shard_check_catches_a_reader_that_repeats_instances() -> None:
    with pytest.raises(AssertionError, match=r"2 worker\(s\) x 1 rank\(s\).*extra or repeated"):
        assert_reader_shards_exactly_once(EveryShardReadsAll(), "unused")


def test_read_shards_puts_the_reader_back(lines: str) -> None:
    reader = LineReader()
    shards = read_shards(reader, lines, 2, 2)
    assert [len(s) for s in shards] == [3, 3, 3, 2]
    assert reader.get_worker_info() is None and len(list(reader.read(lines))) == 11


def test_memory_backend_serves_counts_and_refuses_unknown_urls(tmp_path: Path) -> None:
    MemoryBackend.reset()
    DownloadBackend.register("mem")(MemoryBackend)
    MemoryBackend.objects["mem://bucket/a.txt"] = b"hello"
    manager = DownloadManager(cache_dir=tmp_path)
    path = manager.cached_path("mem://bucket/a.txt")
    assert path.read_bytes() == b"hello"
    assert manager.cached_path("mem://bucket/a.txt") == path
    assert MemoryBackend.opens["mem://bucket/a.txt"] == 1  # the second call is a cache hit
    with pytest.raises(DownloadError, match="mem://bucket/missing"):
        manager.cached_path("mem://bucket/missing")
    MemoryBackend.reset()


def test_fresh_registry_drops_what_was_registered_inside() -> None:
    class Base(Registrable):
        pass

    outer = get_registry()
    with fresh_registry() as inner:
        assert get_registry() is inner and inner is not outer
        Base.register("inside")(type("Inside", (Base,), {}))
        assert Base.list_available() == ["inside"]
    assert get_registry() is outer and Base.list_available() == []


class IndexedReader(DatasetReader):
    """Correct: attaches a field in the main-process hook, as the loader runs it."""

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        yield from ({"i": i} for i in range(6))

    def apply_token_indexers(self, instance: dict[str, Any]) -> None:
        instance["indexed"] = True


def test_shard_check_runs_the_main_process_hook_as_the_loader_does() -> None:
    instances = assert_reader_shards_exactly_once(IndexedReader(), "unused")
    assert instances == [{"i": i, "indexed": True} for i in range(6)]


class DropsTheRemainder(DatasetReader):
    """Wrong: each shard takes len // shards instances, so a remainder is lost. With 6
    instances, the default grids' 2, 3 and 6 shards all divide evenly."""

    def __init__(self) -> None:
        super().__init__(manual_multiprocess_sharding=True, manual_distributed_sharding=True)

    def _read(self, file_path: Any) -> Iterator[dict[str, int]]:
        worker, dist = self.get_worker_info(), self.get_distributed_info()
        workers = worker.num_workers if worker else 1
        shards = workers * (dist.world_size if dist else 1)
        shard = (dist.global_rank if dist else 0) * workers + (worker.id if worker else 0)
        size = 6 // shards
        yield from ({"i": i} for i in range(shard * size, (shard + 1) * size))


def test_shard_check_catches_a_reader_that_drops_the_remainder() -> None:
    with pytest.raises(AssertionError, match="missing"):
        assert_reader_shards_exactly_once(DropsTheRemainder(), "unused")


def test_read_shards_gives_one_worker_its_worker_info_as_a_loader_does(lines: str) -> None:
    seen: list[Any] = []

    class Recording(LineReader):
        def _read(self, file_path: Any) -> Iterator[dict[str, str]]:
            seen.append(self.get_worker_info())
            yield from super()._read(file_path)

    read_shards(Recording(), lines, 1, 1)
    assert [(info.num_workers, info.id) for info in seen] == [(1, 0)]
