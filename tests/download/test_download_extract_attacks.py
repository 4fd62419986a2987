"""Extraction of archives built to fool the extractor: link chains, lying headers, wrong
names, bombs, damage. Each runs with `tarfile`'s data filter on and, where it matters, off
(as on Python versions without it), and checks that nothing lands outside or gets
published."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import struct
import subprocess
import sys
import tarfile
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any, Optional

import pytest

from framework import errors
from framework.download import DownloadManager
from framework.download._cache import HOST, Entry, work_folder
from framework.download._extract import ExtractLimits, extract_archive, extracted_from
from framework.errors import DownloadError, UnsafeArchiveError
from tests.support.download import cache_files

pytestmark = pytest.mark.timeout(60)

URL = "https://example.org/archive"
Member = tuple[tarfile.TarInfo, bytes]


def _file(name: str, data: bytes = b"payload") -> Member:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> Member:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, b""


def _tar(path: Path, members: list[Member], mode: str = "w") -> Path:
    with tarfile.open(path, mode, format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def _zip(path: Path, files: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", method) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


@pytest.fixture(params=["data-filter", "no-data-filter"])
def data_filter(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run with the stdlib's data filter, and as on a Python without it."""
    if request.param == "no-data-filter":
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    elif not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python has no tarfile data filter")
    return str(request.param)


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """The folder holding the extraction target: an escape would land here."""
    folder = tmp_path / "out"
    folder.mkdir()
    return folder


def _extract(archive: Path, out: Path, limits: Optional[ExtractLimits] = None) -> Path:
    return extract_archive(archive, out / "a-extracted", URL, limits or ExtractLimits(), replace=False)


def _assert_nothing_left(out: Path) -> None:
    """Nothing published, nothing escaped, no temporary folder left behind."""
    assert sorted(os.listdir(out)) == []


SYMLINK_CHAINS = {
    # x first points inside (a does not exist yet); a -> . then sends it outside.
    "write-through-chain": [
        _link("x", "a/../escaped.txt"),
        _link("a", "."),
        _file("x", b"written outside"),
    ],
    # No member is written through the chain, but the tree left behind points outside.
    "dangling-chain": [_link("x", "a/../escaped.txt"), _link("a", ".")],
    # A hard link made through the chain would be a second name of the outside file.
    "hard-link-through-chain": [
        _link("x", "a/../escaped.txt"),
        _link("a", "."),
        _link("h", "x", tarfile.LNKTYPE),
    ],
}


@pytest.mark.parametrize("case", sorted(SYMLINK_CHAINS))
def test_symlink_chain_cannot_escape(tmp_path: Path, out: Path, data_filter: str, case: str) -> None:
    (out / "escaped.txt").write_bytes(b"victim")  # a file the chain would reach
    archive = _tar(tmp_path / "chain.tar", SYMLINK_CHAINS[case])
    with pytest.raises(UnsafeArchiveError) as info:
        _extract(archive, out)
    assert info.value.url == URL and info.value.member in ("x", "h")
    assert (out / "escaped.txt").read_bytes() == b"victim"
    assert sorted(os.listdir(out)) == ["escaped.txt"]


def test_member_under_a_symlinked_folder_refused(tmp_path: Path, out: Path, data_filter: str) -> None:
    # d -> a/.. is inside while a does not exist; after a -> . it is the parent of the target.
    members = [_link("d", "a/.."), _link("a", "."), _file("d/escaped.txt", b"evil")]
    with pytest.raises(UnsafeArchiveError, match="symlink") as info:
        _extract(_tar(tmp_path / "parent.tar", members), out)
    assert info.value.member in ("d/escaped.txt", "d")
    _assert_nothing_left(out)


def test_member_under_an_inside_symlink_is_refused_too(tmp_path: Path, out: Path) -> None:
    members = [_file("real/keep.txt"), _link("alias", "real"), _file("alias/new.txt")]
    with pytest.raises(UnsafeArchiveError, match="its folder 'alias' is a symlink") as info:
        _extract(_tar(tmp_path / "alias.tar", members), out)
    assert info.value.member == "alias/new.txt"
    _assert_nothing_left(out)


def test_links_inside_the_tree_still_work(tmp_path: Path, out: Path, data_filter: str) -> None:
    members = [
        _file("data/a.txt", b"alpha"),
        _link("data/link", "a.txt"),
        _link("top", "data"),
        _link("data/hard", "data/a.txt", tarfile.LNKTYPE),
        _file("data/a.txt", b"replaced"),  # a duplicate replaces the file, not its hard link
        _link("data/other", "a.txt"),
        _link("data/other", "hard"),  # a link may replace a link (appended tars repeat members)
    ]
    folder = _extract(_tar(tmp_path / "ok.tar", members), out)
    assert (folder / "data/link").read_bytes() == b"replaced"
    assert (folder / "top/a.txt").read_bytes() == b"replaced"
    assert (folder / "data/hard").read_bytes() == b"alpha"
    assert os.readlink(folder / "data/other") == "hard"


def test_format_detected_by_content_not_name(tmp_path: Path, out: Path) -> None:
    zipped = _zip(tmp_path / "really-a-zip.tar.gz", {"z.txt": b"zip"})
    assert (_extract(zipped, out) / "z.txt").read_bytes() == b"zip"
    tarred = _tar(tmp_path / "really-a-tar.zip", [_file("t.txt", b"tar")], "w:xz")
    target = extract_archive(tarred, out / "b-extracted", URL, ExtractLimits(), replace=False)
    assert (target / "t.txt").read_bytes() == b"tar"


def test_nested_archive_stays_a_file(tmp_path: Path, out: Path) -> None:
    # A plain tar ending in a zip member: the zip's end record sits near the end of the
    # file, where a reader that looks only there would take the whole file for that zip.
    inner = _zip(tmp_path / "inner.zip", {"inner.txt": b"from the inner zip"}).read_bytes()
    archive = _tar(tmp_path / "outer.tar", [_file("outer.txt", b"outer"), _file("inner.zip", inner)])
    assert zipfile.is_zipfile(archive)  # the trap is set
    folder = _extract(archive, out)
    assert sorted(os.listdir(folder)) == ["inner.zip", "outer.txt"]
    assert (folder / "inner.zip").read_bytes() == inner


def test_too_many_members_refused(tmp_path: Path, out: Path) -> None:
    limits = ExtractLimits(max_members=50)
    members = [_file(f"f{i:03d}", b"") for i in range(100)]
    with pytest.raises(UnsafeArchiveError, match="more than 50 members") as info:
        _extract(_tar(tmp_path / "many.tar", members), out, limits)
    assert info.value.member == "f050"
    zipped = _zip(tmp_path / "many.zip", {f"f{i:03d}": b"" for i in range(100)})
    with pytest.raises(UnsafeArchiveError, match="more than 50 members"):
        _extract(zipped, out, limits)
    _assert_nothing_left(out)


def test_manager_passes_the_member_cap(tmp_path: Path, cache: Path) -> None:
    manager = DownloadManager(cache, progress=False, max_extract_members=10)
    archive = _tar(tmp_path / "many.tar", [_file(f"f{i}", b"") for i in range(20)])
    with pytest.raises(UnsafeArchiveError, match="more than 10 members"):
        manager.cached_path(archive, extract=True)
    assert not Entry(cache, archive.resolve().as_uri()).extracted.exists()


def _set_zip_sizes(data: bytes, size: int) -> bytes:
    """Rewrite every local and central header of a zip to claim `size` uncompressed bytes."""
    buffer = bytearray(data)
    for signature, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        start = buffer.find(signature)
        while start >= 0:
            struct.pack_into("<I", buffer, start + offset, size)
            start = buffer.find(signature, start + 4)
    return bytes(buffer)


def test_zip_lying_about_sizes_is_capped(tmp_path: Path, out: Path) -> None:
    honest = _zip(tmp_path / "honest.zip", {"zeros.bin": bytes(8 << 20)})
    liar = tmp_path / "liar.zip"
    liar.write_bytes(_set_zip_sizes(honest.read_bytes(), 100))
    assert zipfile.ZipFile(liar).getinfo("zeros.bin").file_size == 100  # the lie is read
    with pytest.raises(DownloadError) as info:
        _extract(liar, out, ExtractLimits(max_ratio=10))
    assert isinstance(info.value, (UnsafeArchiveError, errors.CorruptArchiveError))
    assert info.value.url == URL
    _assert_nothing_left(out)


def test_tar_declaring_a_huge_size_refused(tmp_path: Path, out: Path) -> None:
    # The header claims 40 GiB; the archive holds a few bytes of it.
    info, _ = _file("huge.bin")
    info.size = 40 << 30
    archive = tmp_path / "huge.tar"
    archive.write_bytes(info.tobuf(tarfile.GNU_FORMAT) + b"x" * 512 + bytes(1024))
    with pytest.raises(UnsafeArchiveError, match=r"ratio|size cap") as error:
        _extract(archive, out)
    assert error.value.member == "huge.bin"
    _assert_nothing_left(out)


def test_sparse_member_refused(tmp_path: Path, out: Path) -> None:
    # A GNU sparse member (PAX 0.1 map): one byte stored, written at a 1 GiB offset.
    info, data = _file("sparse.bin", b"x")
    info.pax_headers = {"GNU.sparse.map": f"{1 << 30},1", "GNU.sparse.size": "1"}
    archive = _tar(tmp_path / "sparse.tar", [(info, data)])
    with tarfile.open(archive) as tar:
        assert tar.getmember("sparse.bin").issparse()
    with pytest.raises(UnsafeArchiveError, match="sparse"):
        _extract(archive, out)
    _assert_nothing_left(out)


def test_gzip_bomb_refused(tmp_path: Path, out: Path) -> None:
    # Many modest members of zeros: no single header looks large, the stream does.
    members = [_file(f"z{i:02d}", bytes(256 << 10)) for i in range(64)]
    archive = _tar(tmp_path / "bomb.tar.gz", members, "w:gz")
    assert archive.stat().st_size < 200_000
    with pytest.raises(UnsafeArchiveError, match="ratio"):
        _extract(archive, out, ExtractLimits(max_ratio=50))
    _assert_nothing_left(out)


def _truncate(path: Path, keep: float = 0.5) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def _corrupt_stored_zip(path: Path) -> Path:
    _zip(path, {"a.txt": b"A" * 4000}, zipfile.ZIP_STORED)
    data = bytearray(path.read_bytes())
    data[data.find(b"AAAA") + 100] = ord("B")  # the CRC no longer matches
    path.write_bytes(bytes(data))
    return path


def _corrupt_deflate_zip(path: Path) -> Path:
    _zip(path, {"a.bin": os.urandom(20000)})
    data = bytearray(path.read_bytes())
    for i in range(200, 260):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


CORRUPT = {
    "truncated-tar": lambda p: _truncate(_tar(p, [_file("a", os.urandom(20000))])),
    "truncated-tar-gz": lambda p: _truncate(_tar(p, [_file("a", os.urandom(20000))], "w:gz")),
    "truncated-tar-bz2": lambda p: _truncate(_tar(p, [_file("a", os.urandom(20000))], "w:bz2")),
    "truncated-tar-xz": lambda p: _truncate(_tar(p, [_file("a", os.urandom(20000))], "w:xz")),
    "truncated-zip": lambda p: _truncate(_zip(p, {"a": os.urandom(20000)})),
    "bad-crc-zip": _corrupt_stored_zip,
    "broken-deflate-zip": _corrupt_deflate_zip,
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_archive_is_a_download_error(tmp_path: Path, out: Path, case: str) -> None:
    archive = CORRUPT[case](tmp_path / "damaged")
    with pytest.raises(errors.CorruptArchiveError) as info:
        _extract(archive, out)
    assert info.value.url == URL and "damaged or truncated" in str(info.value)
    _assert_nothing_left(out)


def test_corrupt_archive_through_the_manager_publishes_no_folder(tmp_path: Path, cache: Path) -> None:
    archive = _truncate(_tar(tmp_path / "cut.tar.gz", [_file("a", os.urandom(50000))], "w:gz"))
    manager = DownloadManager(cache, progress=False)
    with pytest.raises(errors.CorruptArchiveError) as info:
        manager.cached_path(archive, extract=True)
    assert info.value.url == archive.resolve().as_uri()
    entry = Entry(cache, archive.resolve().as_uri())
    assert not entry.extracted.exists()
    assert not [p for p in cache.iterdir() if p.name.endswith((".tmp", ".old"))]


@pytest.mark.parametrize("refetch", ["force", "new-sha256"])
def test_extracted_folder_follows_a_refetched_archive(tmp_path: Path, cache: Path, refetch: str) -> None:
    # A refetch without extract=True, then extract=True: the folder must be the new archive's.
    source = tmp_path / "data.tar"
    _tar(source, [_file("version.txt", b"one")])
    manager = DownloadManager(cache, progress=False)
    assert (manager.cached_path(source, extract=True) / "version.txt").read_bytes() == b"one"
    _tar(source, [_file("version.txt", b"two")])
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    if refetch == "force":
        manager.cached_path(source, force=True)
    else:
        manager.cached_path(source, sha256=digest)
    folder = manager.cached_path(source, sha256=digest, extract=True)
    assert (folder / "version.txt").read_bytes() == b"two"
    assert (manager.cached_path(source, extract=True) / "version.txt").read_bytes() == b"two"


def test_a_dead_extractors_leftover_marker_file_is_swept(tmp_path: Path, out: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a pid that no longer runs
    leftover = work_folder(out / "a-extracted") / f"a-extracted.json.{HOST}.{child.pid}.deadbeef.tmp"
    leftover.parent.mkdir()
    leftover.write_text("{}")
    folder = _extract(_tar(tmp_path / "ok.tar", [_file("f.txt")]), out)
    assert cache_files(out) == [folder.name]


def test_member_named_through_a_link_is_written_inside(tmp_path: Path, out: Path, data_filter: str) -> None:
    # tarfile joins the raw name: root/a/../escaped.txt resolves through a -> . to `out`.
    members = [_link("a", "."), _file("a/../escaped.txt", b"planted")]
    try:
        folder = _extract(_tar(tmp_path / "through.tar", members), out)
    except UnsafeArchiveError:
        _assert_nothing_left(out)
        return
    assert sorted(os.listdir(out)) == [folder.name]
    assert (folder / "escaped.txt").read_bytes() == b"planted"


def test_hard_link_named_through_a_link_stays_inside(tmp_path: Path, out: Path, data_filter: str) -> None:
    victim = out / "victim.txt"
    victim.write_bytes(b"secret next to the extraction folder")
    members = [_link("a", "."), _file("victim.txt", b"decoy"), _link("h", "a/../victim.txt", tarfile.LNKTYPE)]
    try:
        folder = _extract(_tar(tmp_path / "hard.tar", members), out)
    except UnsafeArchiveError:
        assert sorted(os.listdir(out)) == ["victim.txt"]
        return
    assert not os.path.samefile(folder / "h", victim)
    assert (folder / "h").read_bytes() == b"decoy"
    assert victim.stat().st_nlink == 1


def test_unsafe_modes_are_not_applied(tmp_path: Path, out: Path, data_filter: str) -> None:
    root_info, _ = _file(".")
    root_info.type, root_info.mode = tarfile.DIRTYPE, 0o777
    tool, body = _file("tool", b"#!/bin/sh\nid\n")
    tool.mode = 0o6777
    sub, _ = _file("sub")
    sub.type, sub.mode = tarfile.DIRTYPE, 0o1777
    folder = _extract(_tar(tmp_path / "modes.tar", [(root_info, b""), (tool, body), (sub, b"")]), out)
    risky = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWGRP | stat.S_IWOTH
    for path in (folder, folder / "tool", folder / "sub"):
        assert stat.S_IMODE(os.stat(path).st_mode) & risky == 0, path
    assert os.stat(folder / "tool").st_mode & stat.S_IXUSR  # an executable stays executable


def _pax_tar(path: Path, pax: dict[str, str]) -> Path:
    info, data = _file("ok.txt", b"x")
    info.pax_headers = pax
    return _tar(path, [(info, data)])


HOSTILE_HEADERS = {
    "nul-name": lambda p: _pax_tar(p, {"path": "a\x00b.txt"}),
    "nan-mtime": lambda p: _pax_tar(p, {"mtime": "nan"}),
    "inf-mtime": lambda p: _pax_tar(p, {"mtime": "1e400"}),
    "bad-hdrcharset": lambda p: p.write_bytes(
        _pax_tar(p, {"hdrcharset": "ZZ"}).read_bytes().replace(b"hdrcharset=ZZ", b"hdrcharset=\xff\xfe")
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_HEADERS))
def test_hostile_tar_headers_are_download_errors(tmp_path: Path, cache: Path, case: str) -> None:
    archive = tmp_path / "hostile.tar"
    HOSTILE_HEADERS[case](archive)
    with pytest.raises((errors.CorruptArchiveError, UnsafeArchiveError)) as info:
        DownloadManager(cache, progress=False).cached_path(archive, extract=True)
    assert info.value.url == archive.resolve().as_uri()
    assert not Entry(cache, archive.resolve().as_uri()).extracted.exists()


def test_encrypted_zip_member_refused(tmp_path: Path, out: Path) -> None:
    raw = bytearray(
        _zip(tmp_path / "enc.zip", {"secret.txt": b"0123456789"}, zipfile.ZIP_STORED).read_bytes()
    )
    raw[6] |= 1  # the "encrypted" flag, in the local header and the central directory
    raw[raw.find(b"PK\x01\x02") + 8] |= 1
    (tmp_path / "enc.zip").write_bytes(bytes(raw))
    with pytest.raises(UnsafeArchiveError, match="encrypted") as info:
        _extract(tmp_path / "enc.zip", out)
    assert info.value.member == "secret.txt"
    _assert_nothing_left(out)


def test_tar_starting_with_the_zip_magic_is_not_read_as_its_inner_zip(tmp_path: Path, out: Path) -> None:
    # A valid tar whose first member is named PK\x03\x04..., ending in a zip member.
    inner = _zip(tmp_path / "inner.zip", {"from_inner_zip.txt": b"hidden"}).read_bytes()
    archive = tmp_path / "data.tar"
    with tarfile.open(archive, "w", format=tarfile.USTAR_FORMAT) as tar:
        for info, data in (_file("PK\x03\x04readme.txt", b"benign"), _file("inner.zip", inner)):
            tar.addfile(info, io.BytesIO(data))
    raw = archive.read_bytes().rstrip(b"\0")  # the zip's end record at the end of the file
    archive.write_bytes(raw + b"\0" * (-len(raw) % 512))
    try:
        folder = _extract(archive, out)
    except DownloadError as error:
        assert "both as a tar" in str(error)
        _assert_nothing_left(out)
        return
    assert "from_inner_zip.txt" not in os.listdir(folder)


def test_extraction_folder_is_private_until_published(
    tmp_path: Path, out: Path, data_filter: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from framework.download import _extract as extract_module

    modes: list[int] = []
    original = extract_module._extract_tar

    def watching(archive: Any, root: str, limits: ExtractLimits, url: str) -> None:
        modes.append(stat.S_IMODE(os.stat(root).st_mode))
        original(archive, root, limits, url)
        modes.append(stat.S_IMODE(os.stat(root).st_mode))

    monkeypatch.setattr(extract_module, "_extract_tar", watching)
    os.chmod(out, 0o2777)  # a shared, even world-writable, cache folder
    root_info, _ = _file(".")
    root_info.type, root_info.mode = tarfile.DIRTYPE, 0o777
    folder = _extract(_tar(tmp_path / "p.tar", [(root_info, b""), _file("f.txt")]), out)
    assert modes and all(mode & 0o077 == 0 for mode in modes)  # nobody else can plant a link
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o775  # the cache folder's, never other-writable


def test_a_folder_published_by_another_process_is_not_vouched_for(tmp_path: Path, out: Path) -> None:
    theirs = out / "a-extracted"
    theirs.mkdir()
    (theirs / "theirs.txt").write_text("from another archive")
    archive = _tar(tmp_path / "ours.tar", [_file("ours.txt")])
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    folder = extract_archive(archive, theirs, URL, ExtractLimits(), replace=False, digest=digest)
    assert folder == theirs and os.listdir(folder) == ["theirs.txt"]
    assert not extracted_from(folder, digest)  # our digest is never written onto their folder


def _pax_bomb(path: Path, size: int) -> Path:
    """A tar.gz whose first block is a pax extended header declaring `size` bytes (of
    zeros, so it compresses about 1000:1): no member, no declared member size."""
    header = tarfile.TarInfo("././@PaxHeader")
    header.type, header.size = tarfile.XHDTYPE, size
    with gzip.GzipFile(path, "wb", compresslevel=1, mtime=0) as archive:
        archive.write(header.tobuf(format=tarfile.USTAR_FORMAT))
        for _ in range(size >> 20):
            archive.write(bytes(1 << 20))
        archive.write(bytes(1024))
    return path


@pytest.mark.timeout(120)
def test_a_pax_header_bomb_is_refused_at_the_cap_not_read_into_memory(tmp_path: Path) -> None:
    """The caps (total size, ratio) bound what an archive expands to. A pax extended
    header is read by tarfile in one `read()` of its declared size before the first
    member is seen: a 0.3 MB tar.gz took 64 MiB of memory (a 45 MB one, 10 GiB) and
    was then only called damaged. It is refused before it is read."""
    archive = _pax_bomb(tmp_path / "bomb.tar.gz", 64 << 20)
    assert archive.stat().st_size < 400_000
    tracemalloc.start()
    try:
        with pytest.raises(DownloadError) as info:
            extract_archive(
                archive,
                tmp_path / "out",
                "https://x/bomb.tar.gz",
                ExtractLimits(1 << 20, 50.0, 100),
                replace=True,
            )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not (tmp_path / "out").exists()
    assert peak < 16 << 20, f"{peak} bytes of memory for a {archive.stat().st_size}-byte archive"
    assert isinstance(info.value, UnsafeArchiveError), info.value
