"""Loading plugins: entry points of the ``framework.plugins`` group, through pluggy.

Plugins load once, lazily, on first use of the registry (and again in each spawned
worker process, which starts with an empty registry). The first-party components
come through this very path: they are entry points of this distribution.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from importlib.metadata import EntryPoint, entry_points
from typing import Final, Optional

import pluggy

from framework import hookspecs
from framework.registry import Registrar

__all__ = ["ENTRY_POINT_GROUP", "PluginWarning", "ensure_loaded", "failures", "plugin_manager"]

ENTRY_POINT_GROUP: Final = "framework.plugins"
logger = logging.getLogger("framework.plugins")


class PluginWarning(UserWarning):
    """A plugin failed to load; the others keep working."""


_lock = threading.RLock()
_manager: Optional[pluggy.PluginManager] = None
_failures: dict[str, BaseException] = {}


def _env_names(variable: str) -> Optional[set[str]]:
    value = os.environ.get(variable)
    if value is None:
        return None
    return {name.strip() for name in value.split(",") if name.strip()}


def _provider(entry_point: EntryPoint) -> str:
    dist = entry_point.dist
    return f"{dist.name} {dist.version}" if dist is not None else "unknown distribution"


def failures() -> dict[str, BaseException]:
    """Plugins that failed to load, by entry-point name, with their errors."""
    return dict(_failures)


def plugin_manager() -> pluggy.PluginManager:
    ensure_loaded()
    assert _manager is not None
    return _manager


def ensure_loaded() -> None:
    """Load every allowed plugin once; later calls (and re-entrant ones) return at once."""
    global _manager
    if _manager is not None:
        return
    with _lock:
        if _manager is not None:
            return
        manager = pluggy.PluginManager("framework")
        manager.add_hookspecs(hookspecs)
        _manager = manager  # set first: plugins that register on import re-enter here
        if os.environ.get("FRAMEWORK_TRACE_PLUGINS", "") not in ("", "0"):
            manager.trace.root.setwriter(lambda message: logger.info(message.rstrip()))
            manager.enable_tracing()
        allowed = _env_names("FRAMEWORK_PLUGINS")
        blocked = _env_names("FRAMEWORK_DISABLE_PLUGINS") or set()
        seen: set[str] = set()
        for entry_point in entry_points(group=ENTRY_POINT_GROUP):
            name = entry_point.name
            if name in seen or name in blocked or (allowed is not None and name not in allowed):
                continue
            seen.add(name)
            _load_one(manager, entry_point)


def _load_one(manager: pluggy.PluginManager, entry_point: EntryPoint) -> None:
    provider = _provider(entry_point)
    registrar = Registrar(provider=provider, plugin=entry_point.name)
    plugin: object = None
    try:
        plugin = entry_point.load()
        manager.register(plugin, name=entry_point.name)
        others = [p for p in manager.get_plugins() if p is not plugin]
        caller = manager.subset_hook_caller("framework_register_components", others)
        caller(registrar=registrar)
        registrar.commit()
    except Exception as error:
        _failures[entry_point.name] = error
        if plugin is not None and manager.is_registered(plugin):
            manager.unregister(plugin)
        warnings.warn(
            f"framework plugin {entry_point.name!r} ({entry_point.value}, from {provider}) "
            f"failed to load and was skipped: {type(error).__name__}: {error}",
            PluginWarning,
            stacklevel=4,
        )
