"""JSON Schema (draft 2020-12) of configs, from the registry and constructor annotations.

It reads constructors through `framework.config._signatures`, the module config checking
reads them through, so the schema and `validate` agree on every key. It is the
looser of the two where JSON Schema cannot say what a constructor checks (a value
that only code can make is accepted as anything).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import pathlib
import typing
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Optional, Union

import attrs

from framework.config._annotations import (
    FLOAT_MAX,
    INT_KEY,
    MAPPINGS,
    META_KEYS,
    NONE,
    SEQUENCES,
    SETS,
    UNION_TYPES,
    is_builtin,
    is_constructible,
    is_typed_dict,
    typed_dict_fields,
    unhashable,
    unwrap,
)
from framework.config._construct import Lazy
from framework.config._signatures import (
    EMPTY,
    AtLeast,
    Given,
    Unresolved,
    accepts_anything,
    first_paragraph,
    parameter_docs,
    signature_of,
)
from framework.config._validate import (
    RUN_CONFIG_META_KEYS,
    errors_in,
    given_for,
    resolve_base,
    run_config_shape,
)
from framework.registry import Registrable, RegistryEntry, get_registry

__all__ = ["DRAFT", "build_schema", "json_schema"]

DRAFT = "https://json-schema.org/draft/2020-12/schema"
# a class named by import path instead of a registered name
DOTTED_PATH = r"^[A-Za-z_][\w.]*[.:][A-Za-z_][\w.]*$"
# a float: any number but an integer beyond the float range (JSON has no other floats)
_FLOAT = {"type": "number", "not": {"type": "integer", "not": {"minimum": -FLOAT_MAX, "maximum": FLOAT_MAX}}}
PRIMITIVES: dict[Any, dict[str, Any]] = {
    bool: {"type": "boolean"},
    int: {"type": "integer"},
    float: _FLOAT,
    str: {"type": "string"},
    NONE: {"type": "null"},
}

# None: inside a Lazy, where any missing key may still come from code
_Provided = Optional[frozenset[str]]


def json_schema(base: Union[str, type, None] = None, *, given: Iterable[str] = ()) -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) of run configs, or of configs of one `Registrable` base.

    Every registered name is a `"type"` choice with its own parameters, from the
    registry (this process's registrations and installed plugins) and the
    constructors' annotations. Components it could not describe are listed, with
    the reason, under `"x-framework-undescribed"`. `given`: as for `validate`.
    """
    return build_schema(base, given)


def build_schema(base: Union[str, type, None] = None, given: Iterable[str] = ()) -> dict[str, Any]:
    builder = _Builder()
    if base is None:
        run_config = run_config_shape()
        root = builder.arguments(run_config, frozenset(given))
        root["title"] = "framework run config"
        meta = {
            key: {"type": "string", "description": "the schema this file follows"}
            for key in RUN_CONFIG_META_KEYS
        }
        root["properties"] = {**meta, **root["properties"]}
        for name, parameter in signature_of(run_config).parameters.items():
            # a default config that does not check (a loader without a batch size) is no default
            if isinstance(parameter.default, Mapping) and errors_in(parameter.annotation, parameter.default):
                root["properties"][name].pop("default", None)
                root["required"] = [*root.get("required", []), name]
    else:
        cls = resolve_base(base)
        provided = frozenset(given_for(cls, given))
        root = {"title": f"framework {cls.__name__} config", "$ref": builder.registrable(cls, provided)}
    schema: dict[str, Any] = {"$schema": DRAFT, **root, "$defs": builder.defs}
    if builder.undescribed:
        schema["x-framework-undescribed"] = builder.undescribed
    return schema


def _pointer(key: str) -> str:
    """The `$ref` to `$defs[key]`: a JSON pointer (RFC 6901) in a URI fragment, so
    percent-encoded (a registered name may hold `%`, `#`, quotes, any letter)."""
    return "#" + urllib.parse.quote("/$defs/" + key.replace("~", "~0").replace("/", "~1"), safe=_FRAGMENT)


# what a URI fragment may hold as it is (RFC 3986), besides letters and digits
_FRAGMENT = "!$&'()*+,;=:@/?-._~"


# what `AtLeast` limits, by the JSON type of the value (None: any of them)
_AT_LEAST: dict[Optional[str], tuple[str, ...]] = {
    "integer": ("minimum",),
    "number": ("minimum",),
    "string": ("minLength",),
    "array": ("minItems",),
    "object": ("minProperties",),
    "boolean": (),
    "null": (),
    None: ("minimum", "minLength", "minItems", "minProperties"),
}


def _is_json_choice(value: Any) -> bool:
    """A choice that a JSON value equals as validate compares (a tuple equals no list)."""
    if isinstance(value, float):
        return value == value and abs(value) != float("inf")
    return value is None or type(value) in (str, int, bool) or isinstance(value, (str, int))


def _subclass_entries(cls: type[Registrable]) -> dict[str, RegistryEntry]:
    """The names a concrete `cls`'s "type" may give: those registered on its bases for
    `cls` or a subclass of it (as `Registrable.by_name` finds them)."""
    found: dict[str, RegistryEntry] = {}
    for ancestor in cls.__mro__:
        if not (isinstance(ancestor, type) and issubclass(ancestor, Registrable)):
            continue
        for name, entry in get_registry().entries(ancestor).items():
            if name in found:
                continue
            try:
                loaded = entry.load()
            except Exception:  # by_name fails on it too
                continue
            if issubclass(loaded, cls):
                found[name] = entry
    return found


def _json_default(value: Any) -> tuple[bool, Any]:
    """The default as JSON, if it has a JSON form."""
    if (
        value is attrs.NOTHING
        or value is dataclasses.MISSING
        or type(value).__name__ == "_HAS_DEFAULT_FACTORY_CLASS"
    ):
        return False, None  # made by a factory when the object is built: no value to show
    if isinstance(value, enum.Enum):
        value = value.value
    elif isinstance(value, pathlib.PurePath):
        value = str(value)
    elif isinstance(value, Mapping):
        value = dict(value)
    elif isinstance(value, (tuple, frozenset, set)):
        value = list(value)
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False, None
    return True, value


def _defaults_pass_rules(entry: RegistryEntry) -> bool:
    """Whether a component's declared rules (`config_checks`) accept its defaults, so
    that its name alone is a config (as `validate` finds)."""
    try:
        factory = entry.factory()
    except Exception:  # not importable here: described as accepting anything
        return True
    checks = getattr(factory, "config_checks", None)
    if not callable(checks):
        return True
    defaults = {name: p.default for name, p in signature_of(factory).parameters.items()}
    try:
        return not list(checks(defaults))
    except Exception:  # rules that fail on their own defaults: no name-alone form
        return False


class _Builder:
    def __init__(self) -> None:
        self.defs: dict[str, Any] = {}
        self.undescribed: list[dict[str, str]] = []
        self._names: dict[type, str] = {}

    def note(self, what: str, reason: str) -> None:
        item = {"component": what, "reason": reason}
        if item not in self.undescribed:  # met again under another def (e.g. a Lazy one)
            self.undescribed.append(item)

    def key(
        self, cls: type, provided: _Provided, suffix: str = "", explicit: frozenset[str] = frozenset()
    ) -> str:
        name = self._names.get(cls)
        if name is None:  # two classes of one name (from two modules) get their full names
            taken = cls.__name__ in self._names.values()
            name = self._names[cls] = f"{cls.__module__}.{cls.__qualname__}" if taken else cls.__name__
        if explicit:  # a def of its own: these keys are not properties here
            suffix = f"{suffix} (receives {', '.join(sorted(explicit))})"
            provided = None if provided is None else provided - explicit
        if provided is None:
            return f"{name}{suffix} (lazy)"
        if provided:
            return f"{name}{suffix} (given {', '.join(sorted(provided))})"
        return f"{name}{suffix}"

    def annotation(
        self, annotation: Any, provided: _Provided, explicit: frozenset[str] = frozenset()
    ) -> dict[str, Any]:
        """The schema of `annotation`; `explicit`: keys that the object it makes receives in code."""
        annotation = unwrap(annotation)
        if accepts_anything(annotation):
            return {}
        if isinstance(annotation, Unresolved):
            self.note(f"{annotation.owner}.{annotation.name}", annotation.message())
            return {}
        origin = typing.get_origin(annotation)
        args = typing.get_args(annotation)
        if origin in UNION_TYPES:
            alternatives = [self.annotation(a, provided, explicit) for a in args]
            return {} if {} in alternatives else {"anyOf": alternatives}
        if origin is typing.Literal:  # an enum member: its value or its name, as validate reads it
            choices = [c for a in args for c in ((a.value, a.name) if isinstance(a, enum.Enum) else (a,))]
            return {"enum": [c for c in dict.fromkeys(choices) if _is_json_choice(c)]}
        if origin is Lazy or annotation is Lazy:
            return self.annotation(args[0] if args else Any, None)
        if origin is typing.Annotated:
            return self.annotated(args[0], annotation.__metadata__, provided)
        if origin in SEQUENCES or origin in SETS or origin is tuple:
            return self.collection(origin, args, provided)
        if origin in MAPPINGS:
            values = self.annotation(args[1], provided) if args else {}
            keys = self.mapping_keys(args[0]) if args else {}
            return {
                "type": "object",
                **({"propertyNames": keys} if keys else {}),
                **({"additionalProperties": values} if values else {}),
            }
        if origin is not None and isinstance(origin, type):
            return self.plain(origin, provided)
        if origin is not None:
            return {}
        return self.plain(annotation, provided, explicit)

    def mapping_keys(self, annotation: Any) -> dict[str, Any]:
        """The schema of a mapping's keys (JSON's are strings: an int key is its digits)."""
        annotation = unwrap(annotation)
        if annotation is str:
            return {}
        if annotation is int:
            return {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": INT_KEY}]}
        return self.annotation(annotation, frozenset())

    def annotated(self, annotation: Any, metadata: tuple[Any, ...], provided: _Provided) -> dict[str, Any]:
        given = frozenset(name for m in metadata if isinstance(m, Given) for name in m.names)
        schema = dict(self.annotation(annotation, None if provided is None else provided | given, given))
        for limit in (m for m in metadata if isinstance(m, AtLeast)):
            # a number, or the length of a string, list or mapping (as validate reads it)
            kind = schema.get("type")
            for keyword in (
                _AT_LEAST.get(kind, _AT_LEAST[None]) if isinstance(kind, (str, type(None))) else ()
            ):
                schema[keyword] = limit.minimum
        return schema

    def collection(self, origin: Any, args: tuple[Any, ...], provided: _Provided) -> dict[str, Any]:
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            items = [self.annotation(a, provided) for a in args]
            return {"type": "array", "prefixItems": items, "minItems": len(args), "maxItems": len(args)}
        items_schema = self.annotation(args[0], provided) if args else {}
        if origin in SETS and args and unhashable(args[0]):  # validate says why
            return {"type": "array", "maxItems": 0}
        return {"type": "array", **({"items": items_schema} if items_schema else {})}

    def plain(self, cls: Any, provided: _Provided, explicit: frozenset[str] = frozenset()) -> dict[str, Any]:
        if cls in PRIMITIVES:
            return dict(PRIMITIVES[cls])
        if not isinstance(cls, type):
            return {}
        if is_typed_dict(cls):
            fields, required = typed_dict_fields(cls)
            return {
                "type": "object",
                "properties": {name: self.annotation(field, provided) for name, field in fields.items()},
                **({"required": [name for name in fields if name in required]} if required else {}),
                "additionalProperties": False,
            }
        if getattr(cls, "_is_protocol", False):
            return {"not": {}, "description": f"a {cls.__name__} is made in code: a config cannot give one"}
        if issubclass(cls, enum.Enum):
            choices = [m.value for m in cls] + [m.name for m in cls]
            return {"enum": [c for c in dict.fromkeys(choices) if _is_json_choice(c)]}
        if issubclass(cls, pathlib.PurePath):
            return {"type": "string"}
        if cls in (list, tuple, set, frozenset):
            return {"type": "array"}
        if cls is dict:
            return {"type": "object"}
        if issubclass(cls, Registrable):
            return {"$ref": self.registrable(cls, provided, explicit)}
        if is_constructible(cls) and not is_builtin(cls):
            key = self.key(cls, provided, explicit=explicit)
            if key not in self.defs:
                self.defs[key] = {}  # claimed first: a class may nest itself
                self.defs[key] = self.arguments(cls, provided, explicit=explicit)
            return {"$ref": _pointer(key)}
        # made in code: no JSON value is one (validate agrees); in a union, the others remain
        return {"not": {}, "description": f"a {cls.__name__} is made in code: a config cannot give one"}

    def registrable(
        self, cls: type[Registrable], provided: _Provided, explicit: frozenset[str] = frozenset()
    ) -> str:
        """The `$ref` to `cls`'s definition: its string and mapping forms."""
        key = self.key(cls, provided, explicit=explicit)
        if key in self.defs:
            return _pointer(key)
        self.defs[key] = {}
        entries = cls.registry_entries()
        itself: Optional[str] = None  # a concrete class: a mapping without "type" is one
        if not (inspect.isabstract(cls) or entries):  # "type" may name it or a subclass
            entries = _subclass_entries(cls)
            itself = self.key(cls, provided, " itself", explicit)
            if itself not in self.defs:
                self.defs[itself] = {}
                self.defs[itself] = self.arguments(cls, provided, None, explicit)
        names = sorted(entries) if itself else cls.list_available()
        choices: list[dict[str, Any]] = []
        alone: list[dict[str, Any]] = []  # the names that make a config by themselves
        rules: list[dict[str, Any]] = []
        for name in names:
            component, summary = self.component(cls, entries[name], provided, explicit)
            choices.append({"const": name, **({"description": summary} if summary else {})})
            described = self.defs[self.key(cls, provided, f".{name}", explicit)]
            if "required" not in described and (
                "allOf" not in described or _defaults_pass_rules(entries[name])
            ):
                alone.append(choices[-1])
            rules.append(
                {
                    "if": {"properties": {"type": {"const": name}}, "required": ["type"]},
                    "then": {"$ref": component},
                }
            )
        default = cls.default_implementation if cls.default_implementation in entries else None
        if itself is not None:
            rules.append({"if": {"not": {"required": ["type"]}}, "then": {"$ref": _pointer(itself)}})
        elif default is not None:
            rules.append(
                {
                    "if": {"not": {"required": ["type"]}},
                    "then": {"$ref": self.component(cls, entries[default], provided, explicit)[0]},
                }
            )
        dotted = {
            "type": "string",
            "pattern": DOTTED_PATH,
            "description": "a subclass by import path, 'package.module:Class'",
        }
        type_schema = {"anyOf": [*choices, dotted]}
        mapping: dict[str, Any] = {"type": "object", "properties": {"type": type_schema}}
        if default is None and itself is None:
            mapping["required"] = ["type"]
        if rules:
            mapping["allOf"] = rules
        # a name alone, or a mapping; if/else (not anyOf) so errors inside a mapping show one by one
        self.defs[key] = {
            "description": first_paragraph(cls),
            "type": ["object", "string"],
            "if": {"type": "string"},
            "then": {"anyOf": [*alone, dotted]},
            "else": mapping,
        }
        return _pointer(key)

    def component(
        self, base: type, entry: RegistryEntry, provided: _Provided, explicit: frozenset[str] = frozenset()
    ) -> tuple[str, str]:
        """The `$ref` to one registered component's parameters, and its summary."""
        key = self.key(base, provided, f".{entry.name}", explicit)
        try:
            factory = entry.factory()
        except Exception as error:  # not importable here: say so, accept any arguments
            reason = f"{type(error).__name__}: {error}"
            if key not in self.defs:
                self.note(f"{base.__name__} {entry.name!r} ({entry.target_path})", reason)
                self.defs[key] = {"type": "object", "description": f"not described: {reason}"}
            return _pointer(key), ""
        summary = first_paragraph(factory)
        if key not in self.defs:
            self.defs[key] = {}
            self.defs[key] = self.arguments(factory, provided, {"const": entry.name}, explicit)
        return _pointer(key), summary

    def arguments(
        self,
        factory: Callable[..., Any],
        provided: _Provided,
        type_schema: Optional[dict[str, Any]] = None,
        explicit: frozenset[str] = frozenset(),
    ) -> dict[str, Any]:
        """An object schema of `factory`'s keyword parameters, less those in `explicit`."""
        signature = signature_of(factory)
        docs = parameter_docs(factory)
        properties: dict[str, Any] = {} if type_schema is None else {"type": type_schema}
        required = []
        for name, parameter in signature.parameters.items():
            if name in explicit:
                continue
            schema = dict(self.annotation(parameter.annotation, provided))
            if docs.get(name):
                schema["description"] = docs[name]
            has_default, default = _json_default(parameter.default)
            # a default of another type (None for a class) means "leave it out", not a value
            if (
                parameter.default is not EMPTY
                and has_default
                and not errors_in(parameter.annotation, default)
            ):
                schema["default"] = default
            properties[name] = schema
            if parameter.default is EMPTY and provided is not None and name not in provided:
                required.append(name)
        for key in META_KEYS:  # any config may name its schema, for editors (validate ignores it)
            properties.setdefault(key, {"type": "string", "description": "the schema this file follows"})
        result: dict[str, Any] = {"type": "object"}
        summary = first_paragraph(factory)
        if summary:
            result["description"] = summary
        result["properties"] = properties
        # inside a Lazy, construct() may still give what the rules need: validate runs none there
        rules = (
            {}
            if provided is None
            else dict(getattr(getattr(factory, "config_checks", None), "json_schema", None) or {})
        )
        for name, limits in dict(rules.pop("properties", None) or {}).items():
            if name in properties:  # a parameter's own limits: with its schema, for editors
                properties[name] = {**properties[name], **limits}
            else:
                rules.setdefault("properties", {})[name] = limits
        if rules:  # what else the component's own checks can say in JSON Schema
            result["allOf"] = [rules]
        if required:
            result["required"] = required
        if not signature.accepts_extra:
            result["additionalProperties"] = False
        elif signature.reserved:  # **kwargs cannot take the name of self
            result["propertyNames"] = {"not": {"enum": sorted(signature.reserved)}}
        return result
