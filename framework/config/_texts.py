"""How config errors read: a value quoted to a readable length, a key's place in the
config, what was expected, several errors as one."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, get_args, get_origin

from framework.config._annotations import NONE
from framework.config._signatures import AtLeast
from framework.errors import ConfigError

__all__ = ["SHOWN_CHARACTERS", "combined", "describe", "describe_at_least", "join_path", "mismatch", "shown"]


def combined(errors: list[ConfigError]) -> ConfigError:
    if len(errors) == 1:
        return errors[0]
    first, rest = errors[0], errors[1:]
    more = "; ".join(str(e) for e in rest)
    error = ConfigError(
        first.path, f"{first.reason} (and {len(rest)} more: {more})", first.expected, first.got
    )
    error.errors = list(errors)
    return error


def join_path(path: str, key: Any) -> str:
    if (
        not isinstance(key, str)
        or not key
        or not key.isprintable()
        or len(key) > SHOWN_CHARACTERS
        or any(c.isspace() or c == "." for c in key)
    ):
        key = shown(key)  # quoted, so the path stays one line and its dots stay separators
    return f"{path}.{key}" if path else key


def describe(annotation: Any) -> str:
    if annotation is NONE:
        return "null"
    if get_origin(annotation) is Annotated:  # its rules are said where a value breaks them
        return describe(get_args(annotation)[0])
    if isinstance(annotation, type):
        return annotation.__name__
    if get_origin(annotation) is list and len(get_args(annotation)) == 1:
        return f"list of {describe(get_args(annotation)[0])}"
    return str(annotation).replace("typing.", "")


def describe_at_least(annotation: Any, limit: AtLeast, value: Any = None) -> str:
    if isinstance(value, (list, tuple, Mapping)):
        unit = "keys" if isinstance(value, Mapping) else "items"
        return f"{describe(annotation)} of at least {limit.minimum} {unit}"
    if annotation is str or isinstance(value, str):
        return "a non-empty str" if limit.minimum == 1 else f"a str of at least {limit.minimum} characters"
    if limit.minimum == 1 and annotation is int:
        return "a positive int"
    return f"{describe(annotation)} of at least {limit.minimum}"


def mismatch(path: str, expected: str, got: Any) -> ConfigError:
    quoted = shown(got) if isinstance(got, (str, int, float, bool, type(None))) else f"a {type(got).__name__}"
    return ConfigError(path, f"expected {expected}, got {quoted}", expected=expected, got=got)


SHOWN_CHARACTERS = 100


def shown(value: Any) -> str:
    """`repr(value)` cut to a readable length; it never raises (Python will not print an
    int of over 4300 digits)."""
    try:
        text = repr(value)
    except ValueError:
        text = f"an int of {len(format(value, 'x')) * math.log10(16):.0f} digits"
    if len(text) > SHOWN_CHARACTERS:
        text = f"{text[: SHOWN_CHARACTERS - 20]}... ({len(text)} characters)"
    return text
