"""`framework.config.validate` and the from_config fixes that share its walk."""

from __future__ import annotations

import json
import multiprocessing
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Optional, Union

import jsonschema
import pytest

from framework import DatasetReader, Lazy, Registrable
from framework.cli import main
from framework.config import AtLeast, construct, json_schema, validate
from framework.data import BatchSampler
from framework.errors import ConfigError, UnknownNameError

REPO_ROOT = Path(__file__).resolve().parent.parent


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


BUNDLED = json.loads((REPO_ROOT / "framework" / "examples" / "default.json").read_text(encoding="utf-8"))


def test_validate_reports_every_error_of_a_config_together() -> None:
    config = {
        "dataset_reader": {"type": "txt"},
        "data_loader": {"batch_sampler": {"type": "bucket", "batch_size": "x"}, "num_wrkers": 2},
        "epoch": 3,
        "epochs": 0,
    }
    errors = validate(config)
    assert [str(e).split(" Accepted keys")[0] for e in errors] == [
        "dataset_reader.type: 'txt' is not a registered name for DatasetReader. Did you mean 'text'?"
        + " Available: 'csv', 'jsonl', 'text'. A dotted path such as 'package.module:ClassName' also works.",
        "data_path: missing required key",
        "data_loader.batch_sampler.batch_size: expected int, got 'x'",
        "data_loader.num_wrkers: unknown key for MultiProcessDataLoader. Did you mean 'num_workers'?",
        "epochs: expected a positive int, got 0",
        "epoch: unknown top-level key. Did you mean 'epochs'?",
    ]
    assert all(isinstance(e, ConfigError) for e in errors)


def test_from_config_raises_the_same_errors_that_validate_lists() -> None:
    config = {"type": "circle", "radius": "big", "colour": "red"}
    listed = validate(config, Shape)
    with pytest.raises(ConfigError) as info:
        Shape.from_config(config)
    assert [str(e) for e in info.value.errors] == [str(e) for e in listed]
    assert [e.path for e in listed] == ["radius", "colour"]
    assert str(info.value).startswith("radius: expected float, got 'big' (and 1 more: colour: unknown key")


def test_validate_takes_a_base_by_class_or_name_and_rejects_unknown_bases() -> None:
    assert validate({"type": "bucket", "batch_size": 4}, "BatchSampler") == []
    assert [e.path for e in validate({"type": "bucket"}, BatchSampler)] == ["batch_size"]
    with pytest.raises(UnknownNameError, match="Did you mean 'BatchSampler'"):
        validate({}, "BatchSamplr")
    assert [str(e) for e in validate([1], None)] == ["<root>: expected a mapping (a run config), got a list"]


class Explosive(Shape):
    """Its constructor has side effects: it writes a file and starts a process."""

    def __init__(self, marker: str, size: int = 1) -> None:
        Path(marker).write_text("constructed")
        multiprocessing.get_context("spawn").Process(target=print).start()


# What the process does while armed, from Python's audit events (which every open,
# connect and process start raises); the hook cannot be removed, so it is armed briefly.
_AUDITED: list[tuple[str, str]] = []
_ARMED: list[bool] = []
_WATCHED = ("open", "socket.connect", "subprocess.Popen", "os.fork", "os.posix_spawn", "os.exec")


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _ARMED and event in _WATCHED:
        _AUDITED.append((event, str(args[0]) if args else ""))


sys.addaudithook(_audit)


def test_validate_constructs_nothing_reads_nothing_and_connects_nowhere(tmp_path: Path) -> None:
    Shape.register("explosive")(Explosive)
    marker = tmp_path / "marker"
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    data = tmp_path / "data.txt"
    data.write_text("a b c\n")
    configs = [
        with_data_path(f"http://127.0.0.1:{port}/corpus.txt"),
        with_data_path(str(data)),
        {**with_data_path(str(data)), "data_loader": {"num_workers": 2, "batch_size": 1}},
    ]
    for config in configs:
        validate(config)  # first calls import the components' modules: not what we watch
    before = set(multiprocessing.active_children())
    _ARMED.append(True)
    try:
        assert validate({"type": "explosive", "marker": str(marker)}, Shape) == []
        assert validate({"type": "explosive", "marker": str(marker), "size": "x"}, Shape)
        assert [validate(config) for config in configs] == [[], [], []]
    finally:
        _ARMED.clear()
    try:
        with pytest.raises(socket.timeout):
            listener.accept()  # nobody connected
    finally:
        listener.close()
    assert _AUDITED == []
    assert not marker.exists()
    assert set(multiprocessing.active_children()) == before


def with_data_path(data_path: str) -> dict[str, Any]:
    return {**BUNDLED, "data_path": data_path}


def test_cli_validate_prints_one_line_per_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps({**BUNDLED, "epochs": "two", "dataset_reader": {"type": "text", "max_token": 3}})
    )
    assert main(["config", "validate", str(path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["dataset_reader.max_token", "epochs"]
    assert "Did you mean 'max_tokens'?" in lines[0]
    fixed = ["--override", '{"epochs": 2}', "--override", '{"dataset_reader": "text"}']
    assert main(["config", "validate", str(path), *fixed]) == 0
    assert capsys.readouterr().out == f"{path}: valid\n"
    assert main(["config", "validate", str(path), "--override", "[1]"]) == 1
    assert "--override #1 must be a JSON object" in capsys.readouterr().out
    assert main(["config", "validate", str(tmp_path / "missing.json")]) == 1
    assert "cannot read config file" in capsys.readouterr().out


def test_run_prints_every_error_and_stops_before_any_download(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], isolated_cache: Path
) -> None:
    path = tmp_path / "config.json"
    config = {**BUNDLED, "data_path": "http://127.0.0.1:9/corpus.txt", "epochs": 0}
    config["data_loader"] = {"batch_sampler": {"type": "bucket", "batch_size": "ten"}}
    path.write_text(json.dumps(config))
    assert main(["run", "--no-progress", str(path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "framework run: error: data_loader.batch_sampler.batch_size: expected int, got 'ten'",
        "framework run: error: epochs: expected a positive int, got 0",
    ]
    assert not any(isolated_cache.iterdir())


def test_a_run_config_may_name_components_by_name_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.json"
    data = tmp_path / "corpus.txt"
    data.write_text("a b\nc d e\n")
    config = {"dataset_reader": "text", "data_path": str(data), "data_loader": {"batch_size": 2}}
    path.write_text(json.dumps(config))
    assert main(["run", "--no-progress", "--json", str(path)]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["instances"] == 2
    # a loader by name alone has no batch size: the check names the key, before anything runs
    path.write_text(json.dumps({**config, "data_loader": "multiprocess"}))
    assert main(["run", "--no-progress", str(path)]) == 2
    assert capsys.readouterr().err.startswith(
        "framework run: error: data_loader.batch_size: batch_size is required"
    )


@pytest.mark.timeout(120)
def test_the_main_job_declares_numpy_and_runs_without_warnings(cli_env: dict[str, str]) -> None:
    # torch warns on every import when NumPy is missing; the loader needs it, so a plain
    # install must bring it
    import configparser

    setup = configparser.ConfigParser()
    setup.read(REPO_ROOT / "setup.cfg")
    required = [
        line.split(">")[0].split("=")[0].strip() for line in setup["options"]["install_requires"].split()
    ]
    assert "numpy" in required
    result = subprocess.run(
        [sys.executable, "-W", "default", "-m", "framework", "run", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=100,
        env=cli_env,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr and "NumPy" not in result.stderr, result.stderr


def test_a_config_error_survives_pickling() -> None:
    # worker processes send errors back pickled: a ConfigError raised there must arrive
    import pickle

    error = ConfigError("data_loader.batch_size", "expected int, got 'x'", "int", "x")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.path, copy.reason, copy.expected, copy.got) == (
        "data_loader.batch_size",
        "expected int, got 'x'",
        "int",
        "x",
    )
    assert str(copy) == str(error)


class Palette(Shape):
    def __init__(self, later: Lazy[Color], fixed: Optional[Color] = None) -> None:
        self.later = later
        self.fixed = fixed


def test_a_lazy_part_is_checked_up_front_but_may_miss_keys_given_later() -> None:
    Shape.register("palette")(Palette)
    Color.register("exact")(Exact)
    # "value" is missing, but Lazy.construct(value=...) may still give it: valid
    config = {"type": "palette", "later": {"type": "exact"}}
    assert validate(config, Shape) == []
    built: Any = Shape.from_config(config)
    assert built.later.construct(value=3).value == 3
    # a wrong name or type inside the Lazy is an error now, not when it is built
    bad = {"type": "palette", "later": {"type": "exakt", "value": "x"}, "fixed": {"type": "exact"}}
    assert [e.path for e in validate(bad, Shape)] == ["later.type", "fixed.value"]
    with pytest.raises(
        ConfigError, match=r"^later\.type: 'exakt' is not a registered name for Color\. Did you mean"
    ):
        Shape.from_config(bad)


class Exact(Color):
    def __init__(self, value: int) -> None:
        self.value = value


LOADER = {"dataset_reader": "text", "data_path": "x", "data_loader": {"batch_size": 1}}  # a valid config


# -- an int too long to print ------------------------------------------------------------


def test_an_int_too_long_to_print_is_an_error_that_says_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from framework.config import validate

    errors = validate({**LOADER, "data_path": 10**5000})
    assert [str(e) for e in errors] == ["data_path: expected str or list of str, got an int of 5001 digits"]
    (long_value,) = validate({**LOADER, "epochs": "x" * 10_000})
    assert str(long_value).endswith("... (10002 characters)") and len(str(long_value)) < 150
    long_key = validate({**LOADER, "k" * 1000: 1})[0]
    assert long_key.path.endswith("... (1002 characters)") and len(long_key.path) < 120
    (tmp_path / "big.json").write_text('{"data_path": ' + "9" * 5000 + "}")
    (tmp_path / "big.yaml").write_text("data_path: " + "9" * 5000 + "\n")
    for name in ("big.json", "big.yaml"):
        assert main(["config", "validate", str(tmp_path / name)]) == 1
        assert capsys.readouterr().out.startswith(f"<root>: {tmp_path / name} is not valid ")
    assert (
        main(["config", "validate", str(tmp_path / "big.json"), "-o", '{"epochs": ' + "9" * 5000 + "}"]) == 1
    )
    assert capsys.readouterr().out.startswith(f"<root>: {tmp_path / 'big.json'} is not valid JSON")
    (tmp_path / "ok.json").write_text(json.dumps(LOADER))
    assert (
        main(["config", "validate", str(tmp_path / "ok.json"), "-o", '{"epochs": ' + "9" * 5000 + "}"]) == 1
    )
    out = capsys.readouterr().out
    assert out.startswith("<root>: --override #1 is not valid JSON (Exceeds the limit") and len(out) < 400


class Thing(Registrable):
    pass


def judges(config: dict[Any, Any]) -> tuple[list[str], bool, bool]:
    """What `validate`, `from_config` and the schema say of a `Thing` config."""
    errors = [str(e) for e in validate(config, Thing)]
    try:
        Thing.from_config(config)
        built = True
    except ConfigError:
        built = False
    schema_ok = jsonschema.Draft202012Validator(json_schema(Thing)).is_valid(config)
    return errors, built, schema_ok


@pytest.fixture
def forwarding() -> None:
    @Thing.register("kw")
    class Kw(Thing):
        def __init__(self, a: int = 0, **kwargs: Any) -> None:
            self.kwargs = kwargs


@pytest.mark.usefixtures("forwarding")
@pytest.mark.parametrize("key", ["self", 1])
def test_a_key_kwargs_cannot_take_is_refused_by_validate_and_the_schema(key: Any) -> None:
    # A key **kwargs cannot take ({"self": 1}, a YAML int key) is refused by validate() and
    # the schema, as from_config refuses it (Python cannot pass self=, nor a keyword that is
    # not a string).
    errors, built, schema_ok = judges({"type": "kw", key: 1})
    assert not built
    assert len(errors) == 1 and errors[0].startswith(f"{key}: Kw cannot take this key through **kwargs")
    if isinstance(key, str):  # JSON has only string keys
        assert not schema_ok


@pytest.mark.usefixtures("forwarding")
def test_other_keys_still_go_to_kwargs() -> None:
    assert judges({"type": "kw", "a": 1, "x-y": 2, "cls": 3}) == ([], True, True)


@pytest.fixture
def tokenizer_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    (tmp_path / "review_broken_tokenizer.py").write_text('raise RuntimeError("boom at import")\n')
    (tmp_path / "review_tokenizer_value.py").write_text("NOT_CALLABLE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("review_broken_tokenizer", "review_tokenizer_value"):
        sys.modules.pop(name, None)


@pytest.mark.usefixtures("tokenizer_modules")
@pytest.mark.parametrize(
    "tokenizer",
    [
        "review_missing_module_zz:tokenize",  # not importable
        "review_broken_tokenizer:tokenize",  # its module raises RuntimeError on import
        "review_tokenizer_value:NOT_CALLABLE",  # not callable
    ],
)
def test_a_tokenizer_the_constructor_refuses_is_refused_by_validate(tokenizer: str) -> None:
    # validate() refuses a tokenizer path from_config refuses, and a module raising at import
    # is a ConfigError, not a RuntimeError out of from_config.
    config = {"type": "text", "tokenizer": tokenizer}
    errors = validate(config, DatasetReader)
    assert [e.path for e in errors] == ["tokenizer"]
    assert f"tokenizer {tokenizer!r}" in str(errors[0])
    with pytest.raises(ConfigError, match=r"^tokenizer: "):
        DatasetReader.from_config(config)


def test_a_good_tokenizer_path_still_passes() -> None:
    config = {"type": "text", "tokenizer": "builtins:str.split"}
    assert validate(config, DatasetReader) == []
    assert DatasetReader.from_config(config) is not None


@pytest.fixture
def builtin_parameters() -> None:
    @Thing.register("builtins")
    class Builtins(Thing):
        def __init__(
            self,
            kind: Optional[type[Thing]] = None,
            buffer: Optional[bytearray] = None,
            error: Optional[ValueError] = None,
        ) -> None:
            pass


@pytest.mark.usefixtures("builtin_parameters")
@pytest.mark.parametrize(
    ("key", "value"), [("kind", {"type": "builtins"}), ("buffer", {"source": "ab"}), ("error", {"args": 1})]
)
def test_a_builtin_class_is_not_made_from_a_mapping(key: str, value: Any) -> None:
    # A builtin class's signature cannot be read, so validate() must not take any mapping for
    # it: from_config would fail calling it, and the schema refuses it.
    errors, built, schema_ok = judges({"type": "builtins", key: value})
    assert (built, schema_ok) == (False, False)
    assert [e.split(":")[0] for e in errors] == [key]


@pytest.mark.usefixtures("tokenizer_modules")
def test_a_base_whose_module_raises_at_import_is_a_config_error() -> None:
    # validate(config, base="pkg.mod:Base") and json_schema(...) turn any error of the
    # module's import (a RuntimeError, a SystemExit) into a ConfigError, not only ImportError
    # and AttributeError.
    with pytest.raises(ConfigError, match=r"^base: cannot import 'review_broken_tokenizer:Base'.*boom"):
        validate({}, base="review_broken_tokenizer:Base")
    with pytest.raises(ConfigError, match=r"^base: "):
        json_schema("review_broken_tokenizer:Base")


@pytest.fixture
def limited_float() -> None:
    @Thing.register("limited")
    class Limited(Thing):
        def __init__(self, rate: Annotated[float, AtLeast(1)] = 1.0) -> None:
            self.rate = rate


@pytest.mark.usefixtures("limited_float")
def test_nan_is_not_at_least_anything() -> None:
    # Annotated[float, AtLeast(1)] refuses NaN (json.loads reads it; NaN < 1 is false), so the
    # constructor never gets it.
    config = {"type": "limited", "rate": float("nan")}
    assert [e.path for e in validate(config, Thing)] == ["rate"]
    with pytest.raises(ConfigError, match=r"^rate: "):
        Thing.from_config(config)
    assert validate({"type": "limited", "rate": float("inf")}, Thing) == []


@pytest.fixture
def limited_set() -> None:
    @Thing.register("pairs")
    class Pairs(Thing):
        def __init__(self, ids: Annotated[set[int], AtLeast(2)] = frozenset({1, 2})) -> None:  # type: ignore[assignment]
            assert len(ids) >= 2
            self.ids = ids


@pytest.mark.usefixtures("limited_set")
def test_a_set_of_at_least_n_counts_each_item_once() -> None:
    # AtLeast(2) on a set[int] counts distinct items: [1, 1] is a list of 2 but builds a set
    # of one.
    assert [e.path for e in validate({"type": "pairs", "ids": [1, 1]}, Thing)] == ["ids"]
    assert validate({"type": "pairs", "ids": [1, 2, 2]}, Thing) == []
    assert Thing.from_config({"type": "pairs", "ids": [1, 2, 2]}).ids == {1, 2}  # type: ignore[attr-defined]


@pytest.mark.xfail(
    strict=True,
    reason="validate() does not check data_path's URL scheme against the download backends "
    "(config may not import framework.download); framework run refuses it later with a "
    "DownloadError, before downloading anything",
)
def test_a_data_path_no_backend_serves_is_refused_by_validate() -> None:
    config = {"dataset_reader": "text", "data_path": "nosuchscheme://x", "data_loader": {"batch_size": 1}}
    assert [e.path for e in validate(config)] == ["data_path"]
