"""Guards against forgetting the docs (as datasette does for its plugin hooks).

- every hook in `framework.hookspecs` is explained in a hand-written page;
- every registered component appears on the generated components page, importable
  and with a docstring;
- every public module of the package has an API reference entry (``::: module``);
- the components page is wired into the site (the hook runs, the nav names it).
"""

from __future__ import annotations

import importlib.util
import pkgutil
import re
from pathlib import Path
from types import ModuleType

import pytest
import yaml

import framework
from framework import hookspecs
from framework.registry import all_entries

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCS = REPO_ROOT / "docs"

pytestmark = pytest.mark.timeout(60)


def load_docs_hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def handwritten_docs() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(DOCS.rglob("*.md")))


def hook_names() -> list[str]:
    return sorted(
        name
        for name, value in vars(hookspecs).items()
        if callable(value) and hasattr(value, "framework_spec")
    )


def test_there_are_hooks_to_check() -> None:
    assert "framework_register_components" in hook_names()


@pytest.mark.parametrize("hook", hook_names())
def test_every_hook_is_documented(hook: str) -> None:
    assert f"`{hook}" in handwritten_docs() or f"{hook}(" in handwritten_docs(), (
        f"the hook {hook} is not explained in any page under docs/"
    )
    assert f"`{hook}" in load_docs_hooks().render_hooks()


def test_every_registered_component_is_on_the_components_page() -> None:
    page = load_docs_hooks().render_components()
    entries = all_entries()
    assert entries, "nothing is registered"
    missing = []
    for entry in entries:
        section = page.split(f"## {entry.base.__name__}\n", 1)
        if len(section) != 2 or f"### `{entry.name}`" not in section[1].split("\n## ", 1)[0]:
            missing.append(f"{entry.base.__name__} {entry.name!r}")
    assert not missing, f"missing from the components page: {missing}"
    assert "Not importable when these docs were built" not in page
    assert "Plugins that failed to load" not in page


def test_every_first_party_component_has_a_docstring() -> None:
    undocumented = [
        f"{entry.base.__name__} {entry.name!r} ({entry.target_path})"
        for entry in all_entries()
        if entry.provider.startswith("framework ") and not (entry.load().__doc__ or "").strip()
    ]
    assert not undocumented, f"first-party components without a docstring: {undocumented}"


def public_modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(framework.__path__, "framework."):
        parts = info.name.split(".")
        if any(p.startswith("_") for p in parts) or parts[1] in ("cli", "examples"):
            continue
        if info.ispkg:
            continue
        names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("module", public_modules())
def test_every_public_module_has_an_api_reference(module: str) -> None:
    references = set(re.findall(r"^::: ([\w.]+)", handwritten_docs(), flags=re.MULTILINE))
    assert module in references, f"add '::: {module}' to a page under docs/reference/"


def test_the_components_page_is_generated_and_in_the_nav() -> None:
    text = (REPO_ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    config = yaml.safe_load(text)
    assert "docs/hooks.py" in config["hooks"]
    assert "components.md" in text
    assert not (DOCS / "components.md").exists(), "components.md is generated; don't write one"
