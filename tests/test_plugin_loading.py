"""Loading plugins, and the registry they fill, under odd conditions: threads, clashing
and broken plugins, bad names, interrupts, config-driven imports, warnings as errors.

Plugins here are real distributions found by `importlib.metadata` (a ``.dist-info``
folder with ``entry_points.txt`` on ``sys.path``), used from fresh interpreters.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from framework import Registrable
from framework.errors import DuplicateNameError, RegistryError, UnknownNameError
from framework.registry import Registrar
from tests.support.plugins import make_dist

REPO_ROOT = Path(__file__).resolve().parent.parent


READER = """\
from framework.data.reader import DatasetReader


class {cls}(DatasetReader):
    def _read(self, file_path):
        yield {{"path": file_path}}
"""


def hooks(body: str) -> str:
    return (
        "from framework import hookimpl\n"
        "from framework.data.reader import DatasetReader\n\n"
        "@hookimpl\n"
        "def framework_register_components(registrar):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    )


def run_python(
    site: Path, code: str, *, site_first: bool = True, **env: str
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEWORK_")}
    paths = [str(site), str(REPO_ROOT)] if site_first else [str(REPO_ROOT), str(site)]
    environ["PYTHONPATH"] = os.pathsep.join(paths)
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, env=environ, timeout=60, cwd=site,
    )  # fmt: skip


# -- threads -----------------------------------------------------------------------------


def test_two_threads_on_a_cold_registry_both_see_every_plugin(tmp_path: Path) -> None:
    slow = hooks('registrar.add(DatasetReader, "slowreader", "slow_impl:SlowReader")')
    loading = (
        "import os, pathlib, time\n"
        "pathlib.Path(os.environ['LOADING']).write_text('started')\n"
        "time.sleep(1.0)  # widens the window in which the registry is half-built\n"
    )
    make_dist(
        tmp_path, "slow-plugin",
        {"slow_hooks": loading + slow, "slow_impl": READER.format(cls="SlowReader")},
        {"slow": "slow_hooks"},
    )  # fmt: skip
    code = """
        import os, pathlib, threading, time
        from framework import DatasetReader, DataLoader
        first = threading.Thread(target=DatasetReader.list_available)
        first.start()
        while not pathlib.Path(os.environ['LOADING']).exists():
            time.sleep(0.005)
        # The first thread is loading plugins now; this one must wait for it, not see half.
        print(sorted(DatasetReader.list_available()), DataLoader.by_name('multiprocess').__name__)
        first.join()
    """
    result = run_python(tmp_path, code, LOADING=str(tmp_path / "loading"))
    assert result.returncode == 0, result.stderr
    assert "'slowreader'" in result.stdout and "'text'" in result.stdout
    assert result.stdout.split()[-1] == "MultiProcessDataLoader"


# -- clashing plugins --------------------------------------------------------------------


@pytest.mark.parametrize("site_first", [True, False])
def test_third_party_entry_point_named_like_a_builtin_replaces_nothing(
    tmp_path: Path, site_first: bool
) -> None:
    body = 'registrar.add(DatasetReader, "thirdcore", "core_impl:ThirdCore")'
    make_dist(
        tmp_path, "other-core",
        {"other_core": hooks(body), "core_impl": READER.format(cls="ThirdCore")},
        {"core": "other_core"},
    )  # fmt: skip
    code = """
        from framework import DataLoader, DatasetReader
        print(DataLoader.by_name('multiprocess').__name__, 'thirdcore' in DatasetReader.list_available())
    """
    result = run_python(tmp_path, code, site_first=site_first)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["MultiProcessDataLoader", "True"]


@pytest.mark.parametrize("site_first", [True, False])
def test_a_plugin_replacing_one_builtin_on_purpose_keeps_the_others(tmp_path: Path, site_first: bool) -> None:
    body = 'registrar.add(DatasetReader, "text", "mytext_impl:MyText", exist_ok=True)'
    make_dist(
        tmp_path, "my-text",
        {"mytext": hooks(body), "mytext_impl": READER.format(cls="MyText")},
        {"mytext": "mytext"},
    )  # fmt: skip
    code = """
        import warnings
        warnings.simplefilter('error')
        from framework import DatasetReader
        print(DatasetReader.by_name('text').__name__, DatasetReader.by_name('csv').__name__)
    """
    result = run_python(tmp_path, code, site_first=site_first)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["MyText", "CsvReader"]


@pytest.mark.parametrize("site_first", [True, False])
def test_a_clash_without_exist_ok_skips_only_that_entry_and_names_both(
    tmp_path: Path, site_first: bool
) -> None:
    body = """\
        registrar.add(DatasetReader, "csv", "clash_impl:Clash")
        registrar.add(DatasetReader, "mine", "clash_impl:Clash")
    """
    make_dist(
        tmp_path, "clashing",
        {"clash": hooks(body), "clash_impl": READER.format(cls="Clash")},
        {"clash": "clash"},
    )  # fmt: skip
    code = """
        from framework import DatasetReader
        names = DatasetReader.list_available()
        print(DatasetReader.by_name('csv').__name__, 'mine' in names, 'text' in names)
    """
    result = run_python(tmp_path, code, site_first=site_first)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["CsvReader", "True", "True"]
    assert "PluginWarning" in result.stderr and "'csv'" in result.stderr
    assert "clashing 1.0" in result.stderr and "framework 0.1.0" in result.stderr


# -- registrar atomicity and names -------------------------------------------------------


class Animal(Registrable):
    pass


class Dog(Animal):
    pass


class Cat(Animal):
    pass


def test_staging_one_name_twice_registers_nothing() -> None:
    registrar = Registrar(provider="twice 1.0")
    with pytest.raises(DuplicateNameError):
        registrar.add(Animal, "pet", Dog)
        registrar.add(Animal, "pet", Cat)
        registrar.commit()
    assert "pet" not in Animal.list_available()


@pytest.mark.parametrize("name", [5, None, "", "two words", "tab\there"])
def test_bad_names_are_refused_with_a_clear_error(name: object) -> None:
    with pytest.raises(RegistryError, match="non-empty string without whitespace"):
        Registrar(provider="bad 1.0").add(Animal, name, Dog)  # type: ignore[arg-type]
    with pytest.raises(RegistryError, match="non-empty string without whitespace"):
        Animal.register(name)(Dog)  # type: ignore[arg-type]
    assert Animal.list_available() == []
    assert isinstance(Registrable.list_available(), list)


# -- broken plugins ----------------------------------------------------------------------


def test_a_plugin_raising_system_exit_is_a_failed_plugin(tmp_path: Path) -> None:
    make_dist(tmp_path, "exiting", {"exiting": "raise SystemExit(3)\n"}, {"exiting": "exiting"})
    code = """
        from framework import DataLoader
        print(DataLoader.by_name('multiprocess').__name__)
    """
    result = run_python(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["MultiProcessDataLoader"]
    assert "framework plugin 'exiting'" in result.stderr and "SystemExit" in result.stderr


def test_an_interrupt_while_loading_leaves_the_registry_to_retry(tmp_path: Path) -> None:
    interrupting = (
        "import os, pathlib\n"
        "marker = pathlib.Path(os.environ['ONCE'])\n"
        "if not marker.exists():\n"
        "    marker.write_text('interrupted')\n"
        "    raise KeyboardInterrupt\n"
    )
    make_dist(tmp_path, "ctrl-c", {"ctrlc": interrupting}, {"ctrlc": "ctrlc"})
    code = """
        from framework import DataLoader
        try:
            DataLoader.list_available()
        except KeyboardInterrupt:
            print('interrupted')
        print(DataLoader.by_name('multiprocess').__name__)
    """
    result = run_python(tmp_path, code, ONCE=str(tmp_path / "once"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["interrupted", "MultiProcessDataLoader"]


def test_a_misspelled_hook_is_reported(tmp_path: Path) -> None:
    misspelled = (
        "from framework import hookimpl\n\n"
        "@hookimpl\n"
        "def framework_register_component(registrar):\n"
        "    pass\n"
    )
    make_dist(tmp_path, "typo", {"typo": misspelled}, {"typo": "typo"})
    result = run_python(tmp_path, "from framework import DataLoader\nDataLoader.list_available()\n")
    assert result.returncode == 0, result.stderr
    assert "'typo'" in result.stderr and "'framework_register_component'" in result.stderr


def test_a_plugin_may_be_a_class(tmp_path: Path) -> None:
    plugin = (
        "from framework import hookimpl\n"
        "from framework.data.reader import DatasetReader\n\n"
        "class ClassPlugin:\n"
        "    @hookimpl\n"
        "    def framework_register_components(self, registrar):\n"
        "        registrar.add(DatasetReader, 'classy', 'classy_impl:Classy')\n"
    )
    make_dist(
        tmp_path, "classy",
        {"classy": plugin, "classy_impl": READER.format(cls="Classy")},
        {"classy": "classy:ClassPlugin"},
    )  # fmt: skip
    code = "from framework import DatasetReader\nprint(DatasetReader.by_name('classy').__name__)\n"
    result = run_python(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["Classy"] and "failed" not in result.stderr


# -- targets and config-driven imports ---------------------------------------------------


def test_both_spellings_of_one_target_are_not_a_duplicate() -> None:
    first = Registrar(provider="one 1.0")
    first.add(Animal, "dog", f"{__name__}:Dog")
    first.commit()
    second = Registrar(provider="two 1.0")
    second.add(Animal, "dog", f"{__name__}.Dog")
    second.commit()
    Animal.register("dog")(Dog)
    assert Animal.by_name("dog") is Dog


def test_registered_types_only_imports_nothing_for_a_dotted_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "config_payload_mod.py").write_text(
        "import os, pathlib\npathlib.Path(os.environ['PAYLOAD']).write_text('ran')\n"
        "from framework import Registrable\nclass Thing(Registrable):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PAYLOAD", str(tmp_path / "payload"))
    monkeypatch.setenv("FRAMEWORK_REGISTERED_TYPES_ONLY", "1")
    with pytest.raises(UnknownNameError, match="FRAMEWORK_REGISTERED_TYPES_ONLY"):
        Registrable.by_name("config_payload_mod:Thing")
    assert "config_payload_mod" not in sys.modules and not (tmp_path / "payload").exists()
    # A path that is a registered target is still accepted, as is its name.
    Animal.register("dog")(Dog)
    assert Animal.by_name(f"{__name__}.Dog") is Dog
    monkeypatch.delenv("FRAMEWORK_REGISTERED_TYPES_ONLY")
    with pytest.raises(UnknownNameError):
        Animal.by_name(f"{__name__}:Cat", allow_import=False)
    assert Animal.by_name(f"{__name__}:Cat") is Cat


def test_registered_types_only_gates_every_config_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from framework_plugins.readers import TextReader

    from framework.config import resolve_base, validate
    from framework.errors import ConfigError

    (tmp_path / "tok_payload_mod.py").write_text(
        "import os, pathlib\npathlib.Path(os.environ['PAYLOAD']).write_text('ran')\n"
        "def tok(s):\n    return s.split()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PAYLOAD", str(tmp_path / "payload"))
    monkeypatch.setenv("FRAMEWORK_REGISTERED_TYPES_ONLY", "1")
    for path in ("tok_payload_mod:tok", "os:system"):  # os:system would run each line
        with pytest.raises(ValueError, match="FRAMEWORK_REGISTERED_TYPES_ONLY=1"):
            TextReader(tokenizer=path)
    config = {
        "dataset_reader": {"type": "text", "tokenizer": "tok_payload_mod:tok"},
        "data_loader": {"batch_size": 1},
        "data_path": "x",
    }
    assert [e.path for e in validate(config)] == ["dataset_reader.tokenizer"]
    with pytest.raises(ConfigError, match="FRAMEWORK_REGISTERED_TYPES_ONLY=1"):
        resolve_base("tok_payload_mod:Base")
    assert "tok_payload_mod" not in sys.modules and not (tmp_path / "payload").exists()
    monkeypatch.delenv("FRAMEWORK_REGISTERED_TYPES_ONLY")
    assert validate(config) == [] and TextReader(tokenizer="tok_payload_mod:tok")._tokenize is not None


# -- decorator tier ----------------------------------------------------------------------


def test_registering_a_class_scans_no_plugin(tmp_path: Path) -> None:
    marker = "import os, pathlib\npathlib.Path(os.environ['SCANNED']).write_text('scanned')\n"
    make_dist(tmp_path, "marker", {"marker_plugin": marker}, {"marker": "marker_plugin"})
    code = """
        import os, pathlib, sys
        from framework import Registrable
        class Base(Registrable):
            pass
        @Base.register("x")
        class X(Base):
            pass
        scanned = pathlib.Path(os.environ['SCANNED'])
        print(scanned.exists(), 'framework_plugins.builtin' in sys.modules)
        print(Base.by_name('x').__name__, scanned.exists())
    """
    result = run_python(tmp_path, code, SCANNED=str(tmp_path / "scanned"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False", "X", "True"]


class Sampler(Registrable):
    pass


class FromPlugin(Sampler):
    pass


class Mine(Sampler):
    pass


def _plugin_tier(registry: Any) -> None:
    registrar = Registrar(provider="someplugin 1.0", registry=registry)
    registrar.add(Sampler, "bucket", FromPlugin)
    registry.commit(registrar.staged, on_clash="warn")


@pytest.mark.parametrize("discover_first", [True, False])
def test_decorator_and_plugin_clash_resolve_the_same_whatever_the_order(discover_first: bool) -> None:
    from framework.registry import Registry, use_registry

    with use_registry(Registry(_plugin_tier)) as registry:
        if discover_first:
            registry.ensure_discovered()
        Sampler.register("bucket", exist_ok=True)(Mine)
        assert Sampler.by_name("bucket") is Mine
    with use_registry(Registry(_plugin_tier)) as registry:
        # without exist_ok, the program's own class still wins, and says whose it replaced
        with pytest.warns(UserWarning, match="someplugin 1.0"):
            if discover_first:
                registry.ensure_discovered()
            Sampler.register("bucket")(Mine)
            registry.ensure_discovered()
        assert Sampler.by_name("bucket") is Mine
        with pytest.raises(DuplicateNameError):  # twice in code is still a duplicate
            Sampler.register("bucket")(FromPlugin)


@pytest.mark.parametrize("register_first", [True, False])
def test_the_programs_own_class_wins_over_an_installed_plugins_name(
    tmp_path: Path, register_first: bool
) -> None:
    body = 'registrar.add(DatasetReader, "squares", "squares_impl:PluginSquares")'
    make_dist(tmp_path, "squares-plugin",
              {"squares_plugin": hooks(body), "squares_impl": READER.format(cls="PluginSquares")},
              {"squares": "squares_plugin"})  # fmt: skip
    lookup = "print(DatasetReader.list_available()[:0])\n"  # loads the plugins first
    code = (
        "import warnings\nwarnings.simplefilter('always')\n"
        "from framework import DatasetReader\n"
        + ("" if register_first else lookup)
        + "@DatasetReader.register('squares')\n"
        "class MySquares(DatasetReader):\n"
        "    def _read(self, file_path):\n"
        "        yield {}\n"
        "print(DatasetReader.by_name('squares').__name__)\n"
        "print(DatasetReader.from_config({'type': 'squares'}).__class__.__name__)\n"
    )
    result = run_python(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-2:] == ["MySquares", "MySquares"]
    assert "PluginWarning" in result.stderr and "squares_impl:PluginSquares" in result.stderr
    assert "__main__:MySquares" in result.stderr


def test_a_fresh_registry_discovers_once_on_first_lookup() -> None:
    from framework.registry import Registry, RegistryEntry, use_registry

    calls: list[Registry] = []
    registry = Registry(calls.append)
    with use_registry(registry):
        Sampler.register("mine")(Mine)
        assert calls == []
        assert Sampler.list_available() == ["mine"]
        assert Sampler.by_name("mine") is Mine
    assert calls == [registry]
    assert isinstance(registry.entries(Sampler)["mine"], RegistryEntry)


# -- the command line: a broken plugin ---------------------------------------------------


def test_plugins_with_a_broken_plugin_lists_it_in_one_line(tmp_path: Path) -> None:
    make_dist(tmp_path, "broken", {"broken_mod": "raise RuntimeError('broken on purpose')\n"},
              {"broken": "broken_mod"})  # fmt: skip
    result = run_python(tmp_path, "import sys\nfrom framework.cli import main\nsys.exit(main(['plugins']))\n")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "framework: warning: PluginWarning: framework plugin 'broken' (broken_mod, from broken 1.0) "
        "failed to load and was skipped: RuntimeError: broken on purpose"
    ]
    assert "failed plugin broken: RuntimeError: broken on purpose" in result.stdout


# -- registries that are copies, or not active -------------------------------------------


@pytest.mark.parametrize("round", [1, 2])
def test_a_plugin_added_to_a_copy_stays_in_the_copy(round: int) -> None:
    from framework import hookimpl
    from framework.registry import get_registry

    class Pet(Animal):
        pass

    class PetPlugin:
        @hookimpl
        def framework_register_components(self, registrar: Registrar) -> None:
            registrar.add(Animal, "pet", Pet)

    registry = get_registry()  # the per-test copy from the fresh_registry fixture
    assert registry.add_plugin(PetPlugin, name="pets", provider="pets 1.0")  # twice: no leak
    assert Animal.by_name("pet") is Pet and registry.plugin_manager.has_plugin("pets")


def test_a_registry_that_is_not_active_lists_its_own_entries() -> None:
    from framework.registry import Registry, RegistryEntry

    registry = Registry(lambda registry: None)
    registry.register(RegistryEntry(Animal, "b", Dog))
    registry.register(RegistryEntry(Animal, "a", Cat))
    assert [entry.name for entry in registry.all_entries()] == ["a", "b"]
    assert Animal.list_available() == []  # the active registry never saw them


# -- loading under threads, damage and warnings-as-errors --------------------------------


def test_registering_in_another_thread_while_a_plugin_imports_that_module_does_not_deadlock(
    tmp_path: Path,
) -> None:
    # Thread B holds fancy_pkg's import lock and registers a class; thread A's first lookup
    # loads a plugin importing fancy_pkg. Registering must not wait for loading.
    fancy_pkg = (
        "import os, pathlib, time\n"
        "pathlib.Path(os.environ['STARTED']).write_text('x')\n"
        "time.sleep(1.0)\n" + READER.format(cls="Fancy") + "\n\n"
        "@DatasetReader.register('fancy_direct')\nclass FancyDirect(Fancy):\n    pass\n"
    )
    make_dist(
        tmp_path, "fancy",
        {"fancy_pkg": fancy_pkg, "fancy_plugin": "from fancy_pkg import Fancy\n" + hooks(
            "registrar.add(DatasetReader, 'fancy', Fancy)")},
        {"fancy": "fancy_plugin"},
    )  # fmt: skip
    code = """
        import os, pathlib, threading, time
        from framework import DatasetReader
        b = threading.Thread(target=lambda: __import__('fancy_pkg'), daemon=True)
        b.start()
        while not pathlib.Path(os.environ['STARTED']).exists():
            time.sleep(0.005)
        print(DatasetReader.by_name('fancy').__name__)
        b.join()
        print('fancy_direct' in DatasetReader.list_available())
    """
    result = run_python(tmp_path, code, STARTED=str(tmp_path / "started"))  # a deadlock: TimeoutExpired
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["Fancy", "True"]


DAMAGED = {
    "no name": ("METADATA", b"Metadata-Version: 2.1\nVersion: 1.0\n"),
    "line without =": ("entry_points.txt", b"[framework.plugins]\nthis line has no equals sign\n"),
    "not utf-8": ("entry_points.txt", b"\xff\xfe garbage\n"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGED))
def test_a_damaged_dist_info_is_skipped_and_the_rest_load(tmp_path: Path, damage: str) -> None:
    make_dist(tmp_path, "damaged", {"damaged_hooks": "x = 1\n"}, {"dmg": "damaged_hooks"})
    make_dist(
        tmp_path, "good",
        {"good_hooks": hooks('registrar.add(DatasetReader, "goodreader", "good_impl:Good")'),
         "good_impl": READER.format(cls="Good")},
        {"good": "good_hooks"},
    )  # fmt: skip
    filename, content = DAMAGED[damage]
    (tmp_path / "damaged-1.0.dist-info" / filename).write_bytes(content)
    code = """
        from framework import DataLoader, DatasetReader
        print(DataLoader.list_available(), DatasetReader.by_name('csv').__name__)
        print(DatasetReader.by_name('goodreader').__name__)
    """
    result = run_python(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["['multiprocess']", "CsvReader", "Good"]
    assert "PluginWarning" in result.stderr and "damaged-1.0.dist-info" in result.stderr


def test_a_plugin_whose_exception_cannot_be_printed_fails_alone(tmp_path: Path) -> None:
    badstr = (
        "class PluginConfigError(Exception):\n"
        "    def __init__(self, *args):\n        pass\n"
        "    def __str__(self):\n        return f'bad config: {self.detail}'\n\n"
        "raise PluginConfigError('libfoo missing')\n"
    )
    make_dist(tmp_path, "badstr", {"badstr": badstr}, {"badstr": "badstr"})
    code = """
        from framework import DatasetReader
        print(DatasetReader.by_name('csv').__name__)
        try:
            DatasetReader.by_name('nothing')
        except LookupError as error:
            print('could not be formatted' in str(error))
    """
    result = run_python(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["CsvReader", "True"]
    assert "'badstr'" in result.stderr and "PluginConfigError" in result.stderr


@pytest.mark.parametrize("import_first", [True, False])
def test_a_decorator_clash_inside_a_plugin_resolves_the_same_in_any_load_order(
    tmp_path: Path, import_first: bool
) -> None:
    module = (
        READER.format(cls="Base_") + "\n\n"
        "@DatasetReader.register('csv')  # the built-in's name\nclass MyCsv(Base_):\n    pass\n\n"
        "@DatasetReader.register('mine2')\nclass Mine2(Base_):\n    pass\n"
    )
    make_dist(tmp_path, "clashdeco", {"clashdeco": module}, {"clashdeco": "clashdeco"})
    code = ("import clashdeco\n" if import_first else "") + textwrap.dedent("""
        from framework import DatasetReader
        print('mine2' in DatasetReader.list_available(), DatasetReader.by_name('csv').__name__)
    """)
    result = run_python(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "CsvReader"]
    assert "PluginWarning" in result.stderr and "clashdeco:MyCsv" in result.stderr


def test_one_class_re_exported_by_its_package_is_no_clash(tmp_path: Path) -> None:
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("from mypkg.readers import MyReader\n")
    (tmp_path / "mypkg" / "readers.py").write_text(
        "from framework import DatasetReader\n\n\n"
        "@DatasetReader.register('myreader')\n" + READER.format(cls="MyReader").split("\n\n\n", 1)[1]
    )
    body = 'registrar.add(DatasetReader, "myreader", "mypkg:MyReader")  # the public spelling'
    make_dist(tmp_path, "mypkg", {"mypkg_plugin": hooks(body)}, {"mypkg": "mypkg_plugin"})
    code = "from framework import DatasetReader\nprint(DatasetReader.by_name('myreader').__name__)\n"
    result = run_python(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["MyReader"] and "PluginWarning" not in result.stderr


def test_a_different_class_for_a_name_taken_by_a_plugin_is_reported_when_it_loads(tmp_path: Path) -> None:
    (tmp_path / "otherpkg").mkdir()
    (tmp_path / "otherpkg" / "__init__.py").write_text(
        "from otherpkg.readers import Public\n"
    )  # fmt: skip
    (tmp_path / "otherpkg" / "readers.py").write_text(
        READER.format(cls="Public") + "\n\n@DatasetReader.register('other')\nclass Other(Public):\n    pass\n"
    )
    body = 'registrar.add(DatasetReader, "other", "otherpkg:Public")'
    make_dist(tmp_path, "otherpkg", {"other_plugin": hooks(body)}, {"other": "other_plugin"})
    code = "from framework import DatasetReader\nprint(DatasetReader.by_name('other').__name__)\n"
    result = run_python(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["Public"]
    assert "PluginWarning" in result.stderr and "otherpkg.readers:Other" in result.stderr


def test_warnings_as_errors_break_no_lookup(tmp_path: Path) -> None:
    make_dist(tmp_path, "broken", {"broken_mod": "raise RuntimeError('broken on purpose')\n"},
              {"broken": "broken_mod"})  # fmt: skip
    make_dist(tmp_path, "clashing", {"clash": hooks('registrar.add(DatasetReader, "csv", "x:Y")')},
              {"clash": "clash"})  # fmt: skip
    code = """
        import warnings
        warnings.simplefilter('error')
        from framework import DatasetReader
        from framework.registry import get_registry
        for attempt in range(2):
            print(DatasetReader.by_name('csv').__name__)
        print(sorted(get_registry().failures()))
    """
    result = run_python(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["CsvReader", "CsvReader", "['broken']"]
    assert "broken on purpose" in result.stderr  # logged, since the warning could not be shown


def test_a_plugin_that_fails_after_registering_a_class_leaves_nothing_registered(tmp_path: Path) -> None:
    module = (
        READER.format(cls="Half").replace("class Half", "@DatasetReader.register('half')\nclass Half")
        + "\nraise RuntimeError('broken after registering')\n"
    )
    make_dist(tmp_path, "half", {"half": module}, {"half": "half"})
    code = """
        from framework import DatasetReader
        try:
            DatasetReader.by_name('half')
        except LookupError as error:
            print(type(error.__cause__).__name__)
    """
    result = run_python(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["RuntimeError"]


def test_the_name_a_warning_gives_disables_that_plugin_alone(tmp_path: Path) -> None:
    make_dist(tmp_path, "other-core", {"other_core": "raise RuntimeError('broken third-party core')\n"},
              {"core": "other_core"})  # fmt: skip
    code = "from framework import DataLoader\nprint('multiprocess' in DataLoader.list_available())\n"
    plain = run_python(tmp_path, code)
    assert "'other-core:core'" in plain.stderr
    disabled = run_python(tmp_path, code, FRAMEWORK_DISABLE_PLUGINS="other-core:core")
    assert disabled.returncode == 0, disabled.stderr
    assert disabled.stdout.split() == ["True"] and "broken third-party" not in disabled.stderr
    only = run_python(tmp_path, code, FRAMEWORK_PLUGINS="framework:core")
    assert only.stdout.split() == ["True"] and "broken third-party" not in only.stderr


def test_an_empty_plugin_list_means_every_plugin(tmp_path: Path) -> None:
    code = "from framework import DataLoader\nprint(DataLoader.list_available())\n"
    result = run_python(tmp_path, code, FRAMEWORK_PLUGINS="", FRAMEWORK_DISABLE_PLUGINS="")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["['multiprocess']"]


@pytest.mark.parametrize("name", [None, 5, "", "two words"])
def test_every_way_into_a_registry_checks_the_name(name: Any) -> None:
    from framework.registry import Registry, RegistryEntry, get_registry

    with pytest.raises(RegistryError, match="non-empty string without whitespace"):
        get_registry().commit([(RegistryEntry(Animal, name, Dog, provider="p 1.0"), False)])
    with pytest.raises(RegistryError, match="non-empty string without whitespace"):
        Registry(lambda registry: None).register(RegistryEntry(Animal, name, Dog))
    assert Animal.list_available() == []


def test_a_plugin_implementing_no_framework_hook_is_reported(tmp_path: Path) -> None:
    unmarked = "def framework_register_components(registrar):  # no @hookimpl\n    pass\n"
    other = (
        "import pluggy\nhookimpl = pluggy.HookimplMarker('frameworks')\n\n"
        "@hookimpl\ndef framework_register_components(registrar):\n    pass\n"
    )
    decorated = READER.format(cls="Deco").replace("class Deco", "@DatasetReader.register('deco')\nclass Deco")
    make_dist(tmp_path, "nomarker",
              {"nomarker": unmarked, "othermarker": other, "nothing": "x = 1\n", "decorated": decorated},
              {"nomarker": "nomarker", "othermarker": "othermarker", "nothing": "nothing",
               "decorated": "decorated"})  # fmt: skip
    for first in ("", "import decorated\n"):  # a plugin of decorated classes alone is fine
        lookup = "from framework import DataLoader\nDataLoader.list_available()\n"
        result = run_python(tmp_path, first + lookup)
        assert result.returncode == 0, result.stderr
        for name in ("nomarker", "othermarker"):
            assert f"'{name}' (from nomarker 1.0) implements no framework hook" in result.stderr
            assert "not marked with framework's @hookimpl" in result.stderr
        assert "'nothing' (from nomarker 1.0) implements no framework hook" in result.stderr
        assert "'decorated'" not in result.stderr


def test_a_lookup_from_a_helper_thread_of_a_loading_plugin_fails_instead_of_hanging() -> None:
    import concurrent.futures

    from framework.registry import Registry, use_registry

    seen: list[BaseException] = []

    def discover(registry: Registry) -> None:
        with registry.loading_plugin("pooled"), concurrent.futures.ThreadPoolExecutor(1) as pool:
            error = pool.submit(Sampler.list_available).exception(timeout=30)
            assert error is not None
            seen.append(error)

    with use_registry(Registry(discover, wait_timeout=0.2)):
        assert Sampler.list_available() == []
    assert len(seen) == 1 and isinstance(seen[0], RegistryError)
    assert "helper thread" in str(seen[0])


def test_a_second_entry_point_to_one_plugin_object_keeps_the_first() -> None:
    from framework import hookimpl
    from framework.registry import get_registry

    class Pet(Animal):
        pass

    class PetPlugin:
        @hookimpl
        def framework_register_components(self, registrar: Registrar) -> None:
            registrar.add(Animal, "pet2", Pet)

    registry = get_registry()
    plugin = PetPlugin()
    assert registry.add_plugin(plugin, name="pets", provider="pets 1.0")
    with pytest.warns(UserWarning, match="'pets-again'"):
        assert not registry.add_plugin(plugin, name="pets-again", provider="pets 1.0")
    assert registry.plugin_manager.has_plugin("pets") and Animal.by_name("pet2") is Pet


def test_a_plugin_interrupted_after_registering_a_class_registers_it_once_on_retry(tmp_path: Path) -> None:
    module = (
        "import os, pathlib\n"
        + READER.format(cls="Again").replace("class Again", "@DatasetReader.register('again')\nclass Again")
        + "\nmarker = pathlib.Path(os.environ['ONCE'])\n"
        "if not marker.exists():\n    marker.write_text('interrupted')\n    raise KeyboardInterrupt\n"
    )
    make_dist(tmp_path, "again", {"again": module}, {"again": "again"})
    code = """
        import sys
        from framework import DatasetReader
        try:
            DatasetReader.list_available()
        except KeyboardInterrupt:
            print('interrupted')
        print(DatasetReader.by_name('again') is sys.modules['again'].Again)
    """
    result = run_python(tmp_path, code, ONCE=str(tmp_path / "once"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["interrupted", "True"] and "PluginWarning" not in result.stderr


def test_an_import_interrupted_by_ctrl_c_can_be_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C in the middle of a plugin's first import (the HTTP backend's ``requests``,
    imported at the first download) leaves Python with the package's submodules but not
    the package; the next import must still give a whole package, not one missing the
    submodules (``module 'requests' has no attribute 'exceptions'`` for the rest of the
    process)."""
    from framework.registry import import_target

    package = tmp_path / "interrupted_pkg"
    package.mkdir()
    (package / "sub.py").write_text("VALUE = 42\n")
    marker = tmp_path / "interrupt-once"
    marker.write_text("")
    (package / "__init__.py").write_text(
        textwrap.dedent(
            f"""
            import os
            import interrupted_pkg.sub
            if os.path.exists({str(marker)!r}):
                os.remove({str(marker)!r})
                raise KeyboardInterrupt
            VALUE = interrupted_pkg.sub.VALUE
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("interrupted_pkg", "interrupted_pkg.sub"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(KeyboardInterrupt):
        import_target("interrupted_pkg:VALUE", allow_import=True)
    assert "interrupted_pkg.sub" not in sys.modules  # forgotten with its package
    assert import_target("interrupted_pkg:VALUE", allow_import=True) == 42
    for name in ("interrupted_pkg", "interrupted_pkg.sub"):
        sys.modules.pop(name, None)


def _namespace_dist(site: Path) -> None:
    """A plugin distribution in the namespace package `acme` (no `acme/__init__.py`),
    as company plugins often are; the user's own code lives in `acme.research`."""
    make_dist(site, "acme-fw-plugin", {}, {"acme": "acme.fwplugin"})
    (site / "acme").mkdir()
    (site / "acme" / "fwplugin.py").write_text(
        "from framework import hookimpl\n"
        "from framework.data.reader import DatasetReader\n\n"
        "class PluginSquares(DatasetReader):\n"
        "    def _read(self, file_path):\n"
        "        yield {}\n\n"
        "@hookimpl\n"
        "def framework_register_components(registrar):\n"
        "    registrar.add(DatasetReader, 'squares', 'acme.fwplugin:PluginSquares')\n"
    )
    (site / "acme" / "research.py").write_text(
        "from framework import DatasetReader\n\n"
        "@DatasetReader.register('squares')\n"
        "class MySquares(DatasetReader):\n"
        "    def _read(self, file_path):\n"
        "        yield {}\n"
    )


@pytest.mark.parametrize("register_first", [True, False])
def test_the_users_class_wins_when_it_shares_a_namespace_package_with_a_plugin(
    tmp_path: Path, register_first: bool
) -> None:
    # A class registered in your own code replaces a plugin's of the same name, in either
    # order, also when your package shares a namespace package (`acme`) with the plugin's.
    _namespace_dist(tmp_path)
    lookup = "DatasetReader.list_available()\n"
    code = (
        "from framework import DatasetReader\n"
        + ("" if register_first else lookup)
        + "import acme.research\n"
        "print(DatasetReader.by_name('squares').__name__)\n"
    )
    result = run_python(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "MySquares", result.stderr


_READER_CLASS = "class {cls}(DatasetReader):\n    def _read(self, file_path):\n        yield {{}}\n\n"


def _lazy_impl_dists(site: Path, impl_module: str) -> None:
    """Plugin A names 'squares' by a dotted path to `impl_module`, which also decorates a
    class as 'cubes' when it is imported (lazily, on first use of 'squares'); plugin B
    registers 'cubes' in its hook."""
    hook = "from framework import hookimpl\nfrom framework.data.reader import DatasetReader\n\n"
    make_dist(site, "a-plugin", {}, {"a": "apkg.hooks"})
    (site / "apkg").mkdir()
    (site / "apkg" / "__init__.py").write_text("")
    (site / "apkg" / "hooks.py").write_text(
        hook + "@hookimpl\ndef framework_register_components(registrar):\n"
        f"    registrar.add(DatasetReader, 'squares', '{impl_module}:ASquares')\n"
    )
    impl = site / (impl_module.replace(".", "/") + ".py")
    impl.write_text(
        "from framework.data.reader import DatasetReader\n\n"
        + _READER_CLASS.format(cls="ASquares")
        + "@DatasetReader.register('cubes')\n"
        + _READER_CLASS.format(cls="ACubes")
    )
    make_dist(
        site,
        "b-plugin",
        {"bplug": hook + _READER_CLASS.format(cls="BCubes") + "@hookimpl\n"
         "def framework_register_components(registrar):\n"
         "    registrar.add(DatasetReader, 'cubes', 'bplug:BCubes')\n"},
        {"b": "bplug"},
    )  # fmt: skip


def test_a_plugin_module_imported_lazily_does_not_break_its_own_lookup(tmp_path: Path) -> None:
    # A plugin's own module, imported on first use of its entry, decorates a name another
    # plugin holds: that entry is skipped with a PluginWarning, as between plugins at discovery.
    _lazy_impl_dists(tmp_path, "apkg.impl")
    code = (
        "from framework import DatasetReader\n"
        "print(DatasetReader.by_name('squares').__name__)\n"
        "print(DatasetReader.by_name('cubes').__name__)\n"
    )
    result = run_python(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ASquares", "BCubes"]


def test_a_plugins_lazily_imported_module_resolves_a_clash_whatever_the_lookup_order(
    tmp_path: Path,
) -> None:
    # A plugin's implementation module of its own (`a_impl`, named by its entry) counts as
    # the plugin's when imported lazily: 'cubes' is the same whichever name is looked up first.
    _lazy_impl_dists(tmp_path, "a_impl")
    lookups = {
        "cubes first": "print(DatasetReader.by_name('cubes').__name__)\nDatasetReader.by_name('squares')\n",
        "squares first": "DatasetReader.by_name('squares')\nprint(DatasetReader.by_name('cubes').__name__)\n",
    }
    seen = {}
    for order, code in lookups.items():
        result = run_python(tmp_path, "from framework import DatasetReader\n" + code)
        assert result.returncode == 0, result.stderr
        seen[order] = result.stdout.split()[-1]
    assert seen["cubes first"] == seen["squares first"], seen


def test_adding_a_plugin_object_from_the_main_script_keeps_the_users_classes_the_users(
    tmp_path: Path,
) -> None:
    # A plugin object whose class the script defines makes nothing of `__main__` the
    # plugin's: the script's own 'squares' replaces an installed plugin's.
    make_dist(
        tmp_path,
        "squares-plugin",
        {
            "squares_plugin": "from framework import hookimpl\n"
            "from framework.data.reader import DatasetReader\n\n"
            "@hookimpl\ndef framework_register_components(registrar):\n"
            "    registrar.add(DatasetReader, 'squares', 'squares_impl:PluginSquares')\n",
            "squares_impl": "from framework.data.reader import DatasetReader\n\n"
            + _READER_CLASS.format(cls="PluginSquares"),
        },
        {"squares": "squares_plugin"},
    )
    code = (
        "from framework import DatasetReader, hookimpl\n"
        "from framework.registry import get_registry\n\n"
        "class Extras:\n"
        "    @hookimpl\n"
        "    def framework_register_components(self, registrar):\n"
        "        pass\n\n"
        "get_registry().add_plugin(Extras(), 'extras')\n\n"
        "@DatasetReader.register('squares')\n"
        + _READER_CLASS.format(cls="MySquares")
        + "print(DatasetReader.by_name('squares').__name__)\n"
    )
    result = run_python(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "MySquares"


def test_a_module_of_a_plugins_distribution_registers_as_the_plugin(tmp_path: Path) -> None:
    # `b_helpers` is named by no entry and sits in no plugin package, but the RECORD of
    # plugin A's distribution lists it: its 'cubes' is A's, so B keeps the name.
    _lazy_impl_dists(tmp_path, "a_impl")
    (tmp_path / "b_helpers.py").write_text(
        "from framework.data.reader import DatasetReader\n\n"
        "@DatasetReader.register('cubes')\n" + _READER_CLASS.format(cls="HelperCubes")
    )
    (tmp_path / "a_plugin-1.0.dist-info" / "RECORD").write_text(
        "apkg/__init__.py,,\napkg/hooks.py,,\na_impl.py,,\nb_helpers.py,,\n"
    )
    code = (
        "import warnings\n"
        "from framework import DatasetReader\n"
        "DatasetReader.list_available()\n"
        "with warnings.catch_warnings(record=True):\n"
        "    warnings.simplefilter('always')\n"
        "    import b_helpers\n"
        "print(DatasetReader.by_name('cubes').__name__)\n"
    )
    result = run_python(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "BCubes", result.stderr


@pytest.mark.parametrize(
    "editable",
    [
        False,
        pytest.param(
            True,
            marks=pytest.mark.xfail(
                strict=True,
                reason=(
                    "an editable install's RECORD names only its .pth and finder, so its modules "
                    "outside the plugin's package count as the program's code"
                ),
            ),
        ),
    ],
)
def test_an_editable_plugins_helper_module_registers_as_the_plugin(tmp_path: Path, editable: bool) -> None:
    # As 7122dbb's test, but `pip install -e` leaves a RECORD naming only the .pth and
    # the finder: the plugin's own helper module then counts as the user's code and
    # takes 'cubes' from plugin B. The same plugin installed normally leaves it to B.
    _lazy_impl_dists(tmp_path, "a_impl")
    (tmp_path / "b_helpers.py").write_text(
        "from framework.data.reader import DatasetReader\n\n"
        "@DatasetReader.register('cubes')\n" + _READER_CLASS.format(cls="HelperCubes")
    )
    record = (
        "__editable__.a_plugin-1.0.pth,,\n__editable___a_plugin_1_0_finder.py,,\n"
        if editable
        else "apkg/__init__.py,,\napkg/hooks.py,,\na_impl.py,,\nb_helpers.py,,\n"
    )
    (tmp_path / "a_plugin-1.0.dist-info" / "RECORD").write_text(record)
    code = (
        "import warnings\n"
        "from framework import DatasetReader\n"
        "DatasetReader.list_available()\n"
        "with warnings.catch_warnings(record=True):\n"
        "    warnings.simplefilter('always')\n"
        "    import b_helpers\n"
        "print(DatasetReader.by_name('cubes').__name__)\n"
    )
    result = run_python(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "BCubes", result.stderr


@pytest.mark.xfail(
    strict=True,
    reason="RECORD ownership is by module name: a stray top-level module claims the program's",
)
def test_a_sloppy_wheels_top_level_module_does_not_make_the_users_module_a_plugins(tmp_path: Path) -> None:
    # Many wheels ship a stray top-level `tests`/`utils`; RECORD ownership is by module
    # name, so the user's own `utils` counts as plugin B's code: B keeps 'cubes' (the
    # user's class is skipped with a warning) instead of the user's class winning.
    _lazy_impl_dists(tmp_path, "a_impl")
    (tmp_path / "b_plugin-1.0.dist-info" / "RECORD").write_text("bplug.py,,\nutils/__init__.py,,\n")
    (tmp_path / "utils.py").write_text(
        "from framework.data.reader import DatasetReader\n\n"
        "@DatasetReader.register('cubes')\n" + _READER_CLASS.format(cls="UserCubes")
    )
    code = (
        "import warnings\n"
        "from framework import DatasetReader\n"
        "DatasetReader.list_available()\n"
        "with warnings.catch_warnings(record=True):\n"
        "    warnings.simplefilter('always')\n"
        "    import utils\n"
        "print(DatasetReader.by_name('cubes').__name__)\n"
    )
    result = run_python(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "UserCubes", result.stderr


class AliasBase(Registrable):
    pass


class AliasReal(AliasBase):
    pass


class AliasImpostor(AliasBase):
    pass


@pytest.mark.xfail(
    strict=True,
    reason="a plugin's aliases are trusted, not checked against the class they name",
)
def test_a_plugins_alias_cannot_make_the_type_gate_pick_another_class() -> None:
    # Aliases are taken on a plugin's word: one naming another class's path makes a
    # config path resolve to the plugin's class under FRAMEWORK_REGISTERED_TYPES_ONLY=1,
    # while the same config without the gate builds the real class.
    from framework.registry import Registrar, Registry, use_registry

    def plugin(registry: Registry) -> None:
        registrar = Registrar(provider="impostor 1.0", plugin="impostor", registry=registry)
        registrar.add(AliasBase, "impostor", AliasImpostor, aliases=(f"{__name__}.AliasReal",))
        registry.commit(registrar.staged, on_clash="warn")

    path = f"{__name__}.AliasReal"
    with use_registry(Registry(plugin)):
        open_gate = AliasBase.resolve_class_name(path, allow_import=True)[0]
        gated = AliasBase.resolve_class_name(path, allow_import=False)[0]
    assert open_gate is AliasReal
    assert gated is AliasReal, gated
