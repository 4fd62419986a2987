"""`construct` and `Lazy`: the walk that checks and builds values against annotations.

`_Walk` makes one pass over a config: checking (it records every error, builds
nothing) or building (on a config that checked clean). `construct` and `Lazy` run
it twice, check then build. What it knows of annotations is in `_annotations` (shared
with the JSON Schema), how its errors read in `_texts`. `framework.config` is the
public face and re-exports what callers use.
"""

from __future__ import annotations

import collections.abc
import difflib
import enum
import inspect
import pathlib
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any, Generic, Optional, TypeVar

from framework.config._annotations import (
    FLOAT_MAX,
    INT_KEY,
    MAPPINGS,
    META_KEYS,
    NONE,
    PRIMITIVES,
    SEQUENCES,
    SETS,
    UNION_TYPES,
    is_builtin,
    is_constructible,
    is_typed_dict,
    same_as_json,
    size_of,
    typed_dict_fields,
    unhashable,
    unwrap,
)
from framework.config._signatures import (
    EMPTY,
    AtLeast,
    Given,
    Signature,
    Unresolved,
    accepts_anything,
    signature_of,
)
from framework.config._texts import combined, describe, describe_at_least, join_path, mismatch
from framework.errors import ConfigError
from framework.registry import Registrable, describe_error

__all__ = ["MAX_DEPTH", "Lazy", "checked", "construct"]

T = TypeVar("T")

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
        return f"Lazy[{describe(self.annotation)}]({self.params!r})"


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
        raise combined(checking.errors)
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
        if origin in UNION_TYPES:
            return self.union(args, value, path)
        if origin is typing.Literal:
            for choice in args:
                if same_as_json(value, choice) or (
                    isinstance(choice, enum.Enum)
                    and (same_as_json(value, choice.value) or same_as_json(value, choice.name))
                ):
                    return choice
            shown = (repr(a.value) if isinstance(a, enum.Enum) else repr(a) for a in args)
            return self.fail(mismatch(path, " or ".join(shown), value))
        if origin is Lazy or annotation is Lazy:
            target = args[0] if args else Any
            if isinstance(value, Lazy):
                return value
            if self.build:
                return Lazy(target, value, path=path, extras=self.extras)
            return self._child(self.extras, lazy=True).dispatch(target, value, path)
        if origin is typing.Annotated:
            return self.annotated(args[0], annotation.__metadata__, value, path)
        if origin in SEQUENCES or origin in SETS or origin is tuple:
            return self.collection(origin, args, value, path)
        if origin in MAPPINGS:
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
            size = size_of(value)
            if typing.get_origin(unwrap(annotation)) in SETS and isinstance(value, (list, tuple)):
                try:  # a set holds each item once: [1, 1] is one item
                    size = len(set(value))
                except TypeError:  # unhashable items: an error of their own
                    pass
            if len(self.errors) == before and size is not None and not size >= limit.minimum:  # NaN too
                self.fail(mismatch(path, describe_at_least(annotation, limit, value), value))
        return built

    def plain(self, cls: Any, value: Any, path: str) -> Any:
        if cls in PRIMITIVES:
            accepts, name = PRIMITIVES[cls]
            if cls is float and isinstance(value, int) and not -FLOAT_MAX <= value <= FLOAT_MAX:
                return self.fail(mismatch(path, f"a float (at most {FLOAT_MAX:.2g} in size)", value))
            if accepts(value):
                return float(value) if cls is float else int(value) if cls is int else value
            return self.fail(mismatch(path, name, value))
        if not isinstance(cls, type):
            return value
        if is_typed_dict(cls):
            return self.typed_dict(cls, value, path)
        if getattr(cls, "_is_protocol", False):  # isinstance() raises unless runtime-checkable
            if getattr(cls, "_is_runtime_protocol", False) and isinstance(value, cls):
                return value
            return self.fail(
                mismatch(path, f"{cls.__name__} (made in code: a config cannot give one)", value)
            )
        if isinstance(value, cls):
            return value
        if issubclass(cls, enum.Enum):
            for member in cls:
                if same_as_json(value, member.value) or same_as_json(value, member.name):
                    return member
            return self.fail(mismatch(path, " or ".join(repr(m.value) for m in cls), value))
        if issubclass(cls, pathlib.PurePath) and isinstance(value, str):
            return cls(value)
        if issubclass(cls, Registrable) and isinstance(value, str):
            value = {"type": value}
        # a builtin class (type, bytearray, an exception) is never made from a mapping of
        # keys: its signature cannot be read, so no key could be checked (the schema agrees)
        if isinstance(value, Mapping) and is_constructible(cls) and not is_builtin(cls):
            return self.instance(cls, value, path, {})
        if cls.__module__ == "builtins" or issubclass(cls, collections.abc.Callable):  # type: ignore[arg-type]
            return self.fail(mismatch(path, cls.__name__, value))
        return self.fail(mismatch(path, f"{cls.__name__} (a mapping of its arguments)", value))

    def typed_dict(self, cls: type, value: Any, path: str) -> Any:
        if not isinstance(value, Mapping):
            return self.fail(mismatch(path, f"{cls.__name__} (a mapping)", value))
        hints, required = typed_dict_fields(cls)
        built = {}
        for key, item in value.items():
            if key in hints:
                built[key] = self.value(hints[key], item, join_path(path, key))
            else:
                accepted = ", ".join(hints) or "none"
                self.fail(
                    ConfigError(
                        join_path(path, key), f"unknown key for {cls.__name__}. Accepted keys: {accepted}"
                    )
                )
        for key in [name for name in hints if name in required and name not in value]:
            self.fail(ConfigError(join_path(path, key), f"missing required key for {cls.__name__}"))
        return built

    def union(self, args: tuple[Any, ...], value: Any, path: str) -> Any:
        if value is None and NONE in args:
            return None
        tried: list[list[ConfigError]] = []
        for candidate in (a for a in args if a is not NONE):
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
            misnamed = any(e.path == join_path(path, "type") for e in errors)
            return shallow, misnamed, len(errors)

        best = min(map(rank, tried))
        if len(tried) > 1 and best[0]:
            return self.fail(mismatch(path, " or ".join(describe(a) for a in args), value))
        # several alternatives that did not know the name: each error says what it has
        for errors in [e for e in tried if rank(e) == best][: None if best[1] else 1]:
            for error in errors:
                self.fail(error)
        return None

    def collection(self, origin: Any, args: tuple[Any, ...], value: Any, path: str) -> Any:
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, collections.abc.Iterable):
            return self.fail(mismatch(path, "a list", value))
        items = list(value)
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            if len(items) != len(args):
                return self.fail(mismatch(path, f"a list of {len(args)} items", value))
            pairs = enumerate(zip(args, items))
            return tuple(self.value(a, v, join_path(path, str(i))) for i, (a, v) in pairs)
        item_type = args[0] if args else Any
        built = [self.value(item_type, v, join_path(path, str(i))) for i, v in enumerate(items)]
        if origin is tuple:
            return tuple(built)
        if origin in SETS:
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
                    join_path(path, str(index)),
                    f"a {describe(item_type) if reason else type(item).__name__} cannot be in a set "
                    f"({reason or 'it is not hashable'}): make the parameter a list, or give no items",
                )
            )
            return None
        if not self.build:
            return None
        return frozenset(items) if origin is frozenset else set(items)

    def mapping(self, args: tuple[Any, ...], value: Any, path: str) -> Any:
        if not isinstance(value, Mapping):
            return self.fail(mismatch(path, "a mapping", value))
        key_type, value_type = (unwrap(args[0]), args[1]) if args else (Any, Any)
        pairs = [
            (self.key(key_type, k, join_path(path, k)), self.value(value_type, v, join_path(path, k)))
            for k, v in value.items()
        ]
        return dict(pairs) if self.build else None

    def key(self, key_type: Any, key: Any, path: str) -> Any:
        """A mapping's key as `key_type`; an int key is written as its digits (JSON keys are strings)."""
        if key_type is int and isinstance(key, str):
            if re.fullmatch(INT_KEY, key):
                return int(key)
            return self.fail(mismatch(path, 'an int key (its digits, as in "7")', key))
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
                    return self.fail(mismatch(join_path(path, "type"), "str", chosen))
                try:
                    factory = cls.by_name(chosen)
                except Exception as error:  # unknown, not importable, not a subclass
                    return self.fail(ConfigError(join_path(path, "type"), str(error)))
            elif is_base:
                available = ", ".join(repr(n) for n in cls.list_available()) or "none registered"
                return self.fail(
                    ConfigError(
                        join_path(path, "type"), f"missing 'type' for {cls.__name__}; one of: {available}"
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
                self.fail(mismatch(join_path(path, key), "str (a schema's URL)", meta))
        kwargs: dict[str, Any] = dict(explicit)
        self._check_explicit(signature, params, path, explicit)
        given = dict(explicit)  # what the constructor gets, as configs (for its config_checks)
        for name, parameter in signature.parameters.items():
            if name in kwargs:
                continue
            if name in params:
                given[name] = params.pop(name)
                kwargs[name] = self.value(parameter.annotation, given[name], join_path(path, name))
            elif name in self.extras:
                kwargs[name] = given[name] = self.extras[name]
            elif top_level and isinstance(parameter.default, Mapping) and not self.build:
                self.value(parameter.annotation, parameter.default, join_path(path, name))  # a default config
            elif parameter.default is EMPTY and not self.lazy:
                where = "" if top_level else f" for {owner}"
                self.fail(
                    ConfigError(
                        join_path(path, name),
                        f"missing required key{where}",
                        expected=describe(parameter.annotation),
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
                        join_path(path, name),
                        f"{owner} takes no argument {name!r} (given in code). Accepted keys: {accepted}",
                    )
                )
        for name in [key for key in params if key in explicit]:
            params.pop(name)
            self.fail(
                ConfigError(
                    join_path(path, name),
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
                reason = f"{owner} cannot take this key through **kwargs ({why}): remove it"
                self.fail(ConfigError(join_path(path, key), reason))
            return params  # what **kwargs takes as it is
        known = [name for name in signature.parameters if name not in explicit]
        what = "top-level key" if top_level else f"key for {owner}"
        for key in params:
            close = difflib.get_close_matches(key, known, n=1) if isinstance(key, str) else []
            hint = f" Did you mean {close[0]!r}?" if close else ""
            self.fail(
                ConfigError(
                    join_path(path, key),
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
        own = {path, *(join_path(path, name) for name in parameters)}
        if any(error.path in own for error in self.errors[before:]):
            return  # one of its own keys is wrong: its rules would misread it
        arguments = {name: given.get(name, parameter.default) for name, parameter in parameters.items()}
        try:
            found = list(checks(arguments))
        except Exception as error:  # a component's own rule is broken: say so, never crash
            owner = signature_of(factory).owner
            found = [("", f"{owner}.config_checks raised {describe_error(error)} on this config")]
        for key, problem in found:
            self.fail(ConfigError(join_path(path, key) if key else path, problem))
