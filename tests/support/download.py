"""Helpers for the download tests: a fault-injecting HTTP server on 127.0.0.1 and small
utilities (imported by the tests and by conftest.py)."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import multiprocessing
import os
import socket
import struct
import sys
import tarfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, ClassVar, Optional, TypeVar

import attrs
from framework_plugins.http import HttpBackend

from framework.download import DownloadBackend, DownloadManager
from framework.download._cache import WORK_PREFIX, Entry, unique_token
from framework.download._partial import PartialName
from framework.download._validators import _etag_tag
from framework.hookspecs import hookimpl
from framework.registry import Registrar

FORK = multiprocessing.get_context("fork")
# Parallel-fetch tests: parts of this size (a plan's part and a request's most)...
PART = 256 * 1024
# ...from a server that sends each connection 16 KiB every 8 ms (about 2 MiB/s): one stream
# would need well over `Ramp.ALONE_S` for their objects, so the ramp adds connections.
SLOW: dict[str, Any] = {"chunk": 16 * 1024, "delay": 0.008}


@attrs.define
class Route:
    """What the server answers on one path, and what it saw."""

    data: bytes
    etag: Optional[str] = None
    last_modified: Optional[str] = None  # sent as Last-Modified; matched by If-Range
    status: Optional[int] = None  # a fixed answer, e.g. 404
    fail_statuses: list[int] = attrs.field(factory=list)  # answered first, one per GET
    # "honor" | "ignore" (answer 200) | "from_zero" (every GET, Range or not, is answered as
    # one for bytes=0-) | "always" (a GET without a Range too is answered 206, as bytes=0-;
    # HEAD as usual)
    # | "416" | another status for any Range
    range_mode: str = "honor"
    redirect: Optional[str] = None
    drop_after: Optional[int] = None  # body bytes sent before the fault
    drops: int = 0  # how many GETs get the fault
    drop_kind: str = "reset"  # "reset" (RST) | "short" (clean close, body < Content-Length)
    then: dict[str, Any] = attrs.field(factory=dict)  # route fields set after a fault: a new version
    star_total: bool = False  # answer 206 with an unknown total: Content-Range bytes a-b/*
    size_unknown: bool = False  # a 416 says no size either (no Content-Range), only the ETag
    unsatisfiable_from: Optional[int] = None  # ranges from here on get 416, though the object goes on (a lie)
    range_cap: Optional[int] = None  # a ranged answer (206) carries at most this many bytes
    stall_after: Optional[int] = None  # body bytes sent before the answer stalls (once)
    stall_s: float = 30.0  # or until `released` is set
    stalling: bool = False  # an answer is stalled now
    # Once the route's GETs have sent this many body bytes in all, every answer waits for
    # `released`: a test that kills a fetch mid-way knows the fetch cannot end first.
    hold_after: Optional[int] = None
    released: threading.Event = attrs.field(factory=threading.Event)
    busy_over: Optional[int] = None  # a GET while this many bodies are being sent gets 503
    refused: int = 0  # GETs answered 503 for `busy_over`
    busy_status: int = 503  # the answer for `busy_over` (429: too many requests)
    retry_after: Optional[str] = None  # sent as Retry-After with that answer (and `fail_statuses`')
    gzip_whole: bool = False  # whole answers (200) come gzip-encoded, whatever was asked
    gzip_all: bool = False  # every answer is gzip-encoded, ranges counting encoded bytes (a .gz served so)
    close_delimited: bool = False  # no Content-Length: the body ends when the connection closes
    chunked: bool = False  # no Content-Length: the body comes in chunks (Transfer-Encoding: chunked)
    last_chunk_wait: float = 0.0  # seconds a chunked body's bytes wait for its terminating chunk
    total_delta: int = 0  # a 206's Content-Range names a total this far off the real one (a lie)
    head_status: Optional[int] = None  # HEAD is answered with this (405: a server without HEAD)
    chunk: int = 64 * 1024
    delay: float = 0.0  # seconds per chunk
    # The pace (`chunk` every `delay`) is the whole link's, not each connection's: the
    # connections take turns, so one stream fills it.
    shared_link: bool = False
    link_lock: threading.Lock = attrs.field(factory=threading.Lock)
    answer_wait: float = 0.0  # seconds before each answer to a ranged GET: a server far away
    # Seconds of work before each answer to a ranged GET, one answer at a time: a server
    # whose requests queue for one CPU (as moto's, which reads the object at every GET).
    serial_work: float = 0.0
    work_lock: threading.Lock = attrs.field(factory=threading.Lock)
    gets: int = 0
    full_gets: int = 0  # GETs that started at byte 0
    heads: int = 0
    ranges: list[str] = attrs.field(factory=list)
    headers: list[dict[str, str]] = attrs.field(factory=list)  # every request's headers
    if_ranges: list[str] = attrs.field(factory=list)  # the If-Range header of each GET ('' if none)
    swap_at_get: Optional[int] = None  # at this GET (1-based), apply `then` first: a new version
    body_bytes: int = 0  # body bytes written to clients (all GETs)
    in_flight: int = 0  # GETs whose body is being sent now
    max_in_flight: int = 0
    # Each GET waits here before its body: answers go out only once this many are in flight.
    barrier: Optional[threading.Barrier] = None


class FaultServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # not 5: a parallel fetch's SYNs beyond it would wait a second

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.routes: dict[str, Route] = {}
        self.lock = threading.Lock()
        self.connections = 0
        self.in_flight = 0  # GETs of any route whose body is being sent now
        self.max_in_flight = 0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def add(self, path: str, data: bytes, **options: Any) -> str:
        options.setdefault("etag", '"' + hashlib.sha256(data).hexdigest()[:16] + '"')
        self.routes[path] = Route(data, **options)
        return self.base + path

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that hang up mid-body (timeouts, kills) are part of the tests.
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)

    def route(self, url: str) -> Route:
        return self.routes[url[len(self.base) :]]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FaultServer

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1

    def _empty(self, status: int, headers: Optional[dict[str, str]] = None) -> None:
        body = f"status {status}".encode()
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        route = self.server.routes.get(self.path)
        if route is None:
            self._empty(404)
            return
        range_header = self.headers.get("Range")
        if_range = self.headers.get("If-Range")
        with self.server.lock:
            route.headers.append(dict(self.headers))
            if self.command == "GET":
                route.gets += 1
                if route.swap_at_get is not None and route.gets == route.swap_at_get:
                    for key, value in route.then.items():
                        setattr(route, key, value)
                    route.then = {}
                route.ranges.append(range_header or "")
                route.if_ranges.append(if_range or "")
            else:
                route.heads += 1
            fail = route.fail_statuses.pop(0) if route.fail_statuses and self.command == "GET" else None
            over = route.busy_over is not None and route.in_flight >= route.busy_over
            busy = over and self.command == "GET"
            if busy:
                fail = route.busy_status
                route.refused += 1
        if fail is not None:
            self._empty(fail, {"Retry-After": route.retry_after} if route.retry_after else None)
            return
        if self.command == "HEAD" and route.head_status is not None:
            self._empty(route.head_status)
            return
        if route.status is not None:
            self._empty(route.status)
            return
        if route.redirect is not None:
            self._empty(302, {"Location": route.redirect})
            return
        data = gzip.compress(route.data, compresslevel=1, mtime=0) if route.gzip_all else route.data
        size = len(data)
        start, stop = 0, size
        status = 200
        if if_range is not None and if_range not in (route.etag, route.last_modified):
            range_header = None  # RFC 9110 If-Range: another version is sent whole
        always = route.range_mode == "always" and self.command == "GET"
        if route.range_mode == "from_zero" or (always and not range_header):
            range_header = "bytes=0-"
        if range_header and route.range_mode != "ignore":
            first, _, last = range_header.split("=", 1)[1].partition("-")
            start = int(first)
            lie = route.unsatisfiable_from
            past = start >= size or (lie is not None and start >= lie)
            if route.range_mode == "416" or past:
                if route.size_unknown:
                    self._empty(416, {"ETag": route.etag} if route.etag else {})
                else:
                    self._empty(416, {"Content-Range": f"bytes */{size}"})
                return
            if route.range_mode.isdigit():  # a server that refuses ranges with this status
                self._empty(int(route.range_mode))
                return
            stop = min(size, int(last) + 1) if last.strip() else size
            if route.range_cap is not None:  # a server that sends less than asked (and says so)
                stop = min(stop, start + route.range_cap)
            status = 206
        if self.command == "GET" and start == 0:
            with self.server.lock:
                route.full_gets += 1
        body = data[start:stop]
        if range_header and route.answer_wait:
            time.sleep(route.answer_wait)
        if range_header and route.serial_work:
            with route.work_lock:
                time.sleep(route.serial_work)
        self.send_response(status)
        if route.gzip_whole and status == 200:
            body = gzip.compress(body, compresslevel=1)
            self.send_header("Content-Encoding", "gzip")
        if route.gzip_all:
            self.send_header("Content-Encoding", "gzip")
        if route.close_delimited:
            self.close_connection = True
            self.send_header("Connection", "close")
        elif route.chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        if route.etag:
            self.send_header("ETag", route.etag)
        if route.last_modified:
            self.send_header("Last-Modified", route.last_modified)
        if status == 206:
            total = "*" if route.star_total else str(size + route.total_delta)
            self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{total}")
        self.end_headers()
        if self.command == "HEAD":
            return
        fault_at = None
        with self.server.lock:
            if route.drop_after is not None and route.drops > 0:
                route.drops -= 1
                fault_at = route.drop_after
        with self.server.lock:
            route.in_flight += 1
            route.max_in_flight = max(route.max_in_flight, route.in_flight)
            self.server.in_flight += 1
            self.server.max_in_flight = max(self.server.max_in_flight, self.server.in_flight)
        try:
            if route.barrier is not None:
                route.barrier.wait()  # broken (a timeout) if fewer GETs ever come at once
            self._send_body(route, body, fault_at)
        finally:
            with self.server.lock:
                route.in_flight -= 1
                self.server.in_flight -= 1

    def _send_body(self, route: Route, body: bytes, fault_at: Optional[int]) -> None:
        sent = 0
        while sent < len(body):
            end = min(len(body), sent + route.chunk)
            if fault_at is not None and end >= fault_at:
                if route.chunked:
                    self.wfile.write(b"%x\r\n%s\r\n" % (fault_at - sent, body[sent:fault_at]))
                else:
                    self.wfile.write(body[sent:fault_at])
                self.wfile.flush()
                self._fault(route.drop_kind)
                with self.server.lock:
                    for key, value in route.then.items():
                        setattr(route, key, value)
                    route.then = {}
                return
            if route.hold_after is not None and route.body_bytes + end - sent > route.hold_after:
                self.wfile.flush()
                route.released.wait(60)
            if route.chunked:
                self.wfile.write(b"%x\r\n%s\r\n" % (end - sent, body[sent:end]))
            else:
                self.wfile.write(body[sent:end])
            with self.server.lock:
                route.body_bytes += end - sent
                stall = route.stall_after is not None and sent < route.stall_after <= end
                if stall:
                    route.stall_after = None
            sent = end
            if stall:
                self.wfile.flush()
                route.stalling = True
                route.released.wait(route.stall_s)
                route.stalling = False
            if route.delay:
                with route.link_lock if route.shared_link else contextlib.nullcontext():
                    time.sleep(route.delay)
        if route.chunked:
            if route.last_chunk_wait:
                self.wfile.flush()
                time.sleep(route.last_chunk_wait)
            self.wfile.write(b"0\r\n\r\n")

    def _fault(self, kind: str) -> None:
        self.close_connection = True
        if kind == "reset":  # SO_LINGER 0: close() sends a TCP RST
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()


class PacedProxy:
    """A TCP forwarder on 127.0.0.1 in front of `upstream` (a port): what comes back is
    sent on in `chunk`-byte writes `delay` apart; a connection is cut once it has sent
    `cut_after` bytes back, and the byte at `flip_at` is flipped (counts include the
    headers). A context manager; `url` is its address."""

    def __init__(
        self,
        upstream: int,
        chunk: int,
        delay: float,
        cut_after: Optional[int] = None,
        flip_at: Optional[int] = None,
    ) -> None:
        self.upstream, self.chunk, self.delay = upstream, chunk, delay
        self.cut_after, self.flip_at = cut_after, flip_at
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, back: bool) -> None:
        limit = self.cut_after if back else None
        flip = self.flip_at if back else None
        sent = 0
        try:
            while limit is None or sent < limit:
                data = source.recv(self.chunk if limit is None else min(self.chunk, limit - sent))
                if not data:
                    break
                if flip is not None and sent <= flip < sent + len(data):
                    data = data[: flip - sent] + bytes([data[flip - sent] ^ 1]) + data[flip - sent + 1 :]
                time.sleep(self.delay if back else 0.0)
                sink.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                end.close()

    def __enter__(self) -> PacedProxy:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.listener.close()


_Server = TypeVar("_Server", bound=ThreadingHTTPServer)


@contextmanager
def serving(server: _Server) -> Iterator[_Server]:
    """`server` answering on a daemon thread until the block ends."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def unique_path(name: str) -> str:
    """A URL path no other test uses (the session's server is shared)."""
    return f"/{name}-{uuid.uuid4().hex[:8]}.bin"


def parts_manager(cache: Path, connections: Optional[int] = 4, **options: Any) -> DownloadManager:
    """A manager that fetches in `PART` parts over at most `connections`, quickly retried."""
    options.setdefault("lock_timeout", 20)
    return DownloadManager(
        cache, connections=connections, part_size=PART, backoff_factor=0.01, progress=False, **options
    )


def end_child(child: Any) -> None:
    """Wait up to 10 s for a test's child process, then kill it: a failing test leaks none."""
    child.join(10)
    if child.is_alive():
        child.kill()
        child.join(10)


def cache_files(folder: Path) -> list[str]:
    """Every name in a cache folder and in its work folders (`.framework-partial-<uid>`),
    as paths relative to `folder`: `folder / name` opens each. The work folders
    themselves are left out: made once, they stay."""
    if not folder.exists():
        return []
    names = []
    for name in os.listdir(folder):
        if name.startswith(WORK_PREFIX) and (folder / name).is_dir():
            names.extend(f"{name}/{inner}" for inner in os.listdir(folder / name))
        else:
            names.append(name)
    return sorted(names)


def stray_files(folder: Path) -> list[str]:
    """Temporary or partial files left in a cache folder or its work folders (relative
    to `folder`)."""
    return [n for n in cache_files(folder) if n.endswith((".part", ".parts", ".tmp", ".old"))]


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.01)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class MemoryPlugin:
    """A third-party plugin, as an entry point of the ``framework.plugins`` group would name it."""

    @staticmethod
    @hookimpl
    def framework_register_components(registrar: Registrar) -> None:
        registrar.add(DownloadBackend, "mem", "framework.testing:MemoryBackend")


# Backends and partial files that several download test files plant.

OLD, V = '"old"', '"v"'


def single_manager(cache: Path, backend: HttpBackend) -> DownloadManager:
    return parts_manager(cache, connections=1, backends={"http": backend})


def planted_partial(cache: Path, url: str, etag: str, data: bytes) -> Path:
    """A partial file of `url` at version `etag` holding `data`, left by a writer that is gone."""
    final = Entry(cache, url).final
    cache.mkdir(exist_ok=True)
    token = unique_token().split(".")
    token[1] = "999999"  # a pid that does not run
    part = PartialName(final, _etag_tag(etag), ".".join(token)).path
    part.parent.mkdir(exist_ok=True)
    part.write_bytes(data)
    return part


class NoIfRange(HttpBackend):
    """A proxy that strips If-Range: the engine's own checks must refuse another version."""

    supports_ranges: ClassVar[bool] = True  # its `open` passes `end` on

    def open(
        self, url: str, offset: int = 0, *, if_range: Optional[str] = None, end: Optional[int] = None
    ) -> Any:
        return super().open(url, offset, end=end)


class Lying(HttpBackend):
    """Lies on part requests (offset > 0 with an end) in one way; whole requests are honest."""

    supports_ranges: ClassVar[bool] = True  # its `open` passes `end` on

    def __init__(self, how: str) -> None:
        super().__init__(backoff_factor=0.01)
        self.how = how

    def open(
        self, url: str, offset: int = 0, *, if_range: Optional[str] = None, end: Optional[int] = None
    ) -> Any:
        if self.how == "start" and offset > 0:  # bytes from one byte earlier than asked
            return super().open(url, offset - 1, if_range=if_range, end=end)
        stream = super().open(url, offset, if_range=if_range, end=end)
        if self.how == "encoding" and offset > 0 and end is not None:
            body = gzip.compress(b"".join(stream.chunks))
            stream.chunks, stream.encoding = iter([body]), "gzip"
        if self.how == "oversize" and offset == 0 and end is None:
            inner = stream.chunks
            stream.chunks = (c for cs in (inner, iter([b"extra"])) for c in cs)
        return stream


def one_member_tar(name: str, data: bytes) -> bytes:
    """An uncompressed tar archive holding one file, `name`, of `data`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class Listings:
    """Every `os.listdir` / `os.scandir` call (pathlib and glob go through them), by
    folder; see `counted_listings`."""

    def __init__(self) -> None:
        self.folders: list[str] = []

    def of(self, folder: Path) -> int:
        return sum(1 for seen in self.folders if os.path.realpath(seen) == os.path.realpath(folder))


@contextmanager
def counted_listings() -> Iterator[Listings]:
    """Count the folders listed while the block runs."""
    seen = Listings()
    listdir, scandir = os.listdir, os.scandir

    def counting_listdir(path: Any = ".") -> Any:
        seen.folders.append(os.fspath(path))
        return listdir(path)

    def counting_scandir(path: Any = ".") -> Any:
        seen.folders.append(os.fspath(path))
        return scandir(path)

    os.listdir, os.scandir = counting_listdir, counting_scandir  # type: ignore[assignment]
    try:
        yield seen
    finally:
        os.listdir, os.scandir = listdir, scandir


def refusal_before_the_second_start(monkeypatch: Any) -> threading.Event:
    """Hold a parallel fetch's second connection start until a refused request has been
    handled (at most 10 s): the refusal lands while a step's connections are being
    opened. The event returned is set once one was."""
    from framework.download.parallel import _engine

    refused = threading.Event()
    started: list[int] = []
    real_start, real_refused = _engine.Engine._start, _engine.Engine._refused

    def start(engine: Any, first: Any) -> Any:
        if first is None:
            started.append(1)
            if len(started) == 2:  # the first new connection's request is refused first
                refused.wait(10)
        return real_start(engine, first)

    def refusal(engine: Any, connection: Any, error: Any) -> None:
        try:
            real_refused(engine, connection, error)
        finally:
            refused.set()

    monkeypatch.setattr(_engine.Engine, "_start", start)
    monkeypatch.setattr(_engine.Engine, "_refused", refusal)
    return refused
