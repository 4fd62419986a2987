"""Registration must not hide a class's type from mypy (AllenNLP #5010)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api")

SNIPPET = textwrap.dedent(
    """
    from framework import Registrable

    class Base(Registrable):
        pass

    @Base.register("thing")
    class Thing(Base):
        def speak(self) -> str:
            return "hi"

    reveal_type(Thing)
    reveal_type(Thing().speak())
    reveal_type(Base.by_name("thing"))
    """
)


# The project's own cache and options (pyproject.toml: strict): CI's mypy step has just
# filled it for framework and torch, so only the snippet is checked here.
CACHE = Path(__file__).resolve().parents[1] / ".mypy_cache"


@pytest.mark.timeout(120)
def test_register_keeps_the_class_type(tmp_path: Path) -> None:
    source = tmp_path / "snippet.py"
    source.write_text(SNIPPET)
    stdout, stderr, _ = mypy_api.run([str(source), "--cache-dir", str(CACHE)])
    revealed = [line for line in stdout.splitlines() if "Revealed type" in line]
    assert len(revealed) == 3, stdout + stderr
    assert "def () -> snippet.Thing" in revealed[0]
    assert revealed[1].endswith(('"str"', '"builtins.str"'))
    assert "snippet.Base" in revealed[2]
