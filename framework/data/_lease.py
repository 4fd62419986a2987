"""`WorkerPools`: the worker pools of one loader. The loader owns it (and so the
persistent pool); a pass leases a pool from it and hands it back when it ends."""

from __future__ import annotations

import multiprocessing
import pickle
import sys
import warnings
from typing import Optional

from framework.data._pool import WorkerPool, closed_error
from framework.data._settings import LoaderSettings
from framework.data.reader import DistributedInfo, UnshardedReadWarning

__all__ = ["WorkerPools"]


class WorkerPools:
    """The persistent pool (`pool`, kept between lazy passes with persistent_workers)
    and the pools passes and the eager read start."""

    def __init__(self, settings: LoaderSettings) -> None:
        self.settings = settings
        self.pool: Optional[WorkerPool] = None
        self.closes = 0  # close() calls: one while workers start (another thread) ends that pass

    def lease(self, info: Optional[DistributedInfo], dealt: bool = False) -> WorkerPool:
        """A pool for a lazy pass (`dealt`: one dealing whole shards): the persistent
        one, or a new one."""
        if self.pool is not None and self.pool.closed:
            self.pool = None
        if self.pool is not None and self.pool.busy:
            # Another iteration of this loader is still open: give this one its own
            # workers rather than pull the others' out from under it.
            return self.start(info, dealt)
        if self.pool is None:
            self.pool = self.start(info, dealt)
        return self.pool

    def release(self, pool: WorkerPool, finished: bool) -> None:
        """A pass is done with `pool`: keep it for the next pass only when the pass ran to
        its end, the workers persist and the pool is still the owned one."""
        owned = pool is self.pool
        if not finished or not self.settings.persistent_workers or not owned:
            pool.shutdown()
            if owned:
                self.pool = None

    def start(self, info: Optional[DistributedInfo], dealt: bool = False) -> WorkerPool:
        """A new pool (not kept: the caller shuts it down or leases it)."""
        settings = self.settings
        self._advise(dealt)
        context = multiprocessing.get_context(settings.start_method)
        closes = self.closes
        try:
            pool = WorkerPool(settings.spec(info), settings.num_workers, context, settings.quiet)
        except (TypeError, AttributeError, ValueError, pickle.PicklingError) as error:
            if settings.start_method == "fork":
                raise
            raise TypeError(
                f"start_method={settings.start_method!r} pickles the reader, sampler and "
                f"collate_fn to start each worker, and that failed: {error}. Define them "
                "at module level (importable), or use start_method='fork'"
            ) from error
        if self.closes != closes:  # close() from another thread while the workers started
            pool.shutdown()
            raise closed_error()
        return pool

    def retire(self) -> None:
        """Keep the persistent pool no longer (its workers were started with a setting that
        changed): stop it now if no pass reads from it, else when that pass ends
        (`release` stops a pool that is no longer the owned one)."""
        pool, self.pool = self.pool, None
        if pool is not None and not pool.busy:
            pool.shutdown()

    def shutdown(self) -> None:
        """Stop the persistent pool's workers now."""
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None

    def _advise(self, dealt: bool) -> None:
        """Warn when every worker is about to parse every record: a reader that does not
        shard by worker reads the whole data in each worker and keeps its share."""
        settings = self.settings
        if settings.num_workers < 2 or settings.reader.manual_multiprocess_sharding:
            return
        if dealt:
            return  # streamed shards dealt whole: each worker reads only its own
        kind = type(settings.reader)
        mode = "" if settings.lazy else "use lazy mode (max_instances_in_memory) and "
        if settings.reader.manual_distributed_sharding:
            # It shards by rank itself: shard_iterable() would shard by rank again.
            advice = (
                f"{kind.__name__} shards by rank (manual_distributed_sharding=True) but not "
                f"by worker; {mode}let it shard by worker too: set "
                "manual_multiprocess_sharding=True and keep, inside _read(), the records "
                "whose position modulo get_worker_info().num_workers is get_worker_info().id "
                "(not self.shard_iterable(...), which would shard by rank a second time)"
            )
        else:
            advice = (
                f"{kind.__name__} does not shard by worker; {mode}let the reader shard: set "
                "manual_multiprocess_sharding=True and manual_distributed_sharding=True and "
                "wrap the records in self.shard_iterable(...) inside _read()"
            )
        # As the reader's own unsharded warning: it points at the reader's _read, where
        # the fix goes, and is recorded in that module's registry, so the default filter
        # shows it once per process per reader class (the text names only the class).
        code = getattr(kind._read, "__code__", None)
        module = sys.modules.get(kind.__module__)
        warnings.warn_explicit(
            "each loader worker parses every record and keeps its share, because " + advice,
            UnshardedReadWarning,
            code.co_filename if code else __file__,
            code.co_firstlineno if code else 0,
            registry=vars(module).setdefault("__warningregistry__", {}) if module else None,
        )
