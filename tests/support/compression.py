"""Data files in the compressed forms the built-in readers read (`.gz`, `.zst`)."""

from __future__ import annotations

import gzip
from pathlib import Path

import zstandard

FORMS = ("", ".gz", ".zst")  # "" is the plain file


def compress(raw: bytes, form: str) -> bytes:
    """`raw` in `form`, as two gzip members or zstd frames (split mid-stream, so readers
    cross a member boundary), or as it is for ""."""
    if not form:
        return raw
    half = len(raw) // 2
    if form == ".gz":
        return b"".join(gzip.compress(part, mtime=0) for part in (raw[:half], raw[half:]))
    if form == ".zst":
        compressor = zstandard.ZstdCompressor(write_checksum=True)
        return b"".join(compressor.compress(part) for part in (raw[:half], raw[half:]))
    raise ValueError(f"unknown form {form!r}; one of {FORMS}")


def write(path: Path, raw: bytes, form: str) -> Path:
    """`raw` written to `path` + `form` in that form; the path written."""
    target = path.with_name(path.name + form)
    target.write_bytes(compress(raw, form))
    return target
