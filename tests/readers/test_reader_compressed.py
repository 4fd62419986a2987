"""The built-in readers over `.gz` and `.zst` files: a stream that seeks exactly, and a
clear error naming the file for one cut short, damaged, misnamed, or (zstd) without
the `zstandard` package."""

from __future__ import annotations

import bz2
import gzip
import io
import random
import sys
from pathlib import Path

import pytest
from framework_plugins.compressed import open_data_file

from framework.data.multiprocess import MultiProcessDataLoader
from framework.data.reader import DatasetReader
from framework.errors import WorkerError
from tests.support.compression import FORMS, compress, write

pytestmark = pytest.mark.timeout(60)

RAW = b"".join(b'{"id": %d, "text": "row %d"}\n' % (i, i) for i in range(3000))
COMPRESSED = [form for form in FORMS if form]


def _lines(path: Path) -> list[str]:
    return [record["text"] for record in DatasetReader.by_name("jsonl")().read(str(path))]


@pytest.mark.parametrize("form", FORMS)
def test_the_stream_reads_and_seeks_to_any_offset_of_the_decompressed_bytes(
    tmp_path: Path, form: str
) -> None:
    path = write(tmp_path / "data.jsonl", RAW, form)
    with open_data_file(path) as handle:
        assert b"".join(handle) == RAW
        generator = random.Random(0)
        for _ in range(50):  # forward and backward, across the member/frame boundary
            offset = generator.randrange(len(RAW) + 10)
            assert handle.seek(offset) == offset
            assert handle.read(40) == RAW[offset : offset + 40], offset


@pytest.mark.parametrize("form", COMPRESSED)
def test_a_stream_cut_short_is_an_error_naming_the_file(tmp_path: Path, form: str) -> None:
    whole = compress(RAW, form)
    path = tmp_path / f"data.jsonl{form}"
    path.write_bytes(whole[: len(whole) * 3 // 4])  # mid-way through the second member/frame
    with pytest.raises(ValueError, match=rf"data\.jsonl\{form}: the \w+ stream ends mid-stream .* truncated"):
        _lines(path)


@pytest.mark.parametrize("form", COMPRESSED)
def test_a_damaged_stream_is_an_error_naming_the_file(tmp_path: Path, form: str) -> None:
    damaged = bytearray(compress(RAW, form))
    middle = len(damaged) // 4  # inside the first member/frame's compressed data
    damaged[middle : middle + 8] = bytes(b ^ 0xFF for b in damaged[middle : middle + 8])
    path = tmp_path / f"data.jsonl{form}"
    path.write_bytes(bytes(damaged))
    with pytest.raises(ValueError, match=rf"data\.jsonl\{form}: the \w+ stream is damaged"):
        _lines(path)


def test_a_damaged_stream_in_a_worker_is_a_worker_error_naming_the_file(tmp_path: Path) -> None:
    whole = compress(RAW, ".gz")
    path = tmp_path / "data.jsonl.gz"
    path.write_bytes(whole[:-5])  # the last member's trailer (CRC, size) cut
    loader = MultiProcessDataLoader(
        DatasetReader.by_name("jsonl")(),
        str(path),
        batch_size=50,
        num_workers=1,
        max_instances_in_memory=100,
        quiet=True,
    )
    with pytest.raises(WorkerError, match=r"data\.jsonl\.gz: the gzip stream ends mid-stream"):
        list(loader)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("data.jsonl.gz", RAW, r"data\.jsonl\.gz is named \.gz but is not compressed"),
        ("data.jsonl.zst", compress(RAW, ".gz"), r"named \.zst but is gzip-compressed"),
        ("data.jsonl.gz", b"", r"named \.gz but is empty"),
        ("data.jsonl", compress(RAW, ".zst"), r"data\.jsonl holds zstd-compressed data .* data\.jsonl\.zst"),
        (
            "data.csv",
            gzip.compress(b"a,b\n1,2\n", mtime=0),
            r"holds gzip-compressed data .* rename it to data\.csv\.gz",
        ),
    ],
)
def test_a_misnamed_file_is_an_error_naming_the_file(
    tmp_path: Path, name: str, content: bytes, message: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        _lines(path)


def test_a_zst_file_without_zstandard_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path / "data.jsonl", RAW, ".zst")
    monkeypatch.setitem(sys.modules, "zstandard", None)  # `import zstandard` raises ImportError
    with pytest.raises(
        ImportError, match=r"data\.jsonl\.zst is zstd-compressed.*pip install 'framework\[zstd\]'"
    ):
        _lines(path)


@pytest.mark.parametrize("form", COMPRESSED)
def test_csv_and_text_read_compressed_files(tmp_path: Path, form: str) -> None:
    csv_path = write(tmp_path / "data.csv", b"id,text\n1,one\n2,two\n", form)
    rows = list(DatasetReader.by_name("csv")(field_types={"id": "int"}).read(str(csv_path)))
    assert rows == [{"id": 1, "text": "one"}, {"id": 2, "text": "two"}]
    text_path = write(tmp_path / "data.txt", b"first line\nsecond\n", form)
    assert [x["text"] for x in DatasetReader.by_name("text")().read(str(text_path))] == [
        "first line",
        "second",
    ]


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("name", ["data.jsonl.gz", "data.jsonl.bz2"])
def test_a_data_file_that_is_not_text_is_an_error_naming_the_file(
    tmp_path: Path, name: str, workers: int
) -> None:
    records = b'{"id": 1}\n' * 100
    path = tmp_path / name
    # compressed twice; or in a form that is read as it is
    path.write_bytes(gzip.compress(gzip.compress(records)) if name.endswith(".gz") else bz2.compress(records))
    loader = MultiProcessDataLoader(
        DatasetReader.by_name("jsonl")(),
        str(path),
        batch_size=5,
        num_workers=workers,
        max_instances_in_memory=10,
        quiet=True,
    )
    with pytest.raises(WorkerError) as raised:
        list(loader)
    assert name in str(raised.value).splitlines()[0]


def test_an_intact_long_window_zst_file_is_read_or_refused_for_what_it_is(tmp_path: Path) -> None:
    zstandard = pytest.importorskip("zstandard")
    raw = b'{"x": 1}\n' * 1000
    params = zstandard.ZstdCompressionParameters.from_level(
        19, window_log=30, enable_ldm=True, write_content_size=False
    )
    written = io.BytesIO()
    with zstandard.ZstdCompressor(compression_params=params).stream_writer(written, closefd=False) as sink:
        sink.write(raw)
    path = tmp_path / "data.jsonl.zst"
    path.write_bytes(written.getvalue())
    assert zstandard.get_frame_parameters(written.getvalue()).window_size == 1 << 30  # as --long=30 writes
    try:
        with open_data_file(path) as handle:
            assert handle.read() == raw
    except ValueError as error:  # refusing it is fine, as long as the cause is named
        assert "damaged" not in str(error) and "fetch or copy" not in str(error)
