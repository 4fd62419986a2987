"""Moving objects between loader processes over a pipe, tensors out of band.

A message is one frame: a 16-byte header (frame length, metadata length), a pickle
(protocol 5) of the object in which every CPU tensor is replaced by a reference to
an out-of-band buffer, then the raw tensor bytes, each aligned to 64 bytes. The
sender writes the parts with one ``writev`` (no copy into a joined buffer); the
receiver reads the frame into one ``bytearray`` and rebuilds each tensor as a view
of it (no per-tensor copy, no shared-memory segment to clean up).

``mode="shared_memory"`` instead pickles with torch's ``ForkingPickler`` reductions
(tensors moved to shared memory, file descriptors passed through a socket); it is
what CUDA tensors need, and the benchmark compares the two.
"""

from __future__ import annotations

import ctypes
import io
import os
import pickle
import struct
from typing import Any, Literal

import torch

__all__ = ["TransferMode", "read_frame", "write_frame"]

TransferMode = Literal["pickle5", "shared_memory"]

_HEADER = struct.Struct("<QQ")  # frame length after the header, metadata length
_ALIGN = 64
_IOV_MAX = 512
_PAD = bytes(_ALIGN)


def _rebuild_tensor(dtype: str, shape: tuple[int, ...], buffer: Any) -> torch.Tensor:
    kind = getattr(torch, dtype)
    numel = 1
    for size in shape:
        numel *= size
    if numel == 0:
        return torch.empty(shape, dtype=kind)
    return torch.frombuffer(buffer, dtype=kind, count=numel).view(shape)


class _TensorPickler(pickle.Pickler):
    """Pickles plain CPU tensors as (dtype, shape, out-of-band buffer)."""

    def __init__(self, file: io.BytesIO, keep: list[Any], buffers: list[pickle.PickleBuffer]):
        super().__init__(file, protocol=5, buffer_callback=buffers.append)
        self._keep = keep

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is not torch.Tensor:
            return NotImplemented
        if obj.device.type != "cpu" or obj.layout != torch.strided or obj.requires_grad:
            return NotImplemented
        if obj.is_quantized or obj.is_conj() or obj.is_neg():
            return NotImplemented
        tensor = obj.contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        self._keep.append(tensor)  # the memory must outlive the write
        if nbytes == 0:
            view = memoryview(bytearray(0))
        else:
            view = memoryview((ctypes.c_char * nbytes).from_address(tensor.data_ptr())).cast("B")
        dtype = str(tensor.dtype).rpartition(".")[2]
        return _rebuild_tensor, (dtype, tuple(tensor.shape), pickle.PickleBuffer(view))


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def write_frame(fd: int, obj: Any, mode: TransferMode = "pickle5") -> None:
    """Write `obj` to the pipe `fd` as one frame (raises what pickling raises)."""
    buffers: list[pickle.PickleBuffer] = []
    keep: list[Any] = []
    if mode == "shared_memory":
        from multiprocessing.reduction import ForkingPickler

        import torch.multiprocessing  # noqa: F401  (registers torch's reductions)

        meta = bytes(ForkingPickler.dumps(obj, protocol=5))
    else:
        stream = io.BytesIO()
        _TensorPickler(stream, keep, buffers).dump(obj)
        meta = stream.getvalue()
    views = [buffer.raw() for buffer in buffers]
    sizes = [view.nbytes for view in views]
    table = struct.pack(f"<I{len(sizes)}Q", len(sizes), *sizes)
    head = table + meta
    parts: list[Any] = [None, head, _PAD[: _aligned(len(head)) - len(head)]]
    total = _aligned(len(head))
    for view, size in zip(views, sizes):
        parts.append(view)
        pad = _aligned(size) - size
        if pad:
            parts.append(_PAD[:pad])
        total += size + pad
    parts[0] = _HEADER.pack(total, len(head))
    _write_all(fd, [part for part in parts if len(part)])
    del keep


def _write_all(fd: int, parts: list[Any]) -> None:
    views = [memoryview(part).cast("B") for part in parts]
    while views:
        written = os.writev(fd, views[:_IOV_MAX])
        while views and written >= views[0].nbytes:
            written -= views[0].nbytes
            views.pop(0)
        if written:
            views[0] = views[0][written:]


def _read_exact(fd: int, view: memoryview) -> bool:
    """Fill `view` from `fd`; False on end of file (the writer is gone)."""
    pos = 0
    while pos < view.nbytes:
        got = os.readv(fd, [view[pos:]])
        if got == 0:
            return False
        pos += got
    return True


def read_frame(fd: int) -> Any:
    """Read one frame from `fd` and rebuild its object; EOFError if the writer closed."""
    header = bytearray(_HEADER.size)
    if not _read_exact(fd, memoryview(header)):
        raise EOFError("the pipe closed before a message began")
    total, head_len = _HEADER.unpack(header)
    frame = bytearray(total)
    view = memoryview(frame)
    if not _read_exact(fd, view):
        raise EOFError("the pipe closed in the middle of a message")
    (count,) = struct.unpack_from("<I", frame)
    sizes = struct.unpack_from(f"<{count}Q", frame, 4)
    meta = view[4 + 8 * count : head_len]
    offset = _aligned(head_len)
    out_of_band = []
    for size in sizes:
        out_of_band.append(view[offset : offset + size])
        offset += _aligned(size)
    return pickle.loads(meta, buffers=out_of_band)


def set_pipe_size(fd: int, size: int = 1 << 20) -> None:
    """Grow a Linux pipe's buffer so that a batch fits in fewer writes (best effort)."""
    try:
        import fcntl

        fcntl.fcntl(fd, 1031, size)  # F_SETPIPE_SZ
    except (ImportError, OSError):
        pass
