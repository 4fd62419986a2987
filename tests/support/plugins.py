"""Plugins as real distributions, without pip: what `importlib.metadata` finds."""

from __future__ import annotations

import textwrap
from pathlib import Path


def make_dist(site: Path, dist: str, modules: dict[str, str], entry_points: dict[str, str]) -> None:
    """Install `dist` into `site` the way pip would leave it: modules plus a dist-info."""
    site.mkdir(exist_ok=True)
    for name, text in modules.items():
        (site / f"{name}.py").write_text(textwrap.dedent(text))
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[framework.plugins]\n{lines}")
