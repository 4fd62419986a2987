"""`framework cache ls|verify|prune` and `framework.download.inventory` on caches that
`cached_path` filled from the HTTP test server: what is listed, what verify catches,
what prune removes (least recently used first) and what it never touches (an entry
another process holds the lock of, a user's own files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import filelock
import pytest

from framework.cli import main
from framework.download import DownloadManager
from framework.download._cache import Entry, unique_token, work_folder
from framework.download.inventory import entries, prune, remove, stale_files
from framework.download.sizes import format_size, parse_size
from tests.support.download import (
    FORK,
    FaultServer,
    cache_files,
    end_child,
    one_member_tar,
    planted_partial,
    unique_path,
)

pytestmark = pytest.mark.timeout(60)

KB = 1000


def _fill(server: FaultServer, manager: DownloadManager, sizes: list[int]) -> list[str]:
    """One URL per size, fetched into the manager's cache, in that order."""
    urls = []
    for index, size in enumerate(sizes):
        url = server.add(unique_path(f"inv-{index}"), os.urandom(size))
        manager.cached_path(url)
        urls.append(url)
    return urls


def _age(cache: Path, url: str, seconds_ago: float) -> None:
    """Set `url`'s access time to `seconds_ago` (its sidecar's fetch time stays: see `_age_all`)."""
    path = Entry(cache, url).final
    info = os.lstat(path)
    stamp = time.time() - seconds_ago
    os.utime(path, ns=(int(stamp * 1e9), info.st_mtime_ns))  # the mtime binds the sidecar: kept


def _age_all(cache: Path, urls: list[str]) -> None:
    """Every entry last used hours ago, the first the longest ago; sidecars dated alike."""
    for rank, url in enumerate(urls):
        entry = Entry(cache, url)
        meta = json.loads(entry.sidecar.read_text())
        meta["time"] = time.time() - 7200 - 60 * (len(urls) - rank)
        entry.sidecar.write_text(json.dumps(meta))
        _age(cache, url, 7200 + 60 * (len(urls) - rank))


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["cache", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_ls_lists_each_fetched_url_with_its_size_and_a_total(
    http_server: FaultServer, manager: DownloadManager, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    urls = _fill(http_server, manager, [1000, 25 * KB, 300 * KB])
    secret = http_server.add(unique_path("signed") + "?token=hunter2", b"s" * 777)
    manager.cached_path(secret)
    archive = http_server.add(unique_path("archive"), one_member_tar("a.txt", b"x" * 5000))
    manager.cached_path(archive, extract=True)
    code, out, _ = _cli(capsys, "ls", "--cache-dir", str(cache), "--json")
    assert code == 0
    listed = json.loads(out)
    by_url = {row["url"]: row for row in listed["entries"]}
    assert [by_url[url]["size"] for url in urls] == [1000, 25 * KB, 300 * KB]
    assert "hunter2" not in out and secret.replace("hunter2", "***") in by_url
    assert by_url[archive]["extracted"] is not None and by_url[archive]["extracted_size"] == 5000
    assert listed["total"] == sum(row["size"] + row["extracted_size"] for row in listed["entries"])
    assert [row["url"] for row in listed["entries"]] == sorted(by_url)
    code, out, _ = _cli(capsys, "ls", "--cache-dir", str(cache))
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:3] == ["URL", "SIZE", "SHA256"]
    assert len(lines) == 1 + 5 + 1  # header, one row per entry, the total
    assert lines[-1].startswith(f"5 entries, {format_size(listed['total'])} ({listed['total']} bytes)")
    assert "hunter2" not in out


def test_ls_of_a_missing_folder_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = _cli(capsys, "ls", "--cache-dir", str(tmp_path / "nowhere"))
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "no cache folder at" in err


def test_verify_catches_a_flipped_byte_and_a_truncated_file_and_fix_refetches(
    http_server: FaultServer, manager: DownloadManager, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flipped, truncated, good = _fill(http_server, manager, [64 * KB, 64 * KB, 64 * KB])
    path = Entry(cache, flipped).final
    info = os.lstat(path)
    data = bytearray(path.read_bytes())
    data[1234] ^= 0x01
    path.write_bytes(bytes(data))
    # Bit rot keeps the mtime: the sidecar still vouches for the file, so a hit serves it.
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert manager.cached_path(flipped).read_bytes() == bytes(data)
    with open(Entry(cache, truncated).final, "r+b") as file:
        file.truncate(1000)
    code, out, _ = _cli(capsys, "verify", "--cache-dir", str(cache))
    bad = [line for line in out.splitlines() if line.startswith("bad: ")]
    assert code == 1
    assert len(bad) == 2 and "3 entries checked, 2 bad" in out
    assert any(flipped in line and "sha256" in line for line in bad)
    assert any(truncated in line and "1000 bytes" in line for line in bad)
    assert Entry(cache, flipped).final.exists()  # nothing removed without --fix
    code, out, _ = _cli(capsys, "verify", "--cache-dir", str(cache), flipped, good)
    assert code == 1 and "2 entries checked, 1 bad" in out
    gets = {url: http_server.route(url).gets for url in (flipped, truncated, good)}
    code, out, _ = _cli(capsys, "verify", "--cache-dir", str(cache), "--fix")
    assert code == 1 and out.count("; removed") == 2
    for url in (flipped, truncated, good):
        assert manager.cached_path(url).read_bytes() == http_server.route(url).data
    assert http_server.route(flipped).gets == gets[flipped] + 1  # fetched again
    assert http_server.route(truncated).gets == gets[truncated] + 1
    assert http_server.route(good).gets == gets[good]  # kept, a hit
    code, out, _ = _cli(capsys, "verify", "--cache-dir", str(cache))
    assert code == 0 and "3 entries checked, 0 bad" in out


def test_verify_of_a_url_not_cached_is_one_line(
    manager: DownloadManager, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache.mkdir()
    code, _, err = _cli(capsys, "verify", "--cache-dir", str(cache), "http://127.0.0.1:9/none.bin")
    assert code == 1 and err.count("\n") == 1 and "is not cached in" in err


def test_verify_does_not_count_as_a_use(
    http_server: FaultServer, manager: DownloadManager, cache: Path
) -> None:
    (url,) = _fill(http_server, manager, [10 * KB])
    _age_all(cache, [url])
    before = entries(cache)[0].last_used
    assert time.time() - before > 3600
    assert main(["cache", "verify", "--cache-dir", str(cache)]) == 0
    assert entries(cache)[0].last_used == pytest.approx(before, abs=1)


def test_a_hit_records_its_use_and_keeps_the_sidecar_bound(
    http_server: FaultServer, manager: DownloadManager, cache: Path
) -> None:
    (url,) = _fill(http_server, manager, [10 * KB])
    path = Entry(cache, url).final
    _age(cache, url, 7200)
    mtime = os.lstat(path).st_mtime_ns
    gets = http_server.route(url).gets
    assert manager.cached_path(url) == path
    info = os.lstat(path)
    assert time.time() - info.st_atime < 60 and info.st_mtime_ns == mtime
    assert entries(cache)[0].bound and http_server.route(url).gets == gets


def test_prune_keeps_the_most_recently_used_and_fits(
    http_server: FaultServer, manager: DownloadManager, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    urls = _fill(http_server, manager, [100 * KB] * 5)
    _age_all(cache, urls)  # urls[0] the least recently used ... urls[4] the most
    manager.cached_path(urls[1])  # a hit: now the most recently used
    code, out, _ = _cli(capsys, "prune", "--cache-dir", str(cache), "--max-size", "250KB")
    assert code == 0
    kept = {entry.url for entry in entries(cache)}
    assert kept == {urls[1], urls[4]}
    assert sum(entry.total for entry in entries(cache)) <= 250 * KB
    assert out.count("removed: ") == 3 and "freed" in out
    gets = [http_server.route(url).gets for url in urls]
    manager.cached_path(urls[1]), manager.cached_path(urls[4])
    assert [http_server.route(url).gets for url in urls] == gets  # still hits


def test_prune_dry_run_removes_nothing(
    http_server: FaultServer, manager: DownloadManager, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _fill(http_server, manager, [50 * KB] * 3)
    planted_partial(cache, http_server.base + "/gone.bin", '"v1"', b"p" * 5000)
    before = {name: os.lstat(cache / name).st_mtime_ns for name in cache_files(cache)}
    code, out, _ = _cli(capsys, "prune", "--cache-dir", str(cache), "--max-size", "0", "--dry-run")
    assert code == 0
    assert out.count("would remove: ") == 4 and "would hold 0 B" in out
    assert {name: os.lstat(cache / name).st_mtime_ns for name in cache_files(cache)} == before


def _hold_lock(lock_path: str, held: object, release: object) -> None:
    with filelock.FileLock(lock_path):
        held.set()  # type: ignore[attr-defined]
        release.wait(30)  # type: ignore[attr-defined]


def test_an_entry_whose_lock_another_process_holds_is_never_removed(
    http_server: FaultServer, manager: DownloadManager, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    locked, _other = _fill(http_server, manager, [20 * KB, 20 * KB])
    held, release = FORK.Event(), FORK.Event()
    child = FORK.Process(target=_hold_lock, args=(str(Entry(cache, locked).lock), held, release))
    child.start()
    try:
        assert held.wait(20)
        code, out, _ = _cli(capsys, "prune", "--cache-dir", str(cache), "--max-size", "0")
        assert code == 1  # still above the size: one entry could not go
        assert f"skipped: {locked}: another process is fetching or reading it" in out
        assert [entry.url for entry in entries(cache)] == [locked]
        assert manager.cached_path(locked).read_bytes() == http_server.route(locked).data
        assert main(["cache", "verify", "--cache-dir", str(cache), "--fix"]) == 0
    finally:
        release.set()
        end_child(child)
    assert prune(cache, 0).removed[0].url == locked  # released: it goes now
    assert entries(cache) == []


def test_a_stale_partial_whose_entry_is_locked_stays(http_server: FaultServer, cache: Path) -> None:
    """A fetch holding the lock may be adopting the orphaned partial file: it stays."""
    url = http_server.base + "/adopted.bin"
    orphan = planted_partial(cache, url, '"v1"', b"o" * 4000)
    held, release = FORK.Event(), FORK.Event()
    child = FORK.Process(target=_hold_lock, args=(str(Entry(cache, url).lock), held, release))
    child.start()
    try:
        assert held.wait(20)
        assert stale_files(cache) == [orphan]
        assert prune(cache, 0).swept == () and orphan.exists()
    finally:
        release.set()
        end_child(child)
    assert prune(cache, 0).swept == (orphan,) and not orphan.exists()


def test_prune_never_removes_a_users_own_files(
    http_server: FaultServer, manager: DownloadManager, cache: Path
) -> None:
    _fill(http_server, manager, [30 * KB] * 2)
    own = {
        "notes.txt": b"mine",
        "0123456789abcdef0123-looks-like-an-entry.bin": b"no sidecar",
        "0123456789abcdef0123-with-a-json.bin": b"its json is no sidecar",
        "0123456789abcdef0123-with-a-json.bin.json": b'{"hello": 1}',
        "data.json": b'{"size": 1, "sha256": "' + b"0" * 64 + b'"}',
        "old.tmp": b"a temporary of no writer we know",
    }
    for name, data in own.items():
        (cache / name).write_bytes(data)
    (cache / "folder").mkdir()
    (cache / "folder" / "inside.bin").write_bytes(b"x" * 10_000)
    done = prune(cache, 0)
    assert done.fits and len(done.removed) == 2
    assert entries(cache) == []
    for name, data in own.items():
        assert (cache / name).read_bytes() == data
    assert (cache / "folder" / "inside.bin").stat().st_size == 10_000


def test_prune_removes_an_extracted_folder_with_its_archive(
    http_server: FaultServer, manager: DownloadManager, cache: Path
) -> None:
    url = http_server.add(unique_path("tar"), one_member_tar("member.txt", b"m" * 20_000))
    folder = manager.cached_path(url, extract=True)
    (entry,) = entries(cache)
    assert entry.extracted == folder and entry.total == entry.size + 20_000
    prune(cache, 0)
    assert not folder.exists() and not Entry(cache, url).sidecar.exists()
    assert not (cache / f"{folder.name}.json").exists()  # its marker
    assert [name for name in cache_files(cache) if name.endswith(".old")] == []
    assert (manager.cached_path(url, extract=True) / "member.txt").read_bytes() == b"m" * 20_000


def test_either_half_of_an_entry_alone_is_a_miss_and_a_lone_sidecar_is_swept(
    http_server: FaultServer, manager: DownloadManager, cache: Path
) -> None:
    """The orders a removal can stop in: a file without its sidecar and a sidecar without
    its file are both misses; `remove` takes the file first, so a crash leaves the small
    sidecar, which prune recognises as ours."""
    no_sidecar, no_file = _fill(http_server, manager, [10 * KB, 10 * KB])
    Entry(cache, no_sidecar).sidecar.unlink()
    Entry(cache, no_file).final.unlink()
    assert Entry(cache, no_sidecar).lookup(None) is None
    assert Entry(cache, no_file).lookup(None) is None
    assert stale_files(cache) == [Entry(cache, no_file).sidecar]
    prune(cache, 10**9)
    assert not Entry(cache, no_file).sidecar.exists()
    assert Entry(cache, no_sidecar).final.exists()  # no record says it is ours: kept


def test_a_removal_stopped_midway_leaves_only_a_sidecar_that_prune_sweeps(
    http_server: FaultServer, manager: DownloadManager, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (url,) = _fill(http_server, manager, [10 * KB])
    entry = Entry(cache, url)
    real_unlink = os.unlink

    def killed_at_the_sidecar(path: os.PathLike[str], *args: object, **kwargs: object) -> None:
        if os.fspath(path) == str(entry.sidecar):
            raise KeyboardInterrupt
        real_unlink(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "unlink", killed_at_the_sidecar)
    with pytest.raises(KeyboardInterrupt):
        remove(entries(cache)[0])
    monkeypatch.undo()
    assert not entry.final.exists() and entry.sidecar.exists()  # the file went first
    assert entry.lookup(None) is None and entries(cache) == []
    assert prune(cache, 10**9).swept == (entry.sidecar,)
    assert manager.cached_path(url).read_bytes() == http_server.route(url).data


def test_prune_sweeps_orphaned_partials_and_dead_temporaries_only(
    http_server: FaultServer, manager: DownloadManager, cache: Path
) -> None:
    _fill(http_server, manager, [10 * KB])
    orphan = planted_partial(cache, http_server.base + "/orphan.bin", '"v1"', b"o" * 4000)
    folder = work_folder(cache / "any")
    host, _pid, random = unique_token().split(".")
    live = folder / f"{Entry(cache, 'x').final.name}.v1.{host}.{os.getppid()}.{random}.part"  # alive
    live.write_bytes(b"l" * 3000)
    dead_tmp = folder / f"{Entry(cache, 'y').final.name}.json.{host}.999999.{random}.tmp"
    dead_tmp.write_bytes(b"{}")
    swept = set(stale_files(cache))
    assert orphan in swept and dead_tmp in swept and live not in swept
    done = prune(cache, 10**9)
    assert set(done.swept) == swept and done.removed == ()
    assert not orphan.exists() and not dead_tmp.exists() and live.exists()


@pytest.mark.parametrize("value", ["50XB", "-1", "", "1e9", "GB", "1.2.3"])
def test_a_bad_max_size_is_a_one_line_error(
    value: str, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["cache", "prune", "--cache-dir", str(cache), "--max-size", value])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1
    assert "--max-size" in err and repr(value) in err


@pytest.mark.parametrize(
    ("text", "size"),
    [("50GB", 50 * 10**9), ("500MiB", 500 * 2**20), ("1.5TB", 1_500_000_000_000), ("4096", 4096),
     (" 2 kib ", 2048), ("0", 0), ("7b", 7)],
)  # fmt: skip
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_the_commands_run_as_a_program(
    http_server: FaultServer, manager: DownloadManager, cache: Path
) -> None:
    urls = _fill(http_server, manager, [10 * KB, 20 * KB])
    _age_all(cache, urls)

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "framework", "cache", *argv, "--cache-dir", str(cache)]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

    listed = run("ls")
    assert listed.returncode == 0 and all(url in listed.stdout for url in urls)
    assert "2 entries, 29.3 KiB (30000 bytes)" in listed.stdout
    pruned = run("prune", "--max-size", "25kB")
    assert pruned.returncode == 0 and pruned.stderr == ""
    assert [entry.url for entry in entries(cache)] == [urls[1]]


@pytest.mark.parametrize("action", ["ls", "verify", "prune"])
def test_each_action_has_help(action: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["cache", action, "--help"])
    assert stopped.value.code == 0
    assert f"usage: framework cache {action}" in capsys.readouterr().out


def test_prune_with_the_caches_soft_lock_keeps_a_held_entry_and_fetches_again(
    http_server: FaultServer, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--lock softfilelock` for a cache whose fetches take that lock: an entry whose soft
    lock is held is skipped, and one removed leaves no lock file that a later fetch
    would wait on."""
    with DownloadManager(cache, progress=False, connections=1, lock="softfilelock", lock_timeout=2) as soft:
        held_url, free_url = _fill(http_server, soft, [2000, 3000])
        held = filelock.SoftFileLock(str(Entry(cache, held_url).lock))
        with held:
            code, out, _ = _cli(
                capsys, "prune", "--cache-dir", str(cache), "--max-size", "0", "--lock", "softfilelock"
            )
        assert code == 1 and held_url in out
        assert [entry.url for entry in entries(cache)] == [held_url]
        assert not Entry(cache, free_url).lock.exists()
        assert soft.cached_path(free_url).read_bytes() == http_server.route(free_url).data


def test_prune_never_sweeps_a_cached_json_file_as_a_stale_sidecar(
    http_server: FaultServer, manager: DownloadManager, cache: Path
) -> None:
    # A dataset's own checksum record, as many hosts publish next to their shards.
    record = json.dumps({"file": "train-00000.jsonl.gz", "size": 8388608, "sha256": "9f" * 32}).encode()
    url = http_server.add(unique_path("corpus") + "/checksums.json", record)
    path = manager.cached_path(url)
    assert [entry.url for entry in entries(cache)] == [url]
    done = prune(cache, 1 << 40)  # a terabyte: nothing has to go
    assert done.swept == () and done.removed == ()
    assert path.read_bytes() == record


def _hold_soft_lock(lock_path: str, held: object, release: object) -> None:
    # What a fetch by `DownloadManager(lock="softfilelock")` holds (filesystems without flock).
    with filelock.SoftFileLock(lock_path):
        held.set()  # type: ignore[attr-defined]
        release.wait(30)  # type: ignore[attr-defined]


def test_prune_skips_an_entry_a_softfilelock_fetch_holds(http_server: FaultServer, cache: Path) -> None:
    url = http_server.add(unique_path("soft"), os.urandom(20_000))
    with DownloadManager(cache, progress=False, connections=1, lock="softfilelock") as soft:
        soft.cached_path(url)
    held, release = FORK.Event(), FORK.Event()
    child = FORK.Process(target=_hold_soft_lock, args=(str(Entry(cache, url).lock), held, release))
    child.start()
    try:
        assert held.wait(20)
        done = prune(cache, 0, lock="softfilelock")  # the lock the cache's fetches take
        assert [entry.url for entry in done.skipped] == [url]
        assert [entry.url for entry in entries(cache)] == [url]
    finally:
        release.set()
        end_child(child)


def test_a_url_pruned_from_a_softfilelock_cache_is_fetched_again(
    http_server: FaultServer, cache: Path
) -> None:
    url = http_server.add(unique_path("soft-again"), os.urandom(5000))
    with DownloadManager(cache, progress=False, connections=1, lock="softfilelock", lock_timeout=2) as soft:
        soft.cached_path(url)
        assert [entry.url for entry in prune(cache, 0, lock="softfilelock").removed] == [url]
        assert soft.cached_path(url).read_bytes() == http_server.route(url).data


def test_ls_shows_a_planted_urls_control_characters_escaped(
    http_server: FaultServer, manager: DownloadManager, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sidecar's URL is written by whoever can write the cache folder: `ls` prints it
    escaped, so a planted terminal escape sequence is shown, never obeyed."""
    (url,) = _fill(http_server, manager, [1000])
    sidecar = Entry(cache, url).sidecar
    meta = json.loads(sidecar.read_text())
    meta["url"] = url + "\x1b]0;owned\x07"
    sidecar.write_text(json.dumps(meta))
    code, out, _ = _cli(capsys, "ls", "--cache-dir", str(cache))
    assert code == 0 and "\x1b" not in out and "\\x1b]0;owned\\x07" in out


def test_an_entry_another_prune_removed_first_is_not_reported_as_held(
    http_server: FaultServer, manager: DownloadManager, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two prunes at once: what the other removed after this one listed it is gone, not
    "another process is fetching it", and the cache fits."""
    import framework.download.inventory as inventory

    _fill(http_server, manager, [1000, 2000])
    listed = entries(cache)
    assert remove(listed[0])  # the other prune, between this one's listing and its removal
    monkeypatch.setattr(inventory, "_entries", lambda cache_dir, names: listed)
    done = prune(cache, 0)
    assert done.skipped == () and done.fits and [e.url for e in done.removed] == [listed[1].url]
