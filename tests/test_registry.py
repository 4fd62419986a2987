from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from framework import Registrable
from framework.data.reader import DatasetReader
from framework.errors import DuplicateNameError, PluginError, RegistryError, UnknownNameError
from framework.registry import Registrar


class Animal(Registrable):
    default_implementation = "dog"


class Plant(Registrable):
    pass


def _register_animals() -> tuple[type[Animal], type[Animal]]:
    @Animal.register("dog")
    class Dog(Animal):
        pass

    @Animal.register("cat")
    class Cat(Animal):
        @classmethod
        def kitten(cls) -> Cat:
            return cls()

    return Dog, Cat


def test_register_and_by_name_return_the_class() -> None:
    dog, cat = _register_animals()
    assert Animal.by_name("dog") is dog
    assert Animal.by_name("cat") is cat
    assert Animal.resolve_class_name("cat") == (cat, None)


def test_register_returns_the_class_unchanged() -> None:
    class Fish(Animal):
        pass

    assert Animal.register("fish")(Fish) is Fish


def test_constructor_name_is_returned_by_by_name() -> None:
    @Animal.register("kitten", constructor="kitten")
    class Kitten(Animal):
        @classmethod
        def kitten(cls) -> Kitten:
            instance = cls()
            instance.made_by = "kitten"  # type: ignore[attr-defined]
            return instance

    factory = Animal.by_name("kitten")
    assert factory().made_by == "kitten"  # type: ignore[attr-defined]
    assert Animal.resolve_class_name("kitten") == (Kitten, "kitten")


def test_list_available_puts_the_default_first() -> None:
    _register_animals()

    @Animal.register("aardvark")
    class Aardvark(Animal):
        pass

    assert Animal.list_available() == ["dog", "aardvark", "cat"]


def test_each_base_has_its_own_names() -> None:
    dog, _ = _register_animals()

    @Plant.register("dog")
    class DogRose(Plant):
        pass

    assert Animal.by_name("dog") is dog
    assert Plant.by_name("dog") is DogRose
    assert Plant.list_available() == ["dog"]


def test_registrable_by_name_searches_every_base_but_refuses_ambiguity() -> None:
    _, cat = _register_animals()
    assert Registrable.by_name("cat") is cat

    @Plant.register("cat")
    class Catnip(Plant):
        pass

    with pytest.raises(RegistryError, match="several bases"):
        Registrable.by_name("cat")


def test_dotted_paths_work_in_both_spellings() -> None:
    assert Animal.by_name(f"{__name__}:Animal") is Animal
    assert Animal.by_name(f"{__name__}.Animal") is Animal
    with pytest.raises(RegistryError, match="not a subclass of Animal"):
        Animal.by_name(f"{__name__}:Plant")
    with pytest.raises(UnknownNameError, match="Importing it failed"):
        Animal.by_name("no_such_module_xyz:Thing")


def test_unknown_name_lists_available_and_suggests_closest() -> None:
    _register_animals()
    with pytest.raises(UnknownNameError) as info:
        Animal.by_name("dgo")
    error = info.value
    assert isinstance(error, LookupError)
    assert error.name == "dgo"
    assert error.base == "Animal"
    assert error.available == ["dog", "cat"]
    assert error.suggestions == ["dog"]
    assert "Did you mean 'dog'?" in str(error)
    assert "Available: 'dog', 'cat'" in str(error)


def test_unknown_name_suggests_dash_underscore_swap() -> None:
    @Animal.register("sea_lion")
    class SeaLion(Animal):
        pass

    with pytest.raises(UnknownNameError) as info:
        Animal.by_name("sea-lion")
    assert info.value.suggestions[0] == "sea_lion"


def test_duplicate_registration_names_both_classes_and_providers() -> None:
    _register_animals()

    class Wolf(Animal):
        pass

    with pytest.raises(DuplicateNameError) as info:
        Animal.register("dog")(Wolf)
    error = info.value
    assert error.name == "dog" and error.base == "Animal"
    assert error.existing.endswith("Dog") and error.new.endswith("Wolf")
    assert f"module {__name__}" in (error.existing_provider, error.new_provider)
    assert "Dog" in str(error) and "Wolf" in str(error) and "exist_ok=True" in str(error)
    # Nothing was overwritten.
    assert Animal.by_name("dog").__name__ == "Dog"


def test_exist_ok_replaces_on_purpose() -> None:
    _register_animals()

    @Animal.register("dog", exist_ok=True)
    class Wolf(Animal):
        pass

    assert Animal.by_name("dog") is Wolf


def test_exist_ok_replaces_a_first_party_plugin_component() -> None:
    from framework.data.sampler import BatchSampler

    class MyBucket(BatchSampler):
        pass

    BatchSampler.register("bucket", exist_ok=True)(MyBucket)
    assert BatchSampler.by_name("bucket") is MyBucket


def test_register_refuses_a_non_subclass() -> None:
    with pytest.raises(RegistryError, match="not a subclass of Animal"):
        Animal.register("rose")(Plant)  # type: ignore[arg-type]


def test_registrar_is_all_or_nothing() -> None:
    dog, _ = _register_animals()
    registrar = Registrar(provider="somepkg 1.0", plugin="some")
    registrar.add(Animal, "cow", f"{__name__}:Animal")
    registrar.add(Animal, "dog", "elsewhere:Dog")
    with pytest.raises(DuplicateNameError) as info:
        registrar.commit()
    assert info.value.new_provider == "somepkg 1.0"
    assert "cow" not in Animal.list_available()
    assert Animal.by_name("dog") is dog


def test_lazy_target_is_not_imported_until_used(tmp_path, monkeypatch) -> None:
    module = tmp_path / "lazy_animal_mod.py"
    module.write_text(
        "import pathlib, os\n"
        "pathlib.Path(os.environ['MARKER']).write_text('imported')\n"
        "from tests_animal_base import Base\n"
        "class Horse(Base):\n    pass\n"
    )
    (tmp_path / "tests_animal_base.py").write_text(
        "from framework import Registrable\nclass Base(Registrable):\n    pass\n"
    )
    marker = tmp_path / "marker"
    monkeypatch.setenv("MARKER", str(marker))
    monkeypatch.syspath_prepend(str(tmp_path))
    from tests_animal_base import Base  # type: ignore[import-not-found]

    registrar = Registrar(provider="horsepkg 2.0")
    registrar.add(Base, "horse", "lazy_animal_mod:Horse")
    registrar.commit()
    entry = Base.registry_entries()["horse"]
    assert Base.list_available() == ["horse"]
    assert not entry.is_loaded and not marker.exists()
    horse = Base.by_name("horse")
    assert marker.read_text() == "imported"
    assert horse.__name__ == "Horse" and entry.is_loaded


def test_lazy_target_that_fails_to_import_raises_plugin_error_with_cause() -> None:
    registrar = Registrar(provider="brokenpkg 0.1", plugin="broken")
    registrar.add(Animal, "ghost", "no_such_module_abc:Ghost")
    registrar.commit()
    with pytest.raises(PluginError) as info:
        Animal.by_name("ghost")
    assert info.value.plugin == "broken"
    assert "brokenpkg 0.1" in str(info.value) and "no_such_module_abc" in str(info.value)
    assert isinstance(info.value.__cause__, ImportError)


def test_lazy_target_of_the_wrong_base_is_refused() -> None:
    registrar = Registrar(provider="confused 1.0")
    registrar.add(Animal, "weed", f"{__name__}:Plant")
    registrar.commit()
    with pytest.raises(PluginError, match="not a subclass of Animal"):
        Animal.by_name("weed")


def test_registrar_rejects_bad_arguments() -> None:
    registrar = Registrar(provider="x")
    with pytest.raises(RegistryError, match="not a Registrable base"):
        registrar.add(int, "n", "x:y")  # type: ignore[arg-type]
    with pytest.raises(RegistryError, match=r"must be 'package\.module:ClassName'"):
        registrar.add(Animal, "n", 42)  # type: ignore[arg-type]


def test_first_party_components_come_from_this_distribution() -> None:
    from framework.data.loader import DataLoader

    entry = DataLoader.registry_entries()["multiprocess"]
    assert entry.provider.startswith("framework ")
    assert entry.plugin == "core"
    assert entry.target_path == "framework.data.multiprocess:MultiProcessDataLoader"


def test_fresh_registry_fixture_part_one_registers() -> None:
    @Plant.register("leaky")
    class Leaky(Plant):
        pass

    assert "leaky" in Plant.list_available()


def test_fresh_registry_fixture_part_two_sees_nothing() -> None:
    # Runs after part one (pytest keeps file order): the fixture restored the registry.
    assert "leaky" not in Plant.list_available()


@pytest.mark.parametrize("name", ["BucketBatchSampler", "MaxTokensBatchSampler"])
def test_a_config_naming_a_sampler_by_its_old_dotted_path_builds_with_registered_types_only(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    # Under FRAMEWORK_REGISTERED_TYPES_ONLY=1 a registered class's re-export path (an alias)
    # is accepted, by from_config and validate alike.
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
    # A plugin added later with an exist_ok=True entry leaves your class in place, as a
    # plugin's exist_ok entry does at discovery.
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


class _NoScan:
    """Claimed modules that can be added to and asked about, and fail if walked through."""

    def __init__(self, names: Any) -> None:
        self._names = set(names)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def update(self, names: Any) -> None:
        self._names.update(names)

    def __iter__(self) -> Any:
        raise AssertionError("the claimed modules were scanned")

    __or__ = __ror__ = __iter__


def test_registering_looks_claimed_modules_up_without_scanning_them() -> None:
    # With many plugin distributions, each registration scanning every claimed module
    # made 1,000 registrations ~100x slower; a module and its packages are looked up.
    from framework.registry import Registrable, Registry, use_registry

    class Base(Registrable):
        pass

    registry = Registry(discover=lambda registry: None)
    registry.ensure_discovered()
    registry.plugin_manager  # noqa: B018 - a plugin manager, as after real discovery
    registry.claim_modules(f"dist{i}.mod{j}" for i in range(20) for j in range(5))
    registry._plugin_modules = _NoScan(registry._plugin_modules)
    registry.claim_modules(["userpkg_but_a_plugin.helpers"])  # claiming adds, never scans
    with use_registry(registry):
        for i in range(3):
            cls = type(f"C{i}", (Base,), {"__module__": "userpkg.models"})
            Base.register(f"n{i}")(cls)
        assert Base.by_name("n2").__name__ == "C2"
