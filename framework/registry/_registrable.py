"""`Registrable`: a base class whose subclasses are chosen by name."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from os import PathLike
from typing import Any, ClassVar, Optional, TypeVar, Union

from framework.errors import RegistryError, UnknownNameError
from framework.registry._store import _default_first, get_registry
from framework.registry._targets import (
    REGISTERED_TYPES_ONLY_ENV,
    RegistryEntry,
    _check_name,
    describe_error,
    import_target,
    imports_allowed,
)

__all__ = ["Registrable", "install_config_builder"]

_T = TypeVar("_T")
_R = TypeVar("_R", bound="Registrable")

# Builds an instance of a class from a config mapping (or file) and extras. The config
# layer sits above the registry and installs it when imported (see `from_config`).
ConfigBuilder = Callable[[type, Union[Mapping[str, Any], str, "PathLike[str]"], dict[str, Any]], Any]
_builder: Optional[ConfigBuilder] = None


def install_config_builder(builder: ConfigBuilder) -> None:
    """Make `builder` what `Registrable.from_config` builds with (`framework.config` does)."""
    global _builder
    _builder = builder


class Registrable:
    """A base class whose subclasses can be registered and then chosen by name.

    `@Base.register("name")` keeps the decorated class's type; `Base.by_name`
    returns the class (or its named constructor); `Base.from_config` builds one
    from a config mapping.
    """

    default_implementation: ClassVar[Optional[str]] = None

    @classmethod
    def register(
        cls, name: str, *, constructor: Optional[str] = None, exist_ok: bool = False
    ) -> Callable[[type[_T]], type[_T]]:
        """Register the decorated subclass as `name` for this base class.

        Scans no plugin. A name that the program's own code registered already raises
        `DuplicateNameError` unless `exist_ok=True`; a plugin's entry of the name is
        replaced, whichever is seen first, with a `PluginWarning` (none with
        `exist_ok=True`). A plugin's own modules registering so count as the plugin.
        """
        _check_name(name, f"{cls.__name__}.register")

        def decorate(subclass: type[_T]) -> type[_T]:
            if not (isinstance(subclass, type) and issubclass(subclass, cls)):
                raise RegistryError(
                    f"cannot register {subclass!r} as {cls.__name__} {name!r}: "
                    f"it is not a subclass of {cls.__name__}"
                )
            provider = f"module {subclass.__module__}"
            get_registry().register(RegistryEntry(cls, name, subclass, constructor, provider), exist_ok)
            return subclass

        return decorate

    @classmethod
    def registry_entries(cls) -> dict[str, RegistryEntry]:
        """This base's entries by name (every base's, called on `Registrable` itself)."""
        registry = get_registry()
        if cls is Registrable:
            merged: dict[str, RegistryEntry] = {}
            for base in registry.bases():
                merged.update(registry.entries(base))
            return merged
        return registry.entries(cls)

    @classmethod
    def list_available(cls) -> list[str]:
        """Registered names, the `default_implementation` first; imports nothing."""
        return _default_first(cls, cls.registry_entries())

    @classmethod
    def resolve_class_name(
        cls: type[_R], name: str, *, allow_import: Optional[bool] = None
    ) -> tuple[type[_R], Optional[str]]:
        """The class registered as `name` (or at dotted path `name`) and its constructor.

        A dotted path imports its module, so it runs code: with `allow_import=False`
        (or `FRAMEWORK_REGISTERED_TYPES_ONLY=1` in the environment) only a path that
        is a registered target is accepted, and nothing else is imported.
        """
        entry = cls._find_entry(name)
        if entry is not None:
            return entry.load(), entry.constructor
        if "." in name or ":" in name:
            if not imports_allowed(allow_import):
                for registered in cls.registry_entries().values():
                    if registered.named_by(name) and issubclass(registered.load(), cls):
                        return registered.load(), None
                raise UnknownNameError(
                    cls.__name__,
                    name,
                    cls.list_available(),
                    note=f"Dotted paths are limited to registered components "
                    f"({REGISTERED_TYPES_ONLY_ENV}=1); register it or use a registered name.",
                )
            try:
                target = import_target(name, allow_import=True)  # allowed just above
            except (Exception, SystemExit) as error:  # the module is someone else's code
                raise UnknownNameError(
                    cls.__name__,
                    name,
                    cls.list_available(),
                    note=f"Importing it failed: {describe_error(error)}",
                ) from error
            if not (isinstance(target, type) and issubclass(target, cls)):
                raise RegistryError(f"{name!r} is {target!r}, not a subclass of {cls.__name__}")
            return target, None
        raise cls._unknown(name)

    @classmethod
    def by_name(cls: type[_R], name: str, *, allow_import: Optional[bool] = None) -> Callable[..., _R]:
        """The class registered as `name` (or its named constructor), or at a dotted path."""
        subclass, constructor = cls.resolve_class_name(name, allow_import=allow_import)
        return getattr(subclass, constructor) if constructor else subclass

    @classmethod
    def _find_entry(cls, name: str) -> Optional[RegistryEntry]:
        registry = get_registry()
        if cls is Registrable:
            owners = [e[name] for e in map(registry.entries, registry.bases()) if name in e]
            if len(owners) > 1:
                bases = ", ".join(sorted(e.base.__name__ for e in owners))
                raise RegistryError(
                    f"{name!r} is registered for several bases ({bases}); "
                    f"ask one of them, e.g. {owners[0].base.__name__}.by_name({name!r})"
                )
            return owners[0] if owners else None
        entry = registry.entries(cls).get(name)
        if entry is not None:
            return entry
        # A subclass finds the names registered on the base it derives from.
        for ancestor in cls.__mro__[1:]:
            if isinstance(ancestor, type) and issubclass(ancestor, Registrable):
                entry = registry.entries(ancestor).get(name)
                if entry is not None and issubclass(entry.load(), cls):
                    return entry
        return None

    @classmethod
    def _unknown(cls, name: str) -> UnknownNameError:
        available = cls.list_available()
        swapped = [n for n in (name.replace("-", "_"), name.replace("_", "-")) if n in available]
        close = difflib.get_close_matches(name, available, n=3, cutoff=0.6)
        suggestions = list(dict.fromkeys(swapped + close))
        failures = get_registry().failures()
        note = ""
        if failures:
            note = "Some plugins failed to load: " + "; ".join(
                f"{plugin}: {describe_error(error)}" for plugin, error in failures.items()
            )
        error = UnknownNameError(cls.__name__, name, available, suggestions, note)
        if failures:
            error.__cause__ = next(iter(failures.values()))
        return error

    @classmethod
    def from_config(cls: type[_R], config: Union[Mapping[str, Any], str, PathLike[str]], **extras: Any) -> _R:
        """Build an instance from a config mapping (or a JSON/YAML file).

        A `"type"` key picks the registered subclass (else `default_implementation`);
        other keys are matched to `__init__` parameters by their annotations,
        recursively. `extras` go to any constructor, at any depth, that takes them.
        """
        if _builder is None:  # the config layer installs it, imported by `framework`'s root
            raise RegistryError("framework.config did not install its config builder")
        get_registry().ensure_discovered()
        built: _R = _builder(cls, config, extras)
        return built
