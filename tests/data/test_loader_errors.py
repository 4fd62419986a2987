"""One caught type in every mode: reader, sampler and collator errors raised while
iterating arrive as `WorkerError`, the original as `__cause__` (issue 9, "Errors lost").

Before: with num_workers=0 the original type escaped (CollateError, the reader's own
error, the sampler's), with workers a WorkerError, so an `except` worked in one mode only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Optional

import pytest

from framework.data.multiprocess import MultiProcessDataLoader
from framework.data.sampler import BatchSampler
from framework.errors import CollateError, WorkerError
from tests.support.loader import (
    CountingReader,
)

pytestmark = pytest.mark.timeout(120)


class ReaderBroke(LookupError):
    """A reader's own error type (module level: it is rebuilt after crossing processes)."""


class SamplerBroke(ArithmeticError):
    pass


class BreakingReader(CountingReader):
    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        for i, instance in enumerate(super()._read(file_path)):
            if i == 5:
                raise ReaderBroke("reader broke at instance 5")
            yield instance


class UnbatchableReader(CountingReader):
    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        for instance in super()._read(file_path):
            instance["when"] = object()  # the default collator cannot batch this
            yield instance


class BreakingSampler(BatchSampler):
    def get_batch_indices(self, instances: Any) -> Any:
        raise SamplerBroke("sampler broke on purpose")
        yield  # a generator, as samplers are

    def get_num_batches(self, instances: Any) -> int:
        return 1


CASES: dict[str, tuple[Any, dict[str, Any], type[Exception], str]] = {
    "reader": (BreakingReader(16), {"batch_size": 2}, ReaderBroke, "reader broke at instance 5"),
    "collator": (UnbatchableReader(16), {"batch_size": 2}, CollateError, "'when'"),
    "sampler": (CountingReader(16), {"batch_sampler": BreakingSampler()}, SamplerBroke,
                "sampler broke on purpose"),
}


@pytest.mark.parametrize("what", sorted(CASES))
@pytest.mark.parametrize("lazy", [None, 4], ids=["eager", "lazy"])
@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_iteration_errors_are_worker_errors_in_every_mode(
    what: str, lazy: Optional[int], num_workers: int
) -> None:
    reader, options, original, text = CASES[what]
    with pytest.raises(WorkerError) as info:
        # Eager mode reads while it is built: that is inside the raises block too.
        loader = MultiProcessDataLoader(reader, "x", num_workers=num_workers, quiet=True,
                                        max_instances_in_memory=lazy, **options)
        list(loader)
    error = info.value
    assert type(error.__cause__) is original, repr(error.__cause__)
    assert text in str(error) and text in str(error.__cause__)
    assert original.__name__ in str(error)  # the traceback, from the worker or this process
    assert "Traceback from" in str(error)
    in_a_worker = num_workers > 0 and (lazy is not None or what == "reader")
    assert (error.worker_id is not None) == in_a_worker


class InterruptedReader(CountingReader):
    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        yield from super()._read(file_path)
        raise KeyboardInterrupt


@pytest.mark.parametrize("lazy", [None, 4], ids=["eager", "lazy"])
def test_keyboard_interrupt_is_never_wrapped(lazy: Optional[int]) -> None:
    with pytest.raises(KeyboardInterrupt):
        list(MultiProcessDataLoader(InterruptedReader(4), "x", batch_size=2, quiet=True,
                                    max_instances_in_memory=lazy))


def test_construction_checks_are_not_wrapped() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        MultiProcessDataLoader(CountingReader(4), "x", batch_size=0, quiet=True)


def make(reader: Any, **kwargs: Any) -> MultiProcessDataLoader:
    kwargs.setdefault("quiet", True)
    kwargs.setdefault("batch_size", 4)
    return MultiProcessDataLoader(reader, "unused", **kwargs)


# -- errors ------------------------------------------------------------------------------


class RaisesBrokenPipe(CountingReader):
    def _read(self, file_path: Any) -> Any:
        yield from super()._read(file_path)
        raise BrokenPipeError("the reader's own socket broke")


@pytest.mark.parametrize("lazy", [None, 4])
def test_broken_pipe_raised_by_the_reader_is_reported(lazy: Any, no_leaks: None) -> None:
    with pytest.raises(WorkerError, match="the reader's own socket broke") as info:
        list(make(RaisesBrokenPipe(8), num_workers=1, max_instances_in_memory=lazy))
    assert "_read" in info.value.traceback
    assert isinstance(info.value.__cause__, BrokenPipeError)


class BadStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ is broken too")


class RaisesBadStr(CountingReader):
    def _read(self, file_path: Any) -> Any:
        yield from super()._read(file_path)
        raise BadStr()


def test_exception_whose_str_raises_keeps_the_traceback(no_leaks: None) -> None:
    with pytest.raises(WorkerError, match="BadStr") as info:
        list(make(RaisesBadStr(8), num_workers=1, max_instances_in_memory=4))
    assert "RaisesBadStr" in info.value.traceback or "_read" in info.value.traceback
