"""Every benchmark figure in the README, the charts and the benchmarks page comes from
``benchmarks/results/*.json`` through ``benchmarks/plot.py``, never typed."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = REPO_ROOT / "benchmarks" / "results"
FIX = "run `python benchmarks/plot.py` and commit what it writes"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def plot() -> ModuleType:
    return _load("bench_plot_figures", REPO_ROOT / "benchmarks" / "plot.py")


def test_the_readme_speed_paragraph_is_generated_from_the_results(plot: ModuleType) -> None:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert plot.readme_with_speed(text) == text, f"README.md's figures differ from the results: {FIX}"


def test_the_readme_speed_section_has_no_typed_figures(plot: ModuleType) -> None:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Speed", 1)[1].split("\n## ", 1)[0]
    typed = re.sub(re.escape(plot.SPEED_BEGIN) + r".*?" + re.escape(plot.SPEED_END), "", section, flags=re.S)
    assert not re.search(r"\d", typed), f"a figure typed outside the generated block: {typed!r}"


@pytest.mark.parametrize("name", ["loader", "download"])
def test_each_chart_was_drawn_from_the_current_results(plot: ModuleType, name: str) -> None:
    image = REPO_ROOT / "docs" / "img" / plot.CHARTS[name]
    assert plot.chart_stamp(image) == plot.results_digest(name), f"{image.name} is stale: {FIX}"


def test_the_benchmarks_page_shows_every_results_file(plot: ModuleType) -> None:
    page = (REPO_ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    names = sorted(path.stem for path in RESULTS.glob("*.json"))
    assert set(names) <= set(plot.TABLES), "a results file without a table in benchmarks/plot.py"
    for name in names:
        assert f"<!-- {name}-results -->" in page, f"docs/benchmarks.md lost its {name} table marker"


def test_the_docs_hook_fills_every_marker_from_the_results(plot: ModuleType) -> None:
    hooks = _load("docs_hooks_figures", REPO_ROOT / "docs" / "hooks.py")
    page: Any = type("Page", (), {"file": type("File", (), {"src_uri": "benchmarks.md"})()})()
    source = (REPO_ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    rendered = hooks.on_page_markdown(source, page=page, config=None, files=None)
    assert "-results -->" not in rendered
    for table in plot.markdown_tables().values():
        assert table in rendered and "No results yet" not in table


def test_the_generator_notices_a_changed_result(plot: ModuleType, tmp_path: Path) -> None:
    for path in RESULTS.glob("*.json"):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    download = tmp_path / "download.json"
    download.write_text(download.read_text().replace('"hit_ours_us_median": ', '"hit_ours_us_median": 1'))
    assert plot.readme_with_speed(text, tmp_path) != text
    problems = plot.stale(tmp_path)
    assert any("bench_download.png" in problem for problem in problems)
    assert any("README.md" in problem for problem in problems)


def _numbers(value: Any, key: str = "") -> Iterator[tuple[str, float]]:
    if isinstance(value, dict):
        for name, inner in value.items():
            yield from _numbers(inner, f"{key}.{name}")
    elif isinstance(value, list):
        for inner in value:
            yield from _numbers(inner, key)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield key, float(value)


def test_the_port_figures_in_the_docs_come_from_the_results() -> None:
    """CONTRIBUTING.md: "Benchmark figures in the README and the docs come from
    benchmarks/results/*.json ... never type a figure": every time the quickstart and
    the port guide quote is a first-batch figure of the results, and they type no ratio."""
    import json

    first_batches = {
        round(value, 2)
        for path in (REPO_ROOT / "benchmarks" / "results").glob("*.json")
        for key, value in _numbers(json.loads(path.read_text(encoding="utf-8")))
        if "first_batch" in key
    }
    typed = []
    for page in ("docs/quickstart.md", "docs/howto/port-allennlp.md"):
        text = (REPO_ROOT / page).read_text(encoding="utf-8")
        seconds = re.findall(r"\b(\d+\.\d+) s\b", text)
        typed += [f"{page}: {figure} s" for figure in seconds if round(float(figure), 2) not in first_batches]
        typed += [f"{page}: {ratio}" for ratio in re.findall(r"\b\d+(?:\.\d+)?x\b", text)]
    assert typed == []
