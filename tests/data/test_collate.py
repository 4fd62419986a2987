"""DefaultDataCollator: padding, stacking, numbers, strings, nesting, clear errors."""

from __future__ import annotations

import pytest
import torch

from framework.data.collate import DataCollator, DefaultDataCollator
from framework.errors import CollateError

pytestmark = pytest.mark.timeout(30)


def test_pads_variable_length_tensors_with_zero_and_stacks() -> None:
    batch = DefaultDataCollator()([{"t": torch.tensor([1, 2, 3])}, {"t": torch.tensor([4])}])
    assert torch.equal(batch["t"], torch.tensor([[1, 2, 3], [4, 0, 0]]))


def test_pads_every_dimension_of_2d_tensors() -> None:
    a, b = torch.ones(2, 3), torch.ones(3, 1)
    out = DefaultDataCollator()([{"m": a}, {"m": b}])["m"]
    assert out.shape == (2, 3, 3)
    assert out[0, 2].sum() == 0 and out[1, :, 1:].sum() == 0 and out.sum() == 9


def test_same_shape_tensors_are_stacked() -> None:
    out = DefaultDataCollator()([{"x": torch.zeros(2, 2)}, {"x": torch.ones(2, 2)}])["x"]
    assert out.shape == (2, 2, 2)


def test_numbers_become_tensors_floats_float() -> None:
    batch = DefaultDataCollator()(
        [{"i": 1, "f": 0.5, "b": True, "m": 1}, {"i": 2, "f": 1.5, "b": False, "m": 2.5}]
    )
    assert batch["i"].dtype == torch.int64 and batch["i"].tolist() == [1, 2]
    assert batch["f"].dtype == torch.float32
    assert batch["b"].dtype == torch.bool
    assert batch["m"].dtype == torch.float32  # ints and floats mixed: floats win


def test_strings_to_lists_and_lists_of_strings_pass_through() -> None:
    batch = DefaultDataCollator()([{"s": "a", "w": ["x", "y"]}, {"s": "b", "w": ["z"]}])
    assert batch["s"] == ["a", "b"]
    assert batch["w"] == [["x", "y"], ["z"]]


def test_lists_of_numbers_are_padded_tensors() -> None:
    out = DefaultDataCollator()([{"ids": [1, 2]}, {"ids": [3]}])["ids"]
    assert torch.equal(out, torch.tensor([[1, 2], [3, 0]]))


def test_nested_dicts_are_batched_recursively() -> None:
    batch = DefaultDataCollator()(
        [{"a": {"b": torch.tensor([1]), "c": "x"}}, {"a": {"b": torch.tensor([2, 3]), "c": "y"}}]
    )
    assert torch.equal(batch["a"]["b"], torch.tensor([[1, 0], [2, 3]]))
    assert batch["a"]["c"] == ["x", "y"]


def test_unbatchable_value_names_the_field_and_why() -> None:
    with pytest.raises(CollateError, match=r"'meta\.handle'.*object") as info:
        DefaultDataCollator()([{"meta": {"handle": object()}}, {"meta": {"handle": object()}}])
    assert info.value.field == "meta.handle"
    assert isinstance(info.value, TypeError)


def test_mixed_types_in_a_field_name_the_instance() -> None:
    with pytest.raises(CollateError, match=r"'x'.*instance 1 holds str"):
        DefaultDataCollator()([{"x": 1}, {"x": "one"}])


def test_missing_field_is_reported() -> None:
    with pytest.raises(CollateError, match="same fields"):
        DefaultDataCollator()([{"x": 1, "y": 2}, {"x": 1}])


def test_tensors_of_different_rank_cannot_be_padded() -> None:
    with pytest.raises(CollateError, match="dimensions"):
        DefaultDataCollator()([{"x": torch.zeros(2)}, {"x": torch.zeros(2, 2)}])


def test_default_collator_is_registered_through_the_plugin_path() -> None:
    assert DataCollator.by_name("default") is DefaultDataCollator
    entry = DataCollator.registry_entries()["default"]
    assert entry.plugin == "core"
    assert isinstance(DataCollator.from_config({}), DefaultDataCollator)
