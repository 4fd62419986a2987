"""The built-in readers resume exactly over real files (issue 24): several files, one
without a final newline, plain or compressed (`.gz`, `.zst`); files identified by their
content (a re-staged copy resumes, a reorder is refused); a UTF-8 byte-order mark."""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from framework.data.multiprocess import MultiProcessDataLoader
from framework.data.reader import DatasetReader
from tests.support.compression import FORMS, write

pytestmark = pytest.mark.timeout(60)

BOM = "\ufeff"


def _reader(kind: str) -> DatasetReader:
    if kind == "csv":
        return DatasetReader.by_name("csv")(field_types={"id": "int"})
    return DatasetReader.by_name(kind)()


def _write(path: Path, kind: str, ids: range, final_newline: bool = True, bom: bool = False,
           form: str = "") -> Path:
    """The records `ids` in `path` (+ `form`: `.gz`, `.zst`); the path written."""
    if kind == "csv":
        text = "id,text\n" + "".join(f"{i},row {i}\n" for i in ids)
    elif kind == "jsonl":
        text = "".join(f'{{"id": {i}, "text": "row {i}"}}\n' for i in ids)
    else:
        text = "".join(f"{i} row {i}\n" for i in ids)
    if not final_newline:
        text = text[:-1]
    return write(path, ((BOM if bom else "") + text).encode("utf-8"), form)


def _key(batch: dict[str, Any]) -> list[Any]:
    if "id" in batch:
        return [int(x) for x in batch["id"].tolist()]
    return [int(text.split()[0]) for text in batch["text"]]


def _loader(kind: str, data: Any, workers: int = 0, lazy: Optional[int] = 4) -> MultiProcessDataLoader:
    return MultiProcessDataLoader(_reader(kind), data, batch_size=1, num_workers=workers,
                                  max_instances_in_memory=lazy, quiet=True, seed=1)


def _resume_at_every_batch(make: Callable[[], MultiProcessDataLoader], total: int) -> None:
    """Cut after every batch: the resumed rest is the uninterrupted rest."""
    whole = [x for batch in make() for x in _key(batch)]
    assert sorted(whole) == list(range(total))
    for cut in range(1, len(whole)):
        original = make()
        iterator = iter(original)
        head = [x for batch in itertools.islice(iterator, cut) for x in _key(batch)]
        state = json.loads(json.dumps(original.state_dict()))
        iterator.close()
        resumed = make()
        resumed.load_state_dict(state)
        assert head + [x for batch in resumed for x in _key(batch)] == whole, cut


KINDS = ["jsonl", "text", "csv"]


@pytest.mark.parametrize(
    ("workers", "lazy", "kind", "form"),
    # Every reader in every form at 0 workers; at 2 workers (a process each, the costly
    # runs) each reader once and each form once: workers read what the reader yields.
    [(0, lazy, kind, form) for lazy in (1, 3) for kind in KINDS for form in FORMS]
    + [(2, 2, kind, form) for kind, form in zip(KINDS, FORMS)],
)
def test_several_files_one_without_a_final_newline_resume_anywhere(
    tmp_path: Path, kind: str, workers: int, lazy: int, form: str
) -> None:
    # A state saved right after the last line of a file without a final newline resumes in
    # the next file: that file's end as the offset must not read as "the file changed".
    # Compressed: the offsets are into the decompressed bytes, each file two members/frames.
    paths = [
        _write(tmp_path / "0.txt", kind, range(0, 3), final_newline=False, form=form),
        _write(tmp_path / "1.txt", kind, range(3, 6), form=form),
        _write(tmp_path / "2.txt", kind, range(6, 9), final_newline=False, form=form),
    ]
    _resume_at_every_batch(lambda: _loader(kind, [str(p) for p in paths], workers, lazy), 9)


@pytest.mark.parametrize(
    ("workers", "lazy", "forms", "kind"),
    # compressed at 0 workers only, and one reader at 2: workers read what the reader
    # yields, as the test above shows
    [(0, lazy, forms, kind) for lazy in (4, None) for forms in (("", ""), (".gz", ".zst")) for kind in KINDS]
    + [(2, 4, ("", ""), "csv")],
)
def test_a_byte_order_mark_is_read_and_resumed(tmp_path: Path, kind: str, workers: int,
                                              lazy: Optional[int], forms: tuple[str, str]) -> None:
    # A byte order mark is not data: jsonl parses the first line, csv names the first column
    # "id" (not "\ufeffid"), and text leaves it out of its first line.
    paths = [
        _write(tmp_path / "a.txt", kind, range(0, 4), bom=True, form=forms[0]),
        _write(tmp_path / "b.txt", kind, range(4, 8), bom=True, final_newline=False, form=forms[1]),
    ]
    data = [str(p) for p in paths]
    batches = list(_loader(kind, data, workers, lazy))
    assert sorted(x for batch in batches for x in _key(batch)) == list(range(8))
    if kind == "text":
        assert all(not text.startswith(BOM) for batch in batches for text in batch["text"])
    _resume_at_every_batch(lambda: _loader(kind, data, workers, lazy), 8)


def test_the_readers_strip_a_byte_order_mark_only_at_the_start_of_a_file(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_bytes((BOM + "first\nsecond " + BOM + "kept\n").encode())
    texts = [x["text"] for x in DatasetReader.by_name("text")().read(str(path))]
    assert texts == ["first", "second " + BOM + "kept"]


def _saved_state(kind: str, path: Path, batches: int = 3) -> tuple[list[int], dict[str, Any]]:
    original = _loader(kind, str(path))
    iterator = iter(original)
    head = [x for batch in itertools.islice(iterator, batches) for x in _key(batch)]
    state = json.loads(json.dumps(original.state_dict()))
    iterator.close()
    return head, state


@pytest.mark.parametrize("kind", ["jsonl", "text"])
def test_a_byte_identical_copy_with_a_new_mtime_resumes(tmp_path: Path, kind: str) -> None:
    # Re-staged data (copied again, restored from a backup): before, refused as changed.
    path = tmp_path / "data.txt"
    _write(path, kind, range(20))
    head, state = _saved_state(kind, path)
    staged = tmp_path / "staged.txt"
    shutil.copyfile(path, staged)
    os.replace(staged, path)
    stamp = path.stat()
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 10**10))
    resumed = _loader(kind, str(path))
    resumed.load_state_dict(state)
    assert sorted(head + [x for batch in resumed for x in _key(batch)]) == list(range(20))


@pytest.mark.parametrize("kind", ["jsonl", "text"])
@pytest.mark.parametrize("size", ["small", "large"])
def test_the_same_records_reordered_with_the_old_size_and_mtime_are_refused(
    tmp_path: Path, kind: str, size: str
) -> None:
    # Records reordered with the old size and mtime are refused: the saved offsets would
    # resume over other records, some yielded twice, some never.
    count = 20 if size == "small" else 60_000  # the large one is sampled, not hashed whole
    path = tmp_path / "data.txt"
    _write(path, kind, range(count))
    _, state = _saved_state(kind, path)
    stamp = path.stat()
    lines = path.read_bytes().splitlines(keepends=True)
    if size == "small":  # hashed whole: swapping two records of the same length is seen
        width = len(lines[10])
        same_width = [n for n, line in enumerate(lines) if len(line) == width]
        first, second = same_width[len(same_width) // 3], same_width[2 * len(same_width) // 3]
        lines[first], lines[second] = lines[second], lines[first]
    else:  # sampled (head, tail, blocks at fixed offsets): the records shuffled are seen
        random.Random(0).shuffle(lines)
    path.write_bytes(b"".join(lines))
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert path.stat().st_size == stamp.st_size
    with pytest.raises(ValueError, match="changed since the state was saved"):
        _loader(kind, str(path)).load_state_dict(state)
