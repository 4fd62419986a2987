"""Resume anywhere (issue 11): another num_workers or world size resumes the rest of the
epoch, every instance not yet yielded exactly once; the built-in readers seek."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from framework.data._resume_checks import file_stamps
from framework.data.multiprocess import MultiProcessDataLoader
from framework.data.reader import DatasetReader
from framework.data.sampler import BatchSampler
from tests.support.loader import CountingReader, RandomReader
from tests.support.ranks import ListReader, start_ranks
from tests.support.ranks import free_port as free_port_now
from tests.support.resume import MODES, PerFileReader, SelfShardingReader, elastic_rank, uneven_rank

pytestmark = pytest.mark.timeout(120)

N = 50
MOVES = [(0, 2), (2, 1), (2, 3), (3, 0)]


def build(num_workers: int, lazy: int | None, batching: str, reader: DatasetReader | None = None,
          data_path: Any = "x", **options: Any) -> MultiProcessDataLoader:
    if batching == "bucket":
        options["batch_sampler"] = BatchSampler.by_name("bucket")(batch_size=3, sorting_keys=["tokens"])
    else:
        options.update(batch_size=3, shuffle=True)
    return MultiProcessDataLoader(
        reader or RandomReader(N), data_path, num_workers=num_workers, max_instances_in_memory=lazy,
        quiet=True, seed=5, **options,
    )


def ids(batches: Any) -> list[int]:
    return [i for batch in batches for i in batch["id"].tolist()]


def save_after(loader: MultiProcessDataLoader, batches: int) -> tuple[list[int], dict[str, Any]]:
    iterator = iter(loader)
    head = ids(itertools.islice(iterator, batches))
    state = json.loads(json.dumps(loader.state_dict()))  # plain data
    iterator.close()
    return head, state


@pytest.mark.parametrize("batching", ["shuffle", "bucket"])
@pytest.mark.parametrize(("before", "after"), MOVES)
def test_lazy_resume_with_other_num_workers(before: int, after: int, batching: str) -> None:
    head, state = save_after(build(before, 8, batching), 5)
    resumed = build(after, 8, batching)
    resumed.load_state_dict(state)
    tail = ids(resumed)
    assert sorted(head + tail) == list(range(N))  # nothing twice, nothing lost
    assert sorted(ids(resumed)) == list(range(N))  # the epoch after is a whole epoch


@pytest.mark.parametrize("batching", ["shuffle", "bucket"])
@pytest.mark.parametrize(("before", "after"), MOVES)
def test_eager_resume_with_other_num_workers(before: int, after: int, batching: str) -> None:
    original = build(before, None, batching)
    head, state = save_after(original, 5)
    resumed = build(after, None, batching)
    resumed.load_state_dict(state)
    tail = ids(resumed)
    assert sorted(head + tail) == list(range(N))
    # Eager mode batches the same cache whatever num_workers: the very batches that were next.
    rest = build(before, None, batching)
    rest.load_state_dict(state)
    assert ids(rest) == tail
    assert sorted(ids(resumed)) == list(range(N))


def test_a_resumed_epoch_can_be_saved_and_resumed_again() -> None:
    head, state = save_after(build(2, 8, "shuffle"), 4)
    middle_loader = build(3, 8, "shuffle")
    middle_loader.load_state_dict(state)
    middle, state = save_after(middle_loader, 3)
    last = build(0, 8, "shuffle")
    last.load_state_dict(state)
    assert sorted(head + middle + ids(last)) == list(range(N))
    # The same split resumes a resumed epoch batch for batch.
    again = build(3, 8, "shuffle")
    again.load_state_dict(state)
    exact = build(3, 8, "shuffle")
    exact.load_state_dict(state)
    assert ids(again) == ids(exact)


def test_the_same_split_still_resumes_batch_for_batch() -> None:
    original = build(2, 8, "bucket")
    iterator = iter(original)
    list(itertools.islice(iterator, 4))
    state = json.loads(json.dumps(original.state_dict()))
    rest = [batch["noise"].tolist() for batch in iterator]
    resumed = build(2, 8, "bucket")
    resumed.load_state_dict(state)
    assert [batch["noise"].tolist() for batch in resumed] == rest


def test_a_reader_that_hides_its_records_resumes_only_the_same_split() -> None:
    # ListReader builds a list in _read: which record an instance came from is unknown.
    head, state = save_after(build(2, 8, "shuffle", reader=ListReader(N)), 3)
    with pytest.raises(ValueError, match="cannot be dealt over another split"):
        build(3, 8, "shuffle", reader=ListReader(N)).load_state_dict(state)
    same = build(2, 8, "shuffle", reader=ListReader(N))
    same.load_state_dict(state)
    assert sorted(head + ids(same)) == list(range(N))


@pytest.mark.parametrize("lazy", [None, 8])
def test_a_reader_that_shards_by_itself_resumes_only_the_same_split(lazy: int | None) -> None:
    # It picks each worker's instances itself: another num_workers caches (eager) or
    # streams (lazy) another order. Before: eager mode took the state under 2 workers
    # and repeated and skipped instances silently.
    head, state = save_after(build(0, lazy, "shuffle", reader=SelfShardingReader(20)), 3)
    with pytest.raises(ValueError, match="shards by itself"):
        build(2, lazy, "shuffle", reader=SelfShardingReader(20)).load_state_dict(state)
    same = build(0, lazy, "shuffle", reader=SelfShardingReader(20))
    same.load_state_dict(state)
    assert sorted(head + ids(same)) == list(range(20))


@pytest.mark.parametrize(("before", "after"), [(2, 3), (0, 2)])
def test_a_reader_that_shards_each_file_resumes_in_another_split(before: int, after: int) -> None:
    # Records are numbered on across shard_iterable() calls, so indexes never collide.
    head, state = save_after(build(before, 8, "shuffle", reader=PerFileReader(N)), 5)
    resumed = build(after, 8, "shuffle", reader=PerFileReader(N))
    resumed.load_state_dict(state)
    assert sorted(head + ids(resumed)) == list(range(N))


def test_the_readers_own_reads_between_batches_are_whole() -> None:
    # The loader's plan (slot, resume point) is for its own read only.
    reader = RandomReader(N)
    head, state = save_after(build(2, 8, "shuffle"), 5)
    loader = build(0, 8, "shuffle", reader=reader)
    loader.load_state_dict(state)
    tail = []
    for batch in loader:
        tail += batch["id"].tolist()
        assert [x["id"] for x in reader.read("x")] == list(range(N))
    assert sorted(head + tail) == list(range(N))


@pytest.mark.parametrize(
    ("change", "field"), [({"data_path": "y"}, "data_path"), ({"reader": True}, "reader")]
)
def test_a_state_from_another_reader_or_data_path_is_refused(change: dict[str, Any], field: str) -> None:
    _, state = save_after(build(2, 8, "shuffle"), 2)
    reader = CountingReader(N) if change.pop("reader", False) else None
    with pytest.raises(ValueError, match=rf"{field}=.*resuming would repeat or skip"):
        build(3, 8, "shuffle", reader=reader, **change).load_state_dict(state)


# -- the built-in readers seek -----------------------------------------------------------


def lines_file(path: Path, count: int = 60) -> Path:
    path.write_text("".join(f'{{"id": {i}, "text": "line {i} {"w " * (i % 5)}"}}\n' for i in range(count)))
    return path


@pytest.mark.parametrize("kind", ["jsonl", "text", "csv"])
@pytest.mark.parametrize("after", [2, 3])
def test_builtin_readers_resume_by_seeking_past_what_was_read(tmp_path: Path, kind: str, after: int) -> None:
    reader_type = DatasetReader.by_name(kind)
    path = tmp_path / "data.txt"
    if kind == "csv":
        path.write_text("id,text\n" + "".join(f"{i},row {i}\n" for i in range(60)))
        reader: Any = lambda: reader_type(field_types={"id": "int"})  # noqa: E731
    else:
        lines_file(path)
        reader = (lambda: reader_type()) if kind == "jsonl" else (lambda: reader_type(keep_text=True))

    def key(batch: dict[str, Any]) -> list[Any]:
        return batch["id"].tolist() if "id" in batch else batch["text"]

    def loader(workers: int) -> MultiProcessDataLoader:
        return MultiProcessDataLoader(reader(), str(path), batch_size=4, shuffle=True, num_workers=workers,
                                      max_instances_in_memory=8, quiet=True, seed=2)

    original = loader(2)
    iterator = iter(original)
    head = [x for batch in itertools.islice(iterator, 8) for x in key(batch)]
    state = json.loads(json.dumps(original.state_dict()))
    rest = [x for batch in iterator for x in key(batch)]
    # Make the part before the saved offset unreadable (same length, not UTF-8): a
    # resumed loader that read it instead of seeking would fail.
    below = state["consumed"]["token"]
    assert below is not None and below[1] > 0
    data = path.read_bytes()
    start = data.index(b"\n") + 1 if kind == "csv" else 0  # the header stays readable
    path.write_bytes(data[:start] + b"\xff" * (below[1] - start - 1) + b"\n" + data[below[1]:])
    state["files"] = file_stamps(str(path))  # taken as unchanged (its fingerprint would see it)
    same = loader(2)
    same.load_state_dict(state)
    assert [x for batch in same for x in key(batch)] == rest
    other = loader(after)
    other.load_state_dict(state)
    tail = [x for batch in other for x in key(batch)]
    assert sorted(map(str, head + tail)) == sorted(map(str, head + rest))
    assert len(head) + len(tail) == 60


# -- torch.distributed: another world size ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 2), (2, 2)])
def test_a_job_of_another_world_size_resumes_the_rest(
    before: int, after: int, free_port: int, tmp_path: Path
) -> None:
    start_ranks(elastic_rank, (before, free_port, str(tmp_path), "save"), before)
    saved = [json.loads((tmp_path / f"save{r}.json").read_text()) for r in range(before)]
    for name in MODES:
        states = [result[name]["state"] for result in saved]
        assert all(state == states[0] for state in states)  # the whole-job state on every rank
        (tmp_path / f"state_{name}.json").write_text(json.dumps(states[0]))
    start_ranks(elastic_rank, (after, free_port_now(), str(tmp_path), "resume"), after)
    resumed = [json.loads((tmp_path / f"resume{r}.json").read_text()) for r in range(after)]
    for name in MODES:
        head = [i for result in saved for batch in result[name]["head"] for i in batch]
        tail = [i for result in resumed for batch in result[name]["tail"] for i in batch]
        assert sorted(head + tail) == list(range(50)), name
        following = [i for result in resumed for batch in result[name]["next"] for i in batch]
        assert sorted(following) == list(range(50)), name  # then whole epochs
        if before == after:  # the same world size: each rank batch for batch
            assert [r[name]["tail"] for r in resumed] == [r[name]["rest"] for r in saved], name


@pytest.mark.parametrize(
    "consumed",
    [{"below": 0, "bits": "not base64!"}, {"below": 0, "bits": "AAAA"}, {"below": -1}, [1]],
)
def test_a_mangled_consumed_part_is_a_clear_error(consumed: Any) -> None:
    _, state = save_after(build(2, 8, "shuffle"), 2)
    with pytest.raises(ValueError, match=r"expects what MultiProcessDataLoader\.state_dict"):
        build(3, 8, "shuffle").load_state_dict({**state, "consumed": consumed})


@pytest.mark.slow
def test_a_rank_whose_epoch_ended_still_counts_in_the_whole_job_state(free_port: int, tmp_path: Path) -> None:
    # A rank whose epoch ended counts what it consumed in the whole-job state; describing its
    # next epoch would deal its 24 instances out again on resume (duplicates).
    start_ranks(uneven_rank, (2, free_port, str(tmp_path), "save"), 2)
    saved = [json.loads((tmp_path / f"save{r}.json").read_text()) for r in range(2)]
    for name in MODES:
        states = [result[name]["state"] for result in saved]
        assert states[0] == states[1]
        (tmp_path / f"state_{name}.json").write_text(json.dumps(states[0]))
    start_ranks(uneven_rank, (3, free_port_now(), str(tmp_path), "resume"), 3)
    resumed = [json.loads((tmp_path / f"resume{r}.json").read_text()) for r in range(3)]
    for name in MODES:
        head = [i for result in saved for batch in result[name]["head"] for i in batch]
        tail = [i for result in resumed for batch in result[name]["tail"] for i in batch]
        assert sorted(head + tail) == list(range(49)), name


# -- the hook is opt-in ------------------------------------------------------------------------


class OpenFileReader(DatasetReader):
    """The common pattern: an open file straight into shard_iterable()."""

    def __init__(self) -> None:
        super().__init__(manual_multiprocess_sharding=True, manual_distributed_sharding=True)

    def _read(self, file_path: Any) -> Any:
        with open(file_path) as handle:
            for line in self.shard_iterable(handle):
                yield {"text": line.strip()}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("lazy", [None, 8])
def test_an_open_file_is_plain_records_not_the_seek_hook(
    tmp_path: Path, workers: int, lazy: int | None
) -> None:
    # A file has __iter__, tell and seek, but cannot tell() while iterated: it was taken
    # for the hook and failed even on a fresh pass.
    path = tmp_path / "a.txt"
    path.write_text("".join(f"L{i}\n" for i in range(40)))

    def loader() -> MultiProcessDataLoader:
        return MultiProcessDataLoader(OpenFileReader(), str(path), batch_size=4, num_workers=workers,
                                      max_instances_in_memory=lazy, shuffle=True, seed=0, quiet=True)

    original = loader()
    iterator = iter(original)
    head = [t for batch in itertools.islice(iterator, 3) for t in batch["text"]]
    state = json.loads(json.dumps(original.state_dict()))
    iterator.close()
    resumed = loader()
    resumed.load_state_dict(state)
    tail = [t for batch in resumed for t in batch["text"]]
    assert sorted(head + tail) == sorted(f"L{i}" for i in range(40))


# -- a state holds only for the same data -----------------------------------------------------


@pytest.mark.parametrize("change", ["prefix", "rewritten", "truncated"])
@pytest.mark.parametrize("after", [0, 1])
def test_a_state_for_a_changed_data_file_is_refused(tmp_path: Path, change: str, after: int) -> None:
    # The saved byte offset would land mid-line or past the end: records repeated or lost.
    path = tmp_path / "a.txt"
    original = "".join(f"line{i:02d}\n" for i in range(20))
    path.write_text(original)

    def loader(workers: int) -> MultiProcessDataLoader:
        return MultiProcessDataLoader(DatasetReader.by_name("text")(), str(path), batch_size=4,
                                      num_workers=workers, max_instances_in_memory=8, quiet=True, seed=0)

    original_loader = loader(0)
    iterator = iter(original_loader)
    list(itertools.islice(iterator, 3))
    state = json.loads(json.dumps(original_loader.state_dict()))
    iterator.close()
    path.write_text({"prefix": "xx\n" + original, "rewritten": "".join(f"r{i:03d}\n" for i in range(30)),
                     "truncated": original[:30]}[change])
    with pytest.raises(ValueError, match="changed since the state was saved"):
        loader(after).load_state_dict(state)


def test_a_resume_offset_that_is_not_a_line_start_is_refused_at_seek(tmp_path: Path) -> None:
    # The fingerprint sees a change; should one get past it, the seek still refuses.
    from framework_plugins.readers import FileRecords, Lines

    path = tmp_path / "a.txt"
    path.write_bytes(b"ab\ncd\nef\n")
    records: FileRecords[Any] = Lines(str(path))
    records.seek([0, 4, 1])
    with pytest.raises(ValueError, match="not the start of a line"):
        list(records)
    records.seek([0, 30, 1])  # past the end
    with pytest.raises(ValueError, match="not the start of a line"):
        list(records)


@pytest.mark.parametrize(("workers", "lazy"), [(0, None), (2, 8)])
def test_batches_per_epoch_resumes_the_rest_of_the_epoch(workers: int, lazy: int | None) -> None:
    # The resumed iter() yielded a whole batches_per_epoch, shifting every later epoch.
    def loader() -> MultiProcessDataLoader:
        return build(workers, lazy, "shuffle", batches_per_epoch=5)

    uninterrupted = loader()
    epochs = [[batch["id"].tolist() for batch in uninterrupted] for _ in range(2)]
    original = loader()
    iterator = iter(original)
    head = [batch["id"].tolist() for batch in itertools.islice(iterator, 2)]
    state = json.loads(json.dumps(original.state_dict()))
    iterator.close()
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + [batch["id"].tolist() for batch in resumed] == epochs[0]
    assert [batch["id"].tolist() for batch in resumed] == epochs[1]


# -- resume: refuse what would be silently wrong -----------------------------------------


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
