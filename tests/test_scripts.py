"""`scripts/`: setting up quietly (no warning that says nothing about this project)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
EDITABLE_WARNING = "Editable installation."


def build_editable(tmp_path: Path, warnings_filter: str) -> str:
    """Build the editable wheel as `pip install -e` does, in a copy of the project
    (the checkout's egg-info is left alone); the build's stderr."""
    project = tmp_path / "project"
    project.mkdir(parents=True)
    for name in ("setup.py", "setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, project)
    for name in ("framework", "plugins"):
        shutil.copytree(REPO_ROOT / name, project / name, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONWARNINGS": warnings_filter}
    code = "from setuptools import build_meta; build_meta.build_editable('dist')"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=project, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stderr


@pytest.mark.timeout(150)
def test_setup_ignores_the_editable_install_warning(tmp_path: Path) -> None:
    setup = (REPO_ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
    found = re.search(r'PYTHONWARNINGS="([^"]+)"\s*\\?\s*\.venv/bin/python -m pip install[^\n]* -e ', setup)
    assert found, "scripts/setup.sh installs the project without a warnings filter"
    assert EDITABLE_WARNING in build_editable(tmp_path / "plain", "default")
    assert EDITABLE_WARNING not in build_editable(tmp_path / "filtered", found.group(1))
