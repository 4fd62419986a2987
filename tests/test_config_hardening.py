"""Config checking, the schema and the ``framework config``/``run`` commands under hostile
input: each test here failed before its fix (the review of issue 13)."""

from __future__ import annotations

import contextlib
import enum
import json
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, NamedTuple, Optional, Protocol

import pytest
from typing_extensions import NotRequired, TypedDict

from framework import Lazy, Registrable
from framework.cli import main
from framework.data import DataLoader, DatasetReader

REPO_ROOT = Path(__file__).resolve().parent.parent
LOADER = {"dataset_reader": "text", "data_path": "x", "data_loader": {"batch_size": 1}}  # a valid config


def make_plugin(site: Path, dist: str, modules: dict[str, str], hook_body: str) -> None:
    """An installed distribution (a dist-info on `site`) whose hook runs `hook_body`."""
    site.mkdir(exist_ok=True)
    for name, text in modules.items():
        (site / f"{name}.py").write_text(textwrap.dedent(text))
    hooks = (
        "from framework import hookimpl\n\n@hookimpl\n"
        "def framework_register_components(registrar):\n"
        "    from framework.data import DatasetReader\n"
        f"    {hook_body}\n"
    )
    (site / f"{dist}_hooks.py").write_text(hooks)
    info = site / f"{dist}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[framework.plugins]\n{dist} = {dist}_hooks\n")


def run_cli(site: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEWORK_")}
    environ["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO_ROOT)])
    return subprocess.run(
        [sys.executable, "-m", "framework", *argv],
        capture_output=True, text=True, env=environ, timeout=120, cwd=site,
    )  # fmt: skip


def write_json(path: Path, config: Any) -> str:
    path.write_text(json.dumps(config))
    return str(path)


# -- 1. SystemExit from someone else's code is a failure, never a silent success ----------
def test_a_component_module_calling_sys_exit_fails_validate_schema_and_run(tmp_path: Path) -> None:
    make_plugin(
        tmp_path, "exitplug", {"exitplug_comp": "import sys\nsys.exit(0)\n"},
        "registrar.add(DatasetReader, 'boom', 'exitplug_comp:Boom')",
    )  # fmt: skip
    config = write_json(tmp_path / "cfg.json", {"dataset_reader": "boom", "data_path": "x", "bogus": 1})
    checked = run_cli(tmp_path, "config", "validate", config)
    assert checked.returncode == 1, checked
    assert "dataset_reader.type" in checked.stdout and "SystemExit" in checked.stdout
    assert "bogus" in checked.stdout  # the other errors are still listed
    schema = run_cli(tmp_path, "config", "schema")
    assert schema.returncode == 0, schema
    undescribed = json.loads(schema.stdout)["x-framework-undescribed"]
    assert any("boom" in item["component"] and "SystemExit" in item["reason"] for item in undescribed)
    ran = run_cli(tmp_path, "run", config)
    assert ran.returncode != 0 and "SystemExit" in ran.stderr, ran


def test_sys_exit_inside_a_constructor_fails_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    @DatasetReader.register("quitter")
    class Quitter(DatasetReader):
        def __init__(self) -> None:
            sys.exit(0)

    (tmp_path / "data.txt").write_text("a b\n")
    config = write_json(
        tmp_path / "cfg.json",
        {"dataset_reader": "quitter", "data_path": "data.txt", "data_loader": {"batch_size": 1}},
    )
    assert main(["run", config]) == 1
    assert "SystemExit(0)" in capsys.readouterr().err


def schema_errors(config: Any, base: Any = None, given: tuple[str, ...] | list[str] = ()) -> list[str]:
    from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

    from framework.config import json_schema

    schema = json_schema(base, given=given)
    return [error.message for error in Draft202012Validator(schema).iter_errors(config)]


# -- 2. keys that `framework run` passes the loader itself -------------------------------
@pytest.mark.parametrize("key", ["data_path", "reader"])
def test_a_loader_key_that_run_supplies_is_rejected_by_validate_schema_and_run(
    key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from framework.config import validate

    (tmp_path / "corpus.txt").write_text("one\ntwo\n")
    (tmp_path / "other.txt").write_text("".join(f"line {i}\n" for i in range(7)))
    value = str(tmp_path / "other.txt") if key == "data_path" else "text"
    config = {
        "dataset_reader": "text",
        "data_path": "corpus.txt",
        "data_loader": {"batch_size": 1, key: value},
    }
    errors = validate(config)
    assert [e.path for e in errors] == [f"data_loader.{key}"]
    assert "remove this key" in errors[0].reason
    assert schema_errors(config)
    assert main(["run", write_json(tmp_path / "cfg.json", config), "--json", "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert f"data_loader.{key}" in captured.err and captured.out == ""


# -- 3. validate knows the value rules that construction enforces ------------------------
def test_validate_reports_what_run_rejects_and_run_reports_it_all_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from framework.config import validate

    (tmp_path / "corpus.txt").write_text("a b\nc d\n")
    no_loader = {"dataset_reader": "text", "data_path": "corpus.txt"}
    assert [str(e) for e in validate(no_loader)] == [
        "data_loader.batch_size: batch_size is required when batch_sampler is not given"
    ]
    three_wrong = {
        "dataset_reader": {"type": "text", "num_buckets": 2},
        "data_path": "corpus.txt",
        "data_loader": {"batch_sampler": {"type": "bucket", "batch_size": 0}, "num_workers": -1},
    }
    paths = ["dataset_reader.num_buckets", "data_loader.batch_sampler.batch_size", "data_loader.num_workers"]
    assert [e.path for e in validate(three_wrong)] == paths
    assert main(["config", "validate", write_json(tmp_path / "b.json", three_wrong)]) == 1
    assert [line.split(":")[0] for line in capsys.readouterr().out.splitlines()] == paths
    assert main(["run", write_json(tmp_path / "b.json", three_wrong), "--no-progress"]) == 2
    assert [line.split(": ")[2] for line in capsys.readouterr().err.splitlines()] == paths


def test_loader_cross_field_rules_are_one_function_for_validate_and_the_constructor() -> None:
    from framework.config import validate
    from framework.data import MultiProcessDataLoader
    from framework.errors import ConfigError

    loader = {"batch_sampler": "bucket", "batch_size": 4, "persistent_workers": True}
    config = {"dataset_reader": "text", "data_path": "x", "data_loader": loader}
    reasons = {e.path: e.reason for e in validate(config)}
    assert "mutually exclusive with batch_size" in reasons["data_loader.batch_size"]
    assert "needs num_workers > 0" in reasons["data_loader.persistent_workers"]
    with pytest.raises(ConfigError, match=r"mutually exclusive with batch_size.*needs num_workers > 0"):
        MultiProcessDataLoader.from_config({**loader, "batch_sampler": {"type": "bucket", "batch_size": 2}},
                                           reader=DatasetReader.by_name("text")(), data_path="x")  # fmt: skip


def test_a_limit_in_an_annotation_is_checked_by_validate_and_in_the_schema() -> None:
    from framework.config import json_schema, validate

    reader = {"type": "text", "max_tokens": 0}
    assert [e.path for e in validate(reader, "DatasetReader")] == ["max_tokens"]
    assert schema_errors(reader, "DatasetReader")
    assert not schema_errors({"type": "text", "max_tokens": 1}, "DatasetReader")
    text = json_schema("DatasetReader")["$defs"]["DatasetReader.text"]["properties"]
    assert {"type": "integer", "minimum": 3} in text["num_buckets"]["anyOf"]


# -- 4. a value the loader cannot use fails the check, before any download ---------------
@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"batches_per_epoch": 10**23}, "batches_per_epoch must be at most"),
        ({"timeout": float("inf")}, "timeout must be a finite positive number"),
        ({"timeout": float("nan")}, "timeout must be a finite positive number"),
    ],
)
def test_an_unusable_loader_value_fails_validate_and_run_before_the_download(
    setting: dict[str, Any], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from framework.config import validate

    with socket_that_refuses() as url:  # a download attempt would fail differently (exit 1)
        config = {"dataset_reader": "text", "data_path": url, "data_loader": {"batch_size": 1, **setting}}
        errors = validate(config)
        assert [e.path for e in errors] == [f"data_loader.{next(iter(setting))}"]
        assert message in errors[0].reason
        assert main(["run", write_json(tmp_path / "cfg.json", config), "--no-progress"]) == 2
    assert message in capsys.readouterr().err


@contextlib.contextmanager
def socket_that_refuses() -> Iterator[str]:
    """A local URL whose port nothing accepts on (bound, not listening)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/corpus.txt"


# -- 5. config validate prints one line per error ----------------------------------------
@pytest.mark.parametrize(
    ("name", "text", "starts"),
    [
        (
            "key.json",
            json.dumps({**LOADER, "bad\nkey": 1, "x.y": 2}),
            ["'bad\\nkey': unknown", "'x.y': unknown"],
        ),
        ("ansi.json", json.dumps({**LOADER, "\x1b[2Jboo": 1}), ["'\\x1b[2Jboo': unknown"]),
        ("bad.yaml", "dataset_reader: text\ndata_path: x\n? [1, 2]\n: 3\n", ["<root>: "]),
        ("typo.yaml", "dataset_reader: {type: text\ndata_path: x\n", ["<root>: "]),
    ],
)
def test_config_validate_prints_each_error_on_one_line(
    name: str, text: str, starts: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / name).write_text(text)
    assert main(["config", "validate", str(tmp_path / name)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(starts) and all(line.isprintable() for line in lines), lines
    assert [line[: len(start)] for line, start in zip(lines, starts)] == starts


# -- 6. TypedDict, Protocol and NamedTuple annotations -----------------------------------
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


# -- 7. bare container annotations --------------------------------------------------------
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


# -- 8. a config that contains itself, or nests very deep --------------------------------
class Node(Registrable):
    pass


def test_a_self_referencing_or_very_deep_config_is_a_config_error_not_a_crash(tmp_path: Path) -> None:
    import yaml

    from framework.config import MAX_DEPTH, load_config, validate

    @Node.register("wrap")
    class Wrap(Node):
        def __init__(self, inner: Optional[Node] = None, items: Optional[list[Any]] = None) -> None:
            self.inner = inner

    def nested(depth: int) -> Any:
        config = None
        for _ in range(depth):
            config = {"type": "wrap", "inner": config}
        return config

    looped = yaml.safe_load("a: &a {type: wrap, inner: *a}")["a"]
    assert [(e.path, "contains itself" in e.reason) for e in validate(looped, Node)] == [("inner", True)]
    listed = yaml.safe_load("a: &a [1, *a]")
    assert [e.path for e in validate({"type": "wrap", "items": listed["a"]}, Node)] == ["items.1"]
    assert validate(nested(MAX_DEPTH), Node) == []
    assert Node.from_config(nested(MAX_DEPTH))
    (error,) = validate(nested(2000), Node)
    assert error.path == ".".join(["inner"] * MAX_DEPTH) and "levels deep" in error.reason
    (tmp_path / "loop.yaml").write_text("dataset_reader: &a {type: text, x: *a}\ndata_path: x\n")
    assert [e.path for e in validate(load_config(tmp_path / "loop.yaml"))][:1] == ["dataset_reader.x"]


@pytest.mark.parametrize("name", ["deep.json", "deep.yaml"])
def test_a_config_file_nested_past_the_parser_s_stack_is_a_config_error(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / name).write_text('{"dataset_reader": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert main(["config", "validate", str(tmp_path / name)]) == 1
    assert (
        capsys.readouterr().out
        == f"<root>: {tmp_path / name} nests too deep to read (more than 50 levels is a mistake)\n"
    )


# -- 9. an int too long to print -----------------------------------------------------------
def test_an_int_too_long_to_print_is_an_error_that_says_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from framework.config import validate

    errors = validate({**LOADER, "data_path": 10**5000})
    assert [str(e) for e in errors] == ["data_path: expected str, got an int of 5001 digits"]
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


# -- 10. a string config is a file, for validate as for from_config -----------------------
def test_validate_reads_a_string_or_path_config_as_a_file_like_from_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from framework.config import validate

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "reader.json").write_text('{"type": "text", "max_tokens": 0}')
    (tmp_path / "reader.py").write_text("raise SystemExit('validate imported reader.py')\n")
    for config in ("reader.json", tmp_path / "reader.json"):
        assert [str(e) for e in validate(config, "DatasetReader")] == [
            "max_tokens: expected a positive int, got 0"
        ]
    (tmp_path / "reader.json").write_text('{"type": "text", "max_tokens": 8}')
    assert validate("reader.json", "DatasetReader") == []
    assert type(DatasetReader.from_config("reader.json")).__name__ == "TextReader"
    (missing,) = validate("nowhere.json", "DatasetReader")
    assert "cannot read config file nowhere.json" in str(missing)
    (tmp_path / "run.yaml").write_text("dataset_reader: text\ndata_path: x\ndata_loader: {batch_size: 1}\n")
    assert validate(tmp_path / "run.yaml") == []


# -- 11. Lazy of a name alone ---------------------------------------------------------------
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


# -- 12. the schema and validate agree on the built-in components --------------------------
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


# -- 13. true is not 1 ------------------------------------------------------------------------
class Mode(enum.Enum):
    ONE = 1
    TWO = 2


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


# -- 14. positional-only parameters --------------------------------------------------------
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


# -- minor: the suffix's case ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["up.YAML", "up.Yml"])
def test_a_yaml_suffix_in_any_case_is_read_as_yaml(name: str, tmp_path: Path) -> None:
    from framework.config import load_config

    (tmp_path / name).write_text("dataset_reader: text\ndata_path: x\n")
    assert load_config(tmp_path / name) == {"dataset_reader": "text", "data_path": "x"}


# -- 15. arguments given in code, for a base's configs ---------------------------------------
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
