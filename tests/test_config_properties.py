"""Three judges agree on configs: the JSON Schema, `validate()` and `from_config`.

Configs are generated from the constructors' annotations, for every built-in component
and for generated constructor signatures (random annotations of the supported kinds,
registered on a fresh registry), then mutated (a wrong type, an extra or misspelt key,
a required key taken out, a number out of range, an unknown ``"type"``, at any depth).
For each, the judges must agree:

- `validate()` returns `ConfigError`s and raises nothing;
- `from_config` builds the object exactly when `validate()` finds nothing, and raises
  only `ConfigError` when it does not;
- the schema (jsonschema's `Draft202012Validator`) accepts exactly what `validate()`
  accepts, save the rules only code can check (a component's `config_checks`, such as
  the loader's ``max_instances_in_memory >= batch_size``): there the schema may accept
  a config that `validate()` refuses, never the other way round.

CI runs a few examples of each; the long profile runs many::

    FRAMEWORK_PROPERTY_EXAMPLES=5000 python -m pytest tests/test_config_properties.py -p no:randomly

(`HYPOTHESIS_PROFILE` is not read here: the env var above sizes every property suite.)
"""

from __future__ import annotations

import collections
import contextlib
import copy
import enum
import inspect
import numbers
import os
import pathlib
import re
import string
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Annotated, Any, Callable, Literal, NamedTuple, NewType, Optional, Union

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from typing_extensions import NotRequired, TypedDict

from framework import Lazy, Registrable
from framework.config import AtLeast, is_typed_dict, json_schema, typed_dict_fields, validate
from framework.config._signatures import EMPTY, signature_of
from framework.errors import ConfigError
from framework.testing import fresh_registry

EXAMPLES = int(os.environ.get("FRAMEWORK_PROPERTY_EXAMPLES", "0"))
SETTINGS = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
LONG = EXAMPLES > 0


def examples(ci: int) -> settings:
    return settings(SETTINGS, max_examples=EXAMPLES or ci)


pytestmark = [
    pytest.mark.timeout(3600 if LONG else 120),
    pytest.mark.filterwarnings("ignore:pin_memory=True but CUDA is not available"),
]

# -- the judges ----------------------------------------------------------------------------


@contextlib.contextmanager
def without_config_checks() -> Iterator[None]:
    """`validate` with no component's `config_checks`: what JSON Schema can say at most."""
    from framework.config import _construct as _validate

    original = _validate._Walk.config_checks
    _validate._Walk.config_checks = lambda *args, **kwargs: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        _validate._Walk.config_checks = original  # type: ignore[method-assign]


class Verdict:
    def __init__(
        self,
        errors: list[ConfigError],
        structural: list[ConfigError],
        schema: list[str],
        built: Optional[str],
    ) -> None:
        self.errors, self.structural, self.schema, self.built = errors, structural, schema, built

    def __repr__(self) -> str:
        return (
            f"validate: {[str(e) for e in self.errors]}\nwithout config_checks: "
            f"{[str(e) for e in self.structural]}\nschema: {self.schema}\nfrom_config: {self.built}"
        )


def judge(
    config: Any,
    base: type[Registrable],
    validator: Draft202012Validator,
    build: Callable[[Any], Any],
) -> Verdict:
    errors = validate(copy.deepcopy(config), base)
    assert all(isinstance(e, ConfigError) for e in errors), errors
    with without_config_checks():
        structural = validate(copy.deepcopy(config), base)
    schema = [f"{e.json_path}: {e.message}" for e in validator.iter_errors(config)]
    try:
        build(copy.deepcopy(config))
        built = None
    except ConfigError as error:
        built = str(error)
    except Exception as error:  # never right; pending_constructor_rules may excuse it on a valid config
        built = f"NOT A ConfigError: {type(error).__name__}: {error}"
    return Verdict(errors, structural, schema, built)


# what the long profile reports: rules the judges are allowed to see differently, by count
EXCUSED: collections.Counter[str] = collections.Counter()


def _gist(message: str) -> str:
    return re.sub(r"(got|, got) .*$|\d+", "", message)[:120]


def assert_agree(
    config: Any, verdict: Verdict, pending: Callable[[Any, str], bool] = lambda config, refusal: False
) -> None:
    shown = f"config: {config!r}\n{verdict!r}"
    if verdict.errors:
        assert verdict.built is not None, f"from_config built a config validate refuses\n{shown}"
        assert not verdict.built.startswith("NOT A ConfigError"), f"from_config raised\n{shown}"
    elif verdict.built is not None:
        # a rule only a constructor has (another branch moves these into config_checks)
        assert pending(config, verdict.built), f"from_config refused a config validate accepts\n{shown}"
        EXCUSED[f"constructor only: {_gist(verdict.built)}"] += 1
    if verdict.schema:
        assert verdict.errors, f"the schema refused a config validate accepts\n{shown}"
    if not verdict.structural:
        if verdict.errors and not verdict.schema:  # a config_checks rule JSON Schema cannot state
            for error in verdict.errors:
                EXCUSED[f"config_checks only: {_gist(error.reason)}"] += 1
        return
    if not verdict.schema and all(_unimportable_path(error) for error in verdict.structural):
        # a "type" by import path: the schema takes any such path, only importing can tell
        EXCUSED['a dotted "type" path that does not import'] += 1
        return
    assert verdict.schema, f"the schema accepted a config with type or key errors\n{shown}"


def _unimportable_path(error: ConfigError) -> bool:
    return (error.path == "type" or error.path.endswith(".type")) and "Importing it failed" in error.reason


GENERATED: collections.Counter[str] = collections.Counter()  # configs judged, for the report


@pytest.fixture(autouse=True, scope="module")
def report_excused() -> Iterator[None]:
    yield
    if GENERATED:
        print(f"\ngenerated signatures: {dict(GENERATED)}")
    if EXCUSED:
        print("\nexcused disagreements (rule: configs):")
        for rule, count in EXCUSED.most_common():
            print(f"  {count:6d}  {rule}")


# -- values from annotations ---------------------------------------------------------------

JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([10**400, -(10**309), 2**63, 1.5, -0.5, 2.0, 1e308, 1e-300, -1, 0]),
    # near-misses: an enum's name or value, an int as a key writes it, a dotted path
    st.sampled_from(["RED", "red", "LOW", "a", "1", "01", "-0", "", " ", "x.y:z", "dot", "line"]),
    st.text(string.ascii_lowercase, max_size=3),
)
# (copied: a mutation may change a drawn list or mapping in place)
GARBAGE = st.one_of(JSON_LEAVES, st.sampled_from([[], {}, [1, "x"], {"k": 1}]).map(copy.deepcopy))


def _unwrap(annotation: Any) -> Any:
    from framework.config._annotations import unwrap

    return unwrap(annotation)


class Values:
    """Strategies for config values of an annotation: mostly right ones."""

    def __init__(self, fixed: Mapping[tuple[type, str], st.SearchStrategy[Any]]) -> None:
        self.fixed = fixed  # a parameter whose good values depend on the machine (a tokenizer)

    def of(self, annotation: Any, depth: int = 0) -> st.SearchStrategy[Any]:
        annotation = _unwrap(annotation)
        if annotation is EMPTY or annotation is Any or annotation is object:
            return JSON_LEAVES
        origin, args = _origin(annotation), _args(annotation)
        if origin is Union:
            return st.one_of([self.of(a, depth) for a in args])
        if origin is Literal:
            return st.sampled_from(
                [c for a in args for c in ((a.value, a.name) if isinstance(a, enum.Enum) else (a,))]
            )
        if origin is Annotated:
            limit = next((m.minimum for m in annotation.__metadata__ if isinstance(m, AtLeast)), None)
            return self.at_least(args[0], limit, depth)
        if origin is Lazy:
            return self.of(args[0], depth)
        if origin in (list, set, frozenset, Sequence, collections.abc.Set):
            return st.lists(self.of(args[0] if args else Any, depth + 1), max_size=0 if depth > 2 else 3)
        if origin is tuple:
            if len(args) == 2 and args[1] is Ellipsis:
                return st.lists(self.of(args[0], depth + 1), max_size=3)
            return st.tuples(*(self.of(a, depth + 1) for a in args)).map(list)
        if origin in (dict, Mapping):
            keys: st.SearchStrategy[Any] = st.text(string.ascii_lowercase, min_size=1, max_size=3)
            if args and _unwrap(args[0]) is int:
                keys = st.integers(-5, 99).map(str)
            elif args and _unwrap(args[0]) is not str and _unwrap(args[0]) is not Any:
                keys = self.of(args[0], depth + 1).filter(lambda k: isinstance(k, str))
            values = self.of(args[1] if args else Any, depth + 1)
            return st.dictionaries(keys, values, max_size=0 if depth > 2 else 3)
        if annotation is type(None):
            return st.none()
        if annotation is bool:
            return st.booleans()
        if annotation is int:
            return st.integers(-2, 40)
        if annotation is float:
            return st.one_of(st.floats(-5, 5, allow_nan=False), st.integers(-5, 5))
        if annotation is str:
            return st.text(string.ascii_lowercase + ".:_", max_size=4)
        if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
            return st.sampled_from([m.value for m in annotation] + [m.name for m in annotation])
        if isinstance(annotation, type) and issubclass(annotation, Registrable):
            return self.component(annotation, depth)
        if isinstance(annotation, type) and issubclass(annotation, pathlib.PurePath):
            return st.text(string.ascii_lowercase + "/.", max_size=6)
        if isinstance(annotation, type) and is_typed_dict(annotation):
            fields, required = typed_dict_fields(annotation)
            return st.fixed_dictionaries(
                {name: self.of(fields[name], depth + 1) for name in fields if name in required},
                optional={name: self.of(fields[name], depth + 1) for name in fields if name not in required},
            )
        if isinstance(annotation, type) and annotation.__module__ != "builtins":
            return self.arguments(annotation, depth)
        return GARBAGE

    def at_least(self, annotation: Any, limit: Optional[int], depth: int) -> st.SearchStrategy[Any]:
        inner = _unwrap(annotation)
        if limit is not None and inner is int:
            return st.integers(limit, limit + 40)
        if limit is not None and inner is str:
            return st.text(string.ascii_lowercase, min_size=limit, max_size=limit + 3)
        if limit is not None and _origin(inner) is list:
            return st.lists(self.of(_args(inner)[0], depth + 1), min_size=limit, max_size=limit + 2)
        return self.of(annotation, depth)

    def component(self, base: type[Registrable], depth: int) -> st.SearchStrategy[Any]:
        entries = base.registry_entries()
        if not entries and not inspect.isabstract(base):
            from framework.config._json_schema import _subclass_entries

            entries = _subclass_entries(base)
            if not entries:
                return self.arguments(base, depth)
        names = sorted(entries)
        if not names:
            return GARBAGE

        @st.composite
        def pick(draw: st.DrawFn) -> Any:
            name = draw(st.sampled_from(names))
            arguments = draw(self.arguments(entries[name].factory(), depth))
            if draw(st.booleans()) and not any(
                p.default is EMPTY for p in signature_of(entries[name].factory()).parameters.values()
            ):
                return name  # the name alone
            if name == base.default_implementation and draw(st.booleans()):
                return arguments
            return {"type": name, **arguments}

        return pick()

    def arguments(self, factory: Any, depth: int) -> st.SearchStrategy[dict[str, Any]]:
        parameters = signature_of(factory).parameters
        given = set(getattr(factory, "config_given", ()))
        for klass in getattr(factory, "__mro__", ()):
            given |= set(getattr(klass, "config_given", ()))

        @st.composite
        def fill(draw: st.DrawFn) -> dict[str, Any]:
            config: dict[str, Any] = {}
            for name, parameter in parameters.items():
                if name in given:
                    continue
                if parameter.default is not EMPTY and (depth > 1 or draw(st.booleans())):
                    continue
                fixed = next(
                    (s for (cls, key), s in self.fixed.items() if key == name and _is_sub(factory, cls)), None
                )
                config[name] = draw(fixed if fixed is not None else self.of(parameter.annotation, depth + 1))
            return config

        return fill()


def _is_sub(factory: Any, cls: type) -> bool:
    return isinstance(factory, type) and issubclass(factory, cls)


def _origin(annotation: Any) -> Any:
    import typing

    origin = typing.get_origin(annotation)
    if origin is not None and origin.__module__ == "types" and origin.__name__ == "UnionType":
        return Union
    return origin


def _args(annotation: Any) -> tuple[Any, ...]:
    import typing

    return typing.get_args(annotation)


# -- mutations -----------------------------------------------------------------------------


def _nodes(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _nodes(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _nodes(item, (*path, index))
    return found


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        value = value[step]
    return value


@st.composite
def mutated(draw: st.DrawFn, config: Any, keys: Sequence[str] = ()) -> Any:
    """`config` with 0 to 2 changes anywhere in it."""
    config = copy.deepcopy(config)
    for _ in range(draw(st.integers(0, 2))):
        nodes = _nodes(config)
        path = draw(st.sampled_from(nodes))
        node = _get(config, path)
        kind = draw(st.sampled_from(["replace", "drop", "add", "type", "range", "rekey"]))
        if kind == "replace" and path:
            _get(config, path[:-1])[path[-1]] = draw(GARBAGE)
        elif kind == "drop" and isinstance(node, dict) and node:
            del node[draw(st.sampled_from(sorted(node, key=str)))]
        elif kind == "add" and isinstance(node, dict):
            near = [k + "s" for k in node if isinstance(k, str)] + [
                k[:-1] for k in node if isinstance(k, str)
            ]
            node[draw(st.sampled_from([*near, *keys, "zzz", "$schema", "type"]))] = draw(GARBAGE)
        elif kind == "type" and isinstance(node, dict):
            node["type"] = draw(st.sampled_from(["no_such_name", "", 3, None]))
        elif kind == "rekey" and isinstance(node, dict) and node:
            key = draw(st.sampled_from(sorted(node, key=str)))
            node[draw(st.sampled_from(["1", "01", "-3", "RED", "red", "", "x"]))] = node.pop(key)
        elif kind == "range" and path and isinstance(node, (int, float)) and not isinstance(node, bool):
            _get(config, path[:-1])[path[-1]] = draw(st.sampled_from([-1, 0, -(10**400), 10**400]))
    return config


# -- the built-in components ---------------------------------------------------------------


def built_in_fixed() -> dict[tuple[type, str], st.SearchStrategy[Any]]:
    """Parameters whose good values depend on the machine: drawn from ones that work here."""
    from framework.data import DataLoader
    from framework.download.backend import DownloadBackend

    return {
        # a tokenizer is imported when the reader is made: only importable ones are good
        (Registrable, "tokenizer"): st.sampled_from([None, "shlex:split", 3]),
        (DataLoader, "cuda_device"): st.sampled_from([None, "cpu", 0, "cuda:1", 1.5]),
        # free strings: nearly always wrong; these are mostly right
        (DataLoader, "start_method"): st.sampled_from(["fork", "spawn", "forkserver", "thread"]),
        (DataLoader, "transfer"): st.sampled_from(["pickle5", "shared_memory", "pipe"]),
        (DataLoader, "batch_size"): st.sampled_from([1, 4, 4, 0]),
        (DataLoader, "batch_sampler"): st.sampled_from(
            [None, None, "bucket", {"type": "bucket", "batch_size": 2}]
        ),
        (DataLoader, "timeout"): st.sampled_from([None, 0.5, 3, 0, -1.0]),
        (DataLoader, "num_workers"): st.sampled_from([0, 1, 2, 2, -1]),
        (DataLoader, "persistent_workers"): st.sampled_from([False, False, True]),
        (DataLoader, "max_instances_in_memory"): st.sampled_from([None, 8, 64, 2, 0]),
        (DataLoader, "batches_per_epoch"): st.sampled_from([None, 3, 0]),
        (DataLoader, "cache_limit"): st.sampled_from([None, None, None, "50GB", 1 << 20, "lots"]),
        (DataLoader, "prefetch"): st.sampled_from([2, 2, 0, 1, -1]),
        (DataLoader, "cache_dir"): st.sampled_from([None, None, "/tmp/framework-unused-cache"]),
        (DownloadBackend, "auth"): st.sampled_from([None, ["user", "pass"], ["user"], "x"]),
    }


# Refusals only a constructor can make: (the config's key, what from_config says).
PENDING_CONSTRUCTOR_RULES: list[tuple[str, str]] = [
    # Whether a tokenizer's dotted path imports is known only by importing it, which
    # validate() does not do (it constructs and imports nothing of the user's).
    ("tokenizer", "could not be imported"),
]


def pending_constructor_rules(base: str) -> Callable[[Any, str], bool]:
    """Whether from_config's refusal of a config validate() accepts is one of the rules above."""

    def matches(config: Any, refusal: str) -> bool:
        if not isinstance(config, dict):
            return False
        keys = set(config) | set(config["reader"] if isinstance(config.get("reader"), dict) else ())
        return any(key in keys and said in refusal for key, said in PENDING_CONSTRUCTOR_RULES)

    return matches


BASES = ["DatasetReader", "DataLoader", "BatchSampler", "DataCollator", "DownloadBackend"]


@contextlib.contextmanager
def loader_reads_nothing() -> Iterator[None]:
    """An eager loader reads its data when made; the judges only need it made."""
    from framework.data.multiprocess import MultiProcessDataLoader

    original = MultiProcessDataLoader._load_instances
    MultiProcessDataLoader._load_instances = lambda self: []  # type: ignore[method-assign,assignment,return-value]
    try:
        yield
    finally:
        MultiProcessDataLoader._load_instances = original  # type: ignore[method-assign]


@pytest.mark.parametrize("base_name", BASES)
def test_the_three_judges_agree_on_built_in_component_configs(base_name: str, tmp_path: Any) -> None:
    from framework_plugins.readers import JsonlReader

    from framework.config import resolve_base

    base = resolve_base(base_name)
    validator = Draft202012Validator(json_schema(base))
    values = Values(built_in_fixed())
    extras: dict[str, Any] = {}
    if base_name == "DataLoader":
        extras = {"reader": JsonlReader(), "data_path": str(tmp_path / "unused.jsonl")}
    keys = sorted(
        {
            name
            for entry in base.registry_entries().values()
            for name in signature_of(entry.factory()).parameters
        }
    )
    pending = pending_constructor_rules(base_name)
    seen = {"valid": 0, "invalid": 0}

    @examples(ci=60)
    @given(st.data())
    def check(data: st.DataObject) -> None:
        config = data.draw(values.component(base, 0).filter(lambda c: isinstance(c, dict)))
        if base_name == "DataLoader" and config.get("batch_sampler") is None and data.draw(st.integers(0, 3)):
            config["batch_size"] = data.draw(st.sampled_from([1, 4]))  # mostly a loader that can batch
        config = data.draw(mutated(config, keys))
        with loader_reads_nothing():
            verdict = judge(config, base, validator, lambda c: base.from_config(c, **extras))
        seen["invalid" if verdict.errors else "valid"] += 1
        assert_agree(config, verdict, pending)

    check()
    print(f"{base_name}: {seen}")
    assert seen["valid"] and seen["invalid"]


def test_the_three_judges_agree_on_run_configs(tmp_path: Any) -> None:
    """A run config has no from_config: validate() and the schema agree on it."""
    from framework.cli.run_config import run_config
    from framework.data import DataLoader

    validator = Draft202012Validator(json_schema())
    values = Values(built_in_fixed())
    keys = list(signature_of(run_config).parameters)
    seen = {"valid": 0, "invalid": 0}

    @examples(ci=40)
    @given(st.data())
    def check(data: st.DataObject) -> None:
        config = data.draw(values.arguments(run_config, 0))
        loader = data.draw(values.component(DataLoader, 0).filter(lambda c: isinstance(c, dict)))
        if loader.get("batch_sampler") is None and data.draw(st.integers(0, 3)):
            loader["batch_size"] = data.draw(st.sampled_from([1, 4]))
        if data.draw(st.integers(0, 3)) == 0:  # a loader of few keys: the run configs are not all bad
            loader = {"batch_size": data.draw(st.sampled_from([1, 4]))}
        config.setdefault("data_loader", loader)
        config = data.draw(mutated(config, keys))
        errors = validate(copy.deepcopy(config), None)
        with without_config_checks():
            structural = validate(copy.deepcopy(config), None)
        schema = [f"{e.json_path}: {e.message}" for e in validator.iter_errors(config)]
        seen["invalid" if errors else "valid"] += 1
        verdict = Verdict(errors, structural, schema, None if not errors else "(not built)")
        assert_agree(config, verdict)

    check()
    print(f"run config: {seen}")
    assert seen["valid"] and seen["invalid"]


# -- generated constructor signatures ------------------------------------------------------


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.Enum):
    LOW = 1
    HIGH = 2


UserId = NewType("UserId", int)
Label = NewType("Label", str)


class Inner(Registrable):
    """A nested base with two components."""


class Dot(Inner):
    def __init__(self, size: int = 1) -> None:
        self.size = size


class Line(Inner):
    def __init__(self, length: Annotated[int, AtLeast(1)], label: str = "") -> None:
        self.length, self.label = length, label


class Point:
    """A plain class: built from a mapping of its arguments."""

    def __init__(self, x: float, y: float = 0.0) -> None:
        self.x, self.y = x, y


class Corner(NamedTuple):
    row: int
    column: int = 0


class Style(TypedDict):
    width: Annotated[int, AtLeast(1)]
    color: NotRequired[Color]


HASHABLE_LEAVES: list[Any] = [int, str, bool, Color, Level, UserId, Literal["a", "b", 3], Literal[Color.RED]]
LEAVES: list[Any] = [
    *HASHABLE_LEAVES,
    float,
    Label,
    Annotated[int, AtLeast(2)],
    Annotated[str, AtLeast(1)],
    Annotated[list[int], AtLeast(1)],
    Annotated[float, AtLeast(0)],
    Inner,
    Lazy[Inner],
    Dot,
    Point,
    Mapping,
    Sequence,
    numbers.Real,
    Any,
    pathlib.Path,
    Corner,
    Style,
    Optional[int],
    tuple[int],
    frozenset[str],
]


def annotations(depth: int = 0) -> st.SearchStrategy[Any]:
    leaves = st.sampled_from(LEAVES)
    if depth >= 2:
        return leaves
    inner = annotations(depth + 1)
    hashable = st.sampled_from(HASHABLE_LEAVES)
    return st.one_of(
        leaves,
        inner.map(lambda a: Optional[a]),
        st.tuples(inner, inner).map(lambda p: Union[p[0], p[1]]),
        inner.map(lambda a: list[a]),  # type: ignore[valid-type]
        st.tuples(inner, inner).map(lambda p: tuple[p[0], p[1]]),  # type: ignore[valid-type]
        inner.map(lambda a: tuple[a, ...]),  # type: ignore[valid-type]
        inner.map(lambda a: dict[str, a]),  # type: ignore[valid-type]
        inner.map(lambda a: dict[int, a]),  # type: ignore[valid-type]
        hashable.map(lambda a: set[a]),  # type: ignore[valid-type]
        st.just(set[list[int]]),
    )


@st.composite
def signatures(draw: st.DrawFn) -> inspect.Signature:
    """A constructor's signature: keyword parameters with annotations and defaults."""
    names = draw(
        st.lists(st.sampled_from(["alpha", "beta", "gamma", "delta", "eps"]), unique=True, max_size=4)
    )
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for name in names:
        annotation = draw(annotations())
        default: Any = inspect.Parameter.empty
        choice = draw(st.integers(0, 3))
        if choice == 1:
            default = None
        elif choice >= 2:
            default = draw(Values({}).of(annotation).filter(lambda v: not isinstance(v, (list, dict))))
        parameters.append(
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
        )
    return inspect.Signature(parameters)


def component_with(signature: inspect.Signature, base: type[Registrable]) -> type:
    def __init__(self: Any, **kwargs: Any) -> None:
        self.kwargs = kwargs

    __init__.__signature__ = signature  # type: ignore[attr-defined]
    __init__.__annotations__ = {
        name: p.annotation
        for name, p in signature.parameters.items()
        if p.annotation is not inspect.Parameter.empty
    }
    return type("Generated", (base,), {"__init__": __init__, "__doc__": "A generated component."})


@examples(ci=80)
@given(signature=signatures(), data=st.data())
def test_the_three_judges_agree_on_generated_constructor_signatures(
    signature: inspect.Signature, data: st.DataObject
) -> None:
    with fresh_registry():
        Inner.register("dot", exist_ok=True)(Dot)
        Inner.register("line", exist_ok=True)(Line)

        class Outer(Registrable):
            """A base made for this example."""

        Outer.register("gen")(component_with(signature, Outer))
        schema = json_schema(Outer)
        Draft202012Validator.check_schema(schema)
        validator = Draft202012Validator(schema)
        values = Values({})
        config = data.draw(values.component(Outer, 0).filter(lambda c: isinstance(c, dict)))
        config = data.draw(mutated(config, [*signature.parameters, "size", "length"]))
        verdict = judge(config, Outer, validator, Outer.from_config)
        GENERATED["invalid" if verdict.errors else "valid"] += 1
        assert_agree(config, verdict)
        assert [str(e) for e in verdict.structural] == [
            str(e) for e in verdict.errors
        ]  # no config_checks here


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-p", "no:randomly", "-s"]))
