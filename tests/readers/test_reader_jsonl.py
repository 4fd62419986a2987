"""The first-party "jsonl" reader: parsing, field selection, errors, sharding."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from framework import DatasetReader
from framework.errors import ConfigError
from tests.support.compression import write


def write_jsonl(path: Path, records: list[Any]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


RECORDS = [{"id": i, "text": f"line {i}", "label": i % 3} for i in range(23)]


def test_registered_by_name_and_reads_every_object(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "data.jsonl", RECORDS)
    reader = DatasetReader.from_config({"type": "jsonl"})
    assert type(reader).__name__ == "JsonlReader"
    assert list(reader.read(path)) == RECORDS


def test_field_selection_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text('{"a": 1, "b": 2, "c": 3}\n\n   \n{"a": 4, "b": 5, "c": 6}\n', encoding="utf-8")
    reader = DatasetReader.from_config({"type": "jsonl", "fields": ["c", "a"]})
    assert list(reader.read(str(path))) == [{"c": 3, "a": 1}, {"c": 6, "a": 4}]


@pytest.mark.parametrize("form", [".gz", ".zst"])
def test_compressed_input(tmp_path: Path, form: str) -> None:
    raw = "".join(json.dumps(r) + "\n" for r in RECORDS).encode()
    path = write(tmp_path / "data.jsonl", raw, form)
    reader = DatasetReader.by_name("jsonl")()
    assert list(reader.read(str(path))) == RECORDS


def test_bad_json_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text('{"a": 1}\n{"a": \n', encoding="utf-8")
    reader = DatasetReader.by_name("jsonl")()
    with pytest.raises(ValueError, match=r"data\.jsonl:2: not valid JSON"):
        list(reader.read(str(path)))


def test_not_an_object_and_missing_field(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text('[1, 2]\n', encoding="utf-8")
    with pytest.raises(ValueError, match="expected a JSON object, got list"):
        list(DatasetReader.by_name("jsonl")().read(str(path)))
    write_jsonl(path, [{"a": 1}])
    reader = DatasetReader.from_config({"type": "jsonl", "fields": ["a", "b"]})
    with pytest.raises(ValueError, match=r"data\.jsonl:1: missing field\(s\) 'b'"):
        list(reader.read(str(path)))


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="data file not found"):
        list(DatasetReader.by_name("jsonl")().read(str(tmp_path / "nope.jsonl")))


def test_bad_config_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"^fields: expected a list, got 'text'"):
        DatasetReader.from_config({"type": "jsonl", "fields": "text"})
    with pytest.raises(ConfigError, match="manual_multiprocess_sharding cannot be turned off"):
        DatasetReader.from_config({"type": "jsonl", "manual_multiprocess_sharding": False})


@pytest.mark.parametrize(("workers", "world"), [(1, 1), (2, 1), (3, 1), (1, 2), (2, 3)])
def test_shards_are_disjoint_and_complete(
    tmp_path: Path, shard_reader: Callable[..., list[list[Any]]], workers: int, world: int
) -> None:
    path = write_jsonl(tmp_path / "data.jsonl", RECORDS)
    shards = shard_reader(DatasetReader.by_name("jsonl")(), path, workers, world)
    assert len(shards) == workers * world
    ids = [r["id"] for shard in shards for r in shard]
    assert sorted(ids) == list(range(len(RECORDS)))  # every record once, none twice
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1


def test_each_shard_parses_only_its_own_lines(
    tmp_path: Path, shard_reader: Callable[..., list[list[Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_jsonl(tmp_path / "data.jsonl", RECORDS)
    reader = DatasetReader.by_name("jsonl")()
    parsed: list[str] = []
    original = reader.parse_line  # type: ignore[attr-defined]

    def counting(line: str, where: str = "") -> Any:
        parsed.append(where)
        return original(line, where)

    monkeypatch.setattr(reader, "parse_line", counting)
    shard_reader(reader, path, 2, 2)
    assert len(parsed) == len(RECORDS)  # not 4x: sharding happens before parsing


def test_max_instances_is_exact_across_shards(
    tmp_path: Path, shard_reader: Callable[..., list[list[Any]]]
) -> None:
    path = write_jsonl(tmp_path / "data.jsonl", RECORDS)
    reader = DatasetReader.from_config({"type": "jsonl", "max_instances": 10})
    shards = shard_reader(reader, path, 2, 2)
    assert sorted(r["id"] for s in shards for r in s) == list(range(10))


def test_a_list_of_files_is_read_in_order_and_sharded_as_one_stream(
    tmp_path: Path, shard_reader: Callable[..., list[list[Any]]]
) -> None:
    first = write_jsonl(tmp_path / "a.jsonl", RECORDS[:5])
    second = write_jsonl(tmp_path / "b.jsonl", RECORDS[5:])
    reader = DatasetReader.by_name("jsonl")()
    assert list(reader.read([first, Path(second)])) == RECORDS
    shards = shard_reader(reader, [first, second], 2, 1)
    assert sorted(r["id"] for s in shards for r in s) == list(range(len(RECORDS)))
    with pytest.raises(TypeError, match="expected a path or a list of paths"):
        list(reader.read({"train": first}))
