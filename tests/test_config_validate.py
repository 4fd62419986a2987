"""`framework.config.validate` and the from_config fixes that share its walk."""

from __future__ import annotations

from typing import Any, Union

import pytest

from framework import Registrable
from framework.config import construct
from framework.errors import ConfigError


class Shape(Registrable):
    pass


class Color(Registrable):
    pass


@pytest.fixture(autouse=True)
def components() -> None:
    @Shape.register("circle")
    class Circle(Shape):
        def __init__(self, radius: float) -> None:
            self.radius = radius

    @Color.register("rgb")
    class Rgb(Color):
        def __init__(self, red: int = 0, green: int = 0, blue: int = 0) -> None:
            self.rgb = (red, green, blue)


def test_kwargs_constructor_receives_the_extra_keys() -> None:
    @Shape.register("free")
    class Free(Shape):
        def __init__(self, name: str, **options: Any) -> None:
            self.name = name
            self.options = options

    built: Any = Shape.from_config({"type": "free", "name": "x", "sides": 3, "fill": "red"})
    assert built.name == "x" and built.options == {"sides": 3, "fill": "red"}


def test_kwargs_forwarded_to_a_parent_still_catch_typos() -> None:
    # the parent takes fixed parameters: a key it does not know would fail there, so it
    # is an unknown key here, with a did-you-mean, before anything is built
    @Shape.register("ring")
    class Ring(Shape.by_name("circle")):  # type: ignore[misc]
        def __init__(self, width: float = 1.0, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.width = width

    ring: Any = Shape.from_config({"type": "ring", "radius": 2, "width": 3})
    assert (ring.radius, ring.width) == (2.0, 3.0)
    with pytest.raises(ConfigError) as info:
        Shape.from_config({"type": "ring", "radis": 2})
    assert [str(e).split(" Accepted")[0] for e in info.value.errors] == [
        "radius: missing required key for Ring",
        "radis: unknown key for Ring. Did you mean 'radius'?",
    ]


@pytest.mark.parametrize("order", ["shape first", "color first"])
def test_union_of_registrables_reports_the_matching_alternative(order: str) -> None:
    annotation = Union[Shape, Color] if order == "shape first" else Union[Color, Shape]
    with pytest.raises(ConfigError) as info:
        construct(annotation, {"type": "rgb", "red": "lots"}, path="paint")
    assert str(info.value).startswith("paint.red: expected int, got 'lots'"), str(info.value)
    with pytest.raises(ConfigError) as info:
        construct(annotation, {"type": "circle", "radius": "big"}, path="paint")
    assert str(info.value).startswith("paint.radius: expected float, got 'big'"), str(info.value)


def test_unresolvable_annotation_is_a_clear_error_not_a_free_pass() -> None:
    namespace: dict[str, Any] = {}
    exec(
        "from framework import Registrable\n"
        "class Thing(Registrable):\n"
        "    def __init__(self, size: int, other: 'NoSuchName' = None) -> None:\n"
        "        self.size, self.other = size, other\n",
        namespace,
    )
    thing = construct(namespace["Thing"], {"size": 2})  # the bad annotation is not used
    assert thing.size == 2
    with pytest.raises(ConfigError) as info:
        construct(namespace["Thing"], {"size": 2, "other": {"any": "thing"}})
    message = str(info.value)
    assert message.startswith("other: "), message
    assert "Thing" in message and "'NoSuchName'" in message and "resolve" in message
