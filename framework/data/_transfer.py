"""Moving objects between loader processes over a pipe, tensors out of band.

A message is one frame: a 16-byte header (frame length, metadata length), a table
of the out-of-band buffers (sizes, and which are tensors), a pickle (protocol 5) of
the object in which every CPU tensor is replaced by a reference to an out-of-band
buffer, then the raw tensor bytes, each aligned to 64 bytes. The sender writes the
parts with one `writev` (no copy into a joined buffer); the receiver reads each
tensor's bytes straight into that tensor's own storage with a scatter `readv` (no
copy, and no tensor keeps another alive: keeping a batch's labels does not keep its
images). A dense tensor keeps its strides (channels_last stays channels_last), as
`clone()` does; other views arrive compacted.

`mode="shared_memory"` instead pickles with torch's `ForkingPickler` reductions
(tensors moved to shared memory, file descriptors passed through a socket); it is
what CUDA tensors need, and the benchmark compares the two. In `"pickle5"` frames a
CUDA tensor is copied to the CPU by the sender.
"""

from __future__ import annotations

import ctypes
import io
import os
import pickle
import struct
import typing
from collections.abc import Callable
from typing import Any, Literal, Optional

import torch

__all__ = ["TRANSFERS", "TransferMode", "read_frame", "set_pipe_size", "write_frame"]

TransferMode = Literal["pickle5", "shared_memory"]
TRANSFERS: tuple[str, ...] = typing.get_args(TransferMode)  # the one list of the names

_HEADER = struct.Struct("<QQ")  # frame length after the header, metadata length
_ALIGN = 64
_IOV_MAX = 512
_PAD = bytes(_ALIGN)


def _rebuild_tensor(dtype: str, shape: tuple[int, ...], strides: tuple[int, ...], raw: Any) -> torch.Tensor:
    """`raw` is the uint8 tensor `read_frame` read this tensor's bytes into."""
    kind = getattr(torch, dtype)
    if not isinstance(raw, torch.Tensor):  # not from read_frame: a plain buffer
        raw = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if len(raw) else None
    if raw is None or raw.numel() == 0:
        return torch.empty_strided(shape, strides, dtype=kind)
    rebuilt: torch.Tensor = raw.view(kind).as_strided(shape, strides)
    return rebuilt


def _dense(tensor: torch.Tensor) -> bool:
    """Whether the elements fill exactly numel() slots from data_ptr() (any dim order)."""
    if tensor.is_contiguous():
        return True
    expected = 1
    for stride, size in sorted((st, si) for si, st in zip(tensor.shape, tensor.stride()) if si > 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _memory(tensor: torch.Tensor, nbytes: int) -> memoryview:
    """A writable byte view of `nbytes` bytes at the tensor's data pointer (no copy)."""
    if nbytes == 0:
        return memoryview(bytearray(0))
    return memoryview((ctypes.c_char * nbytes).from_address(tensor.data_ptr())).cast("B")


class _TensorPickler(pickle.Pickler):
    """Pickles plain CPU (and CUDA, via a CPU copy) tensors as out-of-band buffers."""

    def __init__(self, file: io.BytesIO, keep: list[Any], buffers: list[pickle.PickleBuffer]):
        super().__init__(file, protocol=5, buffer_callback=buffers.append)
        self._keep = keep
        self.tensor_buffers: set[int] = set()  # ids of the buffers that hold tensors

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is not torch.Tensor:
            return NotImplemented
        if obj.device.type not in ("cpu", "cuda") or obj.layout != torch.strided:
            return NotImplemented
        if obj.requires_grad or obj.is_quantized or obj.is_conj() or obj.is_neg():
            return NotImplemented
        tensor = obj.cpu() if obj.device.type == "cuda" else obj
        if not _dense(tensor):
            tensor = tensor.contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        self._keep.append(tensor)  # the memory must outlive the write
        buffer = pickle.PickleBuffer(_memory(tensor, nbytes))
        self.tensor_buffers.add(id(buffer))
        self._keep.append(buffer)  # and the id must stay unique until the table is made
        dtype = str(tensor.dtype).rpartition(".")[2]
        return _rebuild_tensor, (dtype, tuple(tensor.shape), tuple(tensor.stride()), buffer)


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def write_frame(fd: int, obj: Any, mode: TransferMode = "pickle5") -> None:
    """Write `obj` to the pipe `fd` as one frame (raises what pickling raises)."""
    buffers: list[pickle.PickleBuffer] = []
    keep: list[Any] = []
    tensor_buffers: set[int] = set()
    if mode == "shared_memory":
        from multiprocessing.reduction import ForkingPickler

        import torch.multiprocessing  # noqa: F401  (registers torch's reductions)

        meta = bytes(ForkingPickler.dumps(obj, protocol=5))
    else:
        stream = io.BytesIO()
        pickler = _TensorPickler(stream, keep, buffers)
        pickler.dump(obj)
        meta = stream.getvalue()
        tensor_buffers = pickler.tensor_buffers
    views = [buffer.raw() for buffer in buffers]
    sizes = [view.nbytes for view in views]
    flags = [id(buffer) in tensor_buffers for buffer in buffers]
    table = struct.pack(f"<I{len(sizes)}Q{len(flags)}?", len(sizes), *sizes, *flags)
    head = table + meta
    parts: list[Any] = [None, head, _PAD[: _aligned(len(head)) - len(head)]]
    total = _aligned(len(head))
    for view, size in zip(views, sizes):
        parts.append(view)
        parts.append(_PAD[: _aligned(size) - size])
        total += _aligned(size)
    parts[0] = _HEADER.pack(total, len(head))
    _vectored(os.writev, fd, parts, None)
    del keep


def _vectored(
    call: Callable[[int, list[memoryview]], int],
    fd: int,
    parts: list[Any],
    wait: Optional[Callable[[], None]],
    moved: Optional[Callable[[], None]] = None,
) -> None:
    """Move all of `parts` with `os.writev` or `os.readv`, however many calls it takes.

    On a non-blocking `fd` with nothing to read, `wait()` is called (it returns when
    the fd may be ready, or raises); `moved()` after each call that moved bytes; end of
    file raises `EOFError`.
    """
    views = [memoryview(part).cast("B") for part in parts if len(part)]
    while views:
        try:
            done = call(fd, views[:_IOV_MAX])
        except BlockingIOError:
            if wait is None:
                raise
            wait()
            continue
        if done == 0:
            raise EOFError("the pipe closed before the whole message came")
        if moved is not None:
            moved()
        while views and done >= views[0].nbytes:
            done -= views[0].nbytes
            views.pop(0)
        if done:
            views[0] = views[0][done:]


def read_frame(
    fd: int,
    wait: Optional[Callable[[], None]] = None,
    moved: Optional[Callable[[], None]] = None,
    rebuild: Optional[Callable[[Callable[[], Any]], Any]] = None,
) -> Any:
    """Read one frame from `fd` and rebuild its object; EOFError if the writer closed.

    `fd` may be non-blocking: whenever nothing is there yet, `wait()` is called
    (so a caller can also watch the writer's process and a timeout, even in the
    middle of a frame, where another holder of the pipe would keep EOF from coming);
    `moved()` whenever bytes came (so a timeout can measure silence, not frames).
    `rebuild(load)` runs the unpickling (`"shared_memory"` frames ask the sender's
    process for file descriptors then, so a caller may bound it); default: `load()`.
    """
    header = bytearray(_HEADER.size)
    _vectored(os.readv, fd, [header], wait, moved)
    total, head_len = _HEADER.unpack(header)
    head = bytearray(_aligned(head_len))
    _vectored(os.readv, fd, [head], wait, moved)
    (count,) = struct.unpack_from("<I", head)
    sizes = struct.unpack_from(f"<{count}Q", head, 4)
    flags = struct.unpack_from(f"<{count}?", head, 4 + 8 * count)
    meta = memoryview(head)[4 + 9 * count : head_len]
    # Each buffer gets its own memory, read in place: tensors into their own storage.
    scratch = bytearray(_ALIGN)
    buffers: list[Any] = []
    parts: list[Any] = []
    for size, is_tensor in zip(sizes, flags):
        if is_tensor:
            tensor = torch.empty(size, dtype=torch.uint8)
            buffers.append(tensor)
            parts.append(_memory(tensor, size))
        else:
            buffers.append(bytearray(size))
            parts.append(buffers[-1])
        parts.append(memoryview(scratch)[: _aligned(size) - size])
    if total != len(head) + sum(_aligned(size) for size in sizes):
        raise ValueError(f"a corrupt frame: {total} bytes announced for {count} buffers")
    _vectored(os.readv, fd, parts, wait, moved)

    def load() -> Any:
        return pickle.loads(meta, buffers=buffers)

    return load() if rebuild is None else rebuild(load)


def set_pipe_size(fd: int, size: int = 1 << 20) -> None:
    """Grow a Linux pipe's buffer so that a batch fits in fewer writes (best effort)."""
    try:
        import fcntl

        fcntl.fcntl(fd, 1031, size)  # F_SETPIPE_SZ
    except (ImportError, OSError):
        pass
