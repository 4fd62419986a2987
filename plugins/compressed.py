"""Open a data file as the bytes it holds: `.gz` and `.zst` files decompressed on the fly.

The built-in readers resume by an offset into these bytes (the decompressed stream),
so a compressed file seeks: forward by decompressing up to the offset, backward by
starting over from its first byte. The name says the form (by suffix) and the first
bytes must agree: a misnamed file is a clear error, never garbage. A stream cut short
or damaged is an error naming the file, never a silent short read.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Optional, Union

__all__ = ["COMPRESSIONS", "DecompressedStream", "compression_of", "open_data_file"]

# suffix -> the form's name; how a stream of it starts is in `_sniff`
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd"}
_SUFFIX = {form: suffix for suffix, form in COMPRESSIONS.items()}
ZSTD_EXTRA = "pip install 'framework[zstd]'"

# Compressed bytes are taken in small steps, so one step's output stays bounded however well
# the data compresses (zstd can expand 2 KiB to tens of MiB, gzip to 2 MiB), until a
# read has at least `_OUTPUT` bytes to give.
_STEP = 2 * 1024
_OUTPUT = 64 * 1024


def _sniff(head: bytes) -> Optional[str]:
    """The compressed form that `head` (a file's first 4 bytes) starts, if any."""
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    # a zstd frame, or a skippable frame (pzstd and the seekable format write those)
    skippable = len(head) == 4 and head[0] & 0xF0 == 0x50 and head[1:] == b"\x2a\x4d\x18"
    if head == b"\x28\xb5\x2f\xfd" or skippable:
        return "zstd"
    return None


def compression_of(path: Union[str, Path]) -> Optional[str]:
    """`"gzip"`, `"zstd"` or None (read as it is), by the name's suffix."""
    return COMPRESSIONS.get(Path(path).suffix.lower())


def open_data_file(path: Union[str, Path]) -> BinaryIO:
    """`path` opened for reading bytes, decompressed when its suffix is `.gz` or `.zst`.

    ValueError when the first bytes contradict the name (a `.gz` that is not gzip, a
    `data.jsonl` that is); ImportError naming the extra for a `.zst` without `zstandard`.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"data file not found: {path}")
    if path.is_dir():
        raise IsADirectoryError(f"data path {path} is a folder; give the reader a file")
    form = compression_of(path)
    handle = open(path, "rb")
    try:
        found = _sniff(handle.read(4))
        handle.seek(0)
        _check_form(path, form, found)
        if form is None:
            return handle
        return io.BufferedReader(DecompressedStream(handle, str(path), form), buffer_size=64 * 1024)
    except BaseException:
        handle.close()
        raise


def _check_form(path: Path, form: Optional[str], found: Optional[str]) -> None:
    if form == found:
        return
    if form is None:
        assert found is not None
        raise ValueError(
            f"{path} holds {found}-compressed data but its name does not say so: rename it "
            f"to {path.name}{_SUFFIX[found]} so that it is decompressed"
        )
    what = f"{found}-compressed" if found else "not compressed"
    if path.stat().st_size == 0:
        what = "empty"
    raise ValueError(
        f"{path} is named {path.suffix} but is {what} (a {form} stream starts with other "
        "bytes): rename it to what it holds, or fetch or copy it again if it is damaged"
    )


def _decompressor(form: str, name: str) -> tuple[Callable[[], Any], tuple[type[Exception], ...]]:
    """A factory of decompressors for one member or frame, and the errors they raise."""
    if form == "gzip":  # header and trailer (CRC, size) checked
        return (lambda: zlib.decompressobj(wbits=31)), (zlib.error,)
    try:
        import zstandard
    except ImportError as error:
        raise ImportError(
            f"{name} is zstd-compressed; reading it needs the zstandard package: {ZSTD_EXTRA}"
        ) from error
    return (lambda: zstandard.ZstdDecompressor().decompressobj()), (zstandard.ZstdError,)


class DecompressedStream(io.RawIOBase):
    """The decompressed bytes of a gzip or zstd file (every member or frame in turn),
    seekable: `io.BufferedReader` gives it lines and buffering."""

    def __init__(self, raw: BinaryIO, name: str, form: str) -> None:
        super().__init__()
        self.name = name
        self.form = form
        self._raw = raw
        self._new, self._errors = _decompressor(form, name)
        self._rewind()

    def _rewind(self) -> None:
        self._raw.seek(0)
        self._decompress = self._new()
        self._started = False  # the current member or frame has taken input
        self._pending = memoryview(b"")  # decompressed, not yet read (a view: read without copying)
        self._at = 0  # where in `_pending` reading resumes
        self._position = 0  # offset into the decompressed stream

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        while self._at == len(self._pending):
            if not self._fill():
                return 0
        size = min(len(view), len(self._pending) - self._at)
        view[:size] = self._pending[self._at : self._at + size]
        self._at += size
        self._position += size
        return size

    def _fill(self) -> bool:
        """Decompress input until `_pending` holds `_OUTPUT` bytes or the file ends (when
        `_pending` is all read); False at the end of the file."""
        pieces: list[bytes] = []
        size = 0
        while size < _OUTPUT:
            data = self._raw.read(_STEP)
            if not data:
                if self._started:
                    raise ValueError(
                        f"{self.name}: the {self.form} stream ends mid-stream after "
                        f"{self._position + size} decompressed bytes: the file is truncated "
                        "(an interrupted download or copy?); fetch or copy it again"
                    )
                break
            for piece in self._decompressed(data):
                pieces.append(piece)
                size += len(piece)
        self._pending = memoryview(b"".join(pieces))
        self._at = 0
        return size > 0

    def _decompressed(self, data: bytes) -> list[bytes]:
        """The bytes `data` decompresses to, across the ends of members or frames."""
        pieces = []
        while data:
            if not self._started and self.form == "gzip":
                data = data.lstrip(b"\x00")  # gzip allows zero padding after a member
                if not data:
                    break
            self._started = True
            try:
                pieces.append(self._decompress.decompress(data))
            except self._errors as error:
                if "too much memory" in str(error):  # zstd: a window past its 128 MiB default
                    raise ValueError(
                        f"{self.name} is zstd-compressed with a window larger than 128 MiB "
                        f"(zstd --long), which would need that much memory in every reader "
                        f"({error}); compress it again without --long, or with --long=27 or less"
                    ) from None
                raise ValueError(
                    f"{self.name}: the {self.form} stream is damaged near compressed byte "
                    f"{self._raw.tell()} ({error}); fetch or copy the file again"
                ) from None
            if not self._decompress.eof:
                break
            data = self._decompress.unused_data  # the next member or frame
            self._decompress, self._started = self._new(), False
        return pieces

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            offset += self._position
        elif whence == io.SEEK_END:
            while self.read(1 << 20):
                pass
            offset += self._position
        elif whence != io.SEEK_SET:
            raise ValueError(f"invalid whence ({whence})")
        if offset < 0:
            raise ValueError(f"negative seek position {offset}")
        if offset < self._position:
            self._rewind()
        while self._position < offset:
            if self._at == len(self._pending) and not self._fill():
                break
            step = min(offset - self._position, len(self._pending) - self._at)
            self._at += step
            self._position += step
        return self._position

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()
