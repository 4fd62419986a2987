"""Property: published bytes are one version's bytes.

A loopback HTTP server plays a script drawn per example (the object changes version
before or in the middle of an answer, 5xx and 429 answers, connection resets, bodies cut
short, ranges other than the one asked for, a Content-Range whose total or length lies,
a Range ignored), while one to three processes fetch the same entry at once, with a
working lock or none, some killed (SIGKILL) once the server has sent a drawn number of
bytes. A watcher reads the final path all along. Whatever happens:

- every file ever seen at the final path is one version's bytes exactly, so nothing
  partial is ever visible there;
- a published file never changes after publication (each inode seen is read again at
  the end, through the descriptor the watcher kept);
- a fetch that fails raises a `DownloadError`, never anything else, and none hangs;
- a later call, once the server is honest, serves one version's bytes exactly.

CI runs a small budget; ``FRAMEWORK_PROPERTY_EXAMPLES=<n>`` runs n examples (the long
profile: ``FRAMEWORK_PROPERTY_EXAMPLES=2000 pytest tests/download/test_publish_properties.py``).
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import socket
import struct
import threading
import time
import traceback
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from framework.download import DownloadManager
from framework.download._cache import Entry
from framework.errors import DownloadError
from tests.support.download import FORK, serving

EXAMPLES = int(os.environ.get("FRAMEWORK_PROPERTY_EXAMPLES", "35"))
PART_SIZE = 64 << 10  # the smallest part_size: objects of a few parts stay small
_CHUNK = 16 << 10
_HANG_S = 40.0  # a fetch still running after this long is a hang
# Request events (one per GET, in the order the server sees them; then honest answers).
_STATUSES = (500, 502, 503, 429)


# The scripted server ----------------------------------------------------------------


@attrs.define
class Script:
    """What the server answers, and what it saw; one per example (its own URL path)."""

    versions: list[bytes]
    validators: str  # "etag" | "last_modified" | "none"
    events: list[tuple[Any, ...]]
    slow: bool = False  # 16 KiB every 4 ms: a parallel fetch's ramp adds connections
    if_range: bool = True  # honours If-Range (many servers ignore it: a range of another version)
    current: int = 0
    gets: int = 0
    body_bytes: int = 0
    lock: threading.Lock = attrs.field(factory=threading.Lock)

    def headers_of(self, version: int) -> dict[str, str]:
        if self.validators == "etag":
            return {"ETag": f'"v{version}-{len(self.versions[version])}"'}
        if self.validators == "last_modified":
            return {"Last-Modified": f"Mon, 0{version + 1} Jan 2024 00:00:00 GMT"}
        return {}


class ScriptServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _ScriptHandler)
        self.scripts: dict[str, Script] = {}

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients killed mid-body, resets: part of the script


class _ScriptHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ScriptServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        script = self.server.scripts.get(self.path)
        if script is None:
            self._send(404, {})
            return
        with script.lock:
            version = script.current
        data = script.versions[version]
        self.send_response(200)
        for key, value in script.headers_of(version).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()

    def do_GET(self) -> None:
        script = self.server.scripts.get(self.path)
        if script is None:
            self._send(404, {})
            return
        with script.lock:
            event = script.events[script.gets] if script.gets < len(script.events) else ("ok",)
            script.gets += 1
            if event[0] == "switch":
                script.current = 1 - script.current
            version = script.current
        kind = event[0]
        data, validators = script.versions[version], script.headers_of(version)
        if kind == "status":
            self._send(event[1], {"Retry-After": "0"} if event[1] == 429 else {})
            return
        size = len(data)
        range_header, if_range = self.headers.get("Range"), self.headers.get("If-Range")
        if script.if_range and if_range is not None and if_range not in validators.values():
            range_header = None  # RFC 9110: another version comes whole
        if kind == "ignore_range":
            range_header = None
        status, start, stop = 200, 0, size
        headers = dict(validators)
        headers["Accept-Ranges"] = "bytes"
        if range_header:
            first, _, last = range_header.split("=", 1)[1].partition("-")
            start = int(first)
            if start >= size:
                self._send(416, {**validators, "Content-Range": f"bytes */{size}"})
                return
            stop = min(size, int(last) + 1) if last.strip() else size
            if kind == "other_range":  # another range than asked for, labelled as it is
                start = max(0, start - event[1])
            status = 206
            total, end = size, stop - 1
            if kind == "lie_total":
                total += event[1]
            if kind == "bad_length":
                end += event[1]
            headers["Content-Range"] = f"bytes {start}-{end}/{total}"
        body = data[start:stop]
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        cut = int(event[1] * len(body)) if kind in ("reset", "short", "switch_mid") else None
        sent = 0
        while sent < len(body):
            end = min(len(body), sent + _CHUNK)
            if cut is not None and end >= cut:
                self.wfile.write(body[sent:cut])
                self._count(script, cut - sent)
                sent = cut
                if kind == "switch_mid":  # the object changes while this answer goes on
                    with script.lock:
                        script.current = 1 - version
                    cut = None
                    continue
                self.wfile.flush()
                self.close_connection = True
                if kind == "reset":  # SO_LINGER 0: close() sends a TCP RST
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
                return
            self.wfile.write(body[sent:end])
            self._count(script, end - sent)
            sent = end
            if script.slow:
                time.sleep(0.004)

    @staticmethod
    def _count(script: Script, sent: int) -> None:
        with script.lock:
            script.body_bytes += sent


@pytest.fixture(scope="module")
def script_server() -> Iterator[ScriptServer]:
    with serving(ScriptServer()) as server:
        yield server


# What is drawn --------------------------------------------------------------------------

_FRACTION = st.floats(min_value=0.0, max_value=1.0)
_EVENT = st.one_of(
    st.just(("ok",)),
    st.tuples(st.just("status"), st.sampled_from(_STATUSES)),
    st.tuples(st.just("reset"), _FRACTION),
    st.tuples(st.just("short"), _FRACTION),
    st.just(("switch",)),
    st.tuples(st.just("switch_mid"), _FRACTION),
    st.just(("ignore_range",)),
    st.tuples(st.just("other_range"), st.integers(1, 3 * PART_SIZE)),
    st.tuples(st.just("lie_total"), st.sampled_from([-(PART_SIZE + 1), -1, 1, PART_SIZE])),
    st.tuples(st.just("bad_length"), st.sampled_from([-5, 1, 100])),
)


@attrs.frozen
class Racer:
    connections: int
    lock: str  # "filelock" (working) | "none"
    kill_after: Optional[int]  # SIGKILL once the server sent this many bytes (None: never)


@attrs.frozen
class Zombie:
    """A writer on another host, silent past `STALE_AFTER_S` with its partial file of the
    first version open (`fraction` of it written; for a parallel one, the parts that
    fraction covers, recorded), that wakes once the server sent `wake_after` bytes: it
    starts over through its descriptor (truncates, writes zeros, then other bytes, and
    grows the file)."""

    parallel: bool
    fraction: float
    wake_after: int

    def plant(self, final: Path, script: Script) -> Sleeper:
        from framework.download._partial import PARALLEL_TAG, STALE_AFTER_S, PartialName
        from framework.download._validators import Validators
        from framework.download.parallel._parts import _Plan, _save_record

        data = script.versions[0]
        validators = Validators(script.headers_of(0)["ETag"])
        written = int(self.fraction * len(data))
        tag = validators.tag
        if self.parallel:
            plan = _Plan(len(data), PART_SIZE, validators)
            done = set(range(written // PART_SIZE))
            tag = PARALLEL_TAG + tag
        final.parent.mkdir(parents=True, exist_ok=True)
        name = PartialName(final, tag, token=f"elsewhere-ns9.{os.getpid()}.0badcafe")
        name.path.parent.mkdir(exist_ok=True)
        fd = os.open(name.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        if self.parallel:
            os.ftruncate(fd, len(data))
            _save_record(name, plan, done, {})
        os.pwrite(fd, data[:written], 0)
        old = time.time() - STALE_AFTER_S - 60
        os.utime(name.path, (old, old))
        return Sleeper(fd, len(data), self.wake_after)


@attrs.define
class Sleeper:
    """The zombie's descriptor, until it wakes."""

    fd: Optional[int]
    size: int
    wake_after: int

    def wake(self) -> None:
        """Start over through the descriptor, once."""
        fd, self.fd = self.fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, b"\0" * 1000, 0)
            os.pwrite(fd, b"zz" * (self.size // 2 + 1), 0)
            os.ftruncate(fd, self.size + 7)
        finally:
            os.close(fd)


@st.composite
def _examples(draw: Any) -> tuple[Script, list[Racer], int, Optional[Zombie]]:
    seed = draw(st.integers(0, 2**32 - 1))
    rng = random.Random(seed)
    sizes = [draw(st.integers(1, 5 * PART_SIZE)) for _ in range(2)]
    versions = [rng.randbytes(size) for size in sizes]
    if versions[0] == versions[1]:
        versions[1] = bytes([versions[1][0] ^ 1]) + versions[1][1:]
    script = Script(
        versions=versions,
        validators=draw(st.sampled_from(["etag", "etag", "last_modified", "none"])),
        events=draw(st.lists(_EVENT, max_size=8)),
        slow=draw(st.booleans()) and draw(st.booleans()),
        if_range=draw(st.booleans()),
    )
    total = sum(sizes)
    racers = draw(
        st.lists(
            st.builds(
                Racer,
                connections=st.sampled_from([1, 4]),
                lock=st.sampled_from(["filelock", "none"]),
                kill_after=st.one_of(st.none(), st.integers(0, total)),
            ),
            min_size=1,
            max_size=3,
        )
    )
    final_connections = draw(st.sampled_from([1, 4]))
    zombie = None
    if script.validators == "etag":
        zombie = draw(
            st.one_of(
                st.none(),
                st.builds(
                    Zombie,
                    parallel=st.booleans(),
                    fraction=_FRACTION,
                    wake_after=st.integers(0, total),
                ),
            )
        )
    return script, racers, final_connections, zombie


# The fetching processes and the watcher ----------------------------------------------


def _manager(cache: Path, connections: int, lock: str) -> DownloadManager:
    return DownloadManager(
        cache,
        connections=connections,
        part_size=PART_SIZE,
        lock=lock,  # type: ignore[arg-type]
        retries=2,
        backoff_factor=0.01,
        timeout=10,
        lock_timeout=30,
        progress=False,
    )


def _racer(url: str, cache: str, racer: Racer, results: Any) -> None:
    try:
        path = _manager(Path(cache), racer.connections, racer.lock).cached_path(url)
        results.send(("ok", hashlib.sha256(path.read_bytes()).hexdigest()))
    except DownloadError as error:
        results.send(("download-error", f"{type(error).__name__}: {error}"))
    except BaseException:
        results.send(("escaped", traceback.format_exc()))


class Watcher:
    """Reads the final path all along: every inode seen there, with the bytes it first
    held, and a descriptor kept open on it (so it can be read again at the end, even
    once replaced)."""

    def __init__(self, final: Path) -> None:
        self.final = final
        self.seen: dict[tuple[int, int], tuple[int, bytes]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.look()
            time.sleep(0.001)

    def look(self) -> None:
        try:
            fd = os.open(self.final, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return
        info = os.fstat(fd)
        key = (info.st_dev, info.st_ino)
        if key in self.seen:
            os.close(fd)
            return
        self.seen[key] = (fd, _read_all(fd))

    def finish(self) -> dict[tuple[int, int], tuple[bytes, bytes]]:
        """Every inode seen: the bytes first read and the bytes it holds now."""
        self.stop.set()
        self.thread.join(5)
        self.look()
        found = {}
        for key, (fd, first) in self.seen.items():
            found[key] = (first, _read_all(fd))
            os.close(fd)
        return found


def _read_all(fd: int) -> bytes:
    chunks, position = [], 0
    while chunk := os.pread(fd, 1 << 20, position):
        chunks.append(chunk)
        position += len(chunk)
    return b"".join(chunks)


# The property ---------------------------------------------------------------------------

_counter = iter(range(10**9))


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(example=_examples())
@pytest.mark.timeout(max(120, EXAMPLES * 10))
def test_published_bytes_are_one_versions_bytes(
    script_server: ScriptServer, tmp_path_factory: pytest.TempPathFactory, example: Any
) -> None:
    script, racers, final_connections, zombie = example
    path = f"/object-{next(_counter)}-{os.getpid()}.bin"
    script_server.scripts[path] = script
    url = f"http://127.0.0.1:{script_server.server_address[1]}{path}"
    cache = tmp_path_factory.mktemp("publish")
    final = Entry(cache, url).final
    watcher = Watcher(final)
    sleeper = zombie.plant(final, script) if zombie is not None else None
    pipes = [FORK.Pipe(duplex=False) for _ in racers]  # one each: a kill corrupts no other's
    children = [
        FORK.Process(target=_racer, args=(url, str(cache), racer, sending))
        for racer, (_receiving, sending) in zip(racers, pipes)
    ]
    outcomes: list[tuple[str, str]] = []
    try:
        for child in children:
            child.start()
        killed = _run_racers(script, racers, children, sleeper)
        if sleeper is not None:
            sleeper.wake()  # at the end at the latest
        for index, (receiving, _sending) in enumerate(pipes):
            if index not in killed and receiving.poll(10):
                outcomes.append(receiving.recv())
            elif index not in killed:
                raise AssertionError(
                    f"racer {index} ended without a word (exit code {children[index].exitcode})"
                )
        with script.lock:
            script.events = []  # honest from now on (the version it has now stays)
            script.gets = 0
        last = _manager(cache, final_connections, "filelock").cached_path(url)
        assert last.read_bytes() in script.versions
    finally:
        if sleeper is not None:
            sleeper.wake()
        seen = watcher.finish()
        for child in children:
            if child.is_alive():
                child.kill()
            child.join(5)
        for receiving, sending in pipes:
            receiving.close()
            sending.close()
        del script_server.scripts[path]
    versions = {hashlib.sha256(version).hexdigest() for version in script.versions}
    escaped = [detail for kind, detail in outcomes if kind == "escaped"]
    assert not escaped, escaped[0]
    assert all(detail in versions for kind, detail in outcomes if kind == "ok")
    assert seen, "the last call published nothing"
    for first, now in seen.values():
        assert first in script.versions, f"a file of {len(first)} bytes that is no version was visible"
        assert now == first, "a published file changed after publication"


def _run_racers(
    script: Script, racers: list[Racer], children: list[Any], sleeper: Optional[Sleeper]
) -> set[int]:
    """Wait for the racers, killing each once the server has sent its `kill_after`
    bytes, and waking the zombie at its `wake_after`; which were killed. A racer still
    running after `_HANG_S` is a hang."""
    killed: set[int] = set()
    deadline = time.monotonic() + _HANG_S
    while any(child.is_alive() for child in children):
        with script.lock:
            sent = script.body_bytes
        if sleeper is not None and sent >= sleeper.wake_after:
            sleeper.wake()
        for index, (racer, child) in enumerate(zip(racers, children)):
            if racer.kill_after is not None and sent >= racer.kill_after and index not in killed:
                if child.is_alive() and child.pid is not None:
                    os.kill(child.pid, signal.SIGKILL)
                    child.join(5)
                    killed.add(index)
        if time.monotonic() > deadline:
            raise AssertionError(f"a fetch hung: {len(children) - len(killed)} racers still running")
        time.sleep(0.002)
    return killed
