"""The data package as a whole: the failure model in docs/concepts/loader.md names only
tests that exist, and value classes are the standard library's dataclasses."""

from __future__ import annotations

import re
from pathlib import Path


def test_every_test_named_in_the_failure_model_exists() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "concepts" / "loader.md"
    section = docs.read_text().split("## Failure model", 1)[1]
    named = re.findall(r"`(test_\w+\.py)::(test_\w+)", section)
    assert named
    tests = Path(__file__).resolve().parents[1]
    files = {path.name: path for path in tests.rglob("test_*.py")}
    missing = [f"{f}::{t}" for f, t in named if f not in files or f"def {t}(" not in files[f].read_text()]
    assert missing == []


def test_the_data_package_uses_dataclasses_not_attrs() -> None:
    # One way to write value classes in framework.data: the standard library's.
    package = Path(__file__).resolve().parents[2] / "framework" / "data"
    pattern = re.compile(r"^\s*(import attr|from attr)", re.M)
    users = [p.name for p in package.rglob("*.py") if pattern.search(p.read_text())]
    assert users == []
