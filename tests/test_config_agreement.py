"""`validate`, the JSON Schema and `from_config` agree on every annotation: what one
refuses the others refuse, and none of them crashes."""

from __future__ import annotations

import enum
import json
import numbers
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, NewType, Optional, Protocol, Union

import pytest
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from typing_extensions import NotRequired, TypedDict

from framework import Lazy, Registrable
from framework.cli import main
from framework.config import AtLeast, json_schema, validate
from framework.data import DataLoader, DatasetReader
from framework.errors import ConfigError

pytestmark = pytest.mark.timeout(60)


class Part(Registrable):
    """A base for the components these tests register."""


def judges(config: Any, base: type[Registrable] = Part) -> tuple[list[str], list[str], Optional[str]]:
    """What validate, the schema and from_config say of `config`: validate's and the
    schema's errors, and from_config's error (None when it built the object)."""
    schema = json_schema(base)
    Draft202012Validator.check_schema(schema)
    by_validate = [str(error) for error in validate(config, base)]
    by_schema = [error.message for error in Draft202012Validator(schema).iter_errors(config)]
    try:
        base.from_config(config)
        built = None
    except ConfigError as error:
        built = str(error)
    return by_validate, by_schema, built


def assert_all_refuse(config: Any, base: type[Registrable] = Part) -> list[str]:
    by_validate, by_schema, built = judges(config, base)
    assert by_validate, "validate accepted it"
    assert by_schema, "the schema accepted it"
    assert built is not None, "from_config built it"
    return by_validate


def assert_all_accept(config: Any, base: type[Registrable] = Part) -> None:
    assert judges(config, base) == ([], [], None)


# -- validate itself crashed -------------------------------------------------------------


def test_a_float_given_an_integer_beyond_float_range_is_an_error_not_an_overflow() -> None:
    @Part.register("scaled")
    class Scaled(Part):
        def __init__(self, scale: float = 1.0) -> None:
            self.scale = scale

    [error] = assert_all_refuse({"type": "scaled", "scale": 10**400})
    assert error.startswith("scale: expected a float (at most 1.8e+308 in size), got 1000")
    assert_all_refuse({"type": "scaled", "scale": -(10**309)})
    assert_all_accept({"type": "scaled", "scale": 10**308})
    assert_all_accept({"type": "scaled", "scale": 3})


def test_a_set_of_lists_is_an_error_not_a_type_error() -> None:
    @Part.register("sets")
    class Sets(Part):
        def __init__(self, groups: set[list[int]] = set(), tags: set[str] = set()) -> None:  # noqa: B006
            self.groups, self.tags = groups, tags

    [error] = assert_all_refuse({"type": "sets", "groups": [[1, 2]]})
    assert error.startswith("groups.0: ") and "cannot be in a set" in error
    assert_all_accept({"type": "sets", "groups": []})
    assert_all_accept({"type": "sets", "tags": ["a", "b", "a"]})
    assert Part.from_config({"type": "sets", "tags": ["a", "b", "a"]}).tags == {"a", "b"}  # type: ignore[attr-defined]


def test_config_checks_that_raise_are_an_error_not_a_crash() -> None:
    from framework.config import ConfigChecks

    def broken(arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
        raise RuntimeError("the rule itself is broken")

    @Part.register("checked")
    class Checked(Part):
        config_checks = ConfigChecks(broken)

        def __init__(self, size: int = 1) -> None:
            self.size = size

    [error] = validate({"type": "checked"}, Part)
    assert "RuntimeError: the rule itself is broken" in str(error) and "config_checks" in str(error)


def test_a_bug_in_the_checks_is_reported_as_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from framework.config import _construct as _validate

    def broken(self: Any, cls: Any, value: Any, path: str) -> Any:
        raise KeyError("a bug")

    monkeypatch.setattr(_validate._Walk, "plain", broken)
    [error] = validate({"type": "anything"}, Part)
    assert "KeyError: 'a bug'" in str(error) and "please report it" in str(error)
    with pytest.raises(ConfigError, match="a bug"):
        Part.from_config({"type": "anything"})
    from framework.config import errors_in

    assert len(errors_in(int, 3)) == 1


# -- NewType -----------------------------------------------------------------------------

UserId = NewType("UserId", int)
Name = NewType("Name", str)
ShortName = NewType("ShortName", Name)


def test_a_new_type_checks_its_supertype() -> None:
    @Part.register("user")
    class User(Part):
        def __init__(self, uid: UserId, name: ShortName = ShortName(Name("x"))) -> None:  # noqa: B008
            self.uid, self.name = uid, name

    [error] = assert_all_refuse({"type": "user", "uid": "seven"})
    assert error == "uid: expected int, got 'seven'"
    assert_all_refuse({"type": "user", "uid": 7, "name": 3})
    assert_all_accept({"type": "user", "uid": 7, "name": "ann"})
    assert Part.from_config({"type": "user", "uid": 7.0}).uid == 7  # type: ignore[attr-defined]
    schema = json_schema(Part)["$defs"]["Part.user"]["properties"]
    assert schema["uid"] == {"type": "integer"} and schema["name"]["type"] == "string"


# -- names that a JSON pointer must escape -----------------------------------------------


@pytest.mark.parametrize("name", ["50%", "a%41b", "x~y/z", "tab#1", "naïve", 'say"hi"', "a{b}"])
def test_a_registered_name_that_a_pointer_escapes_is_reachable_in_the_schema(name: str) -> None:
    @Part.register(name)
    class Sized(Part):
        def __init__(self, size: int = 1) -> None:
            self.size = size

    @Part.register("other")
    class Other(Part):
        def __init__(self, label: str = "") -> None:
            self.label = label

    assert_all_accept({"type": name, "size": 2})
    [error] = assert_all_refuse({"type": name, "size": "big"})
    assert error == "size: expected int, got 'big'"
    assert_all_refuse({"type": name, "label": "x"})  # the other component's key


# -- "$schema" in a component config -----------------------------------------------------


def test_a_schema_key_is_accepted_and_ignored_in_component_configs_at_any_level() -> None:
    @Part.register("leaf")
    class Leaf(Part):
        def __init__(self, size: int = 1) -> None:
            self.size = size

    @Part.register("tree", exist_ok=True)
    class Tree(Part):
        def __init__(self, child: Optional[Part] = None, **kwargs: Any) -> None:
            self.child, self.kwargs = child, kwargs

    pointed = {"$schema": "./part.schema.json", "type": "tree", "child": {"$schema": "x", "type": "leaf"}}
    assert_all_accept(pointed)
    built = Part.from_config(pointed)
    assert built.kwargs == {} and built.child.size == 1  # type: ignore[attr-defined]
    [error] = assert_all_refuse({"$schema": 3, "type": "leaf"})
    assert error.startswith("$schema: expected str")
    # in a run config too, below the top
    from framework.data import DatasetReader

    config = {"$schema": "x", "dataset_reader": {"$schema": "reader.json", "type": "text"}, "data_path": "p"}
    config["data_loader"] = {"$schema": "loader.json", "batch_size": 2}
    assert validate(config) == []
    schema = json_schema()
    assert list(Draft202012Validator(schema).iter_errors(config)) == []
    assert_all_accept({"$schema": "reader.json", "type": "jsonl"}, DatasetReader)


# -- a mixin before the component --------------------------------------------------------


class Loud:
    """A mixin that forwards what it does not take.

    Args:
        volume: how loud.
    """

    def __init__(self, *, volume: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.volume = volume


class Quiet:
    """A second mixin, that only forwards."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)


class Sized(Part):
    """A component with one parameter.

    Args:
        size: how big.
    """

    def __init__(self, size: int = 1) -> None:
        self.size = size


@pytest.mark.parametrize(
    "mixins", [(Loud,), (Quiet,), (Loud, Quiet), (Quiet, Loud)], ids=lambda m: "+".join(c.__name__ for c in m)
)
def test_a_mixin_listed_before_the_component_forwards_to_it_and_typos_are_unknown_keys(
    mixins: tuple[type, ...],
) -> None:
    mixed = type("Mixed", (*mixins, Sized), {})
    Part.register("mixed")(mixed)
    [error] = assert_all_refuse({"type": "mixed", "sise": 2})
    assert error.startswith("sise: unknown key for Mixed. Did you mean 'size'?")
    assert_all_refuse({"type": "mixed", "size": "big"})
    assert_all_accept({"type": "mixed", "size": 2})
    assert Part.from_config({"type": "mixed", "size": 2}).size == 2  # type: ignore[attr-defined]
    if Loud in mixins:
        assert Part.from_config({"type": "mixed", "volume": 3}).volume == 3  # type: ignore[attr-defined]
        assert_all_refuse({"type": "mixed", "volume": "high"})
    # the schema describes every parameter, the inherited ones from their own class's docs
    properties = json_schema(Part)["$defs"]["Part.mixed"]["properties"]
    assert properties["size"]["description"] == "how big."
    assert Loud not in mixins or properties["volume"]["description"] == "how loud."


# -- schema quality ----------------------------------------------------------------------


def every_property(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (key, name, spec)
        for key, definition in schema["$defs"].items()
        for name, spec in definition.get("properties", {}).items()
        if name != "type"
    ]


def test_defaults_that_are_no_json_value_of_their_type_are_not_published() -> None:
    import attrs

    class Unbuilt:
        """Made in code."""

    @Part.register("defaults")
    @attrs.define
    class Defaults(Part):
        """Defaults of every kind.

        Args:
            names: from a factory.
            count: from a factory too.
            thing: None, which is no Unbuilt.
            label: a plain default.
        """

        names: list[str] = attrs.field(factory=list)
        count: int = attrs.field(factory=lambda: 5)
        thing: Unbuilt = None  # type: ignore[assignment]
        label: str = "x"

    properties = json_schema(Part)["$defs"]["Part.defaults"]["properties"]
    assert "default" not in properties["names"] and "default" not in properties["count"]
    assert "default" not in properties["thing"]
    assert properties["label"]["default"] == "x"
    assert Part.from_config({"type": "defaults"}).names == []  # type: ignore[attr-defined]


def test_every_published_default_passes_its_own_schema_and_validate() -> None:
    schema = json_schema()
    for key, name, spec in every_property(schema):
        if "default" in spec:
            alone = {**spec, "$defs": schema["$defs"]}
            assert not list(Draft202012Validator(alone).iter_errors(spec["default"])), (key, name)


def test_every_built_in_parameter_is_described_in_the_schema_and_a_component_by_its_own_docs() -> None:
    schema = json_schema()
    assert [(key, name) for key, name, spec in every_property(schema) if not spec.get("description")] == []

    @Part.register("undocumented")
    class Undocumented(Sized):
        pass

    definition = json_schema(Part)["$defs"]["Part.undocumented"]
    assert "description" not in definition  # not Sized's: that is another component
    assert definition["properties"]["size"]["description"] == "how big."


@pytest.mark.parametrize(
    ("key", "bad", "good"),
    [
        ("start_method", "thread", "spawn"),
        ("transfer", "pipe", "shared_memory"),
        ("num_workers", -1, 0),
        ("batch_size", 0, 1),
        ("batches_per_epoch", 0, 1),
        ("max_instances_in_memory", 0, 8),
        ("timeout", 0, 0.5),
    ],
)
def test_the_loader_schema_states_its_choices_and_minimums(key: str, bad: Any, good: Any) -> None:
    schema = json_schema(DataLoader)
    validator = Draft202012Validator(schema)
    config = {"batch_size": 4, key: bad}
    assert list(validator.iter_errors(config)) and validate(config, DataLoader)
    config[key] = good
    assert list(validator.iter_errors(config)) == [] and validate(config, DataLoader) == []
    [definition] = [d for k, d in schema["$defs"].items() if k.startswith("DataLoader.multiprocess")]
    if key in ("start_method", "transfer"):
        assert good in definition["properties"][key]["enum"]  # offered by editors


def test_the_loader_schema_refuses_a_null_batch_size_without_a_sampler() -> None:
    validator = Draft202012Validator(json_schema(DataLoader))
    for config in (
        {"batch_size": None},
        {"batch_sampler": None},
        {"batch_size": None, "batch_sampler": None},
    ):
        assert list(validator.iter_errors(config)) and validate(config, DataLoader)
    good = {"batch_size": None, "batch_sampler": {"type": "bucket", "batch_size": 2}}
    assert not list(validator.iter_errors(good)) and validate(good, DataLoader) == []


@pytest.mark.parametrize(
    ("bad", "good"),
    [
        (
            {"batch_size": 4, "persistent_workers": True},
            {"batch_size": 4, "persistent_workers": True, "num_workers": 1},
        ),
        ({"batch_sampler": "bucket", "batch_size": 4}, {"batch_sampler": "bucket", "batch_size": None}),
        ({"batch_sampler": "bucket", "drop_last": True}, {"batch_sampler": "bucket", "drop_last": False}),
        ({"batch_sampler": "bucket", "shuffle": True}, {"batch_sampler": "bucket", "shuffle": False}),
    ],
)
def test_the_loader_schema_states_the_rules_between_its_keys(
    bad: dict[str, Any], good: dict[str, Any]
) -> None:
    validator = Draft202012Validator(json_schema(DataLoader))
    for config in (bad, good):  # a sampler that can be built, whatever the test
        if config.get("batch_sampler") == "bucket":
            config["batch_sampler"] = {"type": "bucket", "batch_size": 2}
    assert list(validator.iter_errors(bad)) and validate(bad, DataLoader)
    assert list(validator.iter_errors(good)) == [] and validate(good, DataLoader) == []


# -- annotations the schema and validate read differently --------------------------------


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


def test_dict_keys_of_int_are_checked_by_both_and_built_as_ints() -> None:
    @Part.register("counts")
    class Counts(Part):
        def __init__(self, by_id: dict[int, str] = {}, by_color: dict[Color, int] = {}) -> None:  # noqa: B006
            self.by_id, self.by_color = by_id, by_color

    assert_all_accept({"type": "counts", "by_id": {"1": "a", "-20": "b", "0": "c"}})
    assert Part.from_config({"type": "counts", "by_id": {"7": "a"}}).by_id == {7: "a"}  # type: ignore[attr-defined]
    for key in ("a", "1.5", "01", " 1", "-0", ""):
        assert_all_refuse({"type": "counts", "by_id": {key: "x"}})
    assert_all_accept({"type": "counts", "by_color": {"red": 1, "BLUE": 2}})
    assert_all_refuse({"type": "counts", "by_color": {"green": 1}})


def test_a_literal_of_an_enum_member_takes_its_value_or_name() -> None:
    @Part.register("lit")
    class Lit(Part):
        def __init__(self, color: Literal[Color.RED, "plain"] = "plain") -> None:
            self.color = color

    assert_all_accept({"type": "lit", "color": "red"})
    assert_all_accept({"type": "lit", "color": "RED"})
    assert_all_accept({"type": "lit", "color": "plain"})
    assert Part.from_config({"type": "lit", "color": "red"}).color is Color.RED  # type: ignore[attr-defined]
    assert_all_refuse({"type": "lit", "color": "blue"})
    assert_all_refuse({"type": "lit", "color": "BLUE"})


def test_at_least_limits_the_length_of_strings_lists_and_mappings() -> None:
    @Part.register("sized_things")
    class SizedThings(Part):
        def __init__(
            self,
            names: Annotated[list[str], AtLeast(2)] = ["a", "b"],  # noqa: B006
            table: Annotated[dict[str, int], AtLeast(1)] = {"a": 1},  # noqa: B006
            either: Annotated[Union[int, str], AtLeast(3)] = 3,
            anything: Annotated[Any, AtLeast(1)] = 1,
        ) -> None:
            pass

    for good in ({"names": ["x", "y"]}, {"table": {"k": 1}}, {"either": "abc"}, {"either": 4}):
        assert_all_accept({"type": "sized_things", **good})
    for bad in (
        {"names": ["x"]},
        {"table": {}},
        {"either": "ab"},
        {"either": 2},
        {"anything": []},
        {"anything": ""},
        {"anything": 0},
    ):
        assert_all_refuse({"type": "sized_things", **bad})
    assert_all_accept({"type": "sized_things", "anything": True})  # a bool has no size


def test_bare_abstract_containers_and_numbers_are_what_json_gives() -> None:
    @Part.register("bare")
    class Bare(Part):
        def __init__(
            self,
            table: Mapping = {},  # type: ignore[type-arg]
            items: Sequence = (),  # type: ignore[type-arg]
            real: numbers.Real = 0,
            whole: numbers.Integral = 0,
        ) -> None:
            self.table, self.items, self.real, self.whole = table, items, real, whole

    built = Part.from_config({"type": "bare", "table": {"a": 1}, "items": [1, "x"], "real": 1.5, "whole": 2})
    assert (built.table, built.items, built.real, built.whole) == ({"a": 1}, [1, "x"], 1.5, 2)  # type: ignore[attr-defined]
    assert_all_accept({"type": "bare", "table": {"a": 1}, "items": [1, "x"], "real": 1.5, "whole": 2})
    assert_all_accept({"type": "bare", "real": 3})
    for bad in (
        {"table": [1]},
        {"items": "abc"},
        {"items": {"a": 1}},
        {"real": "1"},
        {"real": True},
        {"whole": 1.5},
    ):
        assert_all_refuse({"type": "bare", **bad})


def test_lazy_of_a_component_with_config_checks_leaves_them_to_construct() -> None:
    @Part.register("later")
    class Later(Part):
        def __init__(self, loader: Optional[Lazy[DataLoader]] = None) -> None:
            self.loader = loader

    for lazy in ({}, "multiprocess", {"reader": "text"}, {"num_workers": 2}):
        assert_all_accept({"type": "later", "loader": lazy})
    for bad in ({"batch_size": "x"}, {"num_wrkers": 1}, {"type": "nope"}, 3):
        assert_all_refuse({"type": "later", "loader": bad})


class PlainSized(Sized):
    """Sized, registered."""


class Bigger(PlainSized):
    """Sized with a floor.

    Args:
        floor: the least size.
    """

    def __init__(self, floor: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.floor = floor


class Holder(Part):
    def __init__(self, inner: Optional[PlainSized] = None) -> None:
        self.inner = inner


def test_a_concrete_component_class_as_annotation_takes_its_own_keys_or_a_subclass_name() -> None:
    Part.register("plain_sized")(PlainSized)
    Part.register("bigger")(Bigger)
    Part.register("holder")(Holder)

    @Part.register("unrelated")
    class Unrelated(Part):
        def __init__(self, size: int = 1) -> None:
            pass

    for inner in (
        {},
        {"size": 2},
        {"type": "plain_sized"},
        "plain_sized",
        "bigger",
        {"type": "bigger", "floor": 1},
    ):
        assert_all_accept({"type": "holder", "inner": inner})
    assert type(Part.from_config({"type": "holder", "inner": "bigger"}).inner) is Bigger  # type: ignore[attr-defined]
    for bad in ({"type": "unrelated"}, "unrelated", {"type": "nope"}, {"floor": 1}, {"size": "x"}, 3):
        assert_all_refuse({"type": "holder", "inner": bad})


LOADER = {"dataset_reader": "text", "data_path": "x", "data_loader": {"batch_size": 1}}  # a valid config


def schema_errors(config: Any, base: Any = None, given: tuple[str, ...] | list[str] = ()) -> list[str]:
    from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

    from framework.config import json_schema

    schema = json_schema(base, given=given)
    return [error.message for error in Draft202012Validator(schema).iter_errors(config)]


# -- validate knows the value rules that construction enforces ---------------------------


@pytest.mark.timeout(120)
def test_a_limit_in_an_annotation_is_checked_by_validate_and_in_the_schema() -> None:
    from framework.config import json_schema, validate

    reader = {"type": "text", "max_tokens": 0}
    assert [e.path for e in validate(reader, "DatasetReader")] == ["max_tokens"]
    assert schema_errors(reader, "DatasetReader")
    assert not schema_errors({"type": "text", "max_tokens": 1}, "DatasetReader")
    text = json_schema("DatasetReader")["$defs"]["DatasetReader.text"]["properties"]
    assert {"type": "integer", "minimum": 3} in text["num_buckets"]["anyOf"]


# -- TypedDict, Protocol and NamedTuple annotations --------------------------------------


class Options(TypedDict):
    size: int
    name: NotRequired[str]


class Sink(Protocol):
    def write(self, text: str) -> None: ...


class Point(NamedTuple):
    x: int
    y: int = 0


class Shape(Registrable):
    pass


@pytest.fixture
def shapes() -> None:
    @Shape.register("shape")
    class Made(Shape):
        def __init__(
            self, opts: Optional[Options] = None, sink: Optional[Sink] = None, at: Optional[Point] = None
        ):
            self.opts, self.at = opts, at


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("shapes")
@pytest.mark.parametrize(
    ("config", "errors"),
    [
        ({"opts": {"size": 1, "name": "a"}}, []),
        (
            {"opts": {"name": "a", "colour": 1}},
            ["opts.colour: unknown key", "opts.size: missing required key"],
        ),
        ({"opts": {"size": "big"}}, ["opts.size: expected int"]),
        ({"sink": "stdout"}, ["sink: expected Sink (made in code"]),
        ({"at": {"x": 1}}, []),
        ({"at": {"z": 1}}, ["at.x: missing required key", "at.z: unknown key"]),
    ],
)
def test_typeddict_protocol_and_namedtuple_parameters_are_checked_not_crashed(
    config: dict[str, Any], errors: list[str]
) -> None:
    from framework.config import validate

    config = {"type": "shape", **config}
    found = [str(e) for e in validate(config, Shape)]
    assert len(found) == len(errors) and all(f.startswith(e) for f, e in zip(found, errors)), found
    assert bool(schema_errors(config, Shape)) == bool(errors)
    if not errors:
        made: Any = Shape.from_config(config)
        assert made.at in (None, Point(1, 0)) and made.opts in (None, {"size": 1, "name": "a"})


# -- bare container annotations ----------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("kind", "given", "built"),
    [(frozenset, ["a", "b"], frozenset({"a", "b"})), (set, ["a"], {"a"}), (tuple, [1, "x"], (1, "x")),
     (list, [1], [1]), (dict, {"k": 1}, {"k": 1})],
)  # fmt: skip
def test_a_bare_container_annotation_is_checked_and_built(kind: type, given: Any, built: Any) -> None:
    from framework.config import validate

    class Holder(Shape):
        def __init__(self, items: Any) -> None:
            self.items = items

    Holder.__init__.__annotations__["items"] = kind
    Shape.register("holder")(Holder)
    assert validate({"type": "holder", "items": given}, Shape) == []
    assert [e.path for e in validate({"type": "holder", "items": 5}, Shape)] == ["items"]
    holder: Any = Shape.from_config({"type": "holder", "items": given})
    assert holder.items == built and type(holder.items) is kind
    assert not schema_errors({"type": "holder", "items": given}, Shape)


# -- the schema and validate agree on the built-in components ----------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("change", "valid"),
    [
        ({"epochs": 2.0}, True),
        ({"epochs": 2.5}, False),
        ({"data_loader": None}, False),  # no loader: its default has no batch size
        ({"data_loader": "multiprocess"}, False),
        ({"data_loader": {"batch_sampler": "bucket"}}, False),
        ({"data_loader": {"batch_sampler": {"type": "bucket", "batch_size": 2}}}, True),
        ({"data_loader": {"batch_size": 2, "cuda_device": [1, {"x": 2}]}}, False),
        ({"data_loader": {"batch_size": 2, "cuda_device": "cpu"}}, True),
        ({"$schema": 5}, False),
        ({"$schema": "https://example.com/schema.json"}, True),
        ({"data_loader": {"type": None, "batch_size": 2}}, False),
    ],
)
def test_the_schema_and_validate_agree_on_run_configs(change: dict[str, Any], valid: bool) -> None:
    from framework.config import validate

    config = {**LOADER, **change}
    config = {k: v for k, v in config.items() if v is not None}
    assert (validate(config) == [], schema_errors(config) == []) == (valid, valid), validate(config)


# -- true is not 1 -----------------------------------------------------------------------


class Mode(enum.Enum):
    ONE = 1
    TWO = 2


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("config", "built"),
    [
        ({"x": True}, None),
        ({"mode": True}, None),
        ({"flag": 1}, None),
        ({"x": 2}, {"x": 2}),
        ({"x": 2.0}, {"x": 2}),  # JSON's 2.0 is 2, as for an int parameter
        ({"mode": 2}, {"mode": Mode.TWO}),
        ({"mode": "TWO"}, {"mode": Mode.TWO}),
        ({"flag": True}, {"flag": True}),
    ],
)
def test_a_bool_is_not_an_int_for_literal_and_enum_parameters(config: dict[str, Any], built: Any) -> None:
    from framework.config import validate

    @Shape.register("lit")
    class Lit(Shape):
        def __init__(self, x: Literal[1, 2] = 1, mode: Mode = Mode.ONE, flag: Literal[True] = True) -> None:
            self.x, self.mode, self.flag = x, mode, flag

    config = {"type": "lit", **config}
    assert (validate(config, Shape) == []) == (built is not None) == (schema_errors(config, Shape) == [])
    if built is not None:
        made = vars(Shape.from_config(config))
        assert {key: made[key] for key in built} == built
        assert all(type(made[key]) is type(value) for key, value in built.items())


# -- positional-only parameters ----------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_positional_only_parameter_is_named_in_the_config_and_passed_by_position() -> None:
    from framework.config import validate

    @Shape.register("pos")
    class Pos(Shape):
        def __init__(self, size: int, scale: float = 1.0, shift: int = 0, /, name: str = "") -> None:
            self.size, self.scale, self.shift, self.name = size, scale, shift, name

    config = {"type": "pos", "size": 3, "shift": 2, "name": "a"}
    assert validate(config, Shape) == [] and not schema_errors(config, Shape)
    assert vars(Shape.from_config(config)) == {"size": 3, "scale": 1.0, "shift": 2, "name": "a"}
    assert [e.path for e in validate({"type": "pos"}, Shape)] == ["size"]


# -- arguments given in code, for a base's configs ---------------------------------------


@pytest.mark.timeout(120)
def test_validate_and_the_schema_of_a_base_know_the_arguments_given_in_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from framework.config import validate

    (tmp_path / "c.txt").write_text("a b\nc d\n")
    config = {"batch_size": 2}
    assert validate(config, "DataLoader") == [] and not schema_errors(config, "DataLoader")
    loader = DataLoader.from_config(
        config, reader=DatasetReader.by_name("text")(), data_path=str(tmp_path / "c.txt")
    )
    assert sum(1 for _ in loader) == 1

    @Shape.register("sized")
    class Sized(Shape):
        def __init__(self, size: int, colour: str = "red") -> None:
            self.size = size

    assert [e.path for e in validate({"type": "sized"}, Shape)] == ["size"]
    assert validate({"type": "sized"}, Shape, given=["size"]) == []
    assert schema_errors({"type": "sized"}, Shape) and not schema_errors({"type": "sized"}, Shape, ["size"])
    assert main(["config", "schema", "Shape", "--given", "size"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert "required" not in printed["$defs"]["Shape.sized (given size)"]
