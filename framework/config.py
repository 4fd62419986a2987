"""Building objects from config mappings, guided by constructor type annotations.

`construct(Annotation, value)` turns JSON-like data into the annotated type:
a mapping with ``"type"`` becomes the registered subclass of a `Registrable`,
lists, dicts, tuples, unions, literals, enums and paths are converted element by
element, and `Lazy[T]` defers construction until `Lazy.construct(**extras)`.
Every error is a `ConfigError` naming the dotted path of the bad key.
"""

from __future__ import annotations

import collections.abc
import difflib
import enum
import inspect
import json
import pathlib
import types
import typing
from collections.abc import Callable, Mapping
from os import PathLike
from typing import Any, Generic, Optional, TypeVar, Union

from framework.errors import ConfigError, RegistryError
from framework.registry import Registrable

__all__ = ["Lazy", "construct", "load_config"]

T = TypeVar("T")

_EMPTY = inspect.Parameter.empty
_SEQUENCES = (
    list,
    collections.abc.Sequence,
    collections.abc.MutableSequence,
    collections.abc.Iterable,
    collections.abc.Collection,
)
_MAPPINGS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)


def load_config(path: Union[str, PathLike[str]]) -> dict[str, Any]:
    """Read a JSON config, or a YAML one (``.yaml``/``.yml``, needs PyYAML)."""
    path = pathlib.Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError("", f"cannot read config file {path}: {error.strerror or error}") from error
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as error:
            raise ConfigError("", f"{path} is YAML: `pip install pyyaml` to read it") from error
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise ConfigError("", f"{path} is not valid YAML: {error}") from error
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ConfigError("", f"{path} is not valid JSON: {error}") from error
    if not isinstance(data, dict):
        raise ConfigError("", f"{path} must hold a mapping at the top, got {type(data).__name__}")
    return data


class Lazy(Generic[T]):
    """A config for a `T` that is built later, when more arguments are known.

    Annotate a parameter ``Lazy[Vocabulary]``; the constructor receives a `Lazy` and
    calls ``lazy.construct(vocab_size=10)`` when ready. Keyword arguments given to
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
        if isinstance(self.params, Mapping) and _is_class(self.annotation):
            built: T = _construct_object(self.annotation, self.params, self.path, extras, kwargs)
        else:
            built = construct(self.annotation, self.params, path=self.path, extras=extras)
        return built

    def __repr__(self) -> str:
        return f"Lazy[{_describe(self.annotation)}]({self.params!r})"


def construct(
    annotation: Any,
    value: Any,
    *,
    path: str = "",
    extras: Optional[Mapping[str, Any]] = None,
) -> Any:
    """Convert config `value` into an instance of `annotation`; errors name `path`."""
    extras = extras or {}
    if annotation is _EMPTY or annotation is Any or annotation is object:
        return value
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)

    if origin is Union or origin is types.UnionType:
        return _construct_union(args, value, path, extras)
    if origin is typing.Literal:
        if value in args:
            return value
        raise _mismatch(path, " or ".join(repr(a) for a in args), value)
    if origin is Lazy or annotation is Lazy:
        target = args[0] if args else Any
        if isinstance(value, Lazy):
            return value
        return Lazy(target, value, path=path, extras=extras)
    if origin is typing.Annotated:
        return construct(args[0], value, path=path, extras=extras)
    if origin in _SEQUENCES or origin in (set, frozenset, collections.abc.Set, tuple):
        return _construct_collection(origin, args, value, path, extras)
    if origin in _MAPPINGS:
        if not isinstance(value, Mapping):
            raise _mismatch(path, "a mapping", value)
        key_type, value_type = args if args else (Any, Any)
        return {
            construct(key_type, k, path=_join(path, str(k)), extras=extras): construct(
                value_type, v, path=_join(path, str(k)), extras=extras
            )
            for k, v in value.items()
        }
    if origin is not None and _is_class(origin):  # some other generic, e.g. Callable[..]
        return _construct_plain(origin, value, path, extras)
    if origin is not None:
        return value
    if isinstance(annotation, TypeVar):
        return value
    return _construct_plain(annotation, value, path, extras)


def _construct_plain(cls: Any, value: Any, path: str, extras: Mapping[str, Any]) -> Any:
    if cls is bool:
        if isinstance(value, bool):
            return value
        raise _mismatch(path, "bool", value)
    if cls is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _mismatch(path, "int", value)
    if cls is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _mismatch(path, "float", value)
    if cls is str:
        if isinstance(value, str):
            return value
        raise _mismatch(path, "str", value)
    if cls is type(None):
        if value is None:
            return None
        raise _mismatch(path, "null", value)
    if not _is_class(cls):
        return value
    if isinstance(value, cls):
        return value
    if issubclass(cls, enum.Enum):
        for member in cls:
            if value == member.value or value == member.name:
                return member
        raise _mismatch(path, " or ".join(repr(m.value) for m in cls), value)
    if issubclass(cls, pathlib.PurePath) and isinstance(value, str):
        return cls(value)
    if cls in (list, tuple, set, frozenset, dict):
        return construct(getattr(typing, cls.__name__.capitalize(), cls), value, path=path)
    if issubclass(cls, Registrable) and isinstance(value, str):
        value = {"type": value}
    if isinstance(value, Mapping) and _is_constructible(cls):
        return _construct_object(cls, value, path, extras, {})
    if cls.__module__ == "builtins" or issubclass(cls, collections.abc.Callable):  # type: ignore[arg-type]
        raise _mismatch(path, cls.__name__, value)
    raise _mismatch(path, f"{cls.__name__} (a mapping of its arguments)", value)


def _construct_union(args: tuple[Any, ...], value: Any, path: str, extras: Mapping[str, Any]) -> Any:
    if value is None and type(None) in args:
        return None
    candidates = [a for a in args if a is not type(None)]
    errors: list[ConfigError] = []
    for candidate in candidates:
        try:
            return construct(candidate, value, path=path, extras=extras)
        except ConfigError as error:
            errors.append(error)
    if len(errors) == 1:
        raise errors[0]
    # Prefer the error from deepest inside the value: it is the most specific one.
    deepest = max(errors, key=lambda e: e.path.count("."))
    if deepest.path != path:
        raise deepest
    expected = " or ".join(_describe(a) for a in args)
    raise _mismatch(path, expected, value)


def _construct_collection(
    origin: Any, args: tuple[Any, ...], value: Any, path: str, extras: Mapping[str, Any]
) -> Any:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, collections.abc.Iterable):
        raise _mismatch(path, "a list", value)
    items = list(value)
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        if len(items) != len(args):
            raise _mismatch(path, f"a list of {len(args)} items", value)
        return tuple(
            construct(a, v, path=_join(path, str(i)), extras=extras)
            for i, (a, v) in enumerate(zip(args, items))
        )
    item_type = args[0] if args else Any
    built = [construct(item_type, v, path=_join(path, str(i)), extras=extras) for i, v in enumerate(items)]
    if origin is tuple:
        return tuple(built)
    if origin in (set, collections.abc.Set):
        return set(built)
    if origin is frozenset:
        return frozenset(built)
    return built


def _construct_object(
    cls: type,
    config: Mapping[str, Any],
    path: str,
    extras: Mapping[str, Any],
    explicit: Mapping[str, Any],
) -> Any:
    params = dict(config)
    type_name = params.pop("type", None)
    factory: Callable[..., Any] = cls
    if issubclass(cls, Registrable):
        is_base = inspect.isabstract(cls) or cls in _bases_with_registry()
        chosen = type_name if type_name is not None or not is_base else cls.default_implementation
        if chosen is not None:
            if not isinstance(chosen, str):
                raise _mismatch(_join(path, "type"), "str", chosen)
            try:
                factory = cls.by_name(chosen)
            except RegistryError as error:
                raise ConfigError(_join(path, "type"), str(error)) from error
        elif is_base:
            available = ", ".join(repr(n) for n in cls.list_available()) or "none registered"
            raise ConfigError(_join(path, "type"), f"missing 'type' for {cls.__name__}; one of: {available}")
    elif type_name is not None:
        params["type"] = type_name  # not ours: an ordinary argument, or an unknown key below

    signature_owner, parameters = _parameters(factory)
    kwargs: dict[str, Any] = dict(explicit)
    for name, (annotation, default) in parameters.items():
        if name == "**" or name in kwargs:
            continue
        if name in params:
            value = params.pop(name)
            kwargs[name] = construct(annotation, value, path=_join(path, name), extras=extras)
        elif name in extras:
            kwargs[name] = extras[name]
        elif default is _EMPTY:
            raise ConfigError(
                _join(path, name),
                f"missing required key for {signature_owner}",
                expected=_describe(annotation),
            )
    if params:
        key = sorted(params)[0]
        known = [n for n in parameters if n != "**"]
        close = difflib.get_close_matches(key, known, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            _join(path, key),
            f"unknown key for {signature_owner}.{hint} Accepted keys: {', '.join(known) or 'none'}",
        )
    try:
        return factory(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as error:
        raise ConfigError(path, f"{signature_owner}: {error}") from error


def _bases_with_registry() -> set[type]:
    from framework.registry import _REGISTRY

    return set(_REGISTRY)


_Parameters = dict[str, tuple[Any, Any]]


def _parameters(factory: Callable[..., Any]) -> tuple[str, _Parameters]:
    """Parameter name -> (resolved annotation, default); ``"**"`` marks **kwargs."""
    if isinstance(factory, type):
        function: Callable[..., Any] = factory.__init__  # type: ignore[misc]
        owner = factory.__name__
        skip_first = True
    else:
        function = factory
        owner = getattr(factory, "__qualname__", repr(factory))
        skip_first = False
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return owner, {"**": (Any, _EMPTY)}
    hints = _type_hints(function)
    result: _Parameters = {}
    for index, parameter in enumerate(signature.parameters.values()):
        if skip_first and index == 0:
            continue
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            result["**"] = (Any, _EMPTY)
        elif parameter.kind is not inspect.Parameter.VAR_POSITIONAL:
            annotation = hints.get(parameter.name, parameter.annotation)
            if isinstance(annotation, str):
                annotation = Any
            result[parameter.name] = (annotation, parameter.default)
    if "**" in result and isinstance(factory, type):
        # **kwargs are forwarded to a parent class: take its parameters as ours.
        del result["**"]
        parent = next((k for k in factory.__mro__[1:] if "__init__" in vars(k)), object)
        if parent is not object:
            for name, spec in _parameters(parent)[1].items():
                result.setdefault(name, spec)
    return owner, result


def _type_hints(function: Callable[..., Any]) -> dict[str, Any]:
    """Resolved annotations; one that can't be resolved degrades to Any alone."""
    try:
        return typing.get_type_hints(function, include_extras=True)
    except Exception:
        pass
    hints: dict[str, Any] = {}
    namespace = getattr(function, "__globals__", {})
    for name, annotation in getattr(function, "__annotations__", {}).items():
        try:
            probe = types.SimpleNamespace(__annotations__={name: annotation})
            hints[name] = typing.get_type_hints(probe, namespace, include_extras=True)[name]
        except Exception:  # an unresolvable forward reference: accept anything there
            hints[name] = Any
    return hints


def _is_class(value: Any) -> bool:
    return isinstance(value, type)


def _is_constructible(cls: type) -> bool:
    defines_init = any("__init__" in vars(klass) for klass in cls.__mro__[:-1])
    return defines_init or issubclass(cls, Registrable)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _describe(annotation: Any) -> str:
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _mismatch(path: str, expected: str, got: Any) -> ConfigError:
    shown = (
        f"{got!r}" if isinstance(got, (str, int, float, bool, type(None))) else (f"a {type(got).__name__}")
    )
    return ConfigError(path, f"expected {expected}, got {shown}", expected=expected, got=got)
