"""mkdocs hook: generate ``components.md`` from the registry at build time.

The page lists every component registered through the plugin path (base, name,
provider, import target and constructor parameters from ``inspect.signature``) and
every hook a plugin can implement. It is generated in memory on each build, so it
can never drift from the code.
"""

from __future__ import annotations

import inspect
from typing import Any

COMPONENTS_PAGE = "components.md"

_INTRO = """\
# Components

Every component registered through the plugin path, generated from the registry when
these docs were built. Choose one by name in a config (`{"type": "NAME", ...}`), with
`Base.by_name("NAME")`, or list them on your machine (third-party plugins included)
with `framework plugins`.
"""


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _parameters(factory: Any) -> list[str]:
    try:
        target = factory.__init__ if inspect.isclass(factory) else factory
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    rows = []
    for name, parameter in signature.parameters.items():
        if name in ("self", "cls") or parameter.kind in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        ):
            continue
        annotation = parameter.annotation
        if annotation is inspect.Parameter.empty:
            type_text = ""
        elif isinstance(annotation, str):
            type_text = annotation
        else:
            type_text = inspect.formatannotation(annotation)
        if parameter.default is inspect.Parameter.empty:
            default = "required"
        else:
            default = repr(parameter.default)
        rows.append(f"| `{name}` | `{_escape(type_text)}` | `{_escape(default)}` |"
                    if type_text else f"| `{name}` | | `{_escape(default)}` |")
    return rows


def _first_line(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def render_hooks() -> str:
    """The hook section: every hookspec in ``framework.hookspecs`` with its docstring."""
    from framework import hookspecs

    lines = ["## Hooks", "", "A plugin implements these with `@framework.hookimpl`:", ""]
    for name, function in sorted(vars(hookspecs).items()):
        if not name.startswith("framework_") or not callable(function):
            continue
        signature = inspect.signature(function)
        lines.append(f"### `{name}{signature}`")
        lines.append("")
        lines.append(inspect.getdoc(function) or "")
        lines.append("")
    return "\n".join(lines)


def render_components() -> str:
    """The whole components page as markdown."""
    from framework import _plugins
    from framework.registry import all_entries

    out = [_INTRO]
    current = None
    for entry in all_entries():
        base = entry.base
        if base is not current:
            current = base
            out.append(f"## {base.__name__}")
            out.append("")
            default = getattr(base, "default_implementation", None)
            if default:
                out.append(f"Default implementation: `{default}`.")
                out.append("")
        out.append(f"### `{entry.name}`")
        out.append("")
        out.append(f"`{entry.target_path}` &middot; provided by {entry.provider}")
        out.append("")
        try:
            factory = entry.factory()
        except Exception as error:  # a component whose module is not importable here
            out.append(f"*Not importable when these docs were built: {type(error).__name__}.*")
            out.append("")
            continue
        summary = _first_line(factory)
        if summary:
            out.append(summary)
            out.append("")
        rows = _parameters(factory)
        if rows:
            out.append("| parameter | type | default |")
            out.append("|---|---|---|")
            out.extend(rows)
            out.append("")
    failures = _plugins.failures()
    if failures:
        out.append("## Plugins that failed to load")
        out.append("")
        for plugin, error in failures.items():
            out.append(f"- `{plugin}`: {type(error).__name__}")
        out.append("")
    out.append(render_hooks())
    return "\n".join(out)


def on_files(files: Any, config: Any, **kwargs: Any) -> Any:
    from mkdocs.structure.files import File

    existing = files.get_file_from_path(COMPONENTS_PAGE)
    if existing is not None:
        files.remove(existing)
    files.append(File.generated(config, COMPONENTS_PAGE, content=render_components()))
    return files
