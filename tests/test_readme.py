"""The README's 30-second example runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


@pytest.mark.timeout(120)
def test_readme_example_runs(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README.md lost its Python example"
    script = tmp_path / "example.py"
    script.write_text(blocks[0])
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=100, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines == [
        "tensor([0., 1., 2., 3.]) tensor([0., 1., 4., 9.])",
        "tensor([4., 5., 6., 7.]) tensor([16., 25., 36., 49.])",
        "tensor([8., 9.]) tensor([64., 81.])",
    ]


def test_readme_gives_the_two_commands_ci_runs() -> None:
    text = README.read_text()
    ci = (README.parent / ".ci" / "run").read_text()
    assert "bash scripts/run.sh" in text and "bash scripts/test.sh" in text
    assert "bash scripts/test.sh" in ci


def test_the_readme_example_runs_without_a_warning(tmp_path: Path) -> None:
    text = README.read_text(encoding="utf-8")
    example = text.split("## 30-second example", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    script = tmp_path / "example.py"
    script.write_text(example)
    out = subprocess.run(
        [sys.executable, "-W", "default", str(script)],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    assert "Warning" not in out.stderr, out.stderr
