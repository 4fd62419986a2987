"""Frames between processes: tensors out of band, everything else pickled."""

from __future__ import annotations

import ctypes
import gc
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch

from framework.data._transfer import read_frame, set_pipe_size, write_frame
from framework.data.multiprocess import MultiProcessDataLoader
from tests.support.loader import (
    CountingReader,
    RandomReader,
    child_pids,
    new_shm_entries,
    shm_entries,
)

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
        data = MultiProcessDataLoader(
            RandomReader(30),
            "x",
            batch_size=4,
            num_workers=2,
            max_instances_in_memory=8,
            seed=5,
            quiet=True,
            transfer=transfer,
        )
        return [b["id"].tolist() + b["noise"].tolist() for b in data]

    assert batches("shared_memory") == batches("pickle5")


from tests.support.loader import make, run_script  # noqa: E402

# -- /dev/shm after early break ----------------------------------------------------------


class BusyReader(CountingReader):
    """Fast, with 256 KiB tensors: workers are busy sharing memory when told to stop."""

    def _read(self, file_path: Any) -> Any:
        for i in range(self.n):
            yield {"image": torch.full((64, 1024), float(i)), "label": i}


@pytest.mark.timeout(120)
def test_no_shared_memory_left_after_many_early_breaks() -> None:
    # Counts only torch's segments named after our workers: other processes on the
    # machine create and remove their own at any time.
    before = shm_entries()
    workers: set[int] = set()
    data = make(BusyReader(400), num_workers=2, max_instances_in_memory=8, transfer="shared_memory")
    for _ in range(40):
        for i, _batch in enumerate(data):
            if i == 3:
                workers |= child_pids()
                break
    data.close()
    leaked = {
        name
        for name in new_shm_entries(before)
        if name.startswith("torch_") and int(name.split("_")[1]) in workers
    }
    assert leaked == set()


# -- each tensor its own storage ---------------------------------------------------------


class BigBatches(CountingReader):
    """Instances with a 1 MiB image and an int label: 8 MiB a batch of 8."""

    def _read(self, file_path: Any) -> Any:
        for i in range(self.n):
            yield {"image": torch.full((256, 1024), float(i)), "label": i}


def rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.timeout(120)
def test_keeping_only_the_labels_does_not_keep_the_batches() -> None:
    data = make(BigBatches(160), batch_size=8, num_workers=2, max_instances_in_memory=8)
    gc.collect()
    start = rss()
    labels = [batch["label"] for batch in data]  # 20 batches of 8 MiB
    assert len(labels) == 20
    assert all(label.untyped_storage().nbytes() == 8 * 8 for label in labels)
    # The exact check is above; RSS is the coarse one. glibc keeps freed 8 MiB blocks in
    # its heap once its mmap threshold has grown, so hand them back before measuring.
    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)
    growth = rss() - start
    assert growth < 100 * 2**20, f"{growth / 2**20:.0f} MiB"  # the batches took 160 MiB


@pytest.mark.timeout(120)
def test_received_tensors_have_their_own_resizable_storage(pipe: tuple[int, int]) -> None:
    got = roundtrip(pipe, {"a": torch.arange(6.0), "b": torch.arange(3)})
    assert got["a"].untyped_storage().nbytes() == 6 * 4
    assert got["a"].untyped_storage().data_ptr() != got["b"].untyped_storage().data_ptr()
    got["b"].resize_(10)  # as on a local tensor
    assert got["b"][:3].tolist() == [0, 1, 2]


@pytest.mark.timeout(120)
def test_memory_formats_survive_like_a_clone(pipe: tuple[int, int]) -> None:
    image = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    transposed = torch.randn(4, 6).t()
    sliced = torch.arange(20).view(4, 5)[:, 1:3]  # not dense: compacted, as clone() does
    got = roundtrip(pipe, [image, transposed, sliced])
    for sent, back in zip([image, transposed, sliced], got):
        assert torch.equal(sent, back)
        assert back.stride() == sent.clone().stride()
    assert got[0].is_contiguous(memory_format=torch.channels_last)


# -- CUDA tensors in pickle5 frames ------------------------------------------------------


@pytest.mark.timeout(120)
def test_cuda_target_under_spawn_with_pickle5_moves_in_the_main_process() -> None:
    data = make(
        CountingReader(8),
        num_workers=1,
        max_instances_in_memory=4,
        start_method="spawn",
        cuda_device="cuda:0",
    )
    assert data._spec(None).device is None  # pickle-5 frames carry CPU bytes only
    shared = make(
        CountingReader(8),
        num_workers=1,
        max_instances_in_memory=4,
        start_method="spawn",
        cuda_device="cuda:0",
        transfer="shared_memory",
    )
    assert shared._spec(None).device == torch.device("cuda:0")


@pytest.mark.timeout(120)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensor_in_a_pickle5_frame_arrives_on_the_cpu(pipe: tuple[int, int]) -> None:
    sent = torch.arange(6, device="cuda").view(2, 3)
    got = roundtrip(pipe, {"x": sent})
    assert got["x"].device.type == "cpu" and torch.equal(got["x"], sent.cpu())


# -- the messages workers send ----------------------------------------------------------


@pytest.mark.timeout(120)
def test_pickled_worker_messages_are_small() -> None:
    from framework.data import _protocol

    assert len(pickle.dumps(_protocol.Done(3))) < 80


@pytest.mark.timeout(120)
def test_transfer_names_come_from_one_place() -> None:
    from framework.data import _checks, _transfer

    assert _checks.TRANSFERS is _transfer.TRANSFERS
    with pytest.raises(ValueError, match="pickle5"):
        make(CountingReader(4), transfer="bogus")


# -- shared_memory frames from a dead or stopped worker ----------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_shared_memory_frames_of_a_killed_or_stopped_worker(tmp_path: Path, how: str) -> None:
    # Unpickling a queued shared_memory frame connects to the sending worker for each
    # storage's file descriptor: a killed worker gave a raw ConnectionRefusedError, and a
    # stopped one hung the main process despite the timeout.
    out = run_script(
        tmp_path,
        f"""
        import os, signal, time
        from tests.support.loader import CountingReader
        from framework.data.multiprocess import MultiProcessDataLoader
        from framework.errors import WorkerError

        data = MultiProcessDataLoader(CountingReader(400), "x", batch_size=2, num_workers=1,
                                      max_instances_in_memory=8, quiet=True,
                                      transfer="shared_memory", timeout=2)
        it = iter(data)
        next(it)
        time.sleep(1.0)  # the worker fills its prefetch slots
        pid = data._pool.processes[0].pid
        os.kill(pid, signal.{how})
        time.sleep(0.5)
        try:
            for _ in it:
                pass
        except WorkerError as error:
            print("CAUGHT", str(error).splitlines()[0])
        finally:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    """,
        timeout=60,
    )
    assert "CAUGHT" in out, out
    if how == "SIGKILL":
        assert "SIGKILL" in out, out
