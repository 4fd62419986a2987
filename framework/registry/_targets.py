"""Registered targets: the import gate for dotted paths and `RegistryEntry`.

`import_target` is the one place a dotted path from a config is imported, behind
`imports_allowed` (`FRAMEWORK_REGISTERED_TYPES_ONLY`). A `RegistryEntry` names one
registered class, imported on first `load()`; the helpers here tell whether two entries
are the same class and word the clash when they are not. `framework.registry`
re-exports the public names.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Optional, Union

import attrs

from framework.errors import DuplicateNameError, PluginError, RegistryError

if TYPE_CHECKING:
    from framework.registry._registrable import Registrable

__all__ = [
    "REGISTERED_TYPES_ONLY_ENV",
    "PluginWarning",
    "RegistryEntry",
    "describe_error",
    "import_refusal",
    "import_target",
    "imports_allowed",
    "warn_plugin",
]

REGISTERED_TYPES_ONLY_ENV: Final = "FRAMEWORK_REGISTERED_TYPES_ONLY"

_logger = logging.getLogger("framework.plugins")


class PluginWarning(UserWarning):
    """A plugin, or one of its entries, failed to load; everything else keeps working."""


def describe_error(error: BaseException) -> str:
    """`Type: message`, even for an exception whose `__str__` itself raises."""
    try:
        return f"{type(error).__name__}: {error}"
    except Exception:  # a plugin's broken exception class must not break loading
        return f"{type(error).__name__} (its message could not be formatted)"


def warn_plugin(message: str) -> None:
    """A `PluginWarning` that never raises: under warnings-as-errors it is logged instead,
    so one broken plugin cannot abort loading the others."""
    try:
        warnings.warn(message, PluginWarning, stacklevel=3)
    except Exception:
        try:
            _logger.warning("%s", message)
        except Exception:  # a broken logging handler: the failure is still in failures()
            pass


def imports_allowed(allow_import: Optional[bool] = None) -> bool:
    """Whether a dotted path from a config may be imported: `allow_import` if given,
    else unless `FRAMEWORK_REGISTERED_TYPES_ONLY` is set (empty and `0` mean unset)."""
    if allow_import is not None:
        return allow_import
    return os.environ.get(REGISTERED_TYPES_ONLY_ENV, "") in ("", "0")


def import_refusal(path: str, allow_import: Optional[bool] = None) -> Optional[str]:
    """Why `import_target` would refuse `path` now, or None if it would import it.

    For checks that must refuse without importing (`framework config validate`)."""
    if imports_allowed(allow_import):
        return None
    return (
        f"{path!r} was not imported: {REGISTERED_TYPES_ONLY_ENV}=1 limits dotted paths from "
        f"configs to registered components; register it, or unset the variable for configs "
        f"you trust"
    )


def _split(path: str) -> tuple[str, str, str]:
    if ":" in path:
        return path.partition(":")
    return path.rpartition(".")


def import_target(path: str, *, allow_import: Optional[bool] = None) -> Any:
    """Import `pkg.mod:Attr` or `pkg.mod.Attr` and return the attribute.

    Importing runs the module's code, so this is the one gate for every path that comes
    from a config: with `FRAMEWORK_REGISTERED_TYPES_ONLY=1` (or `allow_import=False`)
    it raises ImportError and imports nothing. Installed code (a registered target, a
    plugin naming its bases) passes `allow_import=True`.
    """
    refusal = import_refusal(path, allow_import)
    if refusal is not None:
        raise ImportError(refusal)
    module_name, _, qualname = _split(path)
    if not module_name or not qualname:
        raise ImportError(f"{path!r} is not a dotted path like 'package.module:ClassName'")
    before = set(sys.modules)
    try:
        target: Any = importlib.import_module(module_name)
    except BaseException:
        _drop_orphans(set(sys.modules) - before)
        raise
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def _drop_orphans(added: set[str]) -> None:
    """Forget the modules an interrupted import left without their package.

    Python forgets a package whose import failed (a Ctrl-C in the middle of it) but not
    the submodules it had imported, so the next import of the package finds them already
    there and never binds them to it again (`module 'requests' has no attribute
    'exceptions'` for the rest of the process). Without them, it imports them anew."""
    while True:
        orphans = [name for name in added if name in sys.modules and _parent_gone(name)]
        if not orphans:
            return
        for name in orphans:  # a submodule's own submodules are orphans on the next pass
            del sys.modules[name]


def _parent_gone(name: str) -> bool:
    parent = name.rpartition(".")[0]
    return bool(parent) and parent not in sys.modules


def _describe(target: Union[str, type]) -> str:
    if isinstance(target, str):
        return target
    return f"{target.__module__}:{target.__qualname__}"


def _same_target(a: str, b: str) -> bool:
    """`pkg.mod.Cls` and `pkg.mod:Cls` name the same class."""
    return a.replace(":", ".") == b.replace(":", ".")


def _check_name(name: object, where: str) -> str:
    """`name` if it can be registered; a clear error if not (nothing is registered then)."""
    if not isinstance(name, str) or not name or any(c.isspace() or not c.isprintable() for c in name):
        raise RegistryError(
            f"{where}: a component name must be a non-empty string without whitespace, "
            f"got {name!r} ({type(name).__name__}); pick a name such as 'my_reader'"
        )
    return name


def _valid_name(entry: RegistryEntry, attribute: attrs.Attribute[str], name: str) -> None:
    # Every way in (decorator, registrar, Registry.register/commit) makes an entry: one check.
    _check_name(name, f"{getattr(entry.base, '__name__', entry.base)} entry from {entry.provider}")


@attrs.define
class RegistryEntry:
    """One registered component; a string target is imported on first `load()`."""

    base: type[Registrable]
    name: str = attrs.field(validator=_valid_name)
    target: Union[str, type]
    constructor: Optional[str] = None
    provider: str = "unknown"
    plugin: Optional[str] = None
    # Other dotted paths that name this class (a re-export kept for old configs): the
    # registered-types gate accepts them, importing only `target`.
    aliases: tuple[str, ...] = ()
    _loaded: Optional[type] = attrs.field(default=None, repr=False, eq=False)
    # Entries of the same name whose class could not be compared without importing
    # (a re-export): checked when this one loads.
    _rivals: list[RegistryEntry] = attrs.field(factory=list, repr=False, eq=False)

    @property
    def target_path(self) -> str:
        return _describe(self.target)

    def named_by(self, path: str) -> bool:
        """Whether dotted `path` is this entry's target or one of its aliases."""
        return any(_same_target(known, path) for known in (self.target_path, *self.aliases))

    @property
    def is_loaded(self) -> bool:
        return not isinstance(self.target, str) or self._loaded is not None

    def known_class(self) -> Optional[type]:
        """The class, if it can be had without importing anything (else None)."""
        if not isinstance(self.target, str):
            return self.target
        if self._loaded is not None:
            return self._loaded
        module_name, _, qualname = _split(self.target)
        target: Any = sys.modules.get(module_name)
        for part in qualname.split(".") if target is not None else ():
            target = getattr(target, part, None)
        return target if isinstance(target, type) else None

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
                    f"imported from {self.target!r}: {describe_error(error)}",
                ) from error
            if not (isinstance(loaded, type) and issubclass(loaded, self.base)):
                raise PluginError(
                    self.plugin or self.provider,
                    f"{self.target!r}, registered as {self.base.__name__} {self.name!r} by "
                    f"{self.provider}, is not a subclass of {self.base.__name__}",
                )
            self._loaded = loaded
            for rival in self._rivals:  # now comparable: the same class is no clash
                if rival.known_class() is not loaded:
                    warn_plugin(_skipped(self, rival))
            self._rivals.clear()
        return self._loaded

    def factory(self) -> Callable[..., Any]:
        cls = self.load()
        return getattr(cls, self.constructor) if self.constructor else cls


def _same(a: RegistryEntry, b: RegistryEntry) -> Optional[bool]:
    """Whether two entries are one class; None if that needs an import to tell."""
    if _same_target(a.target_path, b.target_path):
        return True
    known_a, known_b = a.known_class(), b.known_class()
    if known_a is not None and known_b is not None:
        return known_a is known_b
    # A module still being imported (a package re-exporting the class it is importing)
    # can be told once it is done; a module not imported at all names another class.
    unknown = [e for e, known in ((a, known_a), (b, known_b)) if known is None]
    return None if all(_split(e.target_path)[0] in sys.modules for e in unknown) else False


def _clash(existing: Optional[RegistryEntry], entry: RegistryEntry, exist_ok: bool) -> bool:
    return existing is not None and not exist_ok and _same(existing, entry) is False


def _skipped(existing: RegistryEntry, entry: RegistryEntry) -> str:
    return (
        f"{entry.base.__name__} {entry.name!r}: {entry.target_path} from {entry.provider} "
        f"was skipped: the name is taken by {existing.target_path} from "
        f"{existing.provider} (register with exist_ok=True to replace it on purpose)"
    )


def _replaced(existing: RegistryEntry, entry: RegistryEntry) -> str:
    return (
        f"{entry.base.__name__} {entry.name!r}: {entry.target_path} from {entry.provider} "
        f"replaces {existing.target_path} from {existing.provider}: a class registered in "
        f"the program's own code wins over a plugin's (choose another name to keep both, "
        f"or register with exist_ok=True to replace it without this warning)"
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
