"""Loading plugins: entry points of the ``framework.plugins`` group, through pluggy.

Plugins load once, lazily, on the first lookup in a `Registry` (and again in each
spawned worker process, which starts with an empty registry). The first-party
components come through this very path: they are entry points of this distribution.

Conflicts resolve the same way whatever order the environment lists entry points in:
this distribution's plugins load first, then third-party ones sorted by (distribution,
entry-point name). A later entry replaces an earlier one of the same name only with
``exist_ok=True``; otherwise only that entry is skipped, with a `PluginWarning`.
"""

from __future__ import annotations

import collections
import logging
import os
import warnings
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from typing import Final, Optional

import pluggy

from framework import hookspecs
from framework.registry import PluginWarning, Registrar, Registry, get_registry

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
    value = os.environ.get(variable)
    if value is None:
        return None
    return {name.strip() for name in value.split(",") if name.strip()}


def _dist_name(entry_point: EntryPoint) -> str:
    return entry_point.dist.name if entry_point.dist is not None else ""


def _provider(entry_point: EntryPoint) -> str:
    dist = entry_point.dist
    return f"{dist.name} {dist.version}" if dist is not None else "unknown distribution"


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


def _ordered(found: list[EntryPoint]) -> list[EntryPoint]:
    """Unique by (distribution, name); first-party first, then by distribution and name."""
    unique = {(_dist_name(ep), ep.name): ep for ep in reversed(found)}
    return [unique[key] for key in sorted(unique, key=lambda k: (k[0] != FIRST_PARTY, k))]


def discover(registry: Registry) -> None:
    """Load every allowed entry point of the group into `registry`."""
    manager = registry.plugin_manager
    if os.environ.get("FRAMEWORK_TRACE_PLUGINS", "") not in ("", "0"):
        manager.trace.root.setwriter(lambda message: logger.info(message.rstrip()))
        manager.enable_tracing()
    allowed = _env_names("FRAMEWORK_PLUGINS")
    blocked = _env_names("FRAMEWORK_DISABLE_PLUGINS") or set()
    found = _ordered(list(entry_points(group=ENTRY_POINT_GROUP)))
    counts = collections.Counter(ep.name for ep in found)
    for entry_point in found:
        name = entry_point.name
        if name in blocked or (allowed is not None and name not in allowed):
            continue
        dist = _dist_name(entry_point)
        # Two distributions may use one entry-point name: the third-party one is then
        # known by "distribution:name", and neither replaces the other.
        key = name if dist == FIRST_PARTY or counts[name] == 1 else f"{dist}:{name}"
        _load(registry, key, _provider(entry_point), entry_point.load, f"{entry_point.value}, ")


def add_plugin(registry: Registry, plugin: object, name: str, provider: str = "unknown") -> bool:
    """Register a plugin object under `name` and add its components; False if it failed."""
    return _load(registry, name, provider, lambda: plugin, "")


def _load(registry: Registry, name: str, provider: str, load: Callable[[], object], where: str) -> bool:
    manager = registry.plugin_manager
    registrar = Registrar(provider=provider, plugin=name.rpartition(":")[2], registry=registry)
    plugin: object = None
    try:
        plugin = load()
        if isinstance(plugin, type):  # a class is a plugin through its instance
            plugin = plugin()
        manager.register(plugin, name=name)
        _warn_unknown_hooks(manager, plugin, name, provider)
        caller = manager.subset_hook_caller(
            "framework_register_components", [p for p in manager.get_plugins() if p is not plugin]
        )
        caller(registrar=registrar)
        registry.commit(registrar.staged, on_clash="warn")
        return True
    except (Exception, SystemExit) as error:  # a plugin calling sys.exit() is a broken plugin
        registry.record_failure(name, error)
        if plugin is not None and manager.is_registered(plugin):
            manager.unregister(plugin)
        warnings.warn(
            f"framework plugin {name!r} ({where}from {provider}) failed to load and was "
            f"skipped: {type(error).__name__}: {error}",
            PluginWarning,
            stacklevel=2,
        )
        return False


def _warn_unknown_hooks(manager: pluggy.PluginManager, plugin: object, name: str, provider: str) -> None:
    known = ", ".join(n for n in vars(hookspecs) if n.startswith("framework_"))
    for hook in manager.get_hookcallers(plugin) or []:
        optional = all(impl.optionalhook for impl in hook.get_hookimpls() if impl.plugin is plugin)
        if not hook.has_spec() and not optional:
            warnings.warn(
                f"framework plugin {name!r} (from {provider}) implements {hook.name!r}, which is "
                f"not a framework hook (misspelled?); it will never be called. "
                f"Known hooks: {known}",
                PluginWarning,
                stacklevel=3,
            )
