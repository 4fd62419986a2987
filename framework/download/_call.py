"""The steps a plain `cached_path` call and a cluster one share: the cache key of
what was asked for, the digest checked before any request, failed writes in the cache
folder told apart, and whether an extracted folder matches the published file."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional, Union
from urllib.parse import urlsplit

from framework.download._cache import Entry
from framework.download._extract import extracted_from
from framework.download._pipeline import no_room
from framework.download._schemes import split_scheme
from framework.errors import DownloadError, InvalidArgumentError

__all__ = ["PathOrUrl", "cache_writes", "check_sha256", "extracted", "normalize"]

PathOrUrl = Union[str, os.PathLike[str]]


def normalize(url_or_path: PathOrUrl) -> str:
    """A URL for the cache key; plain paths become absolute `file://` URLs."""
    text = os.fspath(url_or_path)
    if "\x00" in text:  # no path or URL holds one; the OS would raise a bare ValueError
        raise InvalidArgumentError(text, "a NUL byte in the path or URL; check where it came from")
    if split_scheme(text) is not None:
        try:
            text.encode("utf-8")  # the cache entry's name and every request encode it
        except UnicodeEncodeError as error:  # a lone surrogate: an undecodable file name's byte
            shown = text.encode("utf-8", "backslashreplace").decode("utf-8")
            raise InvalidArgumentError(
                shown,
                f"the URL holds {text[error.start : error.end]!a}, which is no character (a byte "
                "of a file name that was not UTF-8?); percent-encode the name's bytes",
            ) from None
        try:
            urlsplit(text)  # the cache entry's name is read from it
        except ValueError as error:
            raise InvalidArgumentError(text, f"not a valid URL: {error}") from error
        return text
    return Path(text).expanduser().resolve().as_uri()


def check_sha256(url: str, sha256: Optional[str]) -> Optional[str]:
    """`sha256` in lower case; an `InvalidArgumentError` (before any request) unless it
    is 64 hex digits."""
    if sha256 is None:
        return None
    if not isinstance(sha256, str) or _SHA256.fullmatch(sha256) is None:
        raise InvalidArgumentError(
            url,
            f"sha256 must be 64 hexadecimal digits (the output of sha256sum), got {sha256!r}; "
            "pass the file's full hex digest, or None to skip the check",
        )
    return sha256.lower()


_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


def _digest(entry: Entry) -> Optional[str]:
    """The sha256 of the file published now, from its sidecar."""
    meta = entry.cached()
    return meta["sha256"] if meta is not None else None


def extracted(entry: Entry) -> bool:
    """Whether the extracted folder came from the file published now (not an older one)."""
    digest = _digest(entry)
    return digest is not None and extracted_from(entry.extracted, digest)


@contextmanager
def cache_writes(url: str, root: Path) -> Iterator[None]:
    """Turn a failed write in the cache folder (read-only, no permission, no room) into
    a `DownloadError` that says which."""
    try:
        yield
    except OSError as error:
        full = no_room(url, root, error)
        if full is not None:
            raise full from error
        where = f" ({error.filename})" if error.filename else ""
        raise DownloadError(
            url,
            f"cannot write in the cache folder {root}: {error.strerror or error}{where}; "
            "set FRAMEWORK_CACHE (or cache_dir) to a writable folder",
        ) from error
