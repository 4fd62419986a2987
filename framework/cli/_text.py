"""Text shown on a terminal: every failure is one printable line."""

from __future__ import annotations

__all__ = ["one_line"]


def one_line(text: str) -> str:
    """`text` on one printable line: whitespace runs become one space, and control
    characters (a terminal's escape sequences) are shown escaped, not obeyed."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in " ".join(text.split()))
