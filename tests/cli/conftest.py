"""A static file server on 127.0.0.1 that counts GETs, for the end-to-end CLI tests."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


class _CountingHandler(http.server.SimpleHTTPRequestHandler):
    gets: list[str]

    def do_GET(self) -> None:
        self.gets.append(self.path)
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """Serves ``tmp_path / "www"``; yields the base URL and the list of GET paths."""
    root = tmp_path / "www"
    root.mkdir()
    gets: list[str] = []
    handler = functools.partial(
        type("Handler", (_CountingHandler,), {"gets": gets}), directory=str(root)
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", gets
    finally:
        server.shutdown()
        server.server_close()
