"""What a config can be handed as: every bad file, path or object is a `ConfigError`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import pytest

from framework import DatasetReader, Registrable
from framework.cli import main
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


# -- a config that contains itself, or nests very deep -----------------------------------


class Node(Registrable):
    pass


def test_a_self_referencing_or_very_deep_config_is_a_config_error_not_a_crash(tmp_path: Path) -> None:
    import yaml

    from framework.config import MAX_DEPTH, load_config, validate

    @Node.register("wrap")
    class Wrap(Node):
        def __init__(self, inner: Optional[Node] = None, items: Optional[list[Any]] = None) -> None:
            self.inner = inner

    def nested(depth: int) -> Any:
        config = None
        for _ in range(depth):
            config = {"type": "wrap", "inner": config}
        return config

    looped = yaml.safe_load("a: &a {type: wrap, inner: *a}")["a"]
    assert [(e.path, "contains itself" in e.reason) for e in validate(looped, Node)] == [("inner", True)]
    listed = yaml.safe_load("a: &a [1, *a]")
    assert [e.path for e in validate({"type": "wrap", "items": listed["a"]}, Node)] == ["items.1"]
    assert validate(nested(MAX_DEPTH), Node) == []
    assert Node.from_config(nested(MAX_DEPTH))
    (error,) = validate(nested(2000), Node)
    assert error.path == ".".join(["inner"] * MAX_DEPTH) and "levels deep" in error.reason
    (tmp_path / "loop.yaml").write_text("dataset_reader: &a {type: text, x: *a}\ndata_path: x\n")
    assert [e.path for e in validate(load_config(tmp_path / "loop.yaml"))][:1] == ["dataset_reader.x"]


@pytest.mark.parametrize("name", ["deep.json", "deep.yaml"])
def test_a_config_file_nested_past_the_parser_s_stack_is_a_config_error(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / name).write_text('{"dataset_reader": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert main(["config", "validate", str(tmp_path / name)]) == 1
    assert (
        capsys.readouterr().out
        == f"<root>: {tmp_path / name} nests too deep to read (more than 50 levels is a mistake)\n"
    )


# -- a string config is a file, for validate as for from_config --------------------------


def test_validate_reads_a_string_or_path_config_as_a_file_like_from_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from framework.config import validate

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "reader.json").write_text('{"type": "text", "max_tokens": 0}')
    (tmp_path / "reader.py").write_text("raise SystemExit('validate imported reader.py')\n")
    for config in ("reader.json", tmp_path / "reader.json"):
        assert [str(e) for e in validate(config, "DatasetReader")] == [
            "max_tokens: expected a positive int, got 0"
        ]
    (tmp_path / "reader.json").write_text('{"type": "text", "max_tokens": 8}')
    assert validate("reader.json", "DatasetReader") == []
    assert type(DatasetReader.from_config("reader.json")).__name__ == "TextReader"
    (missing,) = validate("nowhere.json", "DatasetReader")
    assert "cannot read config file nowhere.json" in str(missing)
    (tmp_path / "run.yaml").write_text("dataset_reader: text\ndata_path: x\ndata_loader: {batch_size: 1}\n")
    assert validate(tmp_path / "run.yaml") == []


# -- the suffix's case -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["up.YAML", "up.Yml"])
def test_a_yaml_suffix_in_any_case_is_read_as_yaml(name: str, tmp_path: Path) -> None:
    from framework.config import load_config

    (tmp_path / name).write_text("dataset_reader: text\ndata_path: x\n")
    assert load_config(tmp_path / name) == {"dataset_reader": "text", "data_path": "x"}


@pytest.mark.timeout(30)
def test_a_config_file_that_never_ends_is_an_error_not_a_memory_blowup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `framework config validate /dev/zero` must not read until memory runs out: a file past
    # the cap (shrunk here, so the test is fast) is one ConfigError.
    import framework.config._load

    monkeypatch.setattr(framework.config._load, "MAX_CONFIG_BYTES", 1000)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"data_path": "x" * 2000}))
    for path in (big, Path("/dev/zero")):
        errors = validate(path)
        assert len(errors) == 1 and "larger than" in str(errors[0]), errors
    small = tmp_path / "small.json"
    small.write_text(
        json.dumps({"dataset_reader": "text", "data_path": "x", "data_loader": {"batch_size": 1}})
    )
    assert validate(small) == []
