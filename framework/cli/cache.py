"""`framework cache ls|verify|prune`: what the cache holds, checked and trimmed."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from framework.cli._text import CACHE_DIR_HELP, one_line

__all__ = ["add_parser"]


# Entries are skipped while another process holds their lock: of the kind the cache's
# fetches take (DownloadManager(lock=...)), as two kinds do not see each other.
_LOCK_OPTION: dict[str, Any] = {
    "choices": ["filelock", "softfilelock"],
    "default": "filelock",
    "help": "the lock the cache's fetches take (DownloadManager's lock=; default: filelock)",
}


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "cache",
        help="list, verify or trim the download cache",
        description="Work with the download cache: list what it holds (per URL and size), "
        "re-hash entries against their records, or trim it to a size, least recently used first.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser(
        "ls",
        help="list the cached entries: URL, size, sha256, extracted folder, last use",
        description="List every entry of the cache, sorted by URL (credentials redacted): its "
        "size, sha256, whether an extracted folder goes with it, and when it was last used; "
        "then a total. Nothing is read but the records.",
    )
    listing.add_argument("--cache-dir", help=CACHE_DIR_HELP)
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(handler=list_entries)
    check = actions.add_parser(
        "verify",
        help="re-hash cached files against their records; exit 1 if any is bad",
        description="Hash each entry's file (or those of the URLs given) and compare its size "
        "and sha256 with the record written when it was fetched. Each bad entry is named on a "
        "line and the exit status is 1; with --fix, bad entries are removed, and the next "
        "cached_path fetches them again.",
    )
    check.add_argument("urls", nargs="*", metavar="URL", help="only these entries (default: all)")
    check.add_argument("--cache-dir", help=CACHE_DIR_HELP)
    check.add_argument("--fix", action="store_true", help="remove the bad entries")
    check.add_argument("--lock", **_LOCK_OPTION)
    check.set_defaults(handler=verify_entries)
    trim = actions.add_parser(
        "prune",
        help="remove least recently used entries until the cache fits a size",
        description="Remove stale partial and temporary files that no live process owns, then "
        "the least recently used entries until the cache holds at most SIZE. An entry another "
        "process is fetching or reading is skipped; files that are not cache entries are never removed. "
        "Exit status 1 if the cache still holds more than SIZE.",
    )
    trim.add_argument("--cache-dir", help=CACHE_DIR_HELP)
    trim.add_argument(
        "--max-size",
        required=True,
        type=_size,
        metavar="SIZE",
        help="at most this much: bytes, or 500MB, 50GB, 1.5TiB (KB..TB: powers of 1000; KiB..TiB: of 1024)",
    )
    trim.add_argument("--dry-run", action="store_true", help="say what would be removed; remove nothing")
    trim.add_argument("--lock", **_LOCK_OPTION)
    trim.set_defaults(handler=prune_cache)


def _size(text: str) -> int:
    from framework.download.sizes import parse_size

    try:
        return parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _cache_dir(args: argparse.Namespace) -> Path:
    from framework.download import default_cache_dir

    return Path(args.cache_dir).expanduser() if args.cache_dir else default_cache_dir()


def _count(number: int, noun: str) -> str:
    """`1 entry`, `2 entries`, `0 stale files`."""
    if number == 1:
        return f"1 {noun}"
    return f"{number} {noun[:-1]}ies" if noun.endswith("y") else f"{number} {noun}s"


def _when(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(stamp))


def list_entries(args: argparse.Namespace) -> int:
    from framework.download.inventory import entries
    from framework.download.sizes import format_size

    root = _cache_dir(args)
    found = entries(root)
    total = sum(entry.total for entry in found)
    if args.json:
        rows = [
            {
                "url": e.url,
                "path": str(e.path),
                "size": e.size,
                "sha256": e.sha256,
                "extracted": str(e.extracted) if e.extracted is not None else None,
                "extracted_size": e.extracted_size,
                "fetched": e.fetched,
                "last_used": e.last_used,
                "bound": e.bound,
            }
            for e in found
        ]
        print(json.dumps({"cache_dir": str(root), "entries": rows, "total": total}, indent=2))
        return 0
    headers = ("URL", "SIZE", "SHA256", "EXTRACTED", "LAST USED (UTC)")
    table = [
        (
            one_line(e.url),  # a sidecar's URL, which anyone who can write the folder wrote
            format_size(e.size),
            e.sha256[:12],
            format_size(e.extracted_size) if e.extracted is not None else "-",
            _when(e.last_used),
        )
        for e in found
    ]
    widths = [max([len(h)] + [len(row[i]) for row in table]) for i, h in enumerate(headers)]
    for row in (headers, *table):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    print(f"{_count(len(found), 'entry')}, {format_size(total)} ({total} bytes) in {root}")
    return 0


def verify_entries(args: argparse.Namespace) -> int:
    from framework.download.inventory import entries, entry_for, remove, verify

    root = _cache_dir(args)
    if args.urls:
        chosen = []
        for url in args.urls:
            entry = entry_for(root, url)
            if entry is None:
                raise FileNotFoundError(f"{url} is not cached in {root} (see framework cache ls)")
            chosen.append(entry)
    else:
        chosen = entries(root)
    bad = 0
    for entry in chosen:
        problem = verify(entry)
        if problem is None:
            continue
        bad += 1
        fixed = ""
        if args.fix:
            fixed = (
                "; removed"
                if remove(entry, lock=args.lock)
                else "; not removed: another process is fetching or reading it"
            )
        print(f"bad: {one_line(entry.url)}: {problem}{fixed}")
    print(f"{_count(len(chosen), 'entry')} checked, {bad} bad")
    return 1 if bad else 0


def prune_cache(args: argparse.Namespace) -> int:
    from framework.download.inventory import prune
    from framework.download.sizes import format_size

    root = _cache_dir(args)
    done = prune(root, args.max_size, dry_run=args.dry_run, lock=args.lock)
    verb = "would remove" if done.dry_run else "removed"
    for path in done.swept:
        print(f"{verb}: {path} (stale)")
    for entry in done.removed:
        print(
            f"{verb}: {one_line(entry.url)} ({format_size(entry.total)}, last used {_when(entry.last_used)})"
        )
    for entry in done.skipped:
        print(f"skipped: {one_line(entry.url)}: another process is fetching or reading it")
    freed, holds = ("would free", "would hold") if done.dry_run else ("freed", "holds")
    print(
        f"{freed} {format_size(done.freed)}: {_count(len(done.removed), 'entry')}, "
        f"{_count(len(done.swept), 'stale file')}; the cache {holds} {format_size(done.size)} "
        f"(at most {done.max_size} bytes asked)"
    )
    return 0 if done.fits else 1
