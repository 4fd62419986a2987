"""Backends wired the way httpx wires transports: configured instances by scheme, schemes
declared by the backend classes, and a manager that closes what it holds."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import requests
from framework_plugins.http import HttpBackend
from framework_plugins.local import LocalBackend
from framework_plugins.s3 import S3Backend

from framework.download import DownloadBackend, DownloadManager
from framework.download._schemes import backend_name_for
from framework.errors import DownloadError, InvalidArgumentError
from framework.hookspecs import hookimpl
from framework.registry import Registrar, get_registry
from framework.testing import MemoryBackend
from tests.support.download import FORK, FaultServer

pytestmark = pytest.mark.timeout(60)


class ClosingBackend(MemoryBackend):
    """A memory backend that counts its `close` calls."""

    schemes: ClassVar[tuple[str, ...]] = ("memx",)
    closes: ClassVar[int] = 0

    def close(self) -> None:
        type(self).closes += 1


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    MemoryBackend.reset()
    ClosingBackend.closes = 0
    yield
    MemoryBackend.reset()


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("http://h/x", "http"),
        ("HTTPS://h/x", "http"),
        ("s3://b/k", "s3"),
        ("file:///tmp/x", "local"),
        ("/tmp/x", "local"),
        ("nobody://a/b", "nobody"),
    ],
)
def test_builtin_schemes_come_from_the_backend_classes(url: str, name: str) -> None:
    assert backend_name_for(url) == name
    assert HttpBackend.schemes == ("http", "https")
    assert (S3Backend.schemes, LocalBackend.schemes) == (("s3",), ("file",))


def test_a_plugin_class_declaring_schemes_serves_them(cache: Path) -> None:
    DownloadBackend.register("closing")(ClosingBackend)
    MemoryBackend.objects["memx://bucket/a.bin"] = b"declared"
    with DownloadManager(cache, progress=False) as manager:
        assert manager.cached_path("memx://bucket/a.bin").read_bytes() == b"declared"
        assert isinstance(manager.backend_for("memx://x"), ClosingBackend)
        with pytest.raises(DownloadError) as info:
            manager.cached_path("gopher://host/x")
    message = str(info.value)
    for scheme in ("'gopher'", "file", "http", "https", "memx", "s3"):
        assert scheme in message
    assert ClosingBackend.closes == 1  # the one it made, closed on leaving the block


def test_configured_http_backend_sends_its_headers_and_auth(http_server: FaultServer, cache: Path) -> None:
    url = http_server.add("/wired/private.bin", b"private")
    backend = HttpBackend(headers={"X-Api-Key": "k123"}, auth=("alice", "pw"))
    with DownloadManager(cache, progress=False, backends={"http": backend}) as manager:
        assert manager.backend_for(url) is backend
        assert manager.cached_path(url).read_bytes() == b"private"
    sent = http_server.route(url).headers[-1]
    assert sent["X-Api-Key"] == "k123" and sent["Authorization"].startswith("Basic ")
    assert sent["Accept-Encoding"] == "identity"  # byte offsets still count stored bytes


def test_headers_and_auth_stay_with_their_host(http_server: FaultServer, cache: Path) -> None:
    port = http_server.server_address[1]
    target = http_server.add("/wired/elsewhere.bin", b"moved")
    # Same server, another host name: a redirect to another host must not carry secrets.
    url = http_server.add("/wired/moved.bin", b"", redirect=f"http://localhost:{port}/wired/elsewhere.bin")
    backend = HttpBackend(headers={"X-Api-Key": "k123"}, auth=("alice", "pw"))
    manager = DownloadManager(cache, progress=False, backends={"http": backend})
    assert manager.cached_path(url).read_bytes() == b"moved"
    assert http_server.route(url).headers[-1]["X-Api-Key"] == "k123"
    arrived = http_server.route(target).headers[-1]
    assert "X-Api-Key" not in arrived and "Authorization" not in arrived


class _TokenAuth(requests.auth.AuthBase):
    """An auth putting its secret in a header of its own (GitLab's PRIVATE-TOKEN)."""

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["PRIVATE-TOKEN"] = "s3cr3t-token"
        return request


class _Challenging(BaseHTTPRequestHandler):
    """127.0.0.1/start redirects to localhost/file, which asks for Digest auth."""

    seen: list[tuple[str, dict[str, str]]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.seen.append((self.headers["Host"].split(":")[0], dict(self.headers)))
        if self.path == "/start":
            self.send_response(302)
            self.send_header("Location", f"http://localhost:{self.server.server_address[1]}/file")
        elif "Authorization" not in self.headers:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Digest realm="r", nonce="n", qop="auth"')
        else:
            self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.mark.parametrize("kind", ["token-header", "digest"])
def test_auth_objects_stay_with_their_host(cache: Path, kind: str) -> None:
    handler = type("Handler", (_Challenging,), {"seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    auth: requests.auth.AuthBase = (
        _TokenAuth() if kind == "token-header" else requests.auth.HTTPDigestAuth("alice", "pw")
    )
    try:
        with DownloadManager(cache, progress=False, backends={"http": HttpBackend(auth=auth)}) as manager:
            try:
                manager.cached_path(f"http://127.0.0.1:{server.server_address[1]}/start")
            except DownloadError:
                pass  # the other host's 401 stays unanswered
    finally:
        server.shutdown()
        server.server_close()
    own = [headers for host, headers in handler.seen if host == "127.0.0.1"]
    elsewhere = [headers for host, headers in handler.seen if host == "localhost"]
    assert elsewhere and not [h for h in elsewhere if "PRIVATE-TOKEN" in h or "Authorization" in h]
    if kind == "token-header":
        assert own[0]["PRIVATE-TOKEN"] == "s3cr3t-token"  # the URL's own host still gets it


def test_configured_s3_backend_takes_endpoint_and_profile(
    s3_env: str, tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    boto3.client("s3", endpoint_url=s3_env).create_bucket(Bucket="wired")
    boto3.client("s3", endpoint_url=s3_env).put_object(Bucket="wired", Key="k.bin", Body=b"s3 bytes")
    credentials = tmp_path / "credentials"
    credentials.write_text("[lab]\naws_access_key_id = lab\naws_secret_access_key = lab\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    backend = S3Backend(profile="lab", endpoint_url=s3_env, region="us-east-1")
    with DownloadManager(cache, progress=False, backends={"s3": backend}) as manager:
        assert manager.cached_path("s3://wired/k.bin").read_bytes() == b"s3 bytes"
        assert backend.client.meta.endpoint_url == s3_env
    # the process's client for these settings outlives the manager, shared by a backend alike
    assert S3Backend(profile="lab", endpoint_url=s3_env, region="us-east-1").client is backend.client


def test_close_closes_given_and_made_backends_and_the_manager_stays_usable(cache: Path) -> None:
    DownloadBackend.register("closing")(ClosingBackend)
    given = ClosingBackend()
    MemoryBackend.objects["memx://a/x.bin"] = b"x"
    MemoryBackend.objects["memy://a/y.bin"] = b"y"
    manager = DownloadManager(cache, progress=False, backends={"memy": given, "MEMZ": given})
    with manager:
        manager.cached_path("memx://a/x.bin")  # made from the registry
        manager.cached_path("memy://a/y.bin")  # given
    assert ClosingBackend.closes == 2  # each instance once, though given for two schemes
    assert manager.cached_path("memy://a/y.bin", force=True).read_bytes() == b"y"
    assert manager.backend_for("memz://a") is given


@pytest.mark.parametrize(
    ("backends", "expected"),
    [
        ({"s3": S3Backend}, r"backends\['s3'\] must be a DownloadBackend instance, got the class S3Backend"),
        ({"s3": "s3"}, r"backends\['s3'\] must be a DownloadBackend instance, got 's3'"),
        ({"s3://": S3Backend()}, "keys are URL schemes"),
    ],
)
def test_backends_argument_is_checked(backends: Any, expected: str) -> None:
    with pytest.raises(TypeError, match=expected):
        DownloadManager(backends=backends)


def _use_after_fork(manager: DownloadManager) -> None:
    manager.backend_for("memy://a/b")
    os._exit(0 if ClosingBackend.closes == 1 else 1)


def test_a_forked_child_closes_inherited_connections(cache: Path) -> None:
    given = ClosingBackend()
    manager = DownloadManager(cache, progress=False, backends={"memy": given})
    assert manager.backend_for("memy://a/b") is given and ClosingBackend.closes == 0
    child = FORK.Process(target=_use_after_fork, args=(manager,))
    child.start()
    child.join(timeout=30)
    assert child.exitcode == 0  # the child closed the pooled connections it inherited
    assert ClosingBackend.closes == 0  # the parent's are untouched


class BrokenPlugin:
    """A plugin whose backend cannot be imported."""

    @staticmethod
    @hookimpl
    def framework_register_components(registrar: Registrar) -> None:
        registrar.add(DownloadBackend, "broken", "no_such_module_anywhere:Backend")


def test_a_broken_backend_plugin_does_not_take_other_schemes_down(
    tmp_path: Path, manager: DownloadManager, caplog: pytest.LogCaptureFixture
) -> None:
    assert get_registry().add_plugin(BrokenPlugin, name="broken", provider="broken-plugin 0.1")
    source = tmp_path / "still-works.bin"
    source.write_bytes(b"fine")
    assert manager.cached_path(source.as_uri()).read_bytes() == b"fine"  # found by declared scheme
    assert "skipping the download backend 'broken'" in caplog.text


def test_a_registered_name_is_a_scheme_only_when_its_class_declares_it(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "local" is LocalBackend's name, not a scheme it declares: local:///x is no relative path.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "local:" / "data").mkdir(parents=True)
    (tmp_path / "local:" / "data" / "f.txt").write_text("decoy in the current folder")
    real = tmp_path / "data" / "f.txt"
    real.parent.mkdir()
    real.write_text("the real file")
    assert backend_name_for(f"local://{real}") != "local"
    with pytest.raises(InvalidArgumentError, match="file://"):
        LocalBackend().open(f"local://{real}")
    try:
        got = DownloadManager(cache, progress=False).cached_path(f"local://{real}").read_text()
    except DownloadError:
        return  # no fallback serves local:// here (fsspec missing): refused, not misread
    assert got == "the real file"


class _Mirror(MemoryBackend):
    schemes: ClassVar[tuple[str, ...]] = ("https", "s3", "file")


def test_conflicting_scheme_declarations_keep_the_builtins_and_warn(caplog: pytest.LogCaptureFixture) -> None:
    DownloadBackend.register("aaa-mirror")(_Mirror)  # sorts before every built-in
    caplog.set_level(logging.WARNING, logger="framework.download")
    got = {url: backend_name_for(url) for url in ("http://h/x", "https://h/x", "s3://b/k", "file:///x", "/x")}
    assert got == {
        "http://h/x": "http",
        "https://h/x": "http",
        "s3://b/k": "s3",
        "file:///x": "local",
        "/x": "local",
    }
    assert "'aaa-mirror', 'http' all declare the scheme 'https'" in caplog.text
    DownloadBackend.register("https")(_Mirror)  # registered under the scheme's name: chosen
    assert backend_name_for("https://h/x") == "https"
