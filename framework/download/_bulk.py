"""`DownloadManager.cached_paths`: many files at once, each with `cached_path`'s
guarantees (its own lock, verification and atomic publish), on a pool of threads.

A URL given twice is fetched once. A file that fails does not stop the others: every
file is fetched or has failed before the call returns, and then a `BulkDownloadError`
names each failed URL as given (an error other than a `DownloadError` is wrapped in
one). Ctrl-C cancels the files not yet begun, those waiting for another process's
lock included; the ones under way finish (or keep their partial file, as
`cached_path` does).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable, Optional, Union

from framework.download._call import PathOrUrl, check_sha256, normalize
from framework.errors import BulkDownloadError, DownloadError, InvalidArgumentError

__all__ = ["Digests", "FetchOne", "check_workers", "digests_for", "fetch_all"]

# Expected sha256 per file: a list in the order of the URLs (None: not checked), or a
# mapping from URL (as given, or any spelling of the same path) to digest.
Digests = Union[Sequence[Optional[str]], Mapping[PathOrUrl, str], None]


def check_workers(max_workers: object, first_url: str) -> int:
    if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
        raise InvalidArgumentError(
            first_url, f"max_workers must be a whole number of at least 1, got {max_workers!r}"
        )
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


def _unique(
    urls: Sequence[str], given: Sequence[str], digests: Sequence[Optional[str]]
) -> dict[str, tuple[str, Optional[str]]]:
    """Each URL once, with its first spelling as given and the digest asked for it (two
    different ones are refused)."""
    unique: dict[str, tuple[str, Optional[str]]] = {}
    for url, spelling, digest in zip(urls, given, digests):
        first, known = unique.get(url, (spelling, None))
        if known is not None and digest is not None and known != digest:
            raise InvalidArgumentError(url, f"given twice with two sha256 digests ({known} and {digest})")
        unique[url] = (first, known or digest)
    return unique


# `fetch_one(url, sha256, cancelled)`: the path of one file and the bytes published for it
# (an archive's, with extract=True); `cancelled` is set at Ctrl-C, for a file that only waits.
FetchOne = Callable[[str, Optional[str], threading.Event], tuple[Path, int]]


def fetch_all(
    urls: Sequence[str],
    given: Sequence[str],
    digests: Sequence[Optional[str]],
    fetch_one: FetchOne,
    *,
    max_workers: int,
    show: bool,
) -> list[Path]:
    """`fetch_one` for each distinct URL of `urls` on up to `max_workers` threads; the
    paths in the order of `urls`. `given`: each URL as the caller spelled it, the keys
    of `BulkDownloadError.failures` (the first spelling of a file given twice)."""
    unique = _unique(urls, given, digests)
    paths: dict[str, Path] = {}
    failures: dict[str, DownloadError] = {}
    cancelled = threading.Event()
    with (
        _Bar(show, len(unique)) as bar,
        ThreadPoolExecutor(
            max_workers=max(1, min(max_workers, len(unique))), thread_name_prefix="framework-download"
        ) as pool,
    ):
        try:
            futures: dict[Future[tuple[Path, int]], str] = {}
            for url, (_, digest) in unique.items():  # 10,000 take a while: inside the try
                futures[pool.submit(_begin, fetch_one, url, digest, cancelled)] = url
            for future in as_completed(futures):
                url = futures[future]
                try:
                    paths[url], size = future.result()
                except Exception as error:
                    failures[url] = _failure(url, error)
                    bar.failed()
                else:
                    bar.done(size)
        except BaseException:  # Ctrl-C: files not begun (or only waiting) are dropped
            cancelled.set()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    if failures:
        ordered = {unique[url][0]: failures[url] for url in unique if url in failures}
        raise BulkDownloadError(ordered, len(unique)) from next(iter(ordered.values()))
    return [paths[url] for url in urls]


def _begin(
    fetch_one: FetchOne, url: str, digest: Optional[str], cancelled: threading.Event
) -> tuple[Path, int]:
    """`fetch_one`, unless the call was interrupted while this file was leaving the queue."""
    if cancelled.is_set():
        raise CancelledError(url)
    return fetch_one(url, digest, cancelled)


def _failure(url: str, error: Exception) -> DownloadError:
    """`error` as the `DownloadError` of one file: an error of another kind (a bug, or one
    no backend should raise) is wrapped, and kept as its cause, so that it hides none of
    the other files' failures."""
    if isinstance(error, DownloadError):
        return error
    wrapped = DownloadError(url, f"unexpected {type(error).__name__}: {error}")
    wrapped.__cause__ = error
    return wrapped


class _Bar:
    """One tqdm bar for the whole call: files done, and bytes published so far; failed
    files are counted apart, not as done."""

    def __init__(self, show: bool, total: int) -> None:
        self.show = show and sys.stderr.isatty()
        self.total = total
        self.bytes = 0
        self.failures = 0
        self.bar: Any = None

    def __enter__(self) -> _Bar:
        if self.show:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, unit="file", desc="downloading")
        return self

    def done(self, size: int) -> None:
        self.bytes += size
        self._update(1)

    def failed(self) -> None:
        self.failures += 1
        self._update(0)

    def _update(self, files: int) -> None:
        if self.bar is None:
            return
        published = self.bar.format_sizeof(self.bytes, "B", 1024)
        failed = f", {self.failures} failed" if self.failures else ""
        self.bar.set_postfix_str(published + failed, refresh=files == 0)
        self.bar.update(files)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()
