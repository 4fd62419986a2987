"""Extraction: atomic publish, and every kind of unsafe archive refused by member name."""

from __future__ import annotations

import io
import json
import os
import signal
import stat
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

from framework.download import DownloadManager
from framework.download._cache import Entry
from framework.download._extract import check_member_path
from framework.errors import DownloadError, UnsafeArchiveError
from tests.support.download import FORK, FaultServer, cache_files, stray_files, wait_for

pytestmark = pytest.mark.timeout(30)

FILES = {"data/a.txt": b"alpha\n", "data/sub/b.bin": os.urandom(5000), "README": b"readme"}


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes]], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tar:  # type: ignore[call-overload]
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return path


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def _special(name: str, kind: bytes, link: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info, b""


def _good_members() -> list[tuple[tarfile.TarInfo, bytes]]:
    members = [_file(name, data) for name, data in FILES.items()]
    members.append(_special("data/link", tarfile.SYMTYPE, "a.txt"))
    members.append(_special("data/hard", tarfile.LNKTYPE, "data/a.txt"))
    return members


def _check_tree(folder: Path) -> None:
    for name, data in FILES.items():
        assert (folder / name).read_bytes() == data
    assert (folder / "data/link").read_bytes() == FILES["data/a.txt"]
    assert (folder / "data/hard").read_bytes() == FILES["data/a.txt"]


@pytest.mark.parametrize("mode", ["w", "w:gz", "w:bz2", "w:xz"])
def test_good_tar_extracted_atomically(tmp_path: Path, manager: DownloadManager, mode: str) -> None:
    archive = _tar(tmp_path / "good.tar", _good_members(), mode)
    folder = manager.cached_path(archive, extract=True)
    assert folder.is_dir() and folder.name.endswith("-extracted")
    assert folder.parent == manager.cache_dir
    _check_tree(folder)
    assert manager.cached_path(archive, extract=True) == folder
    assert stray_files(manager.cache_dir) == []


def test_good_zip_extracted_and_force_reextracts(tmp_path: Path, manager: DownloadManager) -> None:
    archive = tmp_path / "good.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in FILES.items():
            zf.writestr(name, data)
    folder = manager.cached_path(archive, extract=True)
    for name, data in FILES.items():
        assert (folder / name).read_bytes() == data
    (folder / "README").write_bytes(b"edited")
    assert manager.cached_path(archive, extract=True) == folder
    assert (folder / "README").read_bytes() == b"edited"  # a hit does not re-extract
    assert manager.cached_path(archive, extract=True, force=True) == folder
    assert (folder / "README").read_bytes() == b"readme"
    assert stray_files(manager.cache_dir) == []


UNSAFE_TARS = {
    "absolute": ([_file("/etc/evil")], "/etc/evil"),
    "dotdot": ([_file("data/../../evil")], "data/../../evil"),
    "sibling-prefix": ([_file("../x-extracted-evil/f")], "../x-extracted-evil/f"),
    "symlink-absolute": ([_special("link", tarfile.SYMTYPE, "/etc/passwd")], "link"),
    "symlink-outside": ([_special("d/link", tarfile.SYMTYPE, "../../outside")], "d/link"),
    "hardlink-outside": ([_special("hard", tarfile.LNKTYPE, "../outside")], "hard"),
    "char-device": ([_special("dev", tarfile.CHRTYPE)], "dev"),
    "block-device": ([_special("blk", tarfile.BLKTYPE)], "blk"),
    "fifo": ([_special("fifo", tarfile.FIFOTYPE)], "fifo"),
}


@pytest.mark.parametrize("case", sorted(UNSAFE_TARS))
def test_unsafe_tar_member_refused(tmp_path: Path, manager: DownloadManager, case: str) -> None:
    members, bad = UNSAFE_TARS[case]
    archive = _tar(tmp_path / f"{case}.tar.gz", [_file("ok.txt"), *members])
    with pytest.raises(UnsafeArchiveError) as info:
        manager.cached_path(archive, extract=True)
    assert info.value.member == bad and repr(bad) in str(info.value)
    assert not Entry(manager.cache_dir, archive.resolve().as_uri()).extracted.exists()
    assert stray_files(manager.cache_dir) == []
    assert not (tmp_path / "outside").exists() and not (tmp_path / "evil").exists()


def test_sibling_prefix_is_not_inside() -> None:
    root = "/srv/cache/data"
    with pytest.raises(UnsafeArchiveError, match="escapes"):
        check_member_path(root, "../data-evil/payload", "u")
    assert check_member_path(root, "sub/../ok", "u") == "/srv/cache/data/ok"


@pytest.mark.parametrize("name", ["/abs.txt", "../up.txt", "a/../../up.txt"])
def test_unsafe_zip_member_refused(tmp_path: Path, manager: DownloadManager, name: str) -> None:
    archive = tmp_path / "bad.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("ok.txt", b"fine")
        zf.writestr(zipfile.ZipInfo(name), b"evil")  # ZipInfo keeps the name as given
    with pytest.raises(UnsafeArchiveError) as info:
        manager.cached_path(archive, extract=True)
    assert info.value.member == name
    assert stray_files(manager.cache_dir) == []


def test_zip_bomb_ratio_refused(tmp_path: Path, manager: DownloadManager) -> None:
    archive = tmp_path / "bomb.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("small.txt", b"fine")
        zf.writestr("zeros.bin", bytes(8 << 20))
    assert archive.stat().st_size < 100_000
    with pytest.raises(UnsafeArchiveError, match="ratio") as info:
        manager.cached_path(archive, extract=True)
    assert info.value.member == "zeros.bin"


def test_tar_bomb_ratio_refused(tmp_path: Path, manager: DownloadManager) -> None:
    archive = _tar(tmp_path / "bomb.tar.gz", [_file("zeros.bin", bytes(8 << 20))])
    with pytest.raises(UnsafeArchiveError, match="ratio") as info:
        manager.cached_path(archive, extract=True)
    assert info.value.member == "zeros.bin"


def test_total_size_cap_refused(tmp_path: Path, cache: Path) -> None:
    manager = DownloadManager(cache, progress=False, max_extract_size=10_000)
    archive = _tar(tmp_path / "big.tar", [_file("a", os.urandom(6000)), _file("b", os.urandom(6000))])
    with pytest.raises(UnsafeArchiveError, match="size cap") as info:
        manager.cached_path(archive, extract=True)
    assert info.value.member == "b"
    assert not any(p.name.endswith("-extracted") for p in cache.iterdir())


def test_not_an_archive(tmp_path: Path, manager: DownloadManager) -> None:
    plain = tmp_path / "plain.txt"
    plain.write_bytes(b"just text")
    with pytest.raises(DownloadError, match="not a tar or zip"):
        manager.cached_path(plain, extract=True)


def _slow_extract(archive: str, cache: str) -> None:
    real = tarfile.TarFile.extract

    def slow(self: Any, *args: Any, **kwargs: Any) -> Any:
        import time

        time.sleep(0.02)
        return real(self, *args, **kwargs)

    tarfile.TarFile.extract = slow  # type: ignore[method-assign]
    DownloadManager(cache, progress=False).cached_path(archive, extract=True)


def test_extraction_killed_midway_leaves_no_final_folder(tmp_path: Path, cache: Path) -> None:
    members = [_file(f"f{i:03d}.txt", b"%d" % i) for i in range(300)]
    archive = _tar(tmp_path / "many.tar", members, "w")
    entry = Entry(cache, archive.resolve().as_uri())
    proc = FORK.Process(target=_slow_extract, args=(str(archive), str(cache)))
    proc.start()
    try:
        wait_for(
            lambda: any(
                p.name.endswith(".tmp") and len(os.listdir(p)) > 5
                for p in (cache / name for name in cache_files(cache))
                if p.is_dir()
            ),
            what="extraction under way",
        )
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=10)
    assert entry.final.exists() and not entry.extracted.exists()
    folder = DownloadManager(cache, progress=False).cached_path(archive, extract=True)
    assert sorted(os.listdir(folder)) == [f"f{i:03d}.txt" for i in range(300)]
    assert stray_files(cache) == []  # the dead extractor's folder was swept


# -- planted folders, and files replaced after their check -------------------------------


def _zip(text: str) -> bytes:
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("model.py", text)
    return buffer.getvalue()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("planted", ["symlink", "folder"])
def test_planted_extracted_folder_is_never_served(
    http_server: FaultServer, manager: DownloadManager, cache: Path, tmp_path: Path, planted: str
) -> None:
    url = http_server.add(f"/extract/planted-{planted}.zip", _zip("real"))
    manager.cached_path(url)  # fetched, not extracted yet
    entry = Entry(cache, url)
    digest = json.loads(entry.sidecar.read_text())["sha256"]  # anyone can read it
    evil = tmp_path / "attacker"
    evil.mkdir()
    (evil / "model.py").write_text("evil")
    if planted == "symlink":
        entry.extracted.symlink_to(evil)
    else:  # a real folder renamed into place, with a marker naming another folder
        os.rename(evil, entry.extracted)
    folder = os.stat(entry.extracted)
    marker = entry.extracted.with_name(entry.extracted.name + ".json")
    marker.write_text(json.dumps({"sha256": digest, "folder": [folder.st_dev, folder.st_ino + 1]}))
    got = manager.cached_path(url, extract=True)
    assert stat.S_ISDIR(os.lstat(got).st_mode) and (got / "model.py").read_text() == "real"
    if planted == "symlink":
        assert (evil / "model.py").read_text() == "evil"  # followed by nothing
    assert not [n for n in os.listdir(cache) if n.endswith(".old")]


# -- Trust in a shared cache -------------------------------------------------------------


def _extract_while_swapped(cache: str, url: str, evil: str, mode: str, results: Any) -> None:
    from framework.download import manager as manager_module

    real = Entry.cached

    def swap_after_the_check(entry: Entry) -> Any:
        meta = real(entry)
        caller, above = sys._getframe(1).f_code.co_name, sys._getframe(2).f_code.co_name
        # The neighbour's rename lands after the check (where extraction once took the digest).
        if caller == "_open_published" or (caller, above) == ("_digest", "cached_path"):
            temp = entry.final.with_name("swap.tmp")
            if mode == "fifo":
                os.mkfifo(temp)
            else:
                temp.symlink_to(evil)
            os.rename(temp, entry.final)
        return meta

    Entry.cached = swap_after_the_check  # type: ignore[method-assign]
    try:
        folder = manager_module.DownloadManager(cache, progress=False).cached_path(url, extract=True)
        results.put((folder / "model.py").read_text())
    except DownloadError as error:
        results.put(f"DownloadError: {error}")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["fifo", "symlink"])
def test_extraction_reads_the_verified_file_never_what_replaced_it(
    http_server: FaultServer, manager: DownloadManager, cache: Path, tmp_path: Path, mode: str
) -> None:
    url = http_server.add(f"/extract/swapped-{mode}.zip", _zip("real"))
    manager.cached_path(url)
    evil = tmp_path / "evil.zip"
    evil.write_bytes(_zip("evil"))
    results = FORK.Queue()
    child = FORK.Process(target=_extract_while_swapped, args=(str(cache), url, str(evil), mode, results))
    child.start()
    try:
        outcome = results.get(timeout=30)
    except Exception:
        outcome = "hung"
    finally:
        child.kill()
        child.join(timeout=10)
    assert outcome.startswith("DownloadError: ") and "was replaced after it was verified" in outcome, outcome
    assert not Entry(cache, url).extracted.exists()
