"""Frames between processes: tensors out of band, everything else pickled."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy
import pytest
import torch
from loader_helpers import RandomReader

from framework.data._transfer import read_frame, set_pipe_size, write_frame
from framework.data.multiprocess import MultiProcessDataLoader

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read, write = os.pipe()
    set_pipe_size(write)
    yield read, write
    os.close(read)
    os.close(write)


def roundtrip(pipe: tuple[int, int], obj: Any) -> Any:
    write_frame(pipe[1], obj)
    return read_frame(pipe[0])


def test_tensors_of_every_kind_survive(pipe: tuple[int, int]) -> None:
    obj = {
        "ints": torch.arange(12).view(3, 4),
        "strided": torch.arange(12).view(3, 4)[:, 1],  # not contiguous
        "empty": torch.zeros(0, 5),
        "scalar": torch.tensor(2.5, dtype=torch.bfloat16),
        "bool": torch.tensor([True, False]),
        "grad": torch.ones(2, requires_grad=True),  # falls back to torch's pickling
        "array": numpy.arange(4.0),
        "nested": [{"a": torch.ones(1, dtype=torch.float16)}, ("text", 3)],
    }
    got = roundtrip(pipe, obj)
    for key in ("ints", "strided", "empty", "scalar", "bool"):
        assert torch.equal(got[key], obj[key]) and got[key].dtype == obj[key].dtype
    assert got["grad"].requires_grad and torch.equal(got["grad"], obj["grad"])
    assert numpy.array_equal(got["array"], obj["array"])
    assert torch.equal(got["nested"][0]["a"], obj["nested"][0]["a"])
    assert got["nested"][1] == ("text", 3)


def test_received_tensors_are_writable_and_independent(pipe: tuple[int, int]) -> None:
    sent = torch.arange(5)
    got = roundtrip(pipe, sent)
    got += 1
    assert sent.tolist() == [0, 1, 2, 3, 4] and got.tolist() == [1, 2, 3, 4, 5]


def test_large_frames_cross_a_pipe_in_pieces(pipe: tuple[int, int]) -> None:
    import threading

    big = torch.randn(1024, 1024)  # 4 MiB: more than the pipe holds at once
    writer = threading.Thread(target=write_frame, args=(pipe[1], big))
    writer.start()
    got = read_frame(pipe[0])
    writer.join()
    assert torch.equal(got, big)


def test_closed_pipe_reads_as_eof() -> None:
    read, write = os.pipe()
    os.close(write)
    with pytest.raises(EOFError):
        read_frame(read)
    os.close(read)


def test_shared_memory_transfer_gives_the_same_batches() -> None:
    def batches(transfer: str) -> list[list[int]]:
        data = MultiProcessDataLoader(RandomReader(30), "x", batch_size=4, num_workers=2,
                                      max_instances_in_memory=8, seed=5, quiet=True,
                                      transfer=transfer)
        return [b["id"].tolist() + b["noise"].tolist() for b in data]

    assert batches("shared_memory") == batches("pickle5")
