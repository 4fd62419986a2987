"""Loading plugins: entry points of the `framework.plugins` group, through pluggy.

Plugins load once, lazily, on the first lookup in a `Registry` (and again in each
spawned worker process, which starts with an empty registry). The first-party
components come through this very path: they are entry points of this distribution.

Conflicts resolve the same way whatever order the environment lists entry points in:
this distribution's plugins load first, then third-party ones sorted by (distribution,
entry-point name). A later entry replaces an earlier one of the same name only with
`exist_ok=True`; otherwise only that entry is skipped, with a `PluginWarning`.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import types
from collections.abc import Callable
from importlib.metadata import Distribution, EntryPoint, distributions
from typing import Final, Optional

import pluggy

from framework import hookspecs
from framework.registry._registrar import Registrar
from framework.registry._store import Registry, get_registry
from framework.registry._targets import PluginWarning, describe_error

__all__ = [
    "ENTRY_POINT_GROUP",
    "PluginWarning",
    "add_plugin",
    "discover",
    "ensure_loaded",
    "failures",
    "plugin_manager",
]

ENTRY_POINT_GROUP: Final = "framework.plugins"
FIRST_PARTY: Final = "framework"
logger = logging.getLogger("framework.plugins")


def _env_names(variable: str) -> Optional[set[str]]:
    """The names listed in `variable`; None when unset or empty (empty means unset)."""
    names = {name.strip() for name in os.environ.get(variable, "").split(",") if name.strip()}
    return names or None


def failures() -> dict[str, BaseException]:
    """Plugins of the active registry that failed to load, by name, with their errors."""
    return get_registry().failures()


def plugin_manager() -> pluggy.PluginManager:
    registry = get_registry()
    registry.ensure_discovered()
    return registry.plugin_manager


def ensure_loaded() -> None:
    """Load every allowed plugin into the active registry, once."""
    get_registry().ensure_discovered()


def _entry_points(registry: Registry) -> list[tuple[str, str, EntryPoint]]:
    """(distribution, version, entry point) of the group, read one distribution at a
    time: a damaged `.dist-info` (no name, a bad line, bad bytes) is skipped with a
    `PluginWarning`, and the others still load. The first of a name on sys.path wins."""
    found: list[tuple[str, str, EntryPoint]] = []
    seen: set[str] = set()
    for dist in distributions():
        try:
            name, version, points = _read(dist)
        except Exception as error:  # its metadata is someone else's, and may be anything
            where = getattr(dist, "_path", None) or dist
            registry.warn(
                f"framework plugins of the distribution at {where} were skipped: its metadata "
                f"could not be read ({describe_error(error)}); reinstall or remove it"
            )
            continue
        key = re.sub(r"[-_.]+", "-", name).lower()  # PEP 503: one project, however spelled
        if key not in seen:
            seen.add(key)
            found.extend((name, version, point) for point in points)
    return found


def _read(dist: Distribution) -> tuple[str, str, list[EntryPoint]]:
    points = [point for point in dist.entry_points if point.group == ENTRY_POINT_GROUP]
    name = dist.metadata["Name"]
    if not isinstance(name, str) or not name:
        if points:
            raise ValueError("its METADATA has no Name")
        return "", "", []
    return name, str(dist.version), points


def _ordered(found: list[tuple[str, str, EntryPoint]]) -> list[tuple[str, str, EntryPoint]]:
    """Unique by (distribution, name); first-party first, then by distribution and name."""
    unique = {(dist, point.name): (dist, version, point) for dist, version, point in reversed(found)}
    return [unique[key] for key in sorted(unique, key=lambda k: (k[0] != FIRST_PARTY, k))]


def discover(registry: Registry) -> None:
    """Load every allowed entry point of the group into `registry`.

    `FRAMEWORK_PLUGINS` / `FRAMEWORK_DISABLE_PLUGINS` list entry-point names (`core`:
    every distribution's `core`) or `distribution:name` (`other-dist:core`: that
    one alone, as warnings name a third-party entry point sharing a built-in's name).
    """
    manager = registry.plugin_manager
    if os.environ.get("FRAMEWORK_TRACE_PLUGINS", "") not in ("", "0"):
        manager.trace.root.setwriter(lambda message: logger.info(message.rstrip()))
        manager.enable_tracing()
    allowed = _env_names("FRAMEWORK_PLUGINS")
    blocked = _env_names("FRAMEWORK_DISABLE_PLUGINS") or set()
    found = _ordered(_entry_points(registry))
    counts = collections.Counter(point.name for _, _, point in found)
    for dist, version, point in found:
        # Two distributions may use one entry-point name: the third-party one is then
        # known by "distribution:name", and neither replaces the other.
        key = point.name if dist == FIRST_PARTY or counts[point.name] == 1 else f"{dist}:{point.name}"
        names = {point.name, f"{dist}:{point.name}"}
        if names & blocked or (allowed is not None and not names & allowed):
            continue
        if dist != FIRST_PARTY:  # what its classes register, whenever imported, is the plugin's
            registry.claim_modules(_modules_of(point.dist))
        _load(registry, key, f"{dist} {version}", point.load, f"{point.value}, ")


def _modules_of(dist: Optional[Distribution]) -> set[str]:
    """The modules whose files a distribution's RECORD lists (a package by its
    `__init__.py`); none without a RECORD. A namespace package has no `__init__.py`,
    so only its own modules are listed, never the namespace."""
    try:
        files = dist.files if dist is not None else None
    except Exception:  # its metadata is someone else's, and may be anything
        return set()
    modules: set[str] = set()
    for file in files or ():
        if file.suffix != ".py":
            continue
        parts = file.with_suffix("").parts
        if parts and parts[-1] == "__init__":
            parts = parts[:-1]
        if parts and all(part.isidentifier() for part in parts):
            modules.add(".".join(parts))
    return modules


def add_plugin(registry: Registry, plugin: object, name: str, provider: str = "unknown") -> bool:
    """Register a plugin object under `name` and add its components; False if it failed."""
    return _load(registry, name, provider, lambda: plugin, "")


def _load(registry: Registry, name: str, provider: str, load: Callable[[], object], where: str) -> bool:
    manager = registry.plugin_manager
    registrar = Registrar(provider=provider, plugin=name.rpartition(":")[2], registry=registry)
    plugin: object = None
    registered = False
    with registry.loading_plugin(name):
        try:
            plugin = load()
            if isinstance(plugin, type):  # a class is a plugin through its instance
                plugin = plugin()
            manager.register(plugin, name=name)
            registered = True
            _check_hooks(registry, manager, plugin, name, provider)
            caller = manager.subset_hook_caller(
                "framework_register_components", [p for p in manager.get_plugins() if p is not plugin]
            )
            caller(registrar=registrar)
            registry.commit(registrar.staged, on_clash="warn")
            return True
        except (Exception, SystemExit) as error:  # a plugin calling sys.exit() is a broken plugin
            registry.record_failure(name, error)
            registry.forget_plugin(name)  # what it registered before failing goes too
            if registered:  # only ours: never another entry point's registration of it
                manager.unregister(plugin)
            registry.warn(
                f"framework plugin {name!r} ({where}from {provider}) failed to load and was "
                f"skipped: {describe_error(error)}"
            )
            return False
        except BaseException:  # Ctrl-C: the next lookup loads it again, and registers again
            registry.forget_plugin(name)
            raise


def _check_hooks(
    registry: Registry, manager: pluggy.PluginManager, plugin: object, name: str, provider: str
) -> None:
    """Hook mistakes are reported, never accepted silently: a misspelled hook, or none."""
    known = ", ".join(n for n in vars(hookspecs) if n.startswith("framework_"))
    callers = manager.get_hookcallers(plugin) or []
    for hook in callers:
        optional = all(impl.optionalhook for impl in hook.get_hookimpls() if impl.plugin is plugin)
        if not hook.has_spec() and not optional:
            registry.warn(
                f"framework plugin {name!r} (from {provider}) implements {hook.name!r}, which is "
                f"not a framework hook (misspelled?); it will never be called. "
                f"Known hooks: {known}"
            )
    unmarked = callable(getattr(plugin, "framework_register_components", None))
    module = getattr(plugin, "__name__", None) if isinstance(plugin, types.ModuleType) else None
    if not any(hook.has_spec() for hook in callers) and (
        unmarked or not registry.registered_by(name, module)
    ):
        registry.warn(
            f"framework plugin {name!r} (from {provider}) implements no framework hook, so it "
            + (
                "registers nothing: its framework_register_components is not marked with "
                "framework's @hookimpl (from framework import hookimpl; a marker of another "
                "project name is not ours)"
                if unmarked
                else f"registers nothing. Known hooks: {known}"
            )
        )
