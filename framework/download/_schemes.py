"""Which registered backend serves a URL's scheme, asked of the backend classes.

No scheme is written down here: `HttpBackend` says it serves `http` and
`https`, `LocalBackend` `file`, and so on (`DownloadBackend.schemes`). The
order, most specific first: a backend registered under the scheme's own name (when
its class lists that scheme, or lists none: `local`, `LocalBackend`'s name, is not
the scheme `local://`), then one whose class lists the scheme, then one whose class
`accepts` any scheme nobody claims (the fsspec backend). Two classes listing the same
scheme are a conflict: the built-in one wins (a plugin takes a built-in scheme over
only by registering under the scheme's name, or through `backends=`), and a warning
names them.
"""

from __future__ import annotations

import logging
import re
from typing import Final, Optional

from framework.download.backend import DownloadBackend
from framework.errors import RegistryError
from framework.registry import RegistryEntry

__all__ = ["backend_name_for", "describe_schemes", "split_scheme", "url_scheme"]

logger = logging.getLogger("framework.download")

# The built-in backends' module: their declared schemes win a conflict.
_BUILTIN_PREFIX: Final = "framework_plugins."
_warned: set[tuple[str, tuple[str, ...]]] = set()

# RFC 3986 scheme; one letter is a Windows drive (C://), not a scheme.
_SCHEME: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+")


def split_scheme(text: str) -> Optional[str]:
    """The lower-case scheme of `scheme://...`; `None` for a plain path. Reads only the
    text before `://`, so a URL that `urlsplit` rejects still names its scheme."""
    head, separator, _ = text.partition("://")
    return head.lower() if separator and _SCHEME.fullmatch(head) else None


def url_scheme(url: str) -> str:
    """`url`'s scheme in lower case; `file` for a plain path."""
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


def _named_for(scheme: str, entry: RegistryEntry) -> bool:
    """Whether the backend registered under the name `scheme` serves that scheme: its
    class lists it, or lists no scheme at all (found by name only)."""
    try:
        cls = entry.load()
    except RegistryError:
        return True  # the manager reports the broken backend by its name
    schemes: tuple[str, ...] = getattr(cls, "schemes", ())
    return not schemes or scheme in schemes


def _declared_by(scheme: str, entries: dict[str, RegistryEntry], declarers: list[str]) -> str:
    """The one of several backends declaring `scheme` that serves it: a built-in first."""
    if len(declarers) == 1:
        return declarers[0]
    builtin = [name for name in declarers if entries[name].target_path.startswith(_BUILTIN_PREFIX)]
    chosen = (builtin or declarers)[0]
    key = (scheme, tuple(declarers))
    if key not in _warned:
        _warned.add(key)
        logger.warning(
            "download backends %s all declare the scheme %r; using %r. To choose, register "
            "one under the name %r, or pass DownloadManager(backends={%r: ...})",
            ", ".join(map(repr, declarers)),
            scheme,
            chosen,
            scheme,
            scheme,
        )
    return chosen


def backend_name_for(url: str) -> str:
    """The registered name of the backend serving `url`'s scheme; the scheme itself
    when no backend serves it."""
    scheme = url_scheme(url)
    entries = DownloadBackend.registry_entries()
    if scheme in entries and _named_for(scheme, entries[scheme]):
        return scheme
    classes = _classes()
    declarers = [name for name, cls in classes.items() if scheme in cls.schemes]
    if declarers:
        return _declared_by(scheme, entries, declarers)
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
