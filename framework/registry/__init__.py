"""`Registrable`: components chosen by name, one namespace per base class.

Every name lives in a `Registry`. The active one (`get_registry()`) is a module-level
default; `use_registry` swaps in another, e.g. a fresh copy per test. A registry has
two tiers: classes registered with `@Base.register` (recorded at once, importing and
scanning nothing) and components from plugins (discovered on the first lookup), which
add theirs through a `Registrar`.

`__all__` holds what plugin authors use; the other names below are for the framework's
own packages.
"""

from framework.registry import _plugins, _store
from framework.registry._plugins import ENTRY_POINT_GROUP as ENTRY_POINT_GROUP
from framework.registry._plugins import ensure_loaded as ensure_loaded
from framework.registry._plugins import failures as failures
from framework.registry._plugins import plugin_manager as plugin_manager
from framework.registry._registrable import Registrable as Registrable
from framework.registry._registrable import install_config_builder as install_config_builder
from framework.registry._registrar import Registrar as Registrar
from framework.registry._store import Registry as Registry
from framework.registry._store import all_entries as all_entries
from framework.registry._store import get_registry as get_registry
from framework.registry._store import registered_bases as registered_bases
from framework.registry._store import use_registry as use_registry
from framework.registry._targets import REGISTERED_TYPES_ONLY_ENV as REGISTERED_TYPES_ONLY_ENV
from framework.registry._targets import PluginWarning as PluginWarning
from framework.registry._targets import RegistryEntry as RegistryEntry
from framework.registry._targets import describe_error as describe_error
from framework.registry._targets import import_refusal as import_refusal
from framework.registry._targets import import_target as import_target
from framework.registry._targets import imports_allowed as imports_allowed
from framework.registry._targets import warn_plugin as warn_plugin

__all__ = [
    "PluginWarning",
    "Registrable",
    "Registrar",
    "Registry",
    "get_registry",
    "import_target",
    "use_registry",
]

# Plugin loading builds on `Registry`, so it is wired in here rather than imported there.
_store.plugin_loading = _plugins
