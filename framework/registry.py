"""`Registrable`: components chosen by name, one namespace per base class.

Every name lives in a `Registry`. The active one (`get_registry()`) is a module-level
default; `use_registry` swaps in another, e.g. a fresh copy per test. A registry has
two tiers: classes registered with ``@Base.register`` (recorded at once, importing and
scanning nothing) and components from plugins (discovered on the first lookup).
"""

from __future__ import annotations

import difflib
import importlib
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from os import PathLike
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, Optional, TypeVar, Union

import attrs

from framework.errors import DuplicateNameError, PluginError, RegistryError, UnknownNameError

if TYPE_CHECKING:
    import pluggy

__all__ = [
    "REGISTERED_TYPES_ONLY_ENV",
    "PluginWarning",
    "Registrable",
    "Registrar",
    "Registry",
    "RegistryEntry",
    "all_entries",
    "get_registry",
    "import_refusal",
    "import_target",
    "imports_allowed",
    "registered_bases",
    "use_registry",
]

REGISTERED_TYPES_ONLY_ENV: Final = "FRAMEWORK_REGISTERED_TYPES_ONLY"

_T = TypeVar("_T")
_R = TypeVar("_R", bound="Registrable")
_Entries = dict[type["Registrable"], dict[str, "RegistryEntry"]]


class PluginWarning(UserWarning):
    """A plugin, or one of its entries, failed to load; everything else keeps working."""


def imports_allowed(allow_import: Optional[bool] = None) -> bool:
    """Whether a dotted path from a config may be imported: `allow_import` if given,
    else unless ``FRAMEWORK_REGISTERED_TYPES_ONLY`` is set (empty and ``0`` mean unset)."""
    if allow_import is not None:
        return allow_import
    return os.environ.get(REGISTERED_TYPES_ONLY_ENV, "") in ("", "0")


def import_refusal(path: str, allow_import: Optional[bool] = None) -> Optional[str]:
    """Why `import_target` would refuse `path` now, or None if it would import it.

    For checks that must refuse without importing (``framework config validate``)."""
    if imports_allowed(allow_import):
        return None
    return (
        f"{path!r} was not imported: {REGISTERED_TYPES_ONLY_ENV}=1 limits dotted paths from "
        f"configs to registered components; register it, or unset the variable for configs "
        f"you trust"
    )


def import_target(path: str, *, allow_import: Optional[bool] = None) -> Any:
    """Import ``pkg.mod:Attr`` or ``pkg.mod.Attr`` and return the attribute.

    Importing runs the module's code, so this is the one gate for every path that comes
    from a config: with ``FRAMEWORK_REGISTERED_TYPES_ONLY=1`` (or ``allow_import=False``)
    it raises ImportError and imports nothing. Installed code (a registered target, a
    plugin naming its bases) passes ``allow_import=True``.
    """
    refusal = import_refusal(path, allow_import)
    if refusal is not None:
        raise ImportError(refusal)
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


def _same_target(a: str, b: str) -> bool:
    """``pkg.mod.Cls`` and ``pkg.mod:Cls`` name the same class."""
    return a.replace(":", ".") == b.replace(":", ".")


def _check_name(name: object, where: str) -> str:
    """`name` if it can be registered; a clear error if not (nothing is registered then)."""
    if not isinstance(name, str) or not name or any(c.isspace() or not c.isprintable() for c in name):
        raise RegistryError(
            f"{where}: a component name must be a non-empty string without whitespace, "
            f"got {name!r} ({type(name).__name__}); pick a name such as 'my_reader'"
        )
    return name


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
                loaded = import_target(self.target, allow_import=True)  # registered: installed code
            except (Exception, SystemExit) as error:  # a module calling sys.exit() is broken
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


def _clash(existing: Optional[RegistryEntry], entry: RegistryEntry, exist_ok: bool) -> bool:
    return (
        existing is not None and not exist_ok and not _same_target(existing.target_path, entry.target_path)
    )


def _duplicate(existing: RegistryEntry, entry: RegistryEntry) -> DuplicateNameError:
    return DuplicateNameError(
        entry.base.__name__,
        entry.name,
        existing.target_path,
        entry.target_path,
        existing.provider,
        entry.provider,
    )


@attrs.define
class Registrar:
    """What a plugin's ``framework_register_components`` hook receives.

    Entries are staged and committed together, so a plugin that fails halfway
    registers nothing.
    """

    provider: str
    plugin: Optional[str] = None
    staged: list[tuple[RegistryEntry, bool]] = attrs.field(factory=list)
    registry: Optional[Registry] = attrs.field(default=None, repr=False)

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
        _check_name(name, f"registrar.add({base.__name__}, ...) from {self.provider}")
        if not isinstance(target, (str, type)):
            raise RegistryError(
                f"registrar.add: target for {name!r} must be 'package.module:ClassName' or a "
                f"class, got {target!r}"
            )
        entry = RegistryEntry(base, name, target, constructor, self.provider, self.plugin)
        for staged, _ in self.staged:
            if staged.base is base and staged.name == name and _clash(staged, entry, exist_ok):
                raise _duplicate(staged, entry)
        self.staged.append((entry, exist_ok))

    def commit(self) -> None:
        """Register every staged entry, or none: a clash raises `DuplicateNameError`."""
        (self.registry or get_registry()).commit(self.staged, on_clash="raise")


def _discover_entry_points(registry: Registry) -> None:
    from framework import _plugins

    _plugins.discover(registry)


class Registry:
    """Every base's named components, safe to share between threads.

    ``@Base.register`` adds to the decorator tier and scans nothing. The first lookup
    runs `discover` once (by default: every ``framework.plugins`` entry point), builds
    the plugin tier on the side, lays the decorator tier over it, and only then
    publishes the result; other threads wait for it. A plugin module that looks names
    up while it loads sees the entries committed so far.
    """

    def __init__(self, discover: Optional[Callable[[Registry], None]] = None) -> None:
        self._lock = threading.RLock()
        self._discover = discover if discover is not None else _discover_entry_points
        self._entries: _Entries = {}
        self._decorated: list[tuple[RegistryEntry, bool]] = []
        self._discovered = False
        self._building: Optional[_Entries] = None
        self._builder: Optional[int] = None
        self._failures: dict[str, BaseException] = {}
        self._manager: Optional[pluggy.PluginManager] = None

    # -- discovery ------------------------------------------------------------------
    def ensure_discovered(self) -> None:
        """Run plugin discovery once; re-entrant calls from a loading plugin return at once."""
        if self._discovered:
            return
        with self._lock:
            if self._discovered or self._builder == threading.get_ident():
                return
            self._building, self._builder = {}, threading.get_ident()
            self._failures, self._manager = {}, None  # a retry starts from a clean slate
            try:
                self._discover(self)
                for entry, exist_ok in self._decorated:
                    self._put(self._building, entry, exist_ok, on_clash="warn")
                self._entries, self._discovered = self._building, True
            finally:  # an interrupt leaves it cold, so the next lookup tries again
                self._building, self._builder = None, None

    @property
    def discovered(self) -> bool:
        return self._discovered

    @property
    def plugin_manager(self) -> pluggy.PluginManager:
        """The pluggy manager holding this registry's plugins (made on first use)."""
        with self._lock:
            if self._manager is None:
                import pluggy

                from framework import hookspecs

                self._manager = pluggy.PluginManager("framework")
                self._manager.add_hookspecs(hookspecs)
            return self._manager

    def record_failure(self, plugin: str, error: BaseException) -> None:
        with self._lock:
            self._failures[plugin] = error

    def failures(self) -> dict[str, BaseException]:
        """Plugins that failed to load, by plugin name, with their errors."""
        self.ensure_discovered()
        return dict(self._failures)

    # -- writing --------------------------------------------------------------------
    def _view(self) -> _Entries:
        if self._building is not None and self._builder == threading.get_ident():
            return self._building
        return self._entries

    def _put(
        self, entries: _Entries, entry: RegistryEntry, exist_ok: bool, on_clash: Literal["raise", "warn"]
    ) -> bool:
        existing = entries.get(entry.base, {}).get(entry.name)
        if existing is not None and _clash(existing, entry, exist_ok):
            if on_clash == "raise":
                raise _duplicate(existing, entry)
            warnings.warn(
                f"{entry.base.__name__} {entry.name!r}: {entry.target_path} from {entry.provider} "
                f"was skipped: the name is taken by {existing.target_path} from "
                f"{existing.provider} (register with exist_ok=True to replace it on purpose)",
                PluginWarning,
                stacklevel=2,
            )
            return False
        entries.setdefault(entry.base, {})[entry.name] = entry
        return True

    def register(self, entry: RegistryEntry, exist_ok: bool = False) -> None:
        """The decorator tier: recorded now, laid over the plugins' entries when they load."""
        with self._lock:
            view = self._view()
            self._put(view, entry, exist_ok, on_clash="raise")
            self._decorated.append((entry, exist_ok))

    def commit(
        self, staged: list[tuple[RegistryEntry, bool]], on_clash: Literal["raise", "warn"] = "raise"
    ) -> None:
        """Add a plugin's entries. ``"raise"``: all or nothing. ``"warn"``: a clashing entry
        is skipped with a `PluginWarning` naming both providers, the others are added."""
        self.ensure_discovered()
        with self._lock:
            view = self._view()
            if on_clash == "raise":
                pending: _Entries = {b: dict(names) for b, names in view.items()}
                for entry, exist_ok in staged:
                    self._put(pending, entry, exist_ok, on_clash="raise")
            for entry, exist_ok in staged:
                self._put(view, entry, exist_ok, on_clash="warn")

    def add_plugin(self, plugin: object, name: str, provider: str = "unknown") -> bool:
        """Register `plugin` (a module, an object, or a class made with no arguments)
        through pluggy and add its components, as discovery does for an entry point.
        False, with a `PluginWarning`, if it failed."""
        from framework import _plugins

        self.ensure_discovered()
        return _plugins.add_plugin(self, plugin, name, provider)

    # -- reading --------------------------------------------------------------------
    def entries(self, base: type[Registrable]) -> dict[str, RegistryEntry]:
        """`base`'s entries by name (a copy)."""
        self.ensure_discovered()
        with self._lock:
            return dict(self._view().get(base, {}))

    def bases(self) -> set[type[Registrable]]:
        """Every base class with at least one registered name."""
        self.ensure_discovered()
        with self._lock:
            return {base for base, names in self._view().items() if names}

    def all_entries(self) -> list[RegistryEntry]:
        """Every entry, by base name, each base's default first; imports nothing."""
        result: list[RegistryEntry] = []
        for base in sorted(self.bases(), key=lambda b: (b.__name__, b.__module__)):
            entries = self.entries(base)
            result.extend(entries[name] for name in _default_first(base, entries))
        return result

    def copy(self) -> Registry:
        """A registry holding the same entries that later changes to either do not reach."""
        self.ensure_discovered()
        with self._lock:
            other = Registry(self._discover)
            other._entries = {base: dict(names) for base, names in self._entries.items()}
            other._decorated = list(self._decorated)
            other._failures = dict(self._failures)
            other._discovered = True
            if self._manager is not None:  # its own manager: a plugin added to one stays there
                for plugin in self._manager.get_plugins():
                    other.plugin_manager.register(plugin, name=self._manager.get_name(plugin))
            return other


_active = Registry()


def get_registry() -> Registry:
    """The registry `Registrable` reads and writes now."""
    return _active


@contextmanager
def use_registry(registry: Registry) -> Iterator[Registry]:
    """Make `registry` the active one inside the block (for every thread)."""
    global _active
    previous, _active = _active, registry
    try:
        yield registry
    finally:
        _active = previous


def registered_bases() -> set[type[Registrable]]:
    """Every base class with at least one registered name."""
    return get_registry().bases()


def all_entries() -> list[RegistryEntry]:
    """Every registered entry, by base name, each base's default first; imports nothing."""
    return get_registry().all_entries()


def _default_first(base: type[Registrable], names: Iterable[str]) -> list[str]:
    ordered = sorted(names)
    default = base.default_implementation if base is not Registrable else None
    if default in ordered:
        ordered.remove(default)
        ordered.insert(0, default)
    return ordered


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
        """Register the decorated subclass as `name` for this base class.

        Scans no plugin: a plugin's entry of the same name is replaced only with
        ``exist_ok=True``, whichever is seen first.
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

        A dotted path imports its module, so it runs code: with ``allow_import=False``
        (or ``FRAMEWORK_REGISTERED_TYPES_ONLY=1`` in the environment) only a path that
        is a registered target is accepted, and nothing else is imported.
        """
        entry = cls._find_entry(name)
        if entry is not None:
            return entry.load(), entry.constructor
        if "." in name or ":" in name:
            if not imports_allowed(allow_import):
                for registered in cls.registry_entries().values():
                    if _same_target(registered.target_path, name) and issubclass(registered.load(), cls):
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
                    note=f"Importing it failed: {type(error).__name__}: {error}",
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

        get_registry().ensure_discovered()
        if not isinstance(config, Mapping):
            config = load_config(config)
        built: _R = construct(cls, config, extras=extras)
        return built
