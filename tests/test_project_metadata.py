"""The project's declared settings agree with each other: the lowest Python version in
setup.cfg is the one ruff and mypy check against."""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_declared_python_matches_what_is_checked() -> None:
    import configparser
    import tomllib

    setup = configparser.ConfigParser()
    setup.read(REPO_ROOT / "setup.cfg", encoding="utf-8")
    requires = setup["options"]["python_requires"]
    assert requires.startswith(">=")
    lowest = tuple(int(part) for part in requires[2:].split("."))
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["tool"]["ruff"]["target-version"] == (
        "py" + "".join(map(str, lowest))
    )
    assert pyproject["tool"]["mypy"]["python_version"] == ".".join(map(str, lowest))
    assert sys.version_info[:2] >= lowest
