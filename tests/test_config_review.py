"""Breaks found by the hostile review of the config layer (issue 24): each test here
failed before its fix, or is marked xfail(strict) with the fix it needs."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from framework import Registrable
from framework.config import json_schema, validate
from framework.errors import ConfigError


class Thing(Registrable):
    pass


def judges(config: dict[Any, Any]) -> tuple[list[str], bool, bool]:
    """What `validate`, `from_config` and the schema say of a `Thing` config."""
    errors = [str(e) for e in validate(config, Thing)]
    try:
        Thing.from_config(config)
        built = True
    except ConfigError:
        built = False
    schema_ok = jsonschema.Draft202012Validator(json_schema(Thing)).is_valid(config)
    return errors, built, schema_ok


@pytest.fixture
def forwarding() -> None:
    @Thing.register("kw")
    class Kw(Thing):
        def __init__(self, a: int = 0, **kwargs: Any) -> None:
            self.kwargs = kwargs


@pytest.mark.usefixtures("forwarding")
@pytest.mark.parametrize("key", ["self", 1])
def test_a_key_kwargs_cannot_take_is_refused_by_validate_and_the_schema(key: Any) -> None:
    # Before: validate() and the schema accepted {"self": 1} (and a YAML int key) for a
    # class whose __init__ ends in **kwargs, while from_config raised (Python cannot pass
    # self=, nor a keyword that is not a string).
    errors, built, schema_ok = judges({"type": "kw", key: 1})
    assert not built
    assert len(errors) == 1 and errors[0].startswith(f"{key}: Kw cannot take this key through **kwargs")
    if isinstance(key, str):  # JSON has only string keys
        assert not schema_ok


@pytest.mark.usefixtures("forwarding")
def test_other_keys_still_go_to_kwargs() -> None:
    assert judges({"type": "kw", "a": 1, "x-y": 2, "cls": 3}) == ([], True, True)
