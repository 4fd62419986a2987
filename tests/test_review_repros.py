"""Reproducers for breaks found by review of issue 25's changes (each fails today).

Each test names the promise it checks; none of them fixes anything."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from framework.data.reader import DatasetReader
from tests.test_plugin_loading import make_dist, run_python


class _TwoLengths(DatasetReader):
    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        for i in range(8):
            yield {"id": i, "a": torch.zeros(i + 1), "b": torch.zeros(8 - i)}


def _sampler_loader(name: str) -> Any:
    from framework.data import BucketBatchSampler, MaxTokensBatchSampler
    from framework.data.multiprocess import MultiProcessDataLoader

    if name == "BucketBatchSampler":
        sampler: Any = BucketBatchSampler(2, sorting_keys=["a"], padding_noise=0.0, shuffle=False)
    else:
        sampler = MaxTokensBatchSampler(10, sorting_keys=["a"], padding_noise=0.0)
    return MultiProcessDataLoader(_TwoLengths(), "x", batch_sampler=sampler, quiet=True, seed=0)


@pytest.mark.parametrize("name", ["BucketBatchSampler", "MaxTokensBatchSampler"])
def test_a_loader_state_saved_before_the_sampler_move_still_resumes(name: str) -> None:
    # Promise (issue 25): "configs and saved loader states keep working". A state saved at
    # 1604d4f (before BucketBatchSampler moved to framework.data.sampler) differs from one
    # saved now in exactly one field, checked by running both versions on this setup:
    # settings.batch_sampler.type was "framework_plugins.samplers.<name>".
    saved = _sampler_loader(name)
    it = iter(saved)
    next(it)
    state = copy.deepcopy(saved.state_dict())
    rest = [batch["id"].tolist() for batch in it]
    state["settings"]["batch_sampler"]["type"] = f"framework_plugins.samplers.{name}"
    resumed = _sampler_loader(name)
    resumed.load_state_dict(state)  # today: ResumeError "settings_differ"
    assert [batch["id"].tolist() for batch in resumed] == rest


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
    # Promise (docs/concepts/registry.md, "When two providers use one name"): a class you
    # register with @Base.register in your own code replaces a plugin's class of the same
    # name, in either order. `acme.research` is not the plugin's package (`acme.fwplugin`
    # is), yet the top-level name `acme` makes the user's class count as the plugin's.
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
    # Promise (registry.md): between plugins, an entry whose name is taken is skipped with a
    # PluginWarning, and the rest of its plugin loads. Here plugin A's implementation module
    # (in A's own package) decorates 'cubes', which plugin B holds: looking up A's
    # 'squares' imports it, and the decorator raises DuplicateNameError out of by_name.
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
    # Promise (registry.md): "Conflicts resolve the same way whatever order"; classes a
    # plugin registers count as that plugin's, not as the program's own. A plugin whose
    # implementation lives in a top-level module of its own (`a_impl`, as in the tests'
    # own squares_impl) decorates 'cubes' on first use: it then takes 'cubes' from
    # plugin B as if the user's code had registered it, so 'cubes' depends on whether
    # 'squares' was looked up first.
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


def test_a_subclass_of_the_http_backend_written_for_the_old_signature_still_downloads(
    tmp_path: Path,
) -> None:
    # Promise (issue 25 / download-backend.md): "A backend written before `end` existed
    # (`open(url, offset=0, *, if_range=None)`) keeps working". A user's HttpBackend
    # subclass that overrides `open` with that signature (to log, to add a header) inherits
    # `supports_ranges = True`, so the manager now passes `end=`: TypeError. Before, the
    # manager read the subclass's signature and fetched it over one stream.
    from typing import Optional

    from framework_plugins.http import HttpBackend

    from framework.download import DownloadManager
    from framework.download.backend import ByteStream
    from tests.support.download import FaultServer, serving, unique_path

    class LoggingHttp(HttpBackend):
        opened: list[int] = []

        def open(self, url: str, offset: int = 0, *, if_range: Optional[str] = None) -> ByteStream:  # type: ignore[override]
            self.opened.append(offset)
            return super().open(url, offset, if_range=if_range)

    data = bytes(range(256)) * 4096
    with serving(FaultServer()) as server:
        url = server.add(unique_path("legacy-subclass"), data, etag='"v1"')
        manager = DownloadManager(
            tmp_path, connections=4, part_size=64 << 10, progress=False, backoff_factor=0.01,
            backends={"http": LoggingHttp(backoff_factor=0.01)},
        )  # fmt: skip
        assert manager.cached_path(url).read_bytes() == data


def test_adding_a_plugin_object_from_the_main_script_keeps_the_users_classes_the_users(
    tmp_path: Path,
) -> None:
    # Promise (registry.md): a class you register in your own code replaces a plugin's
    # class of the same name. `registry.add_plugin(obj)` (documented in the same page) with
    # an object whose class the script defines makes every class of `__main__` count as
    # that plugin's (its "package" is `__main__`), so the script's own 'squares' now raises
    # DuplicateNameError against an installed plugin's 'squares'.
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


@pytest.mark.parametrize("name", ["BucketBatchSampler", "MaxTokensBatchSampler"])
def test_a_config_naming_a_sampler_by_its_old_dotted_path_builds_with_registered_types_only(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    # Promise (issue 25): configs keep working; the old import path re-exports the
    # samplers. Under FRAMEWORK_REGISTERED_TYPES_ONLY=1 a dotted path is accepted when it
    # names a registered component: at 1604d4f "framework_plugins.samplers.<name>" was the
    # registered target and built. The entry now points at framework.data.sampler, so the
    # same config is refused ("not a registered name"), by from_config and validate alike.
    from framework.config import validate
    from framework.data.sampler import BatchSampler

    monkeypatch.setenv("FRAMEWORK_REGISTERED_TYPES_ONLY", "1")
    size = {"batch_size": 2} if name == "BucketBatchSampler" else {"max_tokens": 10}
    config = {"type": f"framework_plugins.samplers.{name}", **size}
    assert validate(config, "BatchSampler") == []
    assert type(BatchSampler.from_config(config)).__name__ == name


def test_a_plugin_added_later_with_exist_ok_does_not_silently_replace_the_users_class(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Promise (registry.md): a class you register in your own code replaces a plugin's
    # class of the same name "in either order"; at discovery a plugin's exist_ok=True entry
    # loses to it. A plugin added after the user's registration with `registry.add_plugin`
    # (documented on the same page) and exist_ok=True takes the name, with no warning.
    import sys
    import types
    import warnings

    from framework.testing import fresh_registry

    plugin = types.ModuleType("review_later_plugin")  # a package of its own, not the user's
    exec(
        "from framework import hookimpl\n"
        "from framework.data.reader import DatasetReader\n\n"
        "class PluginSquares(DatasetReader):\n"
        "    def _read(self, file_path):\n"
        "        yield {}\n\n"
        "@hookimpl\n"
        "def framework_register_components(registrar):\n"
        "    registrar.add(DatasetReader, 'review-squares', 'review_later_plugin:PluginSquares',\n"
        "                  exist_ok=True)\n",
        plugin.__dict__,
    )
    monkeypatch.setitem(sys.modules, "review_later_plugin", plugin)
    with fresh_registry() as registry:
        DatasetReader.list_available()

        @DatasetReader.register("review-squares")
        class MySquares(DatasetReader):
            def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
                yield {}

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert registry.add_plugin(plugin, "later")
        assert DatasetReader.by_name("review-squares") is MySquares, [str(w.message) for w in caught]


def test_a_backend_of_the_oldest_signature_resumes_a_broken_body(tmp_path: Path) -> None:
    # Not new with issue 25 (1604d4f fails alike), kept because the brief asked: a backend
    # with `open(self, url, offset)` (no `if_range`, supports_ranges left False) downloads
    # while nothing breaks, but a body that breaks off is resumed with `if_range=`:
    # TypeError, and the bytes already fetched are thrown away (a TypeError is final).
    from framework.download import DownloadManager
    from framework.download.backend import ByteStream, DownloadBackend
    from framework.errors import NetworkError

    data = bytes(range(256)) * 4096
    broken: list[int] = []

    class Oldest(DownloadBackend):
        def open(self, url: str, offset: int) -> ByteStream:  # type: ignore[override]
            def chunks() -> Iterator[bytes]:
                if not broken:
                    broken.append(offset)
                    yield data[offset : len(data) // 2]
                    raise NetworkError(url, "connection reset")
                yield data[offset:]

            return ByteStream(chunks(), start=offset, size=len(data), etag='"v1"')

    manager = DownloadManager(
        tmp_path, progress=False, backoff_factor=0, backends={"oldest": Oldest(backoff_factor=0)}
    )
    assert manager.cached_path("oldest://x/a.bin").read_bytes() == data
