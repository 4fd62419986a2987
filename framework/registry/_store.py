"""`Registry`: every base's named components, and which registry is active.

Every name lives in a `Registry`. The active one (`get_registry()`) is a module-level
default; `use_registry` swaps in another, e.g. a fresh copy per test. A registry has
two tiers: classes registered with `@Base.register` (recorded at once, importing and
scanning nothing) and components from plugins (discovered on the first lookup).
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Literal, Optional, Protocol

from framework.errors import RegistryError
from framework.registry._targets import (
    RegistryEntry,
    _duplicate,
    _replaced,
    _same,
    _skipped,
    _split,
    warn_plugin,
)

if TYPE_CHECKING:
    import pluggy

    from framework.registry._registrable import Registrable

__all__ = ["PluginLoading", "Registry", "all_entries", "get_registry", "registered_bases", "use_registry"]

_Entries = dict[type["Registrable"], dict[str, "RegistryEntry"]]


class PluginLoading(Protocol):
    """How a registry loads plugins: `framework.registry._plugins`, which builds on this
    module and so is wired in by the package (`framework.registry`) instead of imported."""

    def discover(self, registry: Registry) -> None: ...

    def add_plugin(self, registry: Registry, plugin: object, name: str, provider: str = ...) -> bool: ...


plugin_loading: Optional[PluginLoading] = None


def _loading() -> PluginLoading:
    if plugin_loading is None:
        raise RegistryError("framework.registry was not imported: no plugin loading is wired in")
    return plugin_loading


def _discover_entry_points(registry: Registry) -> None:
    _loading().discover(registry)


class Registry:
    """Every base's named components, safe to share between threads.

    `@Base.register` adds to the decorator tier and scans nothing. The first lookup
    runs `discover` once (by default: every `framework.plugins` entry point), builds
    the plugin tier on the side, lays the decorator tier over it, and only then
    publishes the result; other threads wait for it. A plugin module that looks names
    up while it loads sees the entries committed so far.

    The lock guards only this object's fields and is never held while plugin code runs,
    so a thread registering a class (holding its module's import lock) never waits for
    loading. A thread waiting for another's loading waits as long as the loading runs;
    it gives up with a `RegistryError` only when it may be what the loading waits for:
    after `wait_timeout` seconds in which no plugin finished loading, if it started
    while plugins were loading and the loading thread is blocked on another thread.
    """

    wait_timeout: float = 15.0

    def __init__(
        self, discover: Optional[Callable[[Registry], None]] = None, *, wait_timeout: Optional[float] = None
    ) -> None:
        self._lock = threading.RLock()
        self._progress = threading.Condition(self._lock)  # notified as plugins finish loading
        self._discover = discover if discover is not None else _discover_entry_points
        if wait_timeout is not None:
            self.wait_timeout = wait_timeout
        self._entries: _Entries = {}
        # The decorator tier: (entry, exist_ok, plugin that was loading when it was made).
        self._decorated: list[tuple[RegistryEntry, bool, Optional[str]]] = []
        self._discovered = False
        self._building: Optional[_Entries] = None
        self._builder: Optional[int] = None
        self._threads_before: set[Optional[int]] = set()  # alive when loading began
        self._loading_plugin: Optional[str] = None
        self._steps = 0
        self._notes: list[str] = []  # warnings held back until the registry is published
        self._failures: dict[str, BaseException] = {}
        self._manager: Optional[pluggy.PluginManager] = None
        # Modules that plugins' entries name as targets, or their distributions hold.
        self._plugin_modules: set[str] = set()

    # -- discovery ------------------------------------------------------------------
    def _may_wait_for(self, waiter: int) -> bool:
        """Whether the loading thread may be waiting for `waiter`, which waits for it: a
        thread started while plugins load (a plugin's helper, say) while the loading
        thread is blocked on another thread (its innermost frame in `threading`: a
        future, a queue, a join). Anything else is a slow import, waited for."""
        if waiter in self._threads_before:
            return False
        frame = sys._current_frames().get(self._builder) if self._builder is not None else None
        return frame is not None and frame.f_code.co_filename == threading.__file__

    def ensure_discovered(self) -> None:
        """Run plugin discovery once; re-entrant calls from a loading plugin return at once."""
        if self._discovered:
            return
        me = threading.get_ident()
        with self._lock:
            while not self._discovered and self._builder not in (None, me):
                steps = self._steps
                self._progress.wait(self.wait_timeout)
                if (
                    self._steps == steps
                    and self._builder not in (None, me)
                    and not self._discovered
                    and self._may_wait_for(me)
                ):
                    raise RegistryError(
                        f"waited {self.wait_timeout:g} s for another thread loading framework "
                        f"plugins, and no plugin finished loading meanwhile; a plugin module that "
                        f"looks names up from a helper thread while it is imported (a thread pool "
                        f"it waits on) deadlocks this way: look names up in the hook, or in the "
                        f"importing thread"
                    )
            if self._discovered or self._builder == me:
                return
            self._building, self._builder = {}, me
            self._threads_before = {thread.ident for thread in threading.enumerate()}
            self._failures, self._manager, self._notes = {}, None, []
        try:
            self._discover(self)
            with self._lock:  # replay and publish at once: a registration lands in one or the other
                for entry, exist_ok, tag in self._decorated:
                    in_code = tag is None and not self._in_plugin_package(entry)
                    self._put(self._building, entry, exist_ok, "warn", self._notes, in_code)
                self._entries, self._discovered = self._building, True
        finally:  # an interrupt leaves it cold, so the next lookup tries again
            with self._lock:
                self._building = self._builder = None
                notes, self._notes = self._notes, []
                self._progress.notify_all()
            for message in notes:  # after publishing: a warning raised as an error harms nothing
                warn_plugin(message)

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

    def warn(self, message: str) -> None:
        """A `PluginWarning`, held back until loading in this thread is published; never raises."""
        with self._lock:
            if self._builder == threading.get_ident():
                self._notes.append(message)
                return
        warn_plugin(message)

    @contextmanager
    def loading_plugin(self, name: str) -> Iterator[None]:
        """Tag the classes registered while plugin `name` loads in this thread, so that
        `forget_plugin` can take them back if it fails; marks progress when done."""
        with self._lock:
            previous, self._loading_plugin = self._loading_plugin, name
        try:
            yield
        finally:
            with self._lock:
                self._loading_plugin = previous
                self._steps += 1
                self._progress.notify_all()

    def registered_by(self, plugin: str, module: Optional[str]) -> bool:
        """Whether plugin `plugin` (or module `module`, imported earlier) registered a class
        with `@Base.register`: a plugin may consist of decorated classes alone."""
        with self._lock:
            return any(
                tag == plugin
                or (module is not None and entry.target_path.startswith((module + ":", module + ".")))
                for entry, _, tag in self._decorated
            )

    def claim_modules(self, modules: Iterable[str]) -> None:
        """Count `modules` (and the modules inside them) as plugins' code: the files of a
        plugin's distribution."""
        with self._lock:
            self._plugin_modules.update(modules)

    def forget_plugin(self, name: str) -> None:
        """Drop the classes plugin `name` registered while it loaded (it failed)."""
        with self._lock:
            self._decorated = [item for item in self._decorated if item[2] != name]

    # -- writing --------------------------------------------------------------------
    def _view(self) -> _Entries:
        if self._building is not None and self._builder == threading.get_ident():
            return self._building
        return self._entries

    def _put(
        self,
        entries: _Entries,
        entry: RegistryEntry,
        exist_ok: bool,
        on_clash: Literal["raise", "warn"],
        notes: list[str],
        in_code: bool = False,
    ) -> bool:
        """Put `entry` in `entries`. `in_code`: registered by the program's own code (not a
        plugin's), so it replaces a plugin's entry of its name, saying so."""
        existing = entries.get(entry.base, {}).get(entry.name)
        if existing is not None and exist_ok and not in_code and self._in_code(existing):
            if _same(existing, entry) is False:  # the program's class keeps it, as at discovery
                notes.append(_replaced(entry, existing))
                return False
        if existing is not None and not exist_ok:
            same = _same(existing, entry)
            if same is None:  # tell once the existing one loads; it keeps the name till then
                if all(rival is not entry for rival in existing._rivals):
                    existing._rivals.append(entry)
                return False
            if same is False and in_code and not self._in_code(existing):
                notes.append(_replaced(existing, entry))
            elif same is False:
                if on_clash == "raise":
                    raise _duplicate(existing, entry)
                notes.append(_skipped(existing, entry))
                return False
        entries.setdefault(entry.base, {})[entry.name] = entry
        return True

    def register(self, entry: RegistryEntry, exist_ok: bool = False) -> None:
        """The decorator tier: recorded now, laid over the plugins' entries when they load
        (the program's own class wins over a plugin's of the same name).

        While plugins load in this thread (a plugin module registering its classes), a
        clash only skips that entry, with a `PluginWarning`, as for entry points."""
        with self._lock:
            if self._builder == threading.get_ident():
                self._decorated.append((entry, exist_ok, self._loading_plugin))
                return
            notes: list[str] = []
            # A plugin's module imported lazily (on first use of its entry) registers as that
            # plugin: a clash skips the entry with a warning, as it would at discovery.
            in_code = not self._in_plugin_package(entry)
            self._put(self._entries, entry, exist_ok, "raise" if in_code else "warn", notes, in_code)
            self._decorated.append((entry, exist_ok, None))
        for message in notes:
            warn_plugin(message)

    def _in_code(self, entry: RegistryEntry) -> bool:
        """Whether `entry` was registered by the program's own code, not by a plugin."""
        return any(
            item[0] is entry and item[2] is None and not self._in_plugin_package(entry)
            for item in self._decorated
        )

    def _in_plugin_package(self, entry: RegistryEntry) -> bool:
        """Whether `entry`'s class lives in a loaded plugin's code: the package its plugin
        module (or plugin object's class) belongs to, a module its entries name as
        targets, or one of its distribution's files. A module the program imported
        before the plugins loaded still counts as the plugin's; `__main__` never does."""
        if self._manager is None:
            return False
        module = _split(entry.target_path)[0]
        if module == "__main__":
            return False
        parts = module.split(".")
        # the module and the packages above it: set lookups, not a scan of every claimed name
        candidates = [".".join(parts[: i + 1]) for i in range(len(parts))]
        with self._lock:
            if any(name in self._plugin_modules for name in candidates):
                return True
            packages = {_package_of(plugin) for plugin in self._manager.get_plugins()}
        return any(name in packages for name in candidates)

    def commit(
        self, staged: list[tuple[RegistryEntry, bool]], on_clash: Literal["raise", "warn"] = "raise"
    ) -> None:
        """Add a plugin's entries. `"raise"`: all or nothing. `"warn"`: a clashing entry
        is skipped with a `PluginWarning` naming both providers, the others are added."""
        for entry, _ in staged:
            if not isinstance(entry, RegistryEntry):
                raise RegistryError(f"Registry.commit takes (RegistryEntry, exist_ok) pairs, got {entry!r}")
        self.ensure_discovered()
        notes: list[str] = []
        with self._lock:
            self._plugin_modules.update(  # a plugin's targets (not a Registrar used by hand)
                _split(entry.target)[0]
                for entry, _ in staged
                if entry.plugin is not None and isinstance(entry.target, str)
            )
            view = self._view()
            if on_clash == "raise":
                pending: _Entries = {b: dict(names) for b, names in view.items()}
                for entry, exist_ok in staged:
                    self._put(pending, entry, exist_ok, "raise", notes)
            for entry, exist_ok in staged:
                self._put(view, entry, exist_ok, "warn", notes)
        for message in notes:
            self.warn(message)

    def add_plugin(self, plugin: object, name: str, provider: str = "unknown") -> bool:
        """Register `plugin` (a module, an object, or a class made with no arguments)
        through pluggy and add its components, as discovery does for an entry point.
        False, with a `PluginWarning`, if it failed."""
        self.ensure_discovered()
        return _loading().add_plugin(self, plugin, name, provider)

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
            other = Registry(self._discover, wait_timeout=self.wait_timeout)
            other._entries = {base: dict(names) for base, names in self._entries.items()}
            other._decorated = list(self._decorated)
            other._failures = dict(self._failures)
            other._plugin_modules = set(self._plugin_modules)
            other._discovered = True
            if self._manager is not None:  # its own manager: a plugin added to one stays there
                for plugin in self._manager.get_plugins():
                    other.plugin_manager.register(plugin, name=self._manager.get_name(plugin))
            return other


def _package_of(plugin: object) -> Optional[str]:
    """The package a plugin (a module, or an object of a class) comes from: the outermost
    regular package holding its module, below any namespace package (`acme.fwplugin` in
    a namespace `acme` that others share), or the module itself; None for `__main__`."""
    name = plugin.__name__ if isinstance(plugin, types.ModuleType) else type(plugin).__module__
    if name in ("builtins", "types", "__main__"):
        return None
    owner, parts = name, name.split(".")
    for depth in range(len(parts) - 1, 0, -1):
        parent = sys.modules.get(".".join(parts[:depth]))
        if parent is None or getattr(parent, "__file__", None) is None:  # a namespace package
            break
        owner = parent.__name__
    return owner


_default = Registry()
# The registries of the `use_registry` blocks open now, oldest first: the newest is the
# active one. Each block removes its own entry when it ends, so blocks in two threads
# whose ends do not nest still leave the default active once both have ended.
_blocks: list[tuple[object, Registry]] = []
_blocks_lock = threading.Lock()


def get_registry() -> Registry:
    """The registry `Registrable` reads and writes now."""
    try:
        return _blocks[-1][1]
    except IndexError:  # no block open
        return _default


@contextmanager
def use_registry(registry: Registry) -> Iterator[Registry]:
    """Make `registry` the active one inside the block (for every thread).

    Blocks may overlap in several threads: the registry of the newest block still open
    is active, and once every block has ended, the default is again.
    """
    token = object()
    with _blocks_lock:
        _blocks.append((token, registry))
    try:
        yield registry
    finally:
        with _blocks_lock:
            _blocks[:] = [block for block in _blocks if block[0] is not token]


def registered_bases() -> set[type[Registrable]]:
    """Every base class with at least one registered name."""
    return get_registry().bases()


def all_entries() -> list[RegistryEntry]:
    """Every registered entry, by base name, each base's default first; imports nothing."""
    return get_registry().all_entries()


def _default_first(base: type[Registrable], names: Iterable[str]) -> list[str]:
    ordered = sorted(names)
    default = getattr(base, "default_implementation", None)
    if default in ordered:
        ordered.remove(default)
        ordered.insert(0, default)
    return ordered
