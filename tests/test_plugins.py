"""A real third-party plugin distribution, pip-installed into a temp target and used
from fresh interpreters, exactly as a user's package would be."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parent.parent

SETUP_CFG = """\
[metadata]
name = {dist}
version = 1.2.3

[options]
py_modules =
{modules}

[options.entry_points]
framework.plugins =
{entry_points}
"""

HOOKS = '''\
from framework import hookimpl
from framework.data.reader import DatasetReader


@hookimpl
def framework_register_components(registrar):
    registrar.add(DatasetReader, "{name}", "{impl}:{cls}")
'''

IMPL = '''\
import os
import pathlib

pathlib.Path(os.environ["PLUGIN_MARKER"]).write_text("imported")

from framework.data.reader import DatasetReader


class {cls}(DatasetReader):
    def _read(self, file_path):
        yield {{"path": file_path}}
'''


def _build_dist(root: Path, dist: str, files: dict[str, str], entry_points: dict[str, str]) -> Path:
    source = root / dist
    source.mkdir()
    for name, text in files.items():
        (source / name).write_text(text)
    modules = "\n".join(f"    {name[:-3]}" for name in sorted(files))
    eps = "\n".join(f"    {name} = {target}" for name, target in entry_points.items())
    (source / "setup.cfg").write_text(SETUP_CFG.format(dist=dist, modules=modules, entry_points=eps))
    (source / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    return source


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Install two distributions into one target folder: a good plugin and a broken one."""
    root = tmp_path_factory.mktemp("plugins")
    good = _build_dist(
        root,
        "acme-readers",
        {
            "acme_hooks.py": HOOKS.format(name="acme", impl="acme_impl", cls="AcmeReader"),
            "acme_impl.py": IMPL.format(cls="AcmeReader"),
        },
        {"acme": "acme_hooks"},
    )
    broken = _build_dist(
        root,
        "broken-plugin",
        {"broken_hooks.py": "raise RuntimeError('this plugin is broken on purpose')\n"},
        {"broken": "broken_hooks"},
    )
    target = root / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(good), str(broken)],
        check=True,
        timeout=240,
    )  # fmt: skip
    return target


def _run(site: Path, tmp_path: Path, code_or_args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEWORK_")}
    environ["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO_ROOT)])
    environ["PLUGIN_MARKER"] = str(tmp_path / "marker")
    environ.update(env)
    return subprocess.run(
        [sys.executable, *code_or_args], capture_output=True, text=True, env=environ, timeout=60
    )


@pytest.mark.timeout(300)
def test_listing_does_not_import_the_plugin_module(plugin_site: Path, tmp_path: Path) -> None:
    result = _run(plugin_site, tmp_path, ["-m", "framework", "plugins", "--json"])
    assert result.returncode == 0, result.stderr
    listing = json.loads(result.stdout)
    rows = {(row["base"], row["name"]): row for row in listing["components"]}
    acme = rows[("DatasetReader", "acme")]
    assert acme["target"] == "acme_impl:AcmeReader"
    assert acme["provider"] == "acme-readers 1.2.3"
    assert ("DataLoader", "multiprocess") in rows  # first-party plugins still there
    assert not (tmp_path / "marker").exists(), "listing imported the plugin's module"


@pytest.mark.timeout(300)
def test_by_name_imports_the_plugin_on_first_use(plugin_site: Path, tmp_path: Path) -> None:
    code = (
        "from framework import DatasetReader\n"
        "import pathlib, os\n"
        "m = pathlib.Path(os.environ['PLUGIN_MARKER'])\n"
        "assert 'acme' in DatasetReader.list_available() and not m.exists()\n"
        "cls = DatasetReader.by_name('acme')\n"
        "print(cls.__name__, m.read_text())\n"
    )
    result = _run(plugin_site, tmp_path, ["-c", code])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["AcmeReader", "imported"]


@pytest.mark.timeout(300)
def test_block_list_and_allow_list(plugin_site: Path, tmp_path: Path) -> None:
    blocked = _run(
        plugin_site, tmp_path, ["-m", "framework", "plugins", "--json"],
        FRAMEWORK_DISABLE_PLUGINS="acme, broken",
    )  # fmt: skip
    names = {row["name"] for row in json.loads(blocked.stdout)["components"]}
    assert "acme" not in names and "multiprocess" in names
    assert "broken" not in blocked.stderr

    allowed = _run(
        plugin_site, tmp_path, ["-m", "framework", "plugins", "--json"], FRAMEWORK_PLUGINS="acme"
    )
    names = {row["name"] for row in json.loads(allowed.stdout)["components"]}
    assert names == {"acme"}


@pytest.mark.timeout(300)
def test_broken_plugin_warns_and_the_rest_keep_working(plugin_site: Path, tmp_path: Path) -> None:
    code = (
        "import warnings\n"
        "warnings.simplefilter('always')\n"
        "from framework import DatasetReader, DataLoader\n"
        "from framework.errors import UnknownNameError\n"
        "print(DataLoader.by_name('multiprocess').__name__)\n"
        "print(DatasetReader.by_name('acme').__name__)\n"
        "try:\n"
        "    DatasetReader.by_name('brokenreader')\n"
        "except UnknownNameError as e:\n"
        "    print('cause:', type(e.__cause__).__name__, e.__cause__)\n"
    )
    result = _run(plugin_site, tmp_path, ["-c", code])
    assert result.returncode == 0, result.stderr
    assert "framework plugin 'broken'" in result.stderr
    assert "broken-plugin 1.2.3" in result.stderr
    assert "RuntimeError: this plugin is broken on purpose" in result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == ["MultiProcessDataLoader", "AcmeReader"]
    assert lines[2] == "cause: RuntimeError this plugin is broken on purpose"


@pytest.mark.timeout(300)
def test_trace_logs_hook_calls(plugin_site: Path, tmp_path: Path) -> None:
    code = (
        "import logging\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "from framework import DatasetReader\n"
        "DatasetReader.list_available()\n"
    )
    result = _run(plugin_site, tmp_path, ["-c", code], FRAMEWORK_TRACE_PLUGINS="1")
    assert result.returncode == 0, result.stderr
    assert "framework_register_components" in result.stderr


def test_builtin_plugins_use_the_entry_point_path() -> None:
    from importlib.metadata import entry_points

    from framework.registry import get_registry

    group = entry_points(group="framework.plugins")
    ours = {ep.name for ep in group if ep.dist and ep.dist.name == "framework"}
    assert {"core", "samplers", "readers", "http", "s3", "local"} <= ours
    manager = get_registry().plugin_manager
    registered = {manager.get_name(p) for p in manager.get_plugins()}
    assert ours <= registered


def test_a_plugin_object_registers_through_pluggy() -> None:
    """The registrar a hook receives is the same one the built-ins get."""
    from framework import Registrable, hookimpl
    from framework.registry import Registrar

    class Base(Registrable):
        pass

    class Impl(Base):
        pass

    class MyPlugin:
        @staticmethod
        @hookimpl
        def framework_register_components(registrar: Registrar) -> None:
            registrar.add(Base, "impl", Impl)

    import pluggy

    from framework import hookspecs

    manager = pluggy.PluginManager("framework")
    manager.add_hookspecs(hookspecs)
    manager.register(MyPlugin)
    registrar = Registrar(provider="test")
    manager.hook.framework_register_components(registrar=registrar)
    registrar.commit()
    assert Base.by_name("impl") is Impl
    assert Base.registry_entries()["impl"].provider == "test"


def test_hookspecs_are_tiny_and_documented() -> None:
    import inspect

    from framework import hookspecs

    hooks = [f for name, f in vars(hookspecs).items() if name.startswith("framework_")]
    assert hooks, "framework/hookspecs.py defines no hook"
    for hook in hooks:
        assert inspect.getdoc(hook), f"{hook.__name__} has no docstring"
    assert len(inspect.getsource(hookspecs).splitlines()) < 60
