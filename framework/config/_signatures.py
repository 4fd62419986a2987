"""What a constructor accepts: its parameters, their resolved annotations, its docs.

Config checking and building (`framework.config`) and the JSON Schema
(`framework.config._json_schema`) read constructors through this one module, so the two can
never disagree about which keys a component takes.
"""

from __future__ import annotations

import functools
import inspect
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Optional, TypeVar

import attrs

from framework.errors import ConfigError

__all__ = [
    "EMPTY",
    "AtLeast",
    "ConfigChecks",
    "Given",
    "Parameter",
    "Signature",
    "Unresolved",
    "accepts_anything",
    "arg_docs",
    "first_paragraph",
    "parameter_docs",
    "signature_of",
]

EMPTY: Any = inspect.Parameter.empty


@attrs.frozen
class Unresolved:
    """An annotation that does not resolve: a value given for it cannot be checked."""

    owner: str
    name: str
    text: str
    reason: str

    def message(self) -> str:
        return (
            f"cannot check the value for {self.owner}.{self.name}: its annotation {self.text!r} "
            f"does not resolve ({self.reason}). Import that name at the top of the module that "
            "defines the class (not under `if TYPE_CHECKING:`), or leave this key out"
        )


@attrs.frozen
class AtLeast:
    """`Annotated` metadata: a number of at least `minimum`, or a string that long."""

    minimum: int


@attrs.frozen
class ConfigChecks:
    """A component's rules on its arguments together: `config_checks = ConfigChecks(...)`.

    `problems` takes the arguments (the config's values, defaults filled in, nested
    components still configs) and returns `(key, what to change)` pairs; the
    constructor raises them and `framework.config.validate` reports them. `json_schema`
    is what of them JSON Schema can say, added to the component's schema.
    """

    problems: Callable[[Mapping[str, Any]], Iterable[tuple[str, str]]]
    json_schema: Mapping[str, Any] = attrs.field(factory=dict)

    def __call__(self, arguments: Mapping[str, Any]) -> Iterable[tuple[str, str]]:
        return self.problems(arguments)

    def extended(
        self,
        problems: Callable[[Mapping[str, Any]], Iterable[tuple[str, str]]],
        json_schema: Optional[Mapping[str, Any]] = None,
    ) -> ConfigChecks:
        """These rules and `problems` (a subclass's own), as one `ConfigChecks`."""
        first = self.problems

        def both(arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
            return [*first(arguments), *problems(arguments)]

        return ConfigChecks(both, _joined(self.json_schema, json_schema or {}))

    def enforce(self, arguments: Mapping[str, Any]) -> None:
        """Raise what `problems` finds in `arguments`, as a constructor does: a
        `ConfigError` naming the key (`errors` holding each, when there are several)."""
        found = [ConfigError(key, problem) for key, problem in self.problems(arguments)]
        if found:
            error = ConfigError(found[0].path, "; ".join(e.reason for e in found))
            error.errors = found if len(found) > 1 else [error]
            raise error


def _joined(first: Mapping[str, Any], second: Mapping[str, Any]) -> dict[str, Any]:
    """Both schemas as one: `"properties"` merged name by name (a name in both: each
    of its schemas under `allOf`), any other key both give under `allOf`."""
    joined = dict(first)
    later: dict[str, Any] = {}
    for key, value in second.items():
        if key == "properties" and isinstance(joined.get(key), Mapping):
            properties = dict(joined[key])
            for name, schema in value.items():
                properties[name] = {"allOf": [properties[name], schema]} if name in properties else schema
            joined[key] = properties
        elif key in joined:
            later[key] = value
        else:
            joined[key] = value
    if later:
        joined["allOf"] = [*joined.get("allOf", []), later]
    return joined


@attrs.frozen
class Given:
    """`Annotated` metadata: these arguments come from code (`from_config` extras)."""

    names: tuple[str, ...]


@attrs.frozen
class Parameter:
    name: str
    annotation: Any
    default: Any  # EMPTY when the key is required
    positional: bool = False  # positional-only: a config names it, the call passes it by position


@attrs.frozen
class Signature:
    """The keys a factory takes; `accepts_extra`: unknown keys go to its `**kwargs`."""

    owner: str
    parameters: dict[str, Parameter]
    accepts_extra: bool
    # names `**kwargs` cannot take: each `__init__`'s own first parameter (`self`)
    reserved: frozenset[str] = frozenset()


@functools.lru_cache(maxsize=4096)
def signature_of(factory: Callable[..., Any]) -> Signature:
    """The parameters of a class's `__init__` (or of a function), cached per factory.

    A constructor that takes `**kwargs` is taken to forward them to the next
    `__init__` in the built class's MRO (as AllenNLP assumes; a mixin listed before
    the component forwards to the component), so those parameters are its keys too.
    Keys that no constructor names are passed through to `**kwargs` only where the
    chain ends in a `**kwargs` that nothing forwards: anywhere else the parent
    would reject them, so they are unknown keys.
    """
    if isinstance(factory, type) and issubclass(factory, tuple) and hasattr(factory, "_fields"):
        return _named_tuple_signature(factory)
    if isinstance(factory, type):
        return _class_signature(factory)
    owner = getattr(factory, "__qualname__", repr(factory))
    return _function_signature(factory, owner, skip_first=False) or Signature(owner, {}, True)


def _class_signature(cls: type) -> Signature:
    """The keys of `cls`'s `__init__`, following `**kwargs` along `cls`'s own MRO.

    `super().__init__(**kwargs)` reaches the next class in the MRO of the object
    being built, not of the class that wrote it: a mixin listed before the component
    forwards to the component."""
    owner = cls.__name__
    parameters: dict[str, Parameter] = {}
    reserved: set[str] = set()
    definers = [klass for klass in cls.__mro__ if "__init__" in vars(klass)]
    for index, klass in enumerate(definers):
        if klass is object:  # no __init__ at all; or a **kwargs that nothing forwards
            return Signature(owner, parameters, index > 0, frozenset(reserved - set(parameters)))
        step = _function_signature(klass.__init__, klass.__name__, skip_first=True)  # type: ignore[misc]
        if step is None:  # a builtin without a signature: accept anything
            return Signature(owner, parameters, True, frozenset(reserved - set(parameters)))
        reserved.update(_first_parameter(klass.__init__))  # type: ignore[misc]
        for name, spec in step.parameters.items():
            parameters.setdefault(name, spec)
        if not step.accepts_extra:
            break
    return Signature(owner, parameters, False)


def _first_parameter(function: Callable[..., Any]) -> list[str]:
    """The name `self` has in `function` (a keyword of that name would collide with it)."""
    try:
        first = next(iter(inspect.signature(function).parameters.values()), None)
    except (TypeError, ValueError):
        return []
    return [first.name] if first is not None and first.kind is not first.VAR_POSITIONAL else []


def _function_signature(function: Callable[..., Any], owner: str, skip_first: bool) -> Optional[Signature]:
    """`function`'s keys; None if it has no signature that can be read (a builtin)."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    hints = _type_hints(function, owner)
    parameters: dict[str, Parameter] = {}
    takes_kwargs = False
    for index, parameter in enumerate(signature.parameters.values()):
        if skip_first and index == 0:
            continue
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            takes_kwargs = True
        elif parameter.kind is not inspect.Parameter.VAR_POSITIONAL:
            annotation = hints.get(parameter.name, parameter.annotation)
            positional = parameter.kind is inspect.Parameter.POSITIONAL_ONLY
            parameters[parameter.name] = Parameter(parameter.name, annotation, parameter.default, positional)
    return Signature(owner, parameters, takes_kwargs)


def _named_tuple_signature(cls: type) -> Signature:
    """A NamedTuple's fields (its generated `__new__` carries no annotations)."""
    hints = _type_hints(cls, cls.__name__)
    defaults: dict[str, Any] = getattr(cls, "_field_defaults", {})
    fields: tuple[str, ...] = cls._fields  # type: ignore[attr-defined]
    parameters = {name: Parameter(name, hints.get(name, EMPTY), defaults.get(name, EMPTY)) for name in fields}
    return Signature(cls.__name__, parameters, False)


def _type_hints(function: Callable[..., Any], owner: str) -> dict[str, Any]:
    """Resolved annotations; one that does not resolve becomes `Unresolved`, alone."""
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
        except Exception as error:
            text = annotation if isinstance(annotation, str) else repr(annotation)
            hints[name] = Unresolved(owner, name, text, f"{type(error).__name__}: {error}")
    return hints


def accepts_anything(annotation: Any) -> bool:
    """No annotation, or one that allows any value."""
    return annotation is EMPTY or annotation is Any or annotation is object or isinstance(annotation, TypeVar)


def first_paragraph(obj: Any) -> str:
    """The first paragraph of `obj`'s own docstring, on one line (a class without one
    has none: its parent's describes another component)."""
    own = vars(obj).get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
    doc = inspect.cleandoc(own) if isinstance(own, str) else ""
    return " ".join(doc.strip().split("\n\n", 1)[0].split())


def parameter_docs(factory: Callable[..., Any]) -> dict[str, str]:
    """`factory`'s parameter descriptions; a class's from every class of its MRO (the
    nearest says it), so the parameters it takes through `**kwargs` are described."""
    if not isinstance(factory, type):
        return arg_docs(factory)
    docs: dict[str, str] = {}
    for klass in reversed(factory.__mro__):
        if "__init__" in vars(klass):
            docs.update(arg_docs(vars(klass)["__init__"]))
        docs.update(arg_docs(klass))
    return docs


def arg_docs(obj: Any) -> dict[str, str]:
    """Parameter descriptions from a Google-style `Args:` section of `obj`'s docstring."""
    doc = inspect.getdoc(obj) or ""
    described: dict[str, str] = {}
    in_args = False
    current: Optional[str] = None
    for line in doc.splitlines():
        if line.strip() in ("Args:", "Arguments:", "Parameters:"):
            in_args, current = True, None
            continue
        if not in_args:
            continue
        if line and not line.startswith(" "):
            in_args = False  # the next section
            continue
        match = re.match(r"^ {4}([\w, ]+?)(?: \([^)]*\))?: (.*)$", line)
        if match:
            names = [name.strip() for name in match.group(1).split(",")]
            current = names[0]
            for name in names:
                described[name] = match.group(2).strip()
        elif current is not None and line.strip():
            for name, text in list(described.items()):
                if name == current or text == described[current]:
                    described[name] = f"{text} {line.strip()}"
    return described
