"""`framework download URL`: fetch into the cache (once, verified) and print the path."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from framework.cli._text import CACHE_DIR_HELP


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "download",
        help="fetch a URL or path into the cache and print the local path",
        description="Fetch URL (http, https, s3, file, a plain path, a plugin's scheme, or "
        "with the [fsspec] extra gs, az, hf and the other schemes fsspec knows) "
        "into the cache, verify it, and print the path of the cached file (or of the "
        "extracted folder with --extract). Racing processes fetch it once.",
    )
    parser.add_argument("url", metavar="URL", help="what to fetch")
    parser.add_argument("--sha256", help="expected sha256 hex digest of the file")
    parser.add_argument("--extract", action="store_true", help="unpack a tar/zip archive; print the folder")
    parser.add_argument("--cache-dir", help=CACHE_DIR_HELP)
    parser.add_argument("--force", action="store_true", help="fetch (and extract) again")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Fetch and print the path; a failure is a `DownloadError`, which `main` prints as one line."""
    from framework.download import DownloadManager

    loggers = [] if args.verbose else [logging.getLogger(name) for name in ("urllib3", "framework.download")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:  # one line, the path or the error: retry warnings are for -v
        logger.setLevel(logging.ERROR)
    try:
        with DownloadManager(args.cache_dir) as manager:  # closes the backends' connections
            path = manager.cached_path(
                args.url,
                sha256=args.sha256,
                extract=args.extract,
                force=args.force,
                progress=not args.no_progress,
            )
    finally:  # main() may run inside a process that goes on logging (a test, a notebook)
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
    print(path)
    return 0
