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
