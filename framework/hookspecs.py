"""The hooks a framework plugin can implement (pluggy project name `framework`).

A plugin is a module, an object, or a class (made with no arguments) with `@hookimpl`
functions, named under the `framework.plugins` entry-point group of its distribution.
An `@hookimpl` whose name is not a hook below is reported as a likely misspelling.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from framework.registry import Registrar

__all__ = ["hookimpl", "hookspec"]

hookspec = pluggy.HookspecMarker("framework")
hookimpl = pluggy.HookimplMarker("framework")


@hookspec
def framework_register_components(registrar: Registrar) -> None:
    """Add this plugin's components: `registrar.add(Base, "name", "pkg.module:ClassName")`.

    A string target is imported only when the component is first used, so listing
    components never imports it. A class object is accepted too.
    """
