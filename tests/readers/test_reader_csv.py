"""The first-party "csv" reader: header, field selection and types, errors, sharding."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from framework import DatasetReader
from framework.errors import ConfigError

ROWS = [(i, f"text, with comma {i}" if i % 4 == 0 else f"text {i}", i / 2) for i in range(17)]


@pytest.fixture
def table(tmp_path: Path) -> str:
    lines = ["id,text,score"] + [f'{i},"{t}",{s}' for i, t, s in ROWS]
    # a quoted field spanning two lines must stay one row
    lines.append('99,"two\nlines",0.5')
    path = tmp_path / "table.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_rows_keyed_by_header(table: str) -> None:
    reader = DatasetReader.from_config({"type": "csv"})
    rows = list(reader.read(table))
    assert len(rows) == len(ROWS) + 1
    assert rows[0] == {"id": "0", "text": "text, with comma 0", "score": "0.0"}
    assert rows[-1]["text"] == "two\nlines"


def test_field_selection_and_types(table: str) -> None:
    reader = DatasetReader.from_config(
        {"type": "csv", "fields": ["score", "id"], "field_types": {"id": "int", "score": "float"}}
    )
    rows = list(reader.read(table))
    assert rows[3] == {"score": 1.5, "id": 3}


def test_tsv_delimiter(tmp_path: Path) -> None:
    path = tmp_path / "t.tsv"
    path.write_text("a\tb\n1\tx y\n", encoding="utf-8")
    reader = DatasetReader.from_config({"type": "csv", "delimiter": "\t"})
    assert list(reader.read(str(path))) == [{"a": "1", "b": "x y"}]


def test_errors_name_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("a,b\n1,2\nx,3\n", encoding="utf-8")
    reader = DatasetReader.from_config({"type": "csv", "field_types": {"a": "int"}})
    with pytest.raises(ValueError, match=r"t\.csv:3: column 'a' should be int, got 'x'"):
        list(reader.read(str(path)))
    reader = DatasetReader.from_config({"type": "csv", "fields": ["c"]})
    with pytest.raises(ValueError, match=r"column\(s\) 'c' not in the header"):
        list(reader.read(str(path)))
    path.write_text("a,b\n1,2,3\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"t\.csv:2: 3 values for 2 columns"):
        list(DatasetReader.by_name("csv")().read(str(path)))


def test_empty_file_yields_nothing(tmp_path: Path) -> None:
    path = tmp_path / "empty.csv"
    path.write_text("", encoding="utf-8")
    assert list(DatasetReader.by_name("csv")().read(str(path))) == []


def test_bad_config() -> None:
    with pytest.raises(ConfigError, match="unknown type"):
        DatasetReader.from_config({"type": "csv", "field_types": {"a": "decimal"}})
    with pytest.raises(ConfigError, match="delimiter must be one character"):
        DatasetReader.from_config({"type": "csv", "delimiter": ";;"})


@pytest.mark.parametrize(("workers", "world"), [(2, 1), (1, 3), (2, 2)])
def test_shards_are_disjoint_and_complete(
    table: str, shard_reader: Callable[..., list[list[Any]]], workers: int, world: int
) -> None:
    shards = shard_reader(DatasetReader.by_name("csv")(), table, workers, world)
    ids = sorted(int(r["id"]) for shard in shards for r in shard)
    assert ids == [*range(17), 99]


def test_rows_end_at_a_lone_cr_too(tmp_path: Path) -> None:
    # Classic Mac / some spreadsheet exports; text mode with newline="" split them.
    from framework.data.multiprocess import MultiProcessDataLoader

    path = tmp_path / "a.csv"
    path.write_bytes(b"text,n\rx,1\ry,2\r")
    loader = MultiProcessDataLoader(DatasetReader.by_name("csv")(), str(path), batch_size=8, quiet=True)
    assert [x for b in loader for x in b["text"]] == ["x", "y"]
