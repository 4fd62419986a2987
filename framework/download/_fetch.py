"""The top of a fetch: resume what an earlier call left, and pick the path.

An object comes over one stream (`_stream`), or in parts over several connections
(`parallel`) when the backend declares `DownloadBackend.supports_ranges` and more
than one connection is allowed; either way it lands in one `Partial`, verified
before it is handed back for publishing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Optional

from framework.download._cache import WorkFolder, enter_work_folder
from framework.download._partial import (
    STALE_AFTER_S,
    Fetched,
    Partial,
    resumable,
)
from framework.download._stream import download
from framework.download.backend import DownloadBackend
from framework.download.parallel import adopt_parts, fetch_parts
from framework.errors import DownloadError

__all__ = ["fetch"]

logger = logging.getLogger("framework.download")


@contextmanager
def _progress_bar(enabled: bool, total: Optional[int], desc: str) -> Iterator[Any]:
    if not enabled:
        yield None
        return
    from tqdm.auto import tqdm

    with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc) as bar:
        yield bar


def _enter_work_folder(final: Path, url: str) -> WorkFolder:
    try:
        return enter_work_folder(final)
    except FileExistsError as error:  # every name of it planted
        raise DownloadError(url, f"cannot write a partial file: {error.strerror}") from error


def fetch(
    backend: DownloadBackend,
    url: str,
    final: Path,
    *,
    sha256: Optional[str],
    attempts: int,
    backoff_factor: float,
    progress: bool,
    on_size: Optional[Callable[[int], None]] = None,
    connections: int = 1,
    part_size: int = 8 << 20,
    fixed_connections: bool = False,
) -> Fetched:
    """Download `url` into a partial file in `final`'s work folder, resuming where possible.

    With `connections` > 1 and a backend that reads bounded ranges, an object larger
    than `part_size` comes in parts over several connections (`parallel`): all
    `connections` if `fixed_connections`, else as many as the ramp finds worth it.
    On a network failure or Ctrl-C the partial file is kept for a later call (of
    this or another process); on any other failure it is removed.
    """
    ranged = backend.supports_ranges
    folder = _enter_work_folder(final, url)
    # A work folder made just now is empty: nothing to resume, nothing to sweep.
    resumed = adopt_parts(final) if ranged and not folder.fresh else None  # with one connection too
    parallel = resumed is not None or (connections > 1 and ranged)
    partial = resumed.partial if resumed is not None else None if folder.fresh else Partial.adopt(final)
    if partial is not None:
        logger.info("resuming %s from byte %d", url, partial.offset)
    else:
        partial = Partial.create(final, folder)
    keep = False
    try:
        with _progress_bar(progress, None, final.name.split("-", 1)[-1]) as bar:
            pending, failed = None, 0
            if parallel:
                pending, failed = fetch_parts(
                    backend,
                    url,
                    partial,
                    resumed,
                    connections=connections,
                    part_size=part_size,
                    attempts=attempts,
                    backoff_factor=backoff_factor,
                    bar=bar,
                    on_size=on_size,
                    fixed=fixed_connections,
                )
            if pending is None:
                pending = download(backend, url, partial, attempts - failed, backoff_factor, bar, on_size)
        try:
            os.fsync(partial.fd)  # meanwhile the hash thread works through its backlog
        except BaseException as error:
            pending.abandon(error)  # the hash thread never stays blocked
            raise
        pending.close()
        result = partial.verified(url, sha256)
        keep = True
        return result
    except FileNotFoundError as error:
        if os.path.lexists(partial.name.path) or not final.parent.is_dir():
            raise
        # This process was silent long enough (another host's view) for another to take
        # its partial file over: that one publishes; this one stops, with nothing kept.
        raise DownloadError(
            url,
            f"{partial.name.path} was taken over by another process while this one was silent "
            f"(longer than {STALE_AFTER_S:g}s); nothing published by this one",
        ) from error
    except BaseException as error:
        keep = resumable(error)
        raise
    finally:
        partial.close(keep)
