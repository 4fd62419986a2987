"""`ReadPace`: a body is read as it arrives while a ramp times it, in larger reads once
its reader is steady (counted reads, never timed)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from framework.download import DownloadManager, backend
from framework.download._pipeline import Pipeline
from framework.download.backend import ReadPace
from framework.download.parallel import _engine
from tests.support.download import PART, FaultServer, parts_manager, unique_path

MIB = 1 << 20
# 16 KiB pieces 1 ms apart (about 14 MiB/s a connection): fast enough for steady reads.
BRISK: dict[str, Any] = {"chunk": 16 << 10, "delay": 0.001}


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


class _Body:
    """A body of `size` bytes; records which read was asked for how much."""

    def __init__(self, size: int) -> None:
        self.left = size
        self.asked: list[tuple[str, int]] = []

    def _give(self, kind: str, size: int, most: int) -> bytes:
        self.asked.append((kind, size))
        given = min(size, most, self.left)
        self.left -= given
        return b"x" * given

    def read1(self, size: int) -> bytes:
        return self._give("read1", size, 16 << 10)  # what has arrived: a small piece

    def read(self, size: int) -> bytes:
        return self._give("read", size, size)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(backend, "time", fake)
    return fake


def test_a_body_is_read_as_it_arrives_until_its_reader_is_steady(clock: _Clock) -> None:
    pace, body = ReadPace(), _Body(10 * MIB)
    for _ in range(5):
        assert pace.read(body.read1, body.read, None)
        clock.now += 0.001
    assert body.asked == [("read1", ReadPace.MOST)] * 5


@pytest.mark.parametrize(
    ("rate", "asked"),
    [
        (16 * MIB, ("read", int(16 * MIB * ReadPace.WINDOW_S))),  # the window's bytes at the rate seen
        (1 * MIB, ("read1", ReadPace.MOST)),  # a window under LEAST: what has arrived, as before
        (400 * MIB, ("read", ReadPace.MOST)),  # a fast link: no read over MOST (memory stays bounded)
    ],
)
def test_a_steady_reader_reads_a_window_of_bytes_at_the_rate_seen(
    clock: _Clock, rate: float, asked: tuple[str, int]
) -> None:
    pace, body = ReadPace(), _Body(100 * MIB)
    pace.read(body.read1, body.read, None)  # the first piece: when the body began to come
    pace.steady = True
    clock.now += 0.5
    pace._since_first = int(rate * 0.5)  # what came since the first piece
    pace._last = (0.01, int(rate * 0.01))  # and the last read, at the same rate
    pace.read(body.read1, body.read, None)
    assert body.asked[-1] == asked


def test_a_link_slowing_down_is_read_in_smaller_windows_at_once(clock: _Clock) -> None:
    pace, body = ReadPace(), _Body(100 * MIB)
    pace.read(body.read1, body.read, None)
    pace.steady = True
    clock.now += 0.5
    pace._since_first = 8 * MIB  # 16 MiB/s so far...
    pace._last = (0.1, int(0.4 * MIB))  # ...4 MiB/s in the last read
    pace.read(body.read1, body.read, None)
    assert body.asked[-1] == ("read", int(4 * MIB * ReadPace.WINDOW_S))


def test_a_read_never_asks_past_what_the_body_has_left(clock: _Clock) -> None:
    pace, body = ReadPace(), _Body(10 * MIB)
    pace.read(body.read1, body.read, None)
    pace.steady = True
    clock.now += 1.0
    pace._since_first = 100 * MIB
    pace._last = (0.01, 1 * MIB)
    pace.read(body.read1, body.read, 10)  # a range that ends in 10 bytes: a read past it would wait
    assert body.asked[-1] == ("read", 10)
    pace.wanted = 5  # nor past what the reader takes before it decides to read on
    pace._last = (0.01, 1 * MIB)
    pace.read(body.read1, body.read, None)
    assert body.asked[-1] == ("read", 5)
    pace.steady = False
    pace.read(body.read1, body.read, 10)
    assert body.asked[-1] == ("read1", 5)


def test_one_stream_over_a_slow_link_is_written_in_fewer_larger_chunks(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server sends 16 KiB pieces 1 ms apart (256 of them for 4 MiB); read as they
    arrive, each was a write. A steady single stream reads a window at a time."""
    puts: list[int] = []
    real_put = Pipeline.put

    def put(self: Pipeline, chunk: bytes) -> None:
        puts.append(len(chunk))
        real_put(self, chunk)

    monkeypatch.setattr(Pipeline, "put", put)
    data = os.urandom(4 * MIB)  # 0.3 s: a stream reads as it arrives for its first 0.1 s
    url = http_server.add(unique_path("paced"), data, **BRISK)
    with DownloadManager(tmp_path, connections=1, progress=False) as manager:
        assert manager.cached_path(url).read_bytes() == data
    assert sum(puts) == len(data)
    assert len(puts) <= 256 // 2, len(puts)


def test_parallel_parts_are_written_in_larger_chunks_once_the_count_is_settled(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chosen count settles at once after the probe: from then on each connection
    reads a window at a time (up to a part's end), not each 16 KiB piece."""
    writes: list[int] = []
    real_pwrite = _engine._pwrite

    def pwrite(fd: int, view: Any, offset: int) -> int:
        writes.append(len(view))
        return int(real_pwrite(fd, view, offset))

    monkeypatch.setattr(_engine, "_pwrite", pwrite)
    data = os.urandom(64 * PART)  # 16 MiB: 1,024 pieces of 16 KiB, too many for one stream to stay alone
    url = http_server.add(unique_path("paced-parts"), data, **BRISK)
    assert parts_manager(tmp_path, connections=2).cached_path(url).read_bytes() == data
    assert sum(writes) == len(data)
    assert len(writes) < 1024 * 3 // 4, len(writes)  # each request reads as it arrives for 0.1 s
