"""`framework.config.json_schema`: valid JSON Schema, and it agrees with `validate`."""

from __future__ import annotations

import enum
import importlib.util
import json
import subprocess
import sys
import urllib.parse
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List, Literal, Optional, Tuple, Union

import pytest
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

from framework import Lazy, Registrable
from framework.cli import main
from framework.config import json_schema, validate
from framework.data import BatchSampler, DatasetReader
from framework.registry import Registrar
from tests.support.plugins import make_dist

REPO_ROOT = Path(__file__).resolve().parent.parent
BUNDLED = json.loads((REPO_ROOT / "framework" / "examples" / "default.json").read_text(encoding="utf-8"))

pytestmark = pytest.mark.timeout(120)


def schema_errors(schema: dict[str, Any], config: Any) -> list[str]:
    validator = Draft202012Validator(schema)
    return [f"{e.json_path}: {e.message}" for e in validator.iter_errors(config)]


def with_changes(**changes: Any) -> dict[str, Any]:
    from framework.cli.run import deep_merge

    return deep_merge(BUNDLED, changes)


def test_the_run_schema_is_valid_json_schema_and_accepts_the_bundled_config() -> None:
    schema = json_schema()
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema_errors(schema, BUNDLED) == []
    assert validate(BUNDLED) == []
    # editors point a config at its schema with a "$schema" key: both accept it
    pointed = {"$schema": "./framework-run.schema.json", **BUNDLED}
    assert schema_errors(schema, pointed) == [] and validate(pointed) == []
    assert "x-framework-undescribed" not in schema


@pytest.mark.parametrize(
    "base", ["DatasetReader", "DataLoader", "BatchSampler", "DataCollator", "DownloadBackend"]
)
def test_each_base_has_a_valid_schema_with_every_registered_name(base: str) -> None:
    schema = json_schema(base)
    Draft202012Validator.check_schema(schema)
    # DataLoader's: "(given ...)", percent-encoded in the pointer
    definition = schema["$defs"][urllib.parse.unquote(schema["$ref"].removeprefix("#/$defs/"))]
    mapping = definition["else"]
    choices = [c["const"] for c in mapping["properties"]["type"]["anyOf"] if "const" in c]
    from framework.config import resolve_base

    assert choices == resolve_base(base).list_available()


@pytest.mark.parametrize(
    ("kind", "config", "path"),
    [
        ("unknown type name", with_changes(dataset_reader={"type": "txt"}), "dataset_reader.type"),
        ("wrong type", with_changes(epochs="two"), "epochs"),
        ("unknown key", with_changes(data_loader={"num_wrkers": 2}), "data_loader.num_wrkers"),
        (
            "bad nested sampler value",
            with_changes(data_loader={"batch_sampler": {"sorting_keys": "token_ids"}}),
            "data_loader.batch_sampler.sorting_keys",
        ),
        ("missing data_path", {k: v for k, v in BUNDLED.items() if k != "data_path"}, "data_path"),
        ("unknown top-level key", with_changes(epoch=2), "epoch"),
    ],
)
def test_each_kind_of_bad_config_fails_both_the_schema_and_validate(
    kind: str, config: Any, path: str
) -> None:
    assert schema_errors(json_schema(), config), f"the schema accepted a config with a {kind}"
    assert [e.path for e in validate(config)] == [path]


class Mode(enum.Enum):
    FAST = "fast"
    SLOW = "slow"


class Widget(Registrable):
    """A widget base."""


class Plain(Widget):
    """A plain widget.

    Args:
        size: how big.
    """

    def __init__(self, size: int = 3) -> None:
        self.size = size


def test_a_component_registered_in_this_process_is_described() -> None:
    Widget.register("plain")(Plain)

    @DatasetReader.register("fancy")
    class Fancy(DatasetReader):
        """A reader with every kind of parameter.

        More text that is not the summary.

        Args:
            widgets: named widgets.
            later: a widget built later.
        """

        def __init__(
            self,
            widgets: Dict[str, Widget],
            names: List[str] = [],  # noqa: B006
            pair: Tuple[int, str] = (1, "a"),
            maybe: Optional[float] = None,
            either: Union[int, Widget] = 0,
            later: Optional[Lazy[Widget]] = None,
            mode: Mode = Mode.FAST,
            choice: Literal["x", "y"] = "x",
            **kwargs: Any,
        ) -> None:
            super().__init__(**kwargs)

    schema = json_schema("DatasetReader")
    Draft202012Validator.check_schema(schema)
    fancy = schema["$defs"]["DatasetReader.fancy"]
    assert fancy["description"] == "A reader with every kind of parameter."
    props = fancy["properties"]
    assert props["widgets"] == {
        "type": "object",
        "additionalProperties": {"$ref": "#/$defs/Widget"},
        "description": "named widgets.",
    }
    assert props["pair"]["prefixItems"] == [{"type": "integer"}, {"type": "string"}]
    float_schema = {
        "type": "number",
        "not": {
            "type": "integer",
            "not": {"minimum": -1.7976931348623157e308, "maximum": 1.7976931348623157e308},
        },
    }  # an int beyond a float's range is none
    assert props["maybe"] == {"anyOf": [float_schema, {"type": "null"}], "default": None}
    assert props["later"]["anyOf"][0] == {"$ref": "#/$defs/Widget%20(lazy)"}
    assert props["mode"]["enum"] == ["fast", "slow", "FAST", "SLOW"] and props["mode"]["default"] == "fast"
    assert props["choice"]["enum"] == ["x", "y"]
    assert "max_instances" in props  # **kwargs: the parent's parameters too
    assert fancy["required"] == ["widgets"] and fancy["additionalProperties"] is False
    assert schema["$defs"]["Widget.plain"]["properties"]["size"]["description"] == "how big."
    assert "required" not in schema["$defs"]["Widget.plain (lazy)"]

    good = {
        "type": "fancy",
        "widgets": {"a": {"type": "plain", "size": 1}, "b": "plain"},
        "later": {"type": "plain"},
    }
    assert schema_errors(schema, good) == [] and validate(good, "DatasetReader") == []
    bad = {"type": "fancy", "widgets": {"a": {"type": "plain", "size": "big"}}, "pair": [1], "mode": "medium"}
    assert len(schema_errors(schema, bad)) == 3
    assert [e.path for e in validate(bad, "DatasetReader")] == ["widgets.a.size", "pair", "mode"]


def test_a_component_that_cannot_be_imported_is_listed_not_fatal() -> None:
    registrar = Registrar("test")
    registrar.add(BatchSampler, "ghost", "no_such_module_anywhere:Ghost")
    registrar.commit()
    schema = json_schema("BatchSampler")
    Draft202012Validator.check_schema(schema)
    [item] = schema["x-framework-undescribed"]
    assert item["component"] == "BatchSampler 'ghost' (no_such_module_anywhere:Ghost)"
    assert "No module named 'no_such_module_anywhere'" in item["reason"]
    assert schema_errors(schema, {"type": "bucket", "batch_size": 2}) == []


def test_an_unresolvable_annotation_is_listed() -> None:
    namespace: dict[str, Any] = {}
    exec(
        "from framework.data import BatchSampler\n"
        "class Odd(BatchSampler):\n"
        "    def __init__(self, size: 'NoSuchName' = None) -> None:\n"
        "        pass\n",
        namespace,
    )
    BatchSampler.register("odd")(namespace["Odd"])
    schema = json_schema("BatchSampler")
    [item] = schema["x-framework-undescribed"]
    assert item["component"] == "Odd.size" and "NoSuchName" in item["reason"]


def test_cli_prints_the_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "schema"]) == 0
    assert json.loads(capsys.readouterr().out) == json_schema()
    assert main(["config", "schema", "BatchSampler"]) == 0
    assert json.loads(capsys.readouterr().out)["$ref"] == "#/$defs/BatchSampler"
    assert main(["config", "schema", "BatchSampelr"]) == 1
    assert "Did you mean 'BatchSampler'?" in capsys.readouterr().err


def test_a_base_schema_imports_only_that_base_s_components() -> None:
    code = (
        "import sys, json\n"
        "from framework.config import json_schema\n"
        "json_schema('BatchSampler')\n"
        "print(json.dumps([m for m in ('framework_plugins.readers', 'framework_plugins.http',\n"
        "    'framework_plugins.s3', 'framework.data.sampler') if m in sys.modules]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == ["framework.data.sampler"]


def load_plugin_helpers() -> ModuleType:
    spec = importlib.util.spec_from_file_location("plugin_helpers", REPO_ROOT / "tests" / "test_plugins.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_third_party_plugin_component_appears_in_the_schema(tmp_path: Path) -> None:
    helpers = load_plugin_helpers()
    impl = helpers.IMPL.replace(
        "class {cls}(DatasetReader):",
        'class {cls}(DatasetReader):\n    """Acme\'s reader."""\n\n'
        "    def __init__(self, depth: int = 2, **kwargs):\n        super().__init__(**kwargs)\n",
    )
    site = tmp_path / "site"  # as pip leaves it (test_plugins.py installs with pip)
    make_dist(
        site,
        "acme-schema",
        {
            "acme_hooks": helpers.HOOKS.format(name="acme", impl="acme_impl", cls="AcmeReader"),
            "acme_impl": impl.format(cls="AcmeReader"),
        },
        {"acme": "acme_hooks"},
    )
    result = helpers._run(site, tmp_path, ["-m", "framework", "config", "schema"])
    assert result.returncode == 0, result.stderr
    schema = json.loads(result.stdout)
    acme = schema["$defs"]["DatasetReader.acme"]
    assert acme["description"] == "Acme's reader."
    assert acme["properties"]["depth"] == {"type": "integer", "default": 2}
    config = {
        "dataset_reader": {"type": "acme", "depth": "deep"},
        "data_path": "x",
        "data_loader": {"batch_size": 1},
    }
    assert schema_errors(schema, config)
    (tmp_path / "c.json").write_text(json.dumps(config))
    result = helpers._run(site, tmp_path, ["-m", "framework", "config", "validate", str(tmp_path / "c.json")])
    assert result.returncode == 1
    assert result.stdout.splitlines() == ["dataset_reader.depth: expected int, got 'deep'"]


def test_the_docs_build_serves_the_schema_and_the_how_to_is_in_the_nav() -> None:
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO_ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    assert hooks.SCHEMA_FILE == "schema/framework-run.schema.json"
    assert json.loads(hooks.render_schema()) == json_schema()
    how_to = (REPO_ROOT / "docs" / "howto" / "editor-completion.md").read_text(encoding="utf-8")
    assert "../schema/framework-run.schema.json" in how_to and '"json.schemas"' in how_to
    assert "howto/editor-completion.md" in (REPO_ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    cli_page = hooks.render_cli()
    assert "### `framework config schema`" in cli_page and "### `framework config validate`" in cli_page
