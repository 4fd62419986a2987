from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Tuple, Union

import pytest

from framework import Lazy, Registrable
from framework.config import construct, load_config
from framework.errors import ConfigError


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Sampler(Registrable):
    default_implementation = "simple"


class Tokenizer(Registrable):
    pass


class Loader(Registrable):
    pass


@pytest.fixture(autouse=True)
def components() -> None:
    @Sampler.register("simple")
    class Simple(Sampler):
        def __init__(self, batch_size: int, sorting_keys: Optional[List[str]] = None) -> None:
            self.batch_size = batch_size
            self.sorting_keys = sorting_keys

    @Tokenizer.register("whitespace")
    class Whitespace(Tokenizer):
        def __init__(self, lowercase: bool = False, vocab: Any = None) -> None:
            self.lowercase = lowercase
            self.vocab = vocab

    @Loader.register("basic")
    class Basic(Loader):
        def __init__(
            self,
            reader: object,
            sampler: Sampler,
            tokenizers: Dict[str, Tokenizer] = {},  # noqa: B006
            later: Optional[Lazy[Tokenizer]] = None,
            weights: Tuple[float, ...] = (),
            color: Color = Color.RED,
            path: Path = Path("."),
            mode: Literal["fast", "slow"] = "fast",
            size: Union[int, str] = 0,
        ) -> None:
            self.reader = reader
            self.sampler = sampler
            self.tokenizers = tokenizers
            self.later = later
            self.weights = weights
            self.color = color
            self.path = path
            self.mode = mode
            self.size = size

    @Loader.register("forwarding")
    class Forwarding(Basic):
        def __init__(self, extra: int = 1, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.extra = extra


def test_nested_registrables_containers_and_extras() -> None:
    loader: Any = Loader.from_config(
        {
            "type": "basic",
            "sampler": {"type": "simple", "batch_size": 4, "sorting_keys": ["tokens"]},
            "tokenizers": {"a": {"type": "whitespace", "lowercase": True}, "b": "whitespace"},
            "weights": [1, 2.5],
            "color": "blue",
            "path": "/tmp/x",
            "mode": "slow",
            "size": "big",
        },
        reader="the reader",
    )
    assert loader.reader == "the reader"
    assert loader.sampler.batch_size == 4 and loader.sampler.sorting_keys == ["tokens"]
    assert loader.tokenizers["a"].lowercase is True
    assert loader.tokenizers["b"].lowercase is False
    assert loader.weights == (1.0, 2.5) and isinstance(loader.weights[0], float)
    assert loader.color is Color.BLUE
    assert loader.path == Path("/tmp/x")
    assert loader.mode == "slow" and loader.size == "big"


def test_default_implementation_is_used_without_type() -> None:
    loader: Any = Loader.from_config({"type": "basic", "sampler": {"batch_size": 2}}, reader=None)
    assert type(loader.sampler).__name__ == "Simple"


def test_lazy_is_built_later_with_extra_arguments() -> None:
    loader: Any = Loader.from_config(
        {"type": "basic", "sampler": {"batch_size": 1}, "later": {"type": "whitespace"}},
        reader=None,
    )
    assert isinstance(loader.later, Lazy)
    built = loader.later.construct(vocab={"a": 1})
    assert type(built).__name__ == "Whitespace" and built.vocab == {"a": 1}
    with pytest.raises(ConfigError, match=r"later\.type"):
        Loader.from_config(
            {"type": "basic", "sampler": {"batch_size": 1}, "later": {"type": "nope"}}, reader=None
        ).later.construct()  # type: ignore[attr-defined]


def test_kwargs_are_resolved_against_the_parent_signature() -> None:
    loader: Any = Loader.from_config(
        {"type": "forwarding", "extra": 3, "sampler": {"batch_size": 5}, "color": "red"},
        reader="r",
    )
    assert loader.extra == 3 and loader.sampler.batch_size == 5 and loader.color is Color.RED
    with pytest.raises(ConfigError, match=r"^sampler\.batch_size: expected int, got 'x'"):
        Loader.from_config({"type": "forwarding", "sampler": {"batch_size": "x"}}, reader="r")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"type": "basic", "sampler": {"batch_size": "ten"}}, "sampler.batch_size: expected int, got 'ten'"),
        ({"type": "basic", "sampler": {"batch_size": True}}, "sampler.batch_size: expected int, got True"),
        ({"type": "basic", "sampler": {"batch_size": 1, "sorting_keys": "tokens"}},
         "sampler.sorting_keys: expected a list, got 'tokens'"),
        ({"type": "basic", "sampler": {"batch_size": 1, "sorting_keys": ["a", 3]}},
         "sampler.sorting_keys.1: expected str, got 3"),
        ({"type": "basic", "sampler": {"batch_size": 1}, "tokenizers": {"x": {"type": "white"}}},
         "tokenizers.x.type: 'white' is not a registered name for Tokenizer. Did you mean 'whitespace'?"),
        ({"type": "basic", "sampler": {"batch_size": 1}, "tokenizers": {"x": {"lowercase": "no"}}},
         "tokenizers.x.type: missing 'type' for Tokenizer; one of: 'whitespace'"),
        ({"type": "basic", "sampler": {"batch_size": 1}, "color": "green"},
         "color: expected 'red' or 'blue', got 'green'"),
        ({"type": "basic", "sampler": {"batch_size": 1}, "mode": "medium"},
         "mode: expected 'fast' or 'slow', got 'medium'"),
        ({"type": "basic", "sampler": {}}, "sampler.batch_size: missing required key for Simple"),
        ({"type": "basic", "sampler": {"batch_size": 1}, "weights": [1, "a"]},
         "weights.1: expected float, got 'a'"),
    ],
)
def test_errors_name_the_dotted_path(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        Loader.from_config(config, reader=None)
    assert str(info.value).startswith(message), str(info.value)
    assert isinstance(info.value, ValueError)


def test_unknown_key_is_an_error_with_a_suggestion() -> None:
    with pytest.raises(ConfigError) as info:
        Loader.from_config({"type": "basic", "sampler": {"batch_size": 1, "sorting_key": []}}, reader=1)
    error = info.value
    assert error.path == "sampler.sorting_key"
    assert "unknown key for Simple" in str(error)
    assert "Did you mean 'sorting_keys'?" in str(error)
    assert "Accepted keys: batch_size, sorting_keys" in str(error)


def test_structured_fields_on_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        construct(Dict[str, int], {"a": {"b": "x"}}, path="outer")
    assert info.value.path == "outer.a"
    assert info.value.expected == "int"
    assert info.value.got == {"b": "x"}


def test_construct_primitives_and_unions() -> None:
    assert construct(float, 3) == 3.0
    assert construct(Optional[int], None) is None
    assert construct(Union[int, List[int]], [1, 2]) == [1, 2]
    with pytest.raises(ConfigError, match="expected int or list of int"):
        construct(Union[int, List[int]], "x")
    assert construct(Any, object) is object


def test_already_built_objects_pass_through() -> None:
    sampler = Sampler.by_name("simple")(batch_size=9)
    loader: Any = Loader.from_config({"type": "basic", "sampler": sampler}, reader=None)
    assert loader.sampler is sampler


def test_missing_type_on_a_base_without_default() -> None:
    with pytest.raises(ConfigError, match=r"^type: missing 'type' for Loader; one of: 'basic', 'forwarding'"):
        Loader.from_config({"sampler": {"batch_size": 1}}, reader=None)


def test_load_config_json_and_yaml(tmp_path: Path) -> None:
    config = {"type": "basic", "sampler": {"batch_size": 7}}
    json_file = tmp_path / "c.json"
    json_file.write_text(json.dumps(config))
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("type: basic\nsampler:\n  batch_size: 7\n")
    assert load_config(json_file) == load_config(yaml_file) == config
    loader: Any = Loader.from_config(str(yaml_file), reader=None)
    assert loader.sampler.batch_size == 7


def test_load_config_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="is not valid JSON"):
        load_config(bad)
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(listed)


def test_constructor_errors_become_config_errors_at_the_right_path() -> None:
    @Sampler.register("picky")
    class Picky(Sampler):
        def __init__(self, size: int) -> None:
            if size <= 0:
                raise ValueError("size must be positive; pass a size of at least 1")

    with pytest.raises(ConfigError, match=r"^sampler: Picky: size must be positive"):
        Loader.from_config({"type": "basic", "sampler": {"type": "picky", "size": 0}}, reader=None)


def test_one_unresolvable_annotation_degrades_only_itself() -> None:
    namespace: dict[str, Any] = {}
    exec(
        "from typing import List\n"
        "from framework import Registrable\n"
        "class Thing(Registrable):\n"
        "    def __init__(self, size: int, other: 'NoSuchName', names: 'List[str]') -> None:\n"
        "        self.size, self.other, self.names = size, other, names\n",
        namespace,
    )
    # given in code, the unresolvable one is not checked; in a config, it is an error
    thing = construct(namespace["Thing"], {"size": 2, "names": ["a"]}, extras={"other": 1})
    assert thing.size == 2 and thing.other == 1 and thing.names == ["a"]
    with pytest.raises(ConfigError, match="size: expected int"):
        construct(namespace["Thing"], {"size": "2", "names": []}, extras={"other": 1})
    with pytest.raises(ConfigError, match=r"^other: cannot check the value for Thing\.other"):
        construct(namespace["Thing"], {"size": 2, "other": {"any": "thing"}, "names": ["a"]})
    with pytest.raises(ConfigError, match=r"names\.0: expected str"):
        construct(namespace["Thing"], {"size": 2, "names": [3]}, extras={"other": 1})


class Node(Registrable):
    pass


# -- Lazy of a name alone ----------------------------------------------------------------


def test_lazy_construct_treats_a_name_alone_as_the_mapping_with_only_type() -> None:
    from framework.errors import ConfigError

    @Node.register("free")
    class Free(Node):
        def __init__(self, size: int = 0, **options: Any) -> None:
            self.size, self.options = size, options

    @Node.register("strict")
    class Strict(Node):
        def __init__(self, size: int = 0) -> None:
            self.size = size

    @Node.register("box")
    class Box(Node):
        def __init__(self, part: Lazy[Node]) -> None:
            self.part = part

    built = []
    for form in ({"type": "free"}, "free"):
        box: Any = Node.from_config({"type": "box", "part": form})
        part = box.part.construct(size=3, colour="red")
        built.append((type(part), part.size, part.options))
    assert built == [(Free, 3, {"colour": "red"})] * 2
    for form in ({"type": "strict"}, "strict"):
        box = Node.from_config({"type": "box", "part": form})
        with pytest.raises(ConfigError, match="colour: Strict takes no argument 'colour'"):
            box.part.construct(size=3, colour="red")
