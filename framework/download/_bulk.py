"""`DownloadManager.cached_paths`: many files at once, each with `cached_path`'s
guarantees (its own lock, verification and atomic publish), on a pool of threads.

A URL given twice is fetched once. A file that fails does not stop the others: every
file is fetched or has failed before the call returns, and then a `BulkDownloadError`
names each failed URL. Ctrl-C cancels the files not yet begun; the ones under way
finish (or keep their partial file, as `cached_path` does).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable, Optional, Union

from framework.download._call import PathOrUrl, check_sha256, normalize
from framework.errors import BulkDownloadError, DownloadError, InvalidArgumentError

__all__ = ["Digests", "check_workers", "digests_for", "fetch_all"]

# Expected sha256 per file: a list in the order of the URLs (None: not checked), or a
# mapping from URL (as given, or any spelling of the same path) to digest.
Digests = Union[Sequence[Optional[str]], Mapping[PathOrUrl, str], None]


def check_workers(max_workers: object) -> int:
    if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
        raise ValueError(f"max_workers must be a whole number of at least 1, got {max_workers!r}")
    return max_workers


def digests_for(urls: Sequence[str], sha256: Digests) -> list[Optional[str]]:
    """The expected digest of each URL of `urls` (normalized), checked before any request."""
    if sha256 is None:
        return [None] * len(urls)
    if isinstance(sha256, Mapping):
        by_url: dict[str, str] = {}
        for key, value in sha256.items():
            url = normalize(key)
            value = check_sha256(url, value) or value  # lower case: "AB.." and "ab.." agree
            if by_url.setdefault(url, value) != value:  # two spellings of one file
                raise InvalidArgumentError(
                    url, f"sha256 names it twice, with two digests ({by_url[url]} and {value})"
                )
        unknown = sorted(set(by_url) - set(urls))
        if unknown:  # a typo would silently leave a file unchecked
            raise InvalidArgumentError(unknown[0], "sha256 names a URL that is not among the URLs asked for")
        return [check_sha256(url, by_url.get(url)) for url in urls]
    if isinstance(sha256, (str, bytes)) or not isinstance(sha256, Sequence) or len(sha256) != len(urls):
        raise InvalidArgumentError(
            urls[0] if urls else "",
            "sha256 must be a list with one digest (or None) per URL, in the same order, or a "
            f"mapping from URL to digest; got {type(sha256).__name__} for {len(urls)} URLs",
        )
    return [check_sha256(url, digest) for url, digest in zip(urls, sha256)]


def _unique(urls: Sequence[str], digests: Sequence[Optional[str]]) -> dict[str, Optional[str]]:
    """Each URL once, with the digest asked for it (two different ones are refused)."""
    unique: dict[str, Optional[str]] = {}
    for url, digest in zip(urls, digests):
        known = unique.get(url)
        if known is not None and digest is not None and known != digest:
            raise InvalidArgumentError(url, f"given twice with two sha256 digests ({known} and {digest})")
        unique[url] = known or digest
    return unique


def fetch_all(
    urls: Sequence[str],
    digests: Sequence[Optional[str]],
    fetch_one: Callable[[str, Optional[str]], Path],
    *,
    max_workers: int,
    show: bool,
) -> list[Path]:
    """`fetch_one(url, sha256)` for each distinct URL on up to `max_workers` threads;
    the paths in the order of `urls`."""
    unique = _unique(urls, digests)
    paths: dict[str, Path] = {}
    failures: dict[str, DownloadError] = {}
    other: Optional[BaseException] = None
    with (
        _Bar(show, len(unique)) as bar,
        ThreadPoolExecutor(
            max_workers=max(1, min(max_workers, len(unique))), thread_name_prefix="framework-download"
        ) as pool,
    ):
        futures: dict[Future[Path], str] = {pool.submit(fetch_one, url, unique[url]): url for url in unique}
        try:
            for future in as_completed(futures):
                url = futures[future]
                try:
                    paths[url] = future.result()
                except DownloadError as error:
                    failures[url] = error
                except Exception as error:  # a bug, or an error no backend should raise: after the others
                    other = other or error
                bar.done(paths.get(url))
        except BaseException:  # Ctrl-C: files not begun are dropped, those under way finish
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    if other is not None:
        raise other
    if failures:
        ordered = {url: failures[url] for url in unique if url in failures}
        raise BulkDownloadError(ordered, len(unique)) from next(iter(ordered.values()))
    return [paths[url] for url in urls]


class _Bar:
    """One tqdm bar for the whole call: files done, and bytes published so far."""

    def __init__(self, show: bool, total: int) -> None:
        self.show = show and sys.stderr.isatty()
        self.total = total
        self.bytes = 0
        self.bar: Any = None

    def __enter__(self) -> _Bar:
        if self.show:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, unit="file", desc="downloading")
        return self

    def done(self, path: Optional[Path]) -> None:
        if self.bar is None:
            return
        if path is not None:
            try:
                self.bytes += os.stat(path).st_size if path.is_file() else 0
            except OSError:
                pass
        self.bar.set_postfix_str(self.bar.format_sizeof(self.bytes, "B", 1024), refresh=False)
        self.bar.update(1)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()
