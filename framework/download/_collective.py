"""The step plumbing of ``cached_path(distributed=True)``: a base class whose `_step` runs
a rank's local work in a thread while answering a heartbeat ``all_gather`` every `POLL_S`
seconds and gathers every rank's outcome, and the encoding of a failure as plain values
(rebuilt from `framework.errors` on every rank)."""

from __future__ import annotations

import threading
from typing import Any, Callable, Final, Optional, Union

import torch.distributed as dist

import framework.errors
from framework.errors import DownloadError, _rebuild

__all__ = ["POLL_S", "Outcome"]

POLL_S: Final = 0.5  # the longest gap between heartbeats while a rank works

# One rank's outcome of a step: (True, value) or (False, (error class name, state, args)).
Outcome = tuple[bool, Any]


class _Collective:
    """A collective call's steps over the default process group (`url` names the call)."""

    url: str

    # Steps: every rank runs its part, then all outcomes are gathered ----------------

    def _step(self, work: Optional[Callable[[], Any]], expect: Union[type, tuple[type, ...]]) -> list[Any]:
        """Run `work` here (None: nothing) while answering heartbeats; the values of all
        ranks (each an `expect`), or the first failure (by rank) raised on every rank."""
        box: list[Outcome] = []
        mine: list[BaseException] = []  # this rank's own failure, chained to what it raises
        thread: Optional[threading.Thread] = None
        if work is None:
            box.append((True, None))
        else:

            def run() -> None:
                try:
                    box.append((True, work()))
                except BaseException as error:  # reported to every rank, raised there
                    mine.append(error)
                    box.append((False, _encode(error, self.url, dist.get_rank())))

            thread = threading.Thread(target=run, name="framework-cluster-step", daemon=True)
            thread.start()
        wait = 0.002
        while True:
            if thread is not None:
                thread.join(wait)
                wait = min(2 * wait, POLL_S)
            outcomes: list[Optional[Outcome]] = self._gather(box[0] if box else None)
            for other, outcome in enumerate(outcomes):
                if outcome is not None and not _is_outcome(outcome):
                    self._out_of_step(other, outcome)
            if all(outcome is not None for outcome in outcomes):
                break
        values = []
        for outcome in outcomes:
            assert outcome is not None
            ok, value = outcome
            if not ok:
                raise _decode(*value) from (mine[0] if mine else None)
            values.append(value)
        for other, value in enumerate(values):
            if not isinstance(value, expect):
                self._out_of_step(other, value)
        return values

    def _out_of_step(self, rank: int, got: Any) -> None:
        raise DownloadError(
            self.url,
            f"rank {rank} sent a {type(got).__name__} where this step of "
            "cached_path(distributed=True) expected another answer: the ranks' collectives are "
            "out of step. Every rank must make the call, and no other collective may run on "
            "the default group meanwhile (another thread, another call)",
        )

    def _gather(self, obj: Any) -> list[Any]:
        gathered: list[Any] = [None] * dist.get_world_size()
        try:
            dist.all_gather_object(gathered, obj)
        except RuntimeError as error:  # DistBackendError, a timeout, a closed connection
            raise DownloadError(self.url, _group_failed(error)) from error
        return gathered


def _is_outcome(value: Any) -> bool:
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], bool)):
        return False
    ok, value = value
    return ok or (
        isinstance(value, tuple)
        and len(value) == 3
        and isinstance(value[0], str)
        and isinstance(value[1], dict)
        and isinstance(value[2], tuple)
    )


def _encode(error: BaseException, url: str, rank: int) -> tuple[str, dict[str, Any], tuple[Any, ...]]:
    """`error` as the name of its nearest class in `framework.errors`, its fields and
    args; anything else becomes a `DownloadError` that names it."""
    if not isinstance(error, DownloadError):
        what = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        error = DownloadError(url, f"rank {rank} failed: {what}")
    cls = next(
        c for c in type(error).__mro__ if getattr(framework.errors, c.__name__, None) is c
    )  # a plugin's own subclass arrives as the framework class it derives from
    # Plain values only: a plugin's field (a response, a client, a lock) may not pickle,
    # and the other ranks may not be able to import its class.
    state = {k: _plain(v) for k, v in vars(error).items() if k != "__notes__"}
    return cls.__name__, state, tuple(a if isinstance(a, str) else repr(a) for a in error.args)


def _plain(value: Any) -> Union[str, int, float, bool, None]:
    return value if value is None or isinstance(value, (str, int, float, bool)) else repr(value)


def _decode(name: str, state: dict[str, Any], args: tuple[Any, ...]) -> DownloadError:
    cls = getattr(framework.errors, name, DownloadError)
    if not (isinstance(cls, type) and issubclass(cls, DownloadError)):
        cls = DownloadError
    error = _rebuild(cls, state, args)
    assert isinstance(error, DownloadError)
    return error


def _group_failed(error: BaseException) -> str:
    return (
        f"the process group failed during cached_path(distributed=True): {error}. A rank died, "
        "left the call, or did not answer within the process group's timeout "
        "(init_process_group(timeout=...))"
    )
