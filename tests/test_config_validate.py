"""`framework.config.validate` and the from_config fixes that share its walk."""

from __future__ import annotations

import json
import multiprocessing
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional, Union

import pytest

from framework import Lazy, Registrable
from framework.cli import main
from framework.config import construct, validate
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
