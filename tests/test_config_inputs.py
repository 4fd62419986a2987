"""What a config can be handed as: every bad file, path or object is a `ConfigError`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from framework import DatasetReader
from framework.config import load_config, validate
from framework.errors import ConfigError


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"latin1{suffix}"
    path.write_bytes('{"type": "text", "tokenizer": "caf\u00e9"}'.encode("latin-1"))
    for attempt in (lambda: load_config(path), lambda: DatasetReader.from_config(path)):
        with pytest.raises(ConfigError, match="not UTF-8"):
            attempt()
    [error] = validate(path, "DatasetReader")
    assert "not UTF-8" in str(error) and str(path) in str(error)


def test_a_nul_in_the_path_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        DatasetReader.from_config("a\0b.json")
    [error] = validate("a\0b.json")
    assert "cannot read config file" in str(error)


@pytest.mark.parametrize("config", [[], 3, None, b"config.json"])
def test_a_config_that_is_neither_mapping_nor_path_is_a_config_error(config: Any) -> None:
    with pytest.raises(ConfigError, match="expected a config mapping, or a JSON or YAML file's path"):
        DatasetReader.from_config(config)


def _laughs(levels: int, copies: int) -> str:
    """YAML whose aliases make `copies ** levels` values out of a few hundred bytes."""
    lines = ['l0: &l0 ["lol"]']
    for level in range(1, levels + 1):
        lines.append(f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * copies)}]")
    return "\n".join(
        ["dataset_reader:", "  type: csv", "  fields:", "    - x", "  field_types:", "    bomb:"]
        + ["      " + line for line in lines]
        + ["data_path: x.csv", "data_loader: {batch_size: 2}"]
    )


@pytest.fixture
def counted_walk(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many values the config walk dispatches on."""
    from framework.config._construct import _Walk

    calls = [0]
    original = _Walk.dispatch

    def counting(self: _Walk, annotation: Any, value: Any, path: str) -> Any:
        calls[0] += 1
        return original(self, annotation, value, path)

    monkeypatch.setattr(_Walk, "dispatch", counting)
    return calls


@pytest.mark.timeout(30)  # before the fix: a walk of hundreds of millions of values
def test_yaml_aliases_that_multiply_a_config_are_refused_before_the_walk(
    tmp_path: Path, counted_walk: list[int]
) -> None:
    pytest.importorskip("yaml")
    path = tmp_path / "laughs.yaml"
    path.write_text(_laughs(levels=9, copies=9), encoding="utf-8")  # 9**9: 387 million values
    assert len(path.read_bytes()) < 1000
    errors = validate(path)
    assert [e.path for e in errors] == ["dataset_reader"]
    assert "YAML aliases" in errors[0].reason
    with pytest.raises(ConfigError, match="YAML aliases"):
        DatasetReader.from_config(load_config(path)["dataset_reader"])
    assert counted_walk[0] < 100  # each run walks a few top-level values, not the copies


def test_an_alias_used_a_few_times_is_checked_at_each_place(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    path = tmp_path / "shared.yaml"
    path.write_text(
        "dataset_reader: {type: csv, fields: &f [a, 7]}\n"
        "data_path: x.csv\n"
        "data_loader: {batch_sampler: {type: bucket, batch_size: 2, sorting_keys: *f}}\n",
        encoding="utf-8",
    )
    assert [e.path for e in validate(path)] == [
        "dataset_reader.fields.1",
        "data_loader.batch_sampler.sorting_keys.1",
    ]
