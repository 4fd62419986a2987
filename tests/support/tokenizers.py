"""Tokenizers named by dotted path in the "text" reader tests."""

from __future__ import annotations


def char_tokenize(text: str) -> list[str]:
    return [c for c in text if not c.isspace()]


class CommaTokenizer:
    def __call__(self, text: str) -> list[str]:
        return [part.strip() for part in text.split(",") if part.strip()]


NOT_CALLABLE = 42
