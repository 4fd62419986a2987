"""What the config walk and the JSON Schema both need to know about annotations: which
containers a config's lists and mappings stand for, what a bare class means, whether a
class takes a config at all."""

from __future__ import annotations

import collections.abc
import numbers
import sys
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Optional, Union

from framework.registry import Registrable

__all__ = [
    "BARE",
    "FLOAT_MAX",
    "INT_KEY",
    "MAPPINGS",
    "META_KEYS",
    "NONE",
    "PRIMITIVES",
    "SEQUENCES",
    "SETS",
    "UNION_TYPES",
    "accepts_int",
    "is_builtin",
    "is_constructible",
    "is_typed_dict",
    "same_as_json",
    "size_of",
    "typed_dict_fields",
    "unhashable",
    "unwrap",
]

UNION_TYPES: tuple[Any, ...] = (Union, getattr(types, "UnionType", Union))


SEQUENCES = (
    list,
    collections.abc.Sequence,
    collections.abc.MutableSequence,
    collections.abc.Iterable,
    collections.abc.Collection,
)


SETS = (set, frozenset, collections.abc.Set, collections.abc.MutableSet)


MAPPINGS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)


NONE = type(None)


# a bare container or number annotation, as what a config can give for it (checked item
# by item): a str is a Sequence to Python, but no list to JSON
BARE: dict[Any, Any] = {
    list: list[Any],
    tuple: tuple[Any, ...],
    set: set[Any],
    frozenset: frozenset[Any],
    dict: dict[Any, Any],
    **dict.fromkeys(MAPPINGS[1:], dict[Any, Any]),
    **dict.fromkeys(SEQUENCES[1:], list[Any]),
    **dict.fromkeys(SETS[2:], set[Any]),
    **dict.fromkeys((numbers.Number, numbers.Complex, numbers.Real), float),
    **dict.fromkeys((numbers.Rational, numbers.Integral), int),
}


# a dict key that stands for an int (JSON keys are strings): its digits, as JSON writes them
INT_KEY = r"^(0|-?[1-9][0-9]{0,4299})$"


# keys for editors, allowed in any component's config and ignored: its schema's URL
META_KEYS = ("$schema",)


FLOAT_MAX = sys.float_info.max  # an int beyond it is no float


def unwrap(annotation: Any) -> Any:
    """`annotation` as a config gives it: a `NewType("UserId", int)` is an int, a bare
    `Mapping` a `dict[Any, Any]`, `numbers.Real` a float."""
    while isinstance(annotation, typing.NewType):
        annotation = annotation.__supertype__
    try:
        return BARE.get(annotation, annotation)
    except TypeError:  # unhashable: no bare class
        return annotation


def size_of(value: Any) -> Optional[float]:
    """What `AtLeast` compares: a number, or the length of a str, list or mapping."""
    if isinstance(value, (str, list, tuple, Mapping)):
        return len(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return None


def unhashable(annotation: Any) -> Optional[str]:
    """Why no value built for `annotation` can be in a set, or None if one can."""
    annotation = unwrap(annotation)
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return unhashable(typing.get_args(annotation)[0])
    if origin in UNION_TYPES:
        reasons = [unhashable(a) for a in typing.get_args(annotation)]
        return reasons[0] if all(reasons) else None
    kind = origin if origin is not None else annotation
    if kind in (list, dict, set) or kind in SEQUENCES or kind in MAPPINGS:
        return "a list or a mapping is not hashable"
    if kind in SETS and kind is not frozenset:
        return "a set is not hashable"
    if isinstance(kind, type) and origin is None and getattr(kind, "__hash__", None) is None:
        return f"{kind.__name__} objects are not hashable"
    return None


def same_as_json(value: Any, choice: Any) -> bool:
    """`value` from a config is `choice` as JSON compares them: 1.0 is 1, but true is not."""
    return bool(value == choice) and isinstance(value, bool) == isinstance(choice, bool)


def accepts_int(value: Any) -> bool:
    # 2.0 is an integer to JSON (and to JSON Schema): it is taken as 2
    return not isinstance(value, bool) and (
        isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    )


PRIMITIVES: dict[Any, tuple[Callable[[Any], bool], str]] = {
    bool: (lambda v: isinstance(v, bool), "bool"),
    int: (accepts_int, "int"),
    float: (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "float"),
    str: (lambda v: isinstance(v, str), "str"),
    NONE: (lambda v: v is None, "null"),
}


def is_typed_dict(cls: type) -> bool:
    """A TypedDict class, from `typing` or `typing_extensions` (which has its own)."""
    return issubclass(cls, dict) and hasattr(cls, "__required_keys__") and hasattr(cls, "__total__")


def typed_dict_fields(cls: type) -> tuple[dict[str, Any], set[str]]:
    """A TypedDict's keys with their annotations (unwrapped), and the required keys.

    `Required`/`NotRequired` are read from the resolved annotations: with string
    annotations (`from __future__ import annotations`) the class's own
    `__required_keys__` cannot see them.
    """
    fields: dict[str, Any] = {}
    required: set[str] = set(getattr(cls, "__required_keys__", ()))
    for name, annotation in typing.get_type_hints(cls, include_extras=True).items():
        while typing.get_origin(annotation) in (typing.Required, typing.NotRequired):
            if typing.get_origin(annotation) is typing.Required:
                required.add(name)
            else:
                required.discard(name)
            annotation = typing.get_args(annotation)[0]
        fields[name] = annotation
    return fields, required


def is_builtin(cls: type) -> bool:
    """One of Python's builtin classes (a class made by `exec` has that module name too)."""
    import builtins

    return getattr(builtins, cls.__qualname__, None) is cls


def is_constructible(cls: type) -> bool:
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):  # a NamedTuple: made by __new__
        return True
    defines_init = any("__init__" in vars(klass) for klass in cls.__mro__[:-1])
    return defines_init or issubclass(cls, Registrable)
