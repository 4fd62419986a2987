"""`resolve_shards`: the many files one `data_path` names, as a list of `Shard`s.

A spec is one string, a path, or a list of them; each string is one of:

- `manifest:URL`: a file listing one shard a line (`URL`, or `URL<TAB>sha256<TAB>size`),
  fetched through the download manager; relative URLs are taken from its folder;
- a name with braces, expanded first: `train-{00000..00255}.gz` (a range, zero-padded
  to the width written) or `{train,valid}.gz` (alternatives), nested or several;
- a glob (`*`, `?`, `[...]`, `**` for any folders) on a backend that lists
  (`DownloadBackend.supports_listing`): the longest literal prefix is listed, the
  rest matched name by name with fnmatch's rules (`*` never crosses a `/`; `[*]` is a
  literal `*`);
- anything else: one shard, as written.

A local path that exists is that one file, whatever characters its name holds.

The order is deterministic (the order given; a glob's matches sorted by URL; a
manifest's order), since a loader shuffles shards by its seed; a shard named twice is
an error.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterator, Sequence
from typing import Final, Optional, Union
from urllib.parse import urljoin, urlsplit
from urllib.request import url2pathname

import attrs

from framework.download._call import check_sha256, normalize
from framework.download._schemes import split_scheme
from framework.download.backend import ListedObject, listing_unsupported
from framework.download.manager import DownloadManager
from framework.errors import DownloadError, ShardSpecError

__all__ = [
    "MANIFEST_PREFIX",
    "MAX_EXPANSION",
    "Shard",
    "ShardSpec",
    "expand_braces",
    "local_path",
    "resolve_shards",
]

MANIFEST_PREFIX: Final = "manifest:"
# The most names one brace expression may expand to: a typo such as {0..99999999}
# is refused instead of filling memory.
MAX_EXPANSION: Final = 1_000_000

_MAGIC: Final = re.compile(r"[*?[]")
_RANGE: Final = re.compile(r"(-?\d+)\.\.(-?\d+)")
# Schemes whose relative references `urljoin` resolves (`s3://`, `gs://` are not among them).
_JOINABLE: Final = frozenset({"http", "https", "file"})
_SHOWN: Final = 5  # listed names quoted in an error

ShardSpec = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]]


@attrs.frozen
class Shard:
    """One file of a sharded dataset: its URL or path, and, when a manifest gives them,
    its sha256 (checked when it is fetched) and size in bytes."""

    url: str
    sha256: Optional[str] = None
    size: Optional[int] = None


def resolve_shards(spec: ShardSpec, manager: Optional[DownloadManager] = None) -> list[Shard]:
    """The shards `spec` names, in a deterministic order (see the module's docstring).

    `manager` lists the globs' prefixes (through the backend of each URL's scheme) and
    fetches manifests; by default one with the settings from the environment.

    Raises:
        ShardSpecError: a malformed brace, a glob matching nothing (naming what was
            listed), a bad manifest line (its number), or a shard named twice.
        ListingUnsupportedError: a glob on a scheme whose backend cannot list (HTTP).
        DownloadError: listing or fetching a manifest failed.
    """
    items = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    if not items:
        raise ShardSpecError("[]", "no shards named: the list is empty")
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise ShardSpecError(repr(item), f"a shard is a path or URL string, got {type(item).__name__}")
    if manager is None:
        with DownloadManager() as made:  # its connections are closed once resolved
            return resolve_shards(items, made)
    listing: dict[str, bool] = {}  # by scheme: whether its backend lists
    shards = [shard for item in items for shard in _resolve_one(os.fspath(item), manager, listing)]
    _refuse_duplicates(shards)
    return shards


def _resolve_one(text: str, manager: DownloadManager, listing: dict[str, bool]) -> list[Shard]:
    local = local_path(text)
    if local is not None and os.path.exists(local):
        return [Shard(text)]  # a file that exists is itself, `*`, `[` and braces in its name too
    if text.startswith(MANIFEST_PREFIX):
        return _manifest(text[len(MANIFEST_PREFIX) :], manager)
    shards: list[Shard] = []
    for name in expand_braces(text):
        start = _wildcard(name, manager, listing)
        shards.extend([Shard(name)] if start is None else _glob(name, start, manager))
    return shards


def local_path(url: str) -> Optional[str]:
    """The local file a plain path or a `file://` URL of this host names; None for a
    URL a backend fetches."""
    scheme = split_scheme(url)
    if scheme is None:
        return url
    parts = urlsplit(url)
    if scheme == "file" and parts.netloc in ("", "localhost"):
        return url2pathname(parts.path)
    return None


def _refuse_duplicates(shards: Sequence[Shard]) -> None:
    seen: set[str] = set()
    twice: dict[str, None] = {}  # in the order first seen twice
    for shard in shards:
        key = normalize(shard.url)  # a path, ./path and file:///path are one file, as the cache sees them
        if key in seen:
            twice[shard.url] = None
        seen.add(key)
    if twice:
        shown = ", ".join(list(twice)[:_SHOWN]) + (
            f" and {len(twice) - _SHOWN} more" if len(twice) > _SHOWN else ""
        )
        raise ShardSpecError(
            next(iter(twice)),
            f"{len(twice)} shard(s) named more than once: {shown}; each shard is read once an epoch, "
            "so name it once (do two globs or a glob and a list overlap?)",
        )


# Brace expansion -------------------------------------------------------------------------


def expand_braces(text: str) -> list[str]:
    """`text` with each brace expression expanded, as a shell does, in order:
    `{00..03}` (a range; zero-padded to the wider end when either is written with a
    leading zero; descending when the first end is larger), `{a,b,}` (alternatives, an
    empty one included), nested and several in one name. A `{` or `}` that is unmatched,
    or braces holding neither a range nor a comma, is a `ShardSpecError`."""
    names = _expand(text, text)
    if len(names) > MAX_EXPANSION:
        raise ShardSpecError(text, f"the braces expand to {len(names)} names, more than {MAX_EXPANSION}")
    return names


def _expand(text: str, spec: str) -> list[str]:
    opening = text.find("{")
    if opening < 0:
        if "}" in text:
            raise ShardSpecError(spec, f"a '}}' without its '{{' at {text!r}")
        return [text]
    closing = _matching_brace(text, opening, spec)
    head, inside, tail = text[:opening], text[opening + 1 : closing], text[closing + 1 :]
    if "}" in head:
        raise ShardSpecError(spec, f"a '}}' without its '{{' in {head!r}")
    tails = _expand(tail, spec)
    names: list[str] = []
    for choice in _choices(inside, spec):
        for expanded in _expand(choice, spec):
            names.extend(head + expanded + rest for rest in tails)
            if len(names) > MAX_EXPANSION:
                raise ShardSpecError(spec, f"the braces expand to more than {MAX_EXPANSION} names")
    return names


def _matching_brace(text: str, opening: int, spec: str) -> int:
    depth = 0
    for index in range(opening, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return index
    raise ShardSpecError(spec, f"a '{{' without its '}}' at {text[opening:]!r}")


def _choices(inside: str, spec: str) -> list[str]:
    """What one pair of braces stands for: its alternatives, or the names of its range."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(inside):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(inside[start:index])
            start = index + 1
    if parts:
        return [*parts, inside[start:]]
    found = _RANGE.fullmatch(inside)
    if found is None:
        raise ShardSpecError(
            spec,
            f"{{{inside}}} is neither a range such as {{00000..00255}} nor alternatives such as {{a,b}}",
        )
    first, last = found.groups()
    step = 1 if int(first) <= int(last) else -1
    count = abs(int(last) - int(first)) + 1
    if count > MAX_EXPANSION:
        raise ShardSpecError(spec, f"{{{inside}}} names {count} shards, more than {MAX_EXPANSION}")
    padded = any(len(end.lstrip("-")) > 1 and end.lstrip("-").startswith("0") for end in (first, last))
    width = max(len(first), len(last)) if padded else 0
    return [f"{number:0{width}d}" for number in range(int(first), int(last) + step, step)]


# Globs ---------------------------------------------------------------------------------


def _wildcard(name: str, manager: DownloadManager, listing: dict[str, bool]) -> Optional[int]:
    """Where the first `*`, `?` or `[` of `name` is (None: no glob). On a scheme that
    cannot list, only the URL's path is read (a `?` there starts the query, a `[` may be
    an IPv6 host): a `*` or `[` in the path is a glob, to be refused. `listing` keeps
    each scheme's answer for the next names."""
    found = _MAGIC.search(name)
    scheme = split_scheme(name)
    if found is None or scheme is None:
        return None if found is None else found.start()
    if scheme not in listing:
        listing[scheme] = manager.backend_for(name).supports_listing
    if listing[scheme]:
        return found.start()
    parts = urlsplit(name)
    in_path = _MAGIC.search(parts.path)
    return None if in_path is None else name.index(parts.path) + in_path.start()


def _glob(pattern: str, start: int, manager: DownloadManager) -> list[Shard]:
    backend = manager.backend_for(pattern)
    if not backend.supports_listing:
        raise listing_unsupported(pattern, backend)
    prefix, rest = pattern[:start], pattern[start:]
    recursive = "/" in rest or "**" in rest
    listed = backend.list(prefix, recursive=recursive)
    # The first name of the rest is a whole name (where `**` means any folders) only
    # when the prefix ends a folder.
    whole_first = prefix == "" or prefix.endswith(("/", os.sep))
    matched = [
        Shard(item.url, size=item.size)
        for item in listed
        if item.url.startswith(prefix)
        and _matches(item.url[len(prefix) :].split("/"), rest.split("/"), whole_first)
    ]
    if not matched:
        listing = _what_was_listed(prefix, listed, recursive)
        raise ShardSpecError(pattern, f"the glob matched nothing: {listing}")
    return sorted(matched, key=lambda shard: shard.url)


def _matches(names: list[str], patterns: list[str], whole_first: bool = True) -> bool:
    """Whether the names of a path match the patterns name by name, fnmatch's rules
    within a name, a whole `**` for any number of folders (none included)."""
    if not patterns:
        return not names
    first, others = patterns[0], patterns[1:]
    if first == "**" and whole_first:
        return any(_matches(names[skip:], others) for skip in range(len(names) + 1))
    return bool(names) and fnmatch.fnmatchcase(names[0], first) and _matches(names[1:], others)


def _what_was_listed(prefix: str, listed: Sequence[ListedObject], recursive: bool) -> str:
    # A one-level glob lists one folder: what lies in its subfolders was not looked at.
    where = f"under {prefix!r}" if recursive else f"directly under {prefix!r} (subfolders not listed)"
    deeper = "" if recursive else "; `*` stays within a folder: `**/` matches in subfolders too"
    if not listed:
        return f"no object {where}{deeper}"
    shown = ", ".join(item.url for item in listed[:_SHOWN])
    more = f", and {len(listed) - _SHOWN} more" if len(listed) > _SHOWN else ""
    return f"{len(listed)} object(s) {where}, none matching: {shown}{more}{deeper}"


# Manifests -----------------------------------------------------------------------------


def _manifest(url: str, manager: DownloadManager) -> list[Shard]:
    if not url:
        raise ShardSpecError(MANIFEST_PREFIX, "a manifest spec names its file: manifest:URL")
    # `revalidate`: a manifest is edited in place; a copy cached by an earlier run is
    # served only while the original is still that version.
    path = manager.cached_path(url, revalidate=True)
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark is not part of the first URL
    except UnicodeDecodeError as error:
        raise ShardSpecError(url, f"a manifest is UTF-8 text; this one is not ({error.reason})") from None
    shards = list(_manifest_lines(text, url))
    if not shards:
        raise ShardSpecError(url, "the manifest names no shard (only blank lines and # comments)")
    return shards


def _manifest_lines(text: str, manifest: str) -> Iterator[Shard]:
    # Lines end at \n (and \r\n): not at the other breaks str.splitlines knows (U+2028,
    # form feeds...), which a comment may hold, and which editors do not count as lines.
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = [field.strip() for field in line.split("\t")]
        if len(fields) > 3 or not fields[0]:
            raise ShardSpecError(
                manifest,
                f"expected URL, or URL<TAB>sha256<TAB>size, got {len(fields)} field(s): {line!r}",
                line=number,
            )
        sha256 = fields[1] if len(fields) > 1 and fields[1] else None
        size = fields[2] if len(fields) > 2 and fields[2] else None
        try:
            sha256 = check_sha256(fields[0], sha256)
        except DownloadError:
            raise ShardSpecError(
                manifest, f"the sha256 {sha256!r} is not 64 hex digits", line=number
            ) from None
        if size is not None and not (size.isascii() and size.isdigit()):
            raise ShardSpecError(manifest, f"the size {size!r} is not a whole number of bytes", line=number)
        yield Shard(_join(manifest, fields[0]), sha256, int(size) if size is not None else None)


def _join(manifest: str, reference: str) -> str:
    """`reference` read from the manifest at `manifest`: a URL or absolute path as is,
    anything else relative to the manifest's folder."""
    if split_scheme(reference) is not None:
        return reference
    scheme = split_scheme(manifest)
    if scheme is None:  # a local manifest
        return reference if os.path.isabs(reference) else os.path.join(os.path.dirname(manifest), reference)
    if scheme in _JOINABLE:
        return urljoin(manifest, reference)
    head, _, tail = manifest.partition("://")
    authority, _, path = tail.partition("/")
    if reference.startswith("/"):
        return f"{head}://{authority}{reference}"
    folder = path.rpartition("/")[0]
    return f"{head}://{authority}/{folder + '/' if folder else ''}{reference}"
