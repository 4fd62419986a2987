"""Rules that only a constructor could see before are `validate()`'s too, from one source:
the error `validate()` lists for a config is the one the constructor raises."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from framework import DataLoader, DatasetReader
from framework.config import json_schema, validate
from framework.errors import ConfigError

OFF = "cannot be turned off"
READER_CASES = [
    ({"type": "text", "num_buckets": 10, "vocabulary": "v.txt"}, "vocabulary", "num_buckets or vocabulary"),
    ({"type": "jsonl", "manual_multiprocess_sharding": False}, "manual_multiprocess_sharding", OFF),
    ({"type": "csv", "manual_distributed_sharding": False}, "manual_distributed_sharding", OFF),
    ({"type": "jsonl", "max_instances": -1}, "max_instances", "max_instances must be None or >= 0"),
    ({"type": "text", "max_instances": -3}, "max_instances", "max_instances must be None or >= 0"),
    ({"type": "csv", "delimiter": ";;"}, "delimiter", "delimiter must be one character"),
    ({"type": "csv", "delimiter": ""}, "delimiter", "delimiter must be one character"),
    ({"type": "csv", "field_types": {"a": "bool"}}, "field_types", "unknown type(s) {'a': 'bool'}"),
]  # fmt: skip


def _run(reader: Any, loader: Any = None) -> dict[str, Any]:
    return {"dataset_reader": reader, "data_path": "data.txt", "data_loader": loader or {"batch_size": 2}}


@pytest.mark.parametrize(("config", "key", "message"), READER_CASES)
def test_a_reader_rule_is_reported_by_validate_and_raised_by_the_constructor(
    config: dict[str, Any], key: str, message: str
) -> None:
    [error] = validate(_run(config))
    assert error.path == f"dataset_reader.{key}" and message in error.reason
    [alone] = validate(config, "DatasetReader")
    assert (alone.path, alone.reason) == (key, error.reason)
    with pytest.raises(ConfigError) as raised:  # from_config: the same error
        DatasetReader.from_config(config)
    assert (raised.value.path, raised.value.reason) == (key, error.reason)
    cls = DatasetReader.by_name(config["type"])
    arguments = {k: v for k, v in config.items() if k != "type"}
    with pytest.raises(ConfigError) as direct:  # the constructor in code: the same error
        cls(**arguments)
    assert (direct.value.path, direct.value.reason) == (key, error.reason)


def test_good_reader_options_still_build() -> None:
    assert DatasetReader.from_config({"type": "csv", "delimiter": "\t", "field_types": {"a": "int"}})
    assert DatasetReader.from_config(
        {"type": "jsonl", "max_instances": 0, "manual_multiprocess_sharding": True}
    )
    assert validate(_run({"type": "text", "num_buckets": 10})) == []


@pytest.mark.parametrize("sampler_size", [10, 10.0])
def test_a_sampler_batch_size_above_max_instances_in_memory_is_a_validate_error(
    tmp_path: Path, sampler_size: Any
) -> None:
    loader = {"batch_sampler": {"type": "bucket", "batch_size": sampler_size}, "max_instances_in_memory": 5}
    [error] = validate(_run({"type": "jsonl"}, loader))
    assert error.path == "data_loader.max_instances_in_memory"
    assert "at least the batch_sampler's batch size (10)" in error.reason
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"x": 1}) + "\n", encoding="utf-8")
    reader = DatasetReader.from_config({"type": "jsonl"})
    with pytest.raises(ConfigError) as raised:
        DataLoader.from_config(loader, reader=reader, data_path=str(data))
    assert raised.value.reason == error.reason


def test_a_sampler_without_a_fixed_batch_size_is_not_compared() -> None:
    loader = {"batch_sampler": {"type": "max_tokens", "max_tokens": 100}, "max_instances_in_memory": 5}
    assert validate(_run({"type": "jsonl"}, loader)) == []
    loader = {"batch_sampler": "bucket", "max_instances_in_memory": 5}  # its own error only
    assert [e.path for e in validate(_run({"type": "jsonl"}, loader))] == [
        "data_loader.batch_sampler.batch_size"
    ]


def test_the_schema_states_the_rules_it_can() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json_schema("DatasetReader"))
    for config, _, _ in READER_CASES:
        assert not validator.is_valid(config), config
    assert validator.is_valid({"type": "csv", "delimiter": "\t", "field_types": {"a": "int"}})
    assert validator.is_valid({"type": "text", "num_buckets": None, "vocabulary": "v.txt"})
    assert validator.is_valid("text")  # a name alone: its defaults pass its rules
    run = jsonschema.Draft202012Validator(json_schema())
    for device in ["gpu0", "1", "", -1, "cuda:-1", "cuda:128", 128, " cuda"]:
        assert not run.is_valid(_run({"type": "jsonl"}, {"batch_size": 2, "cuda_device": device})), device
    for device in [0, 127, "cuda", "cuda:0", "cuda:127", "cpu"]:
        assert run.is_valid(_run({"type": "jsonl"}, {"batch_size": 2, "cuda_device": device})), device


@pytest.mark.parametrize("device", ["gpu0", "1", "", -1, "cuda:-1", "cuda:128", 128, " cuda"])
def test_a_device_torch_would_refuse_is_a_config_error_in_validate_and_the_constructor(
    tmp_path: Path, device: Any
) -> None:
    loader = {"batch_size": 2, "cuda_device": device}
    [error] = validate(_run({"type": "jsonl"}, loader))
    assert error.path == "data_loader.cuda_device"
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"x": 1}) + "\n", encoding="utf-8")
    reader = DatasetReader.from_config({"type": "jsonl"})
    with pytest.raises(ConfigError) as raised:  # not torch's RuntimeError
        DataLoader.from_config(loader, reader=reader, data_path=str(data))
    assert raised.value.reason == error.reason
    loader_class = DataLoader.by_name("multiprocess")
    with pytest.raises(ConfigError):  # in code, and when moved later
        loader_class(reader, str(data), batch_size=2, cuda_device=device)
    built = loader_class(reader, str(data), batch_size=2)
    with pytest.raises(ConfigError):
        built.set_target_device(device)


@pytest.mark.parametrize(
    ("device", "expected"), [(0, "cuda:0"), (1.0, "cuda:1"), ("cuda:1", "cuda:1"), ("cpu", "cpu")]
)
def test_a_device_index_is_a_cuda_device_whatever_this_machine_has(
    tmp_path: Path, device: Any, expected: str
) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"x": 1}) + "\n", encoding="utf-8")
    reader = DatasetReader.from_config({"type": "jsonl"})
    assert validate(_run({"type": "jsonl"}, {"batch_size": 2, "cuda_device": device})) == []
    loader = DataLoader.from_config(
        {"batch_size": 2, "cuda_device": device, "max_instances_in_memory": 2},
        reader=reader,
        data_path=str(data),
    )
    assert str(loader.cuda_device) == expected


# -- validate knows the value rules that construction enforces ---------------------------


def test_loader_cross_field_rules_are_one_function_for_validate_and_the_constructor() -> None:
    from framework.config import validate
    from framework.data import MultiProcessDataLoader
    from framework.errors import ConfigError

    loader = {"batch_sampler": "bucket", "batch_size": 4, "persistent_workers": True}
    config = {"dataset_reader": "text", "data_path": "x", "data_loader": loader}
    reasons = {e.path: e.reason for e in validate(config)}
    assert "mutually exclusive with batch_size" in reasons["data_loader.batch_size"]
    assert "needs num_workers > 0" in reasons["data_loader.persistent_workers"]
    with pytest.raises(ConfigError, match=r"mutually exclusive with batch_size.*needs num_workers > 0"):
        MultiProcessDataLoader.from_config({**loader, "batch_sampler": {"type": "bucket", "batch_size": 2}},
                                           reader=DatasetReader.by_name("text")(), data_path="x")  # fmt: skip
