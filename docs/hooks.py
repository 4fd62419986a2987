"""mkdocs hook: generate ``components.md`` from the registry at build time.

The page lists every component this project's distribution registers through the
plugin path (base, name, provider, import target and constructor parameters from
``inspect.signature``) and every hook a plugin can implement; the served JSON Schema
covers the same components. Both are generated in memory on each build, so they can
never drift from the code, and third-party plugins installed where the docs are built
stay off them.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

FIRST_PARTY = "framework"  # this project's distribution name (setup.cfg)
COMPONENTS_PAGE = "components.md"
log = logging.getLogger("mkdocs.hooks.components")

_INTRO = """\
# Components

Every component that comes with `framework`, generated from the registry when these
docs were built. Choose one by name in a config (`{"type": "NAME", ...}`), with
`Base.by_name("NAME")`, or list them on your machine (third-party plugins included)
with `framework plugins`.
"""


def is_first_party(entry: Any) -> bool:
    """Whether this project's distribution registered `entry` (a plugin's provider is
    ``"DISTRIBUTION VERSION"``)."""
    return str(entry.provider).partition(" ")[0] == FIRST_PARTY


@contextmanager
def first_party_only() -> Iterator[None]:
    """Inside the block, the active registry holds this project's components only."""
    from framework.registry import Registry, all_entries, use_registry

    entries = [entry for entry in all_entries() if is_first_party(entry)]
    registry = Registry(lambda registry: None)  # nothing to discover: the entries are given
    for entry in entries:
        registry.register(entry)
    with use_registry(registry):
        yield


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _arg_docs(obj: Any) -> dict[str, str]:
    from framework.config import arg_docs  # the one parser, shared with the JSON Schema

    return arg_docs(obj)


def _default_text(value: Any) -> str:
    text = repr(value)
    if " object at 0x" in text:  # an instance as default: show how to build it
        return f"{type(value).__name__}()"
    return text


def _signature_rows(cls_or_function: Any, seen: set[str]) -> list[tuple[str, str, str, str]]:
    """(name, type, default, description) for each parameter, following **kwargs upwards."""
    target = cls_or_function.__init__ if inspect.isclass(cls_or_function) else cls_or_function
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    docs = {**_arg_docs(target), **_arg_docs(cls_or_function)}
    rows = []
    forwards = False
    for name, parameter in signature.parameters.items():
        if name in ("self", "cls") or parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            forwards = True
            continue
        if name in seen:
            continue
        seen.add(name)
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
            default = _default_text(parameter.default)
        rows.append((name, type_text, default, docs.get(name, "")))
    if forwards and inspect.isclass(cls_or_function):
        # **kwargs go to the parent's constructor, as config construction assumes
        parent = next(
            (k for k in cls_or_function.__mro__[1:] if "__init__" in vars(k)), object
        )
        if parent is not object:
            rows += _signature_rows(parent, seen)
    return rows


def _parameters(factory: Any) -> list[str]:
    rows = []
    for name, type_text, default, description in _signature_rows(factory, set()):
        type_cell = f"`{_escape(type_text)}`" if type_text else ""
        rows.append(
            f"| `{name}` | {type_cell} | `{_escape(default)}` | {_escape(description)} |"
        )
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
    """The whole components page as markdown: this project's components only."""
    with first_party_only():  # not the plugins installed where the docs are built
        return _render_components()


def _render_components() -> str:
    from framework import registry as _plugins
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
            out.append("| parameter | type | default | description |")
            out.append("|---|---|---|---|")
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


CLI_PAGE = "cli.md"
SCHEMA_FILE = "schema/framework-run.schema.json"


def render_schema() -> str:
    """The JSON Schema of run configs with this project's components, served with the
    site for editors (``"$schema"``)."""
    import json

    from framework.config import json_schema

    with first_party_only():
        return json.dumps(json_schema(), indent=2) + "\n"


def render_cli() -> str:
    """The command-line page: ``--help`` of ``framework`` and of every subcommand."""
    import os

    from framework.cli import build_parser

    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "88"  # argparse wraps to the terminal: make the page the same everywhere
    try:
        return _render_cli(build_parser())
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns


def _render_cli(parser: Any) -> str:

    out = [
        "# Command line",
        "",
        "The `framework` command (also `python -m framework`), generated from its `--help`",
        "when these docs were built.",
        "",
        "```text",
        parser.format_help().rstrip(),
        "```",
        "",
    ]
    out += _render_subcommands(parser, "framework", "##")
    return "\n".join(out)


def _render_subcommands(parser: Any, prefix: str, level: str) -> list[str]:
    """Each subcommand's --help, and its own subcommands' one level deeper."""
    import argparse

    out: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                usage = subparser.format_help().rstrip()
                out += [f"{level} `{prefix} {name}`", "", "```text", usage, "```", ""]
                out += _render_subcommands(subparser, f"{prefix} {name}", level + "#")
    return out


def on_files(files: Any, config: Any, **kwargs: Any) -> Any:
    from mkdocs.structure.files import File

    from framework import registry as _plugins

    _plugins.ensure_loaded()
    for plugin, error in _plugins.failures().items():
        # a warning fails `mkdocs build --strict`: the page would be missing components
        log.warning("framework plugin %r failed to load: %s: %s", plugin, type(error).__name__, error)

    for page, render in (
        (COMPONENTS_PAGE, render_components),
        (CLI_PAGE, render_cli),
        (SCHEMA_FILE, render_schema),
    ):
        existing = files.get_file_from_path(page)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, page, content=render()))
    return files


def _benchmark_tables() -> dict[str, str]:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "plot.py"
    spec = importlib.util.spec_from_file_location("framework_benchmarks_plot", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tables: dict[str, str] = module.markdown_tables()
    return tables


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any, **kwargs: Any) -> str:
    """Fill the benchmarks page's result markers from ``benchmarks/results/*.json``."""
    if page.file.src_uri != "benchmarks.md":
        return markdown
    for name, table in _benchmark_tables().items():
        markdown = markdown.replace(f"<!-- {name}-results -->", table)
    return markdown
