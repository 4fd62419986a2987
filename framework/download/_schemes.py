"""Which registered backend serves a URL's scheme, asked of the backend classes.

No scheme is written down here: `HttpBackend` says it serves ``http`` and
``https``, `LocalBackend` ``file``, and so on (`DownloadBackend.schemes`). The
order, most specific first: a backend registered under the scheme's own name, then
one whose class lists the scheme, then one whose class `accepts` any scheme nobody
claims (the fsspec backend).
"""

from __future__ import annotations

import logging
import re
from typing import Final, Optional

from framework.download.backend import DownloadBackend
from framework.errors import RegistryError

__all__ = ["backend_name_for", "describe_schemes", "split_scheme", "url_scheme"]

logger = logging.getLogger("framework.download")

# RFC 3986 scheme; one letter is a Windows drive (C://), not a scheme.
_SCHEME: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+")


def split_scheme(text: str) -> Optional[str]:
    """The lower-case scheme of ``scheme://...``; `None` for a plain path. Reads only the
    text before ``://``, so a URL that `urlsplit` rejects still names its scheme."""
    head, separator, _ = text.partition("://")
    return head.lower() if separator and _SCHEME.fullmatch(head) else None


def url_scheme(url: str) -> str:
    """`url`'s scheme in lower case; ``file`` for a plain path."""
    return split_scheme(url) or "file"


def _classes() -> dict[str, type[DownloadBackend]]:
    """The registered backend classes by name; one that fails to import is skipped
    (and logged), so a broken plugin cannot take the other schemes down with it."""
    classes: dict[str, type[DownloadBackend]] = {}
    for name, entry in sorted(DownloadBackend.registry_entries().items()):
        try:
            classes[name] = entry.load()
        except RegistryError as error:
            logger.warning("skipping the download backend %r: %s", name, error)
    return classes


def backend_name_for(url: str) -> str:
    """The registered name of the backend serving `url`'s scheme; the scheme itself
    when no backend serves it."""
    scheme = url_scheme(url)
    if scheme in DownloadBackend.registry_entries():
        return scheme
    classes = _classes()
    for name, cls in classes.items():
        if scheme in cls.schemes:
            return name
    for name, cls in classes.items():
        if cls.accepts(scheme):
            return name
    return scheme


def _is_fallback(cls: type[DownloadBackend]) -> bool:
    return cls.accepts.__func__ is not DownloadBackend.accepts.__func__  # type: ignore[attr-defined]


def describe_schemes() -> tuple[list[str], list[str]]:
    """(the schemes served: declared, or registered by name; the fallback backends)."""
    classes = _classes()
    declared = {scheme for cls in classes.values() for scheme in cls.schemes}
    by_name = {name for name, cls in classes.items() if not cls.schemes and not _is_fallback(cls)}
    return sorted(declared | by_name), [name for name, cls in classes.items() if _is_fallback(cls)]
