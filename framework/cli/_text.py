"""Text shown on a terminal: every failure is one printable line."""

from __future__ import annotations

__all__ = ["CACHE_DIR_HELP", "one_line"]

# The --cache-dir option's help, in every command that takes one.
CACHE_DIR_HELP = "cache folder (default: $FRAMEWORK_CACHE or ~/.cache/framework)"


def one_line(text: str) -> str:
    """`text` on one printable line: whitespace runs become one space, and control
    characters (a terminal's escape sequences) are shown escaped, not obeyed."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in " ".join(text.split()))
