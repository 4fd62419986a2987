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
from typing import Any

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
    entries = [entry for entry in all_entries() if entry.provider.startswith("framework ")]
    assert entries, "nothing is registered"
    missing = []
    for entry in entries:
        section = page.split(f"## {entry.base.__name__}\n", 1)
        if len(section) != 2 or f"### `{entry.name}`" not in section[1].split("\n## ", 1)[0]:
            missing.append(f"{entry.base.__name__} {entry.name!r}")
    assert not missing, f"missing from the components page: {missing}"
    assert "Not importable when these docs were built" not in page
    assert "Plugins that failed to load" not in page


def test_the_generated_pages_leave_third_party_components_out() -> None:
    from framework import DatasetReader, hookimpl
    from framework.testing import fresh_registry

    class ThirdPartyReader(DatasetReader):
        """A reader some other distribution installed where the docs are built."""

    class OtherPlugin:
        @hookimpl
        def framework_register_components(self, registrar: Any) -> None:
            registrar.add(DatasetReader, "third-party-reader", ThirdPartyReader)

    hooks = load_docs_hooks()
    with fresh_registry() as registry:
        assert registry.add_plugin(OtherPlugin(), "other", provider="other-dist 1.0")
        assert DatasetReader.by_name("third-party-reader") is ThirdPartyReader
        page, schema = hooks.render_components(), hooks.render_schema()
        assert DatasetReader.by_name("third-party-reader") is ThirdPartyReader  # still registered
    assert "### `jsonl`" in page and '"jsonl"' in schema
    assert "third-party-reader" not in page and "other-dist" not in page
    assert "third-party-reader" not in schema and "ThirdPartyReader" not in schema


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


def load_plot() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_plot", REPO_ROOT / "benchmarks" / "plot.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmarks_page_has_the_result_markers_and_images() -> None:
    page = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    for marker in ("<!-- loader-results -->", "<!-- download-results -->"):
        assert marker in page
    for image in re.findall(r"\]\((img/[\w.]+\.png)\)", page):
        assert (DOCS / image).exists(), f"{image} is missing: run python benchmarks/plot.py"


def test_benchmark_charts_and_tables_from_results(tmp_path: Path) -> None:
    import json

    plot = load_plot()
    empty = plot.markdown_tables(tmp_path)
    assert "No results yet" in empty["loader"] and "No results yet" in empty["download"]
    (tmp_path / "loader.json").write_text(json.dumps({
        "batch_size": 32,
        "cheap_reader": {"lines": 10, "ours_2": {"batches_per_s": 1234.5, "first_batch_s": 0.01},
                         "torch_2": {"batches_per_s": 321.0, "first_batch_s": 0.02},
                         "ratios": {"ours_2_vs_torch_2": 3.85}},
    }))  # fmt: skip
    (tmp_path / "download.json").write_text(json.dumps({
        "size_bytes": 10_000_000, "cold_ours_s": 0.5, "cold_pooch_s": 2.0,
        "hit_ours_us_median": 25.0, "hit_pooch_us_median": 150000.0,
    }))  # fmt: skip
    tables = plot.markdown_tables(tmp_path)
    assert "| framework, 2 workers | 1,234 | 10 ms |" in tables["loader"]
    assert "ours 2 vs torch 2 **3.85x**" in tables["loader"]
    assert "| framework (sha256, fsync, atomic publish) | 0.500 s | 19 MiB/s |" in tables["download"]
    assert plot.main(["--results", str(tmp_path), "--out", str(tmp_path / "img")]) == 0
    assert (tmp_path / "img" / "bench_loader.png").stat().st_size > 1000
    assert (tmp_path / "img" / "bench_download.png").stat().st_size > 1000


def test_every_subcommand_is_on_the_command_line_page() -> None:
    from framework.cli import build_parser

    page = load_docs_hooks().render_cli()
    subcommands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert {"plugins", "download", "run"} <= set(subcommands)
    for name in subcommands:
        assert f"## `framework {name}`" in page and f"usage: framework {name}" in page
    assert "cli.md" in (REPO_ROOT / "mkdocs.yml").read_text(encoding="utf-8")


def test_docstrings_use_markdown_backticks_not_rst() -> None:
    # mkdocstrings renders docstrings as Markdown, where RST's ``code`` shows literally.
    rst = re.compile(r"(?<!`)``(?!`)")
    found = [
        f"{path.relative_to(REPO_ROOT)}:{text.count(chr(10), 0, match.start()) + 1}"
        for root in ("framework", "plugins")
        for path in sorted((REPO_ROOT / root).rglob("*.py"))
        for text in [path.read_text(encoding="utf-8")]
        for match in rst.finditer(text)
    ]
    assert not found, f"write `code`, not ``code``, in docstrings: {found[:10]}"


# Phrases of lab notes left on the site: experiments, what was measured and dropped, history.
_NARRATIVE = {
    "docs/concepts/download.md": [
        "three such pauses did not do it",
        "were measured open with a cap of 3",
        "Hashing in one pass at the end instead was measured",
    ],
    "docs/concepts/loader.md": ["digesting every instance cost 1.5-2x"],
    "docs/howto/download-backend.md": ["A backend written before `end` existed"],
    "docs/concepts/security.md": ["test_review_cache.py", "test_review_issue26.py"],
}


def test_the_docs_carry_no_lab_notes() -> None:
    found = []
    for page, phrases in _NARRATIVE.items():
        text = " ".join((REPO_ROOT / page).read_text(encoding="utf-8").split())
        found += [f"{page}: {phrase!r}" for phrase in phrases if phrase in text]
    assert found == []


def test_every_registry_name_the_docs_use_is_in_its_all() -> None:
    import framework.registry

    used: set[str] = set()
    for page in (REPO_ROOT / "docs").rglob("*.md"):
        used |= set(re.findall(r"framework\.registry\.([A-Za-z]\w*)", page.read_text(encoding="utf-8")))
        for names in re.findall(
            r"from framework\.registry import ([\w, ]+)", page.read_text(encoding="utf-8")
        ):
            used |= {name.strip() for name in names.split(",")}
    assert sorted(used - set(framework.registry.__all__)) == []
