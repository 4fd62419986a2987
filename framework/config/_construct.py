"""`construct` and `Lazy`: the walk that checks and builds values against annotations.

`_Walk` makes one pass over a config: checking (it records every error, builds
nothing) or building (on a config that checked clean). `construct` and `Lazy` run
it twice, check then build. Also here: the annotation helpers that the walk and
the JSON Schema (`framework.config._json_schema`) share, and the error texts' formatting.
`framework.config` is the public face and re-exports what callers use.
"""

from __future__ import annotations

import collections.abc
import difflib
import enum
import inspect
import math
import numbers
import pathlib
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Generic, Optional, TypeVar, Union

from framework.config._signatures import (
    EMPTY,
    AtLeast,
    Given,
    Signature,
    Unresolved,
    accepts_anything,
    signature_of,
)
from framework.errors import ConfigError
from framework.registry import Registrable, describe_error

__all__ = ["MAX_DEPTH", "Lazy", "construct", "is_typed_dict", "typed_dict_fields"]

T = TypeVar("T")

_UNION_TYPES: tuple[Any, ...] = (Union, getattr(types, "UnionType", Union))
_SEQUENCES = (
    list,
    collections.abc.Sequence,
    collections.abc.MutableSequence,
    collections.abc.Iterable,
    collections.abc.Collection,
)
_SETS = (set, frozenset, collections.abc.Set, collections.abc.MutableSet)
_MAPPINGS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)
_NONE = type(None)
# a bare container or number annotation, as what a config can give for it (checked item
# by item): a str is a Sequence to Python, but no list to JSON
_BARE: dict[Any, Any] = {
    list: list[Any],
    tuple: tuple[Any, ...],
    set: set[Any],
    frozenset: frozenset[Any],
    dict: dict[Any, Any],
    **dict.fromkeys(_MAPPINGS[1:], dict[Any, Any]),
    **dict.fromkeys(_SEQUENCES[1:], list[Any]),
    **dict.fromkeys(_SETS[2:], set[Any]),
    **dict.fromkeys((numbers.Number, numbers.Complex, numbers.Real), float),
    **dict.fromkeys((numbers.Rational, numbers.Integral), int),
}
# a dict key that stands for an int (JSON keys are strings): its digits, as JSON writes them
INT_KEY = r"^(0|-?[1-9][0-9]{0,4299})$"
# keys for editors, allowed in any component's config and ignored: its schema's URL
META_KEYS = ("$schema",)
FLOAT_MAX = sys.float_info.max  # an int beyond it is no float
MAX_DEPTH = 50  # mappings and lists within each other: more is a mistake, or an attack


class Lazy(Generic[T]):
    """A config for a `T` that is built later, when more arguments are known.

    Annotate a parameter `Lazy[Vocabulary]`; the constructor receives a `Lazy` and
    calls `lazy.construct(vocab_size=10)` when ready. Keyword arguments given to
    `construct` go to the top-level constructor as they are, and down to nested
    constructors that take them.
    """

    def __init__(
        self,
        annotation: Any,
        params: Any = None,
        *,
        path: str = "",
        extras: Optional[Mapping[str, Any]] = None,
    ) -> None:
        self.annotation = annotation
        self.params = {} if params is None else params
        self.path = path
        self.extras = dict(extras or {})

    def construct(self, **kwargs: Any) -> T:
        extras = {**self.extras, **kwargs}
        params = self.params
        if (
            isinstance(params, str)
            and isinstance(self.annotation, type)
            and issubclass(self.annotation, Registrable)
        ):
            params = {"type": params}  # a name alone is the mapping with only "type"
        if isinstance(params, Mapping) and isinstance(self.annotation, type):
            cls, path = self.annotation, self.path
            built: T = _check_then_build(lambda walk: walk.instance(cls, params, path, kwargs), extras)
            return built
        return construct(self.annotation, self.params, path=self.path, extras=extras)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"Lazy[{_describe(self.annotation)}]({self.params!r})"


def construct(
    annotation: Any,
    value: Any,
    *,
    path: str = "",
    extras: Optional[Mapping[str, Any]] = None,
) -> Any:
    """Convert config `value` into an instance of `annotation`; errors name `path`.

    The whole value is checked first (the walk `validate` runs), so a config with
    several errors raises them together and nothing is constructed.
    """
    return _check_then_build(lambda walk: walk.value(annotation, value, path), extras or {})


def _check_then_build(step: Callable[[_Walk], Any], extras: Mapping[str, Any]) -> Any:
    checking = _Walk(build=False, extras=extras)
    checked(checking, step)
    if checking.errors:
        raise _combined(checking.errors)
    return step(_Walk(build=True, extras=extras))


def checked(walk: _Walk, step: Callable[[_Walk], Any]) -> list[ConfigError]:
    """Run a checking `step`; anything but a `ConfigError` that escapes it (a bug) is one
    more error, so checking a config only ever gives `ConfigError`s."""
    try:
        step(walk)
    except Exception as error:
        walk.errors.append(
            ConfigError(
                "",
                f"the check of this config failed ({describe_error(error)}); this is a bug in "
                "framework's config checking: please report it with the config",
            )
        )
    return walk.errors


def _combined(errors: list[ConfigError]) -> ConfigError:
    if len(errors) == 1:
        return errors[0]
    first, rest = errors[0], errors[1:]
    more = "; ".join(str(e) for e in rest)
    error = ConfigError(
        first.path, f"{first.reason} (and {len(rest)} more: {more})", first.expected, first.got
    )
    error.errors = list(errors)
    return error


class _Walk:
    """One pass over a config against an annotation.

    Checking (`build=False`) records every error and constructs nothing; building
    runs on a config that checked clean, so it only meets errors that constructors
    raise. `extras` are arguments given in code; while checking only their names
    count, and inside a `Lazy` any missing key may still come from `construct`.
    `given` (from `Annotated[.., Given(..)]`) names the extras that the next object
    built receives itself: there, a config key of that name is an error.
    """

    def __init__(
        self, build: bool, extras: Mapping[str, Any], lazy: bool = False, given: frozenset[str] = frozenset()
    ) -> None:
        self.build = build
        self.extras = extras
        self.lazy = lazy
        self.given = given
        self.errors: list[ConfigError] = []
        self.open: list[int] = []  # ids of the mappings and lists being walked, outermost first

    def fail(self, error: ConfigError) -> None:
        if self.build:
            raise error
        self.errors.append(error)

    def _child(self, extras: Mapping[str, Any], lazy: bool, given: frozenset[str] = frozenset()) -> _Walk:
        child = _Walk(self.build, extras, lazy, given)
        child.errors = self.errors  # one list: errors from anywhere are reported together
        child.open = self.open
        return child

    def value(self, annotation: Any, value: Any, path: str) -> Any:
        """Enter a value of the config at `path` and check (or build) it as `annotation`."""
        if not isinstance(value, (Mapping, list, tuple)):
            return self.dispatch(annotation, value, path)
        if not self.open:  # the top of a walk: refuse a config that shared nodes blow up
            from framework.config._shared import MAX_SHARED_EXPANSION, shared_expansion

            if shared_expansion(value, MAX_DEPTH) > MAX_SHARED_EXPANSION:
                return self.fail(
                    ConfigError(
                        path,
                        f"YAML aliases (nodes used at several places) make this config more than "
                        f"{MAX_SHARED_EXPANSION:,} values larger than it is written: write the "
                        "repeated parts out, or use them fewer times",
                    )
                )
        # a YAML alias can make a config contain itself; a deep one would exhaust the stack
        if id(value) in self.open:
            return self.fail(
                ConfigError(path, "the config contains itself here (a YAML alias of an enclosing node)")
            )
        if len(self.open) >= MAX_DEPTH:
            return self.fail(ConfigError(path, f"the config nests more than {MAX_DEPTH} levels deep here"))
        self.open.append(id(value))
        try:
            return self.dispatch(annotation, value, path)
        finally:
            self.open.pop()

    def dispatch(self, annotation: Any, value: Any, path: str) -> Any:
        """`value` (already entered by `value`) against `annotation`."""
        annotation = unwrap(annotation)
        if accepts_anything(annotation):
            return value
        if isinstance(annotation, Unresolved):
            return self.fail(ConfigError(path, annotation.message()))
        origin = typing.get_origin(annotation)
        args = typing.get_args(annotation)
        if origin in _UNION_TYPES:
            return self.union(args, value, path)
        if origin is typing.Literal:
            for choice in args:
                if _same(value, choice) or (
                    isinstance(choice, enum.Enum)
                    and (_same(value, choice.value) or _same(value, choice.name))
                ):
                    return choice
            shown = (repr(a.value) if isinstance(a, enum.Enum) else repr(a) for a in args)
            return self.fail(_mismatch(path, " or ".join(shown), value))
        if origin is Lazy or annotation is Lazy:
            target = args[0] if args else Any
            if isinstance(value, Lazy):
                return value
            if self.build:
                return Lazy(target, value, path=path, extras=self.extras)
            return self._child(self.extras, lazy=True).dispatch(target, value, path)
        if origin is typing.Annotated:
            return self.annotated(args[0], annotation.__metadata__, value, path)
        if origin in _SEQUENCES or origin in _SETS or origin is tuple:
            return self.collection(origin, args, value, path)
        if origin in _MAPPINGS:
            return self.mapping(args, value, path)
        if origin is not None and isinstance(origin, type):  # another generic, e.g. Callable[..]
            return self.plain(origin, value, path)
        if origin is not None:
            return value
        return self.plain(annotation, value, path)

    def annotated(self, annotation: Any, metadata: tuple[Any, ...], value: Any, path: str) -> Any:
        # names given in code: while checking, they count as present
        given = frozenset(name for m in metadata if isinstance(m, Given) for name in m.names)
        extras = self.extras if self.build else {**dict.fromkeys(given), **self.extras}
        walk = self._child(extras, self.lazy, given) if given else self
        before = len(self.errors)
        built = walk.dispatch(annotation, value, path)
        for limit in (m for m in metadata if isinstance(m, AtLeast)):
            size = _size(value)
            if typing.get_origin(unwrap(annotation)) in _SETS and isinstance(value, (list, tuple)):
                try:  # a set holds each item once: [1, 1] is one item
                    size = len(set(value))
                except TypeError:  # unhashable items: an error of their own
                    pass
            if len(self.errors) == before and size is not None and not size >= limit.minimum:  # NaN too
                self.fail(_mismatch(path, _describe_at_least(annotation, limit, value), value))
        return built

    def plain(self, cls: Any, value: Any, path: str) -> Any:
        if cls in _PRIMITIVES:
            accepts, name = _PRIMITIVES[cls]
            if cls is float and isinstance(value, int) and not -FLOAT_MAX <= value <= FLOAT_MAX:
                return self.fail(_mismatch(path, f"a float (at most {FLOAT_MAX:.2g} in size)", value))
            if accepts(value):
                return float(value) if cls is float else int(value) if cls is int else value
            return self.fail(_mismatch(path, name, value))
        if not isinstance(cls, type):
            return value
        if is_typed_dict(cls):
            return self.typed_dict(cls, value, path)
        if getattr(cls, "_is_protocol", False):  # isinstance() raises unless runtime-checkable
            if getattr(cls, "_is_runtime_protocol", False) and isinstance(value, cls):
                return value
            return self.fail(
                _mismatch(path, f"{cls.__name__} (made in code: a config cannot give one)", value)
            )
        if isinstance(value, cls):
            return value
        if issubclass(cls, enum.Enum):
            for member in cls:
                if _same(value, member.value) or _same(value, member.name):
                    return member
            return self.fail(_mismatch(path, " or ".join(repr(m.value) for m in cls), value))
        if issubclass(cls, pathlib.PurePath) and isinstance(value, str):
            return cls(value)
        if issubclass(cls, Registrable) and isinstance(value, str):
            value = {"type": value}
        # a builtin class (type, bytearray, an exception) is never made from a mapping of
        # keys: its signature cannot be read, so no key could be checked (the schema agrees)
        if isinstance(value, Mapping) and _is_constructible(cls) and not is_builtin(cls):
            return self.instance(cls, value, path, {})
        if cls.__module__ == "builtins" or issubclass(cls, collections.abc.Callable):  # type: ignore[arg-type]
            return self.fail(_mismatch(path, cls.__name__, value))
        return self.fail(_mismatch(path, f"{cls.__name__} (a mapping of its arguments)", value))

    def typed_dict(self, cls: type, value: Any, path: str) -> Any:
        if not isinstance(value, Mapping):
            return self.fail(_mismatch(path, f"{cls.__name__} (a mapping)", value))
        hints, required = typed_dict_fields(cls)
        built = {}
        for key, item in value.items():
            if key in hints:
                built[key] = self.value(hints[key], item, _join(path, key))
            else:
                accepted = ", ".join(hints) or "none"
                self.fail(
                    ConfigError(
                        _join(path, key), f"unknown key for {cls.__name__}. Accepted keys: {accepted}"
                    )
                )
        for key in [name for name in hints if name in required and name not in value]:
            self.fail(ConfigError(_join(path, key), f"missing required key for {cls.__name__}"))
        return built

    def union(self, args: tuple[Any, ...], value: Any, path: str) -> Any:
        if value is None and _NONE in args:
            return None
        tried: list[list[ConfigError]] = []
        for candidate in (a for a in args if a is not _NONE):
            trial = _Walk(build=False, extras=self.extras, lazy=self.lazy, given=self.given)
            trial.open = self.open
            trial.dispatch(candidate, value, path)
            if not trial.errors:
                return self.dispatch(candidate, value, path) if self.build else value
            tried.append(trial.errors)

        def rank(errors: list[ConfigError]) -> tuple[bool, bool, int]:
            # best: the value had this alternative's shape and its "type" named one
            # of its components, so the errors are about what is inside
            shallow = any(e.path == path for e in errors)
            misnamed = any(e.path == _join(path, "type") for e in errors)
            return shallow, misnamed, len(errors)

        best = min(map(rank, tried))
        if len(tried) > 1 and best[0]:
            return self.fail(_mismatch(path, " or ".join(_describe(a) for a in args), value))
        # several alternatives that did not know the name: each error says what it has
        for errors in [e for e in tried if rank(e) == best][: None if best[1] else 1]:
            for error in errors:
                self.fail(error)
        return None

    def collection(self, origin: Any, args: tuple[Any, ...], value: Any, path: str) -> Any:
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, collections.abc.Iterable):
            return self.fail(_mismatch(path, "a list", value))
        items = list(value)
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            if len(items) != len(args):
                return self.fail(_mismatch(path, f"a list of {len(args)} items", value))
            return tuple(self.value(a, v, _join(path, str(i))) for i, (a, v) in enumerate(zip(args, items)))
        item_type = args[0] if args else Any
        built = [self.value(item_type, v, _join(path, str(i))) for i, v in enumerate(items)]
        if origin is tuple:
            return tuple(built)
        if origin in _SETS:
            return self.set_of(origin, item_type, built, path)
        return built

    def set_of(self, origin: Any, item_type: Any, items: list[Any], path: str) -> Any:
        """A set of `items`; an item that cannot be in one is an error, not a TypeError."""
        reason = unhashable(item_type)
        for index, item in enumerate(items):
            if reason is None:
                try:
                    hash(item)  # checking: the item as the config gives it (a list, say)
                    continue
                except TypeError:
                    pass
            self.fail(
                ConfigError(
                    _join(path, str(index)),
                    f"a {_describe(item_type) if reason else type(item).__name__} cannot be in a set "
                    f"({reason or 'it is not hashable'}): make the parameter a list, or give no items",
                )
            )
            return None
        if not self.build:
            return None
        return frozenset(items) if origin is frozenset else set(items)

    def mapping(self, args: tuple[Any, ...], value: Any, path: str) -> Any:
        if not isinstance(value, Mapping):
            return self.fail(_mismatch(path, "a mapping", value))
        key_type, value_type = (unwrap(args[0]), args[1]) if args else (Any, Any)
        pairs = [
            (self.key(key_type, k, _join(path, k)), self.value(value_type, v, _join(path, k)))
            for k, v in value.items()
        ]
        return dict(pairs) if self.build else None

    def key(self, key_type: Any, key: Any, path: str) -> Any:
        """A mapping's key as `key_type`; an int key is written as its digits (JSON keys are strings)."""
        if key_type is int and isinstance(key, str):
            if re.fullmatch(INT_KEY, key):
                return int(key)
            return self.fail(_mismatch(path, 'an int key (its digits, as in "7")', key))
        return self.value(key_type, key, path)

    def instance(self, cls: type, config: Mapping[str, Any], path: str, explicit: Mapping[str, Any]) -> Any:
        if self.given:  # this object receives them; objects inside it see them as extras
            explicit = {**{name: self.extras[name] for name in self.given if name in self.extras}, **explicit}
            return self._child(self.extras, self.lazy).instance(cls, config, path, explicit)
        params = dict(config)
        named = "type" in params  # a "type" of null is a wrong name, not a missing one
        type_name = params.pop("type", None)
        factory: Callable[..., Any] = cls
        if issubclass(cls, Registrable):
            is_base = inspect.isabstract(cls) or bool(cls.registry_entries())
            chosen = type_name if named or not is_base else cls.default_implementation
            if named or chosen is not None:
                if not isinstance(chosen, str):
                    return self.fail(_mismatch(_join(path, "type"), "str", chosen))
                try:
                    factory = cls.by_name(chosen)
                except Exception as error:  # unknown, not importable, not a subclass
                    return self.fail(ConfigError(_join(path, "type"), str(error)))
            elif is_base:
                available = ", ".join(repr(n) for n in cls.list_available()) or "none registered"
                return self.fail(
                    ConfigError(
                        _join(path, "type"), f"missing 'type' for {cls.__name__}; one of: {available}"
                    )
                )
        elif named:
            params["type"] = type_name  # not ours: an ordinary argument, or an unknown key below
        return self.arguments(factory, params, path, explicit)

    def arguments(
        self,
        factory: Callable[..., Any],
        params: dict[str, Any],
        path: str,
        explicit: Mapping[str, Any],
        top_level: bool = False,
    ) -> Any:
        """Match `params` to `factory`'s parameters, check each, and call it when building."""
        signature = signature_of(factory)
        owner = signature.owner
        before = len(self.errors)
        for key in [key for key in META_KEYS if key in params]:
            meta = params.pop(key)
            if not isinstance(meta, str):
                self.fail(_mismatch(_join(path, key), "str (a schema's URL)", meta))
        kwargs: dict[str, Any] = dict(explicit)
        self._check_explicit(signature, params, path, explicit)
        given = dict(explicit)  # what the constructor gets, as configs (for its config_checks)
        for name, parameter in signature.parameters.items():
            if name in kwargs:
                continue
            if name in params:
                given[name] = params.pop(name)
                kwargs[name] = self.value(parameter.annotation, given[name], _join(path, name))
            elif name in self.extras:
                kwargs[name] = given[name] = self.extras[name]
            elif top_level and isinstance(parameter.default, Mapping) and not self.build:
                self.value(parameter.annotation, parameter.default, _join(path, name))  # a default config
            elif parameter.default is EMPTY and not self.lazy:
                where = "" if top_level else f" for {owner}"
                self.fail(
                    ConfigError(
                        _join(path, name),
                        f"missing required key{where}",
                        expected=_describe(parameter.annotation),
                    )
                )
        kwargs.update(self._leftover(signature, params, path, explicit, top_level))
        if not self.build and not self.lazy:  # building, the constructor runs them itself
            self.config_checks(factory, given, path, before)
        if not self.build or len(self.errors) > before:
            return None
        positional = [p for p in signature.parameters.values() if p.positional]
        given_up_to = max((i + 1 for i, p in enumerate(positional) if p.name in kwargs), default=0)
        args = [kwargs.pop(p.name, p.default) for p in positional[:given_up_to]]
        try:
            return factory(*args, **kwargs)
        except ConfigError:
            raise
        except (TypeError, ValueError) as error:
            raise ConfigError(path, f"{owner}: {error}") from error

    def _check_explicit(
        self, signature: Signature, params: dict[str, Any], path: str, explicit: Mapping[str, Any]
    ) -> None:
        """Arguments code passes (`explicit`) must be parameters, and not in the config too."""
        owner = signature.owner
        if not signature.accepts_extra:
            for name in [key for key in explicit if key not in signature.parameters]:
                accepted = ", ".join(signature.parameters) or "none"
                self.fail(
                    ConfigError(
                        _join(path, name),
                        f"{owner} takes no argument {name!r} (given in code). Accepted keys: {accepted}",
                    )
                )
        for name in [key for key in params if key in explicit]:
            params.pop(name)
            self.fail(
                ConfigError(
                    _join(path, name),
                    f"{owner} receives {name!r} from the code that builds it, not from the config: "
                    "remove this key",
                )
            )

    def _leftover(
        self,
        signature: Signature,
        params: dict[str, Any],
        path: str,
        explicit: Mapping[str, Any],
        top_level: bool,
    ) -> dict[str, Any]:
        """The keys no parameter took: for `**kwargs` if the factory has it, else errors."""
        owner = signature.owner
        if signature.accepts_extra:
            for key in [key for key in params if not isinstance(key, str) or key in signature.reserved]:
                params.pop(key)  # Python cannot pass it as a keyword: the call would fail
                why = "it names self" if isinstance(key, str) else "its name must be a string"
                self.fail(
                    ConfigError(
                        _join(path, key), f"{owner} cannot take this key through **kwargs ({why}): remove it"
                    )
                )
            return params  # what **kwargs takes as it is
        known = [name for name in signature.parameters if name not in explicit]
        what = "top-level key" if top_level else f"key for {owner}"
        for key in params:
            close = difflib.get_close_matches(key, known, n=1) if isinstance(key, str) else []
            hint = f" Did you mean {close[0]!r}?" if close else ""
            self.fail(
                ConfigError(
                    _join(path, key),
                    f"unknown {what}.{hint} Accepted keys: {', '.join(known) or 'none'}",
                )
            )
        return {}

    def config_checks(
        self, factory: Callable[..., Any], given: Mapping[str, Any], path: str, before: int
    ) -> None:
        """The rules `factory` declares on its arguments (`config_checks`), on this config."""
        checks = getattr(factory, "config_checks", None)
        if not callable(checks):
            return
        parameters = signature_of(factory).parameters
        own = {path, *(_join(path, name) for name in parameters)}
        if any(error.path in own for error in self.errors[before:]):
            return  # one of its own keys is wrong: its rules would misread it
        arguments = {name: given.get(name, parameter.default) for name, parameter in parameters.items()}
        try:
            found = list(checks(arguments))
        except Exception as error:  # a component's own rule is broken: say so, never crash
            owner = signature_of(factory).owner
            found = [("", f"{owner}.config_checks raised {describe_error(error)} on this config")]
        for key, problem in found:
            self.fail(ConfigError(_join(path, key) if key else path, problem))


def unwrap(annotation: Any) -> Any:
    """`annotation` as a config gives it: a `NewType("UserId", int)` is an int, a bare
    `Mapping` a `dict[Any, Any]`, `numbers.Real` a float."""
    while isinstance(annotation, typing.NewType):
        annotation = annotation.__supertype__
    try:
        return _BARE.get(annotation, annotation)
    except TypeError:  # unhashable: no bare class
        return annotation


def _size(value: Any) -> Optional[float]:
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
    if origin in _UNION_TYPES:
        reasons = [unhashable(a) for a in typing.get_args(annotation)]
        return reasons[0] if all(reasons) else None
    kind = origin if origin is not None else annotation
    if kind in (list, dict, set) or kind in _SEQUENCES or kind in _MAPPINGS:
        return "a list or a mapping is not hashable"
    if kind in _SETS and kind is not frozenset:
        return "a set is not hashable"
    if isinstance(kind, type) and origin is None and getattr(kind, "__hash__", None) is None:
        return f"{kind.__name__} objects are not hashable"
    return None


def _same(value: Any, choice: Any) -> bool:
    """`value` from a config is `choice` as JSON compares them: 1.0 is 1, but true is not."""
    return bool(value == choice) and isinstance(value, bool) == isinstance(choice, bool)


def _accepts_int(value: Any) -> bool:
    # 2.0 is an integer to JSON (and to JSON Schema): it is taken as 2
    return not isinstance(value, bool) and (
        isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    )


_PRIMITIVES: dict[Any, tuple[Callable[[Any], bool], str]] = {
    bool: (lambda v: isinstance(v, bool), "bool"),
    int: (_accepts_int, "int"),
    float: (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "float"),
    str: (lambda v: isinstance(v, str), "str"),
    _NONE: (lambda v: v is None, "null"),
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


def _is_constructible(cls: type) -> bool:
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):  # a NamedTuple: made by __new__
        return True
    defines_init = any("__init__" in vars(klass) for klass in cls.__mro__[:-1])
    return defines_init or issubclass(cls, Registrable)


def _join(path: str, key: Any) -> str:
    if (
        not isinstance(key, str)
        or not key
        or not key.isprintable()
        or len(key) > _SHOWN_CHARACTERS
        or any(c.isspace() or c == "." for c in key)
    ):
        key = _shown(key)  # quoted, so the path stays one line and its dots stay separators
    return f"{path}.{key}" if path else key


def _describe(annotation: Any) -> str:
    if annotation is _NONE:
        return "null"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _describe_at_least(annotation: Any, limit: AtLeast, value: Any = None) -> str:
    if isinstance(value, (list, tuple, Mapping)):
        unit = "keys" if isinstance(value, Mapping) else "items"
        return f"{_describe(annotation)} of at least {limit.minimum} {unit}"
    if annotation is str or isinstance(value, str):
        return "a non-empty str" if limit.minimum == 1 else f"a str of at least {limit.minimum} characters"
    if limit.minimum == 1 and annotation is int:
        return "a positive int"
    return f"{_describe(annotation)} of at least {limit.minimum}"


def _mismatch(path: str, expected: str, got: Any) -> ConfigError:
    shown = _shown(got) if isinstance(got, (str, int, float, bool, type(None))) else f"a {type(got).__name__}"
    return ConfigError(path, f"expected {expected}, got {shown}", expected=expected, got=got)


_SHOWN_CHARACTERS = 100


def _shown(value: Any) -> str:
    """`repr(value)` cut to a readable length; it never raises (Python will not print an
    int of over 4300 digits)."""
    try:
        text = repr(value)
    except ValueError:
        text = f"an int of {len(format(value, 'x')) * math.log10(16):.0f} digits"
    if len(text) > _SHOWN_CHARACTERS:
        text = f"{text[: _SHOWN_CHARACTERS - 20]}... ({len(text)} characters)"
    return text
