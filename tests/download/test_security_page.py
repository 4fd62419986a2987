"""The security page promises nothing without a test: every row names one, and every
test it names exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

HERE = Path(__file__).resolve().parent
PAGE = HERE.parents[1] / "docs" / "concepts" / "security.md"


def _rows() -> list[list[str]]:
    rows = []
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if line.startswith("|") and cells[0] not in ("threat", "---"):
            rows.append(cells)
    return rows


def test_every_row_has_a_guarantee_a_mechanism_and_a_test() -> None:
    rows = _rows()
    assert len(rows) > 20
    for cells in rows:
        assert len(cells) == 4 and all(cells), cells
        assert "::test_" in cells[3], cells


def test_every_test_the_page_names_exists() -> None:
    named = re.findall(r"`([\w/]+\.py)::(test_\w+)`", PAGE.read_text(encoding="utf-8"))
    assert named
    missing = [
        f"{file}::{test}"
        for file, test in named
        if not (HERE / file).is_file() or f"def {test}(" not in (HERE / file).read_text(encoding="utf-8")
    ]
    assert missing == []
