"""`Registrar`: what a plugin's hook adds its components through."""

from __future__ import annotations

from typing import Optional, Union

import attrs

from framework.errors import RegistryError
from framework.registry._registrable import Registrable
from framework.registry._store import Registry, get_registry
from framework.registry._targets import RegistryEntry, _check_name, _clash, _duplicate

__all__ = ["Registrar"]


@attrs.define
class Registrar:
    """What a plugin's `framework_register_components` hook receives.

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
        aliases: tuple[str, ...] = (),
    ) -> None:
        """Register `target` (`"pkg.module:Class"` or a class) as `name` for `base`.

        `aliases`: other dotted paths of the same class (a module that re-exports it),
        accepted in configs under `FRAMEWORK_REGISTERED_TYPES_ONLY=1`."""
        if not (isinstance(base, type) and issubclass(base, Registrable)):
            raise RegistryError(f"registrar.add: {base!r} is not a Registrable base class")
        _check_name(name, f"registrar.add({base.__name__}, ...) from {self.provider}")
        if not isinstance(target, (str, type)):
            raise RegistryError(
                f"registrar.add: target for {name!r} must be 'package.module:ClassName' or a "
                f"class, got {target!r}"
            )
        entry = RegistryEntry(base, name, target, constructor, self.provider, self.plugin, tuple(aliases))
        for staged, _ in self.staged:
            if staged.base is base and staged.name == name and _clash(staged, entry, exist_ok):
                raise _duplicate(staged, entry)
        self.staged.append((entry, exist_ok))

    def commit(self) -> None:
        """Register every staged entry, or none: a clash raises `DuplicateNameError`."""
        (self.registry or get_registry()).commit(self.staged, on_clash="raise")
