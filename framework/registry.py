"""`Registrable`: components chosen by name, one registry per base class."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Mapping
from os import PathLike
from typing import Any, ClassVar, Optional, TypeVar, Union

import attrs

from framework.errors import DuplicateNameError, PluginError, RegistryError, UnknownNameError

__all__ = ["Registrable", "Registrar", "RegistryEntry", "all_entries", "import_target"]

_T = TypeVar("_T")
_R = TypeVar("_R", bound="Registrable")


def import_target(path: str) -> Any:
    """Import ``pkg.mod:Attr`` or ``pkg.mod.Attr`` and return the attribute."""
    if ":" in path:
        module_name, _, qualname = path.partition(":")
    else:
        module_name, _, qualname = path.rpartition(".")
    if not module_name or not qualname:
        raise ImportError(f"{path!r} is not a dotted path like 'package.module:ClassName'")
    target: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def _describe(target: Union[str, type]) -> str:
    if isinstance(target, str):
        return target
    return f"{target.__module__}:{target.__qualname__}"


@attrs.define
class RegistryEntry:
    """One registered component; a string target is imported on first `load()`."""

    base: type[Registrable]
    name: str
    target: Union[str, type]
    constructor: Optional[str] = None
    provider: str = "unknown"
    plugin: Optional[str] = None
    _loaded: Optional[type] = attrs.field(default=None, repr=False, eq=False)

    @property
    def target_path(self) -> str:
        return _describe(self.target)

    @property
    def is_loaded(self) -> bool:
        return not isinstance(self.target, str) or self._loaded is not None

    def load(self) -> type:
        if not isinstance(self.target, str):
            return self.target
        if self._loaded is None:
            try:
                loaded = import_target(self.target)
            except Exception as error:
                raise PluginError(
                    self.plugin or self.provider,
                    f"{self.base.__name__} {self.name!r} (from {self.provider}) could not be "
                    f"imported from {self.target!r}: {type(error).__name__}: {error}",
                ) from error
            if not (isinstance(loaded, type) and issubclass(loaded, self.base)):
                raise PluginError(
                    self.plugin or self.provider,
                    f"{self.target!r}, registered as {self.base.__name__} {self.name!r} by "
                    f"{self.provider}, is not a subclass of {self.base.__name__}",
                )
            self._loaded = loaded
        return self._loaded

    def factory(self) -> Callable[..., Any]:
        cls = self.load()
        return getattr(cls, self.constructor) if self.constructor else cls


# One dict per base class: names of one base never collide with another's.
_REGISTRY: dict[type[Registrable], dict[str, RegistryEntry]] = {}


def _check_free(entry: RegistryEntry, exist_ok: bool) -> None:
    existing = _REGISTRY.get(entry.base, {}).get(entry.name)
    if existing is not None and not exist_ok and existing.target_path != entry.target_path:
        raise DuplicateNameError(
            entry.base.__name__,
            entry.name,
            existing.target_path,
            entry.target_path,
            existing.provider,
            entry.provider,
        )


def _add(entry: RegistryEntry, exist_ok: bool) -> None:
    _check_free(entry, exist_ok)
    _REGISTRY.setdefault(entry.base, {})[entry.name] = entry


@attrs.define
class Registrar:
    """What a plugin's ``framework_register_components`` hook receives.

    Entries are staged and committed together, so a plugin that fails halfway
    registers nothing.
    """

    provider: str
    plugin: Optional[str] = None
    staged: list[tuple[RegistryEntry, bool]] = attrs.field(factory=list)

    def add(
        self,
        base: type[Registrable],
        name: str,
        target: Union[str, type],
        *,
        constructor: Optional[str] = None,
        exist_ok: bool = False,
    ) -> None:
        """Register `target` (``"pkg.module:Class"`` or a class) as `name` for `base`."""
        if not (isinstance(base, type) and issubclass(base, Registrable)):
            raise RegistryError(f"registrar.add: {base!r} is not a Registrable base class")
        if not isinstance(target, (str, type)):
            raise RegistryError(
                f"registrar.add: target for {name!r} must be 'package.module:ClassName' or a "
                f"class, got {target!r}"
            )
        entry = RegistryEntry(base, name, target, constructor, self.provider, self.plugin)
        self.staged.append((entry, exist_ok))

    def commit(self) -> None:
        for entry, exist_ok in self.staged:
            _check_free(entry, exist_ok)  # all or nothing
        for entry, exist_ok in self.staged:
            _add(entry, exist_ok)


def _ensure_plugins() -> None:
    from framework import _plugins

    _plugins.ensure_loaded()


class Registrable:
    """A base class whose subclasses can be registered and then chosen by name.

    ``@Base.register("name")`` keeps the decorated class's type; ``Base.by_name``
    returns the class (or its named constructor); ``Base.from_config`` builds one
    from a config mapping.
    """

    default_implementation: ClassVar[Optional[str]] = None

    @classmethod
    def register(
        cls, name: str, *, constructor: Optional[str] = None, exist_ok: bool = False
    ) -> Callable[[type[_T]], type[_T]]:
        """Register the decorated subclass as `name` for this base class."""
        _ensure_plugins()  # so that exist_ok=True replaces a plugin's entry, not the reverse

        def decorate(subclass: type[_T]) -> type[_T]:
            if not (isinstance(subclass, type) and issubclass(subclass, cls)):
                raise RegistryError(
                    f"cannot register {subclass!r} as {cls.__name__} {name!r}: "
                    f"it is not a subclass of {cls.__name__}"
                )
            provider = f"module {subclass.__module__}"
            _add(RegistryEntry(cls, name, subclass, constructor, provider), exist_ok)
            return subclass

        return decorate

    @classmethod
    def registry_entries(cls) -> dict[str, RegistryEntry]:
        """This base's entries by name (every base's, called on `Registrable` itself)."""
        _ensure_plugins()
        if cls is Registrable:
            merged: dict[str, RegistryEntry] = {}
            for names in _REGISTRY.values():
                merged.update(names)
            return merged
        return dict(_REGISTRY.get(cls, {}))

    @classmethod
    def list_available(cls) -> list[str]:
        """Registered names, the `default_implementation` first; imports nothing."""
        if cls is Registrable:
            _ensure_plugins()
            return sorted({name for names in _REGISTRY.values() for name in names})
        names = sorted(cls.registry_entries())
        default = cls.default_implementation
        if default in names:
            names.remove(default)
            names.insert(0, default)
        return names

    @classmethod
    def resolve_class_name(cls: type[_R], name: str) -> tuple[type[_R], Optional[str]]:
        """The class registered as `name` (or at dotted path `name`) and its constructor."""
        entry = cls._find_entry(name)
        if entry is not None:
            return entry.load(), entry.constructor
        if "." in name or ":" in name:
            try:
                target = import_target(name)
            except (ImportError, AttributeError) as error:
                raise UnknownNameError(
                    cls.__name__, name, cls.list_available(), note=f"Importing it failed: {error}"
                ) from error
            if not (isinstance(target, type) and issubclass(target, cls)):
                raise RegistryError(f"{name!r} is {target!r}, not a subclass of {cls.__name__}")
            return target, None
        raise cls._unknown(name)

    @classmethod
    def by_name(cls: type[_R], name: str) -> Callable[..., _R]:
        """The class registered as `name` (or its named constructor), or at a dotted path."""
        subclass, constructor = cls.resolve_class_name(name)
        return getattr(subclass, constructor) if constructor else subclass

    @classmethod
    def _find_entry(cls, name: str) -> Optional[RegistryEntry]:
        entries = cls.registry_entries()
        if cls is Registrable:
            owners = [names[name] for names in _REGISTRY.values() if name in names]
            if len(owners) > 1:
                bases = ", ".join(sorted(e.base.__name__ for e in owners))
                raise RegistryError(
                    f"{name!r} is registered for several bases ({bases}); "
                    f"ask one of them, e.g. {owners[0].base.__name__}.by_name({name!r})"
                )
        if name in entries:
            return entries[name]
        # A subclass finds the names registered on the base it derives from.
        for ancestor in cls.__mro__[1:]:
            entry = _REGISTRY.get(ancestor, {}).get(name)  # type: ignore[call-overload]
            if entry is not None and issubclass(entry.load(), cls):
                return entry
        return None

    @classmethod
    def _unknown(cls, name: str) -> UnknownNameError:
        from framework import _plugins

        available = cls.list_available()
        swapped = [n for n in (name.replace("-", "_"), name.replace("_", "-")) if n in available]
        close = difflib.get_close_matches(name, available, n=3, cutoff=0.6)
        suggestions = list(dict.fromkeys(swapped + close))
        failures = _plugins.failures()
        note = ""
        if failures:
            note = "Some plugins failed to load: " + "; ".join(
                f"{plugin}: {type(error).__name__}: {error}" for plugin, error in failures.items()
            )
        error = UnknownNameError(cls.__name__, name, available, suggestions, note)
        if failures:
            error.__cause__ = next(iter(failures.values()))
        return error

    @classmethod
    def from_config(cls: type[_R], config: Union[Mapping[str, Any], str, PathLike[str]], **extras: Any) -> _R:
        """Build an instance from a config mapping (or a JSON/YAML file).

        A ``"type"`` key picks the registered subclass (else `default_implementation`);
        other keys are matched to ``__init__`` parameters by their annotations,
        recursively. `extras` go to any constructor, at any depth, that takes them.
        """
        from framework.config import construct, load_config

        _ensure_plugins()
        if not isinstance(config, Mapping):
            config = load_config(config)
        built: _R = construct(cls, config, extras=extras)
        return built


def all_entries() -> list[RegistryEntry]:
    """Every registered entry, by base name, each base's default first; imports nothing."""
    _ensure_plugins()
    return [
        _REGISTRY[base][name]
        for base in sorted(_REGISTRY, key=lambda b: (b.__name__, b.__module__))
        for name in base.list_available()
    ]


def _snapshot() -> dict[type[Registrable], dict[str, RegistryEntry]]:
    """A copy of every registry, for tests that must not leak registrations."""
    _ensure_plugins()
    return {base: dict(names) for base, names in _REGISTRY.items()}


def _restore(snapshot: Mapping[type[Registrable], Mapping[str, RegistryEntry]]) -> None:
    _REGISTRY.clear()
    _REGISTRY.update({base: dict(names) for base, names in snapshot.items()})
