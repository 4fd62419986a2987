"""Secrets in URLs (user-info, tokens in the query, the fragment or path parameters) are
never shown: not in errors, logs, progress bars or cache file names."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from framework._redact import redact_url
from framework.download import DownloadManager
from framework.errors import DownloadError, HTTPStatusError, InvalidArgumentError, NetworkError
from tests.support.download import FaultServer

SECRETS = ("hunter2", "sigsecret", "toksecret", "credsecret")


def _secret_url(base: str, path: str) -> str:
    host = base.split("://", 1)[1]
    query = "X-Amz-Credential=credsecret&X-Amz-Signature=sigsecret&token=toksecret&v=2"
    return f"http://alice:hunter2@{host}{path}?{query}"


def _assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, text


def test_redact_url_keeps_what_is_not_secret() -> None:
    url = "https://user:pw@h.org/d/f.bin?X-Amz-Signature=abc&v=2&api_key=k#part"
    assert redact_url(url) == "https://***@h.org/d/f.bin?X-Amz-Signature=***&v=2&api_key=***#part"
    assert redact_url("s3://bucket/report?v=2") == "s3://bucket/report?v=2"


def test_secrets_never_appear_in_errors_or_logs(
    http_server: FaultServer, manager: DownloadManager, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="framework.download")
    missing = _secret_url(http_server.base, "/missing.bin")
    with pytest.raises(HTTPStatusError) as status:
        manager.cached_path(missing)
    assert status.value.url == missing  # the field keeps the URL as given
    _assert_no_secret(str(status.value))
    assert "v=2" in str(status.value) and "missing.bin" in str(status.value)

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    refused = _secret_url(f"http://127.0.0.1:{port}", "/gone.bin")
    quick = DownloadManager(manager.cache_dir, retries=1, backoff_factor=0.01, progress=False)
    with pytest.raises(NetworkError) as network:
        quick.cached_path(refused)
    _assert_no_secret(str(network.value))
    _assert_no_secret(repr(network.value))

    served = _secret_url(http_server.base, "/served.bin")
    http_server.add(served.split(str(http_server.server_address[1]), 1)[1], b"served")
    assert manager.cached_path(served).read_bytes() == b"served"
    assert any("served.bin" in record.getMessage() for record in caplog.records)
    _assert_no_secret(caplog.text)


def test_download_error_redacts_urls_quoted_in_its_message() -> None:
    error = DownloadError("https://h/x?token=toksecret", "redirected to https://u:hunter2@o/y?sig=sigsecret")
    _assert_no_secret(str(error))
    _assert_no_secret(error.reason)


def test_no_secret_is_written_into_the_shared_cache(http_server: FaultServer, cache: Path) -> None:
    # Others read a group-readable cache folder: the sidecar and the lock's owner file
    # must not hand them the token.
    served = _secret_url(http_server.base, "/cached-secret.bin")
    http_server.add(served.split(str(http_server.server_address[1]), 1)[1], b"payload", delay=0.2, chunk=2)
    manager = DownloadManager(cache, progress=False)
    seen: dict[str, bytes] = {}
    done = threading.Event()

    def watch() -> None:  # read every file in the cache while the download runs
        while not done.is_set():
            for path in cache.rglob("*") if cache.exists() else []:  # the work folder's too
                with contextlib.suppress(OSError):
                    seen[path.name] = path.read_bytes()
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        assert manager.cached_path(served).read_bytes() == b"payload"
    finally:
        done.set()
        watcher.join()
    for path in cache.rglob("*"):
        if path.is_file():
            seen[path.name] = path.read_bytes()
    assert any(name.endswith(".owner") for name in seen) and any(name.endswith(".json") for name in seen)
    for name, content in seen.items():
        _assert_no_secret(f"{name}: {content!r}")


def test_s3_url_with_credentials_is_refused_without_quoting_them(manager: DownloadManager) -> None:
    url = "s3://AKIAEXAMPLE:MySecretKey@bucket/key"
    with pytest.raises(InvalidArgumentError, match="profile or the environment") as info:
        manager.cached_path(url)
    assert info.value.url == url and "MySecretKey" not in str(info.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # requests and urllib take everything before the LAST "@" as user-info
        ("http://user:hunter@2SECRET@127.0.0.1:1/f.bin", "http://***@127.0.0.1:1/f.bin"),
        # a raw AWS secret key may hold "/"
        ("s3://AKIA:ab/2SECRET@bucket/key", "s3://***@bucket/key"),
        ("https://h/a?pass=2SECRET&pw=2SECRET&v=1", "https://h/a?pass=***&pw=***&v=1"),
        ("https://h/a#access_token=2SECRET&x=1", "https://h/a#access_token=***&x=1"),
        ("https://h/a?hdnts=exp=1~hmac=2SECRET&hmac=2SECRET", "https://h/a?hdnts=***&hmac=***"),
        # a port before a path with "@" is no password
        ("https://h.org:8443/users/me@example.com/f", "https://h.org:8443/users/me@example.com/f"),
    ],
)
def test_redact_url_hides_the_whole_secret(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_password_with_an_at_sign_is_not_half_shown(manager: DownloadManager) -> None:
    url = "http://user:hunter@2SECRET@127.0.0.1:1/f.bin"
    quick = DownloadManager(manager.cache_dir, retries=1, backoff_factor=0, progress=False)
    with pytest.raises(DownloadError) as info:
        quick.cached_path(url)
    assert "2SECRET" not in str(info.value) and "127.0.0.1:1/f.bin" in str(info.value)


def test_urllib3_debug_logs_carry_no_query_token(
    http_server: FaultServer, manager: DownloadManager, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # what people turn on to troubleshoot: urllib3.util.retry too
    caplog.set_level(logging.DEBUG, logger="urllib3")  # `framework download` may have quietened it
    url = http_server.add("/retried.bin?token=TOKSECRET123", b"hi", fail_statuses=[503])
    quick = DownloadManager(manager.cache_dir, backoff_factor=0, progress=False)
    assert quick.cached_path(url).read_bytes() == b"hi"
    assert any(record.name.startswith("urllib3") for record in caplog.records)
    assert "TOKSECRET123" not in caplog.text


def test_a_hidden_secret_is_not_in_cache_file_names_or_logs(
    http_server: FaultServer, cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="framework.download")
    url = http_server.add("/file.bin;jsessionid=SESSION0123456789", b"hi")
    manager = DownloadManager(cache, progress=False)
    path = manager.cached_path(url)
    assert path.read_bytes() == b"hi" and path.name.endswith("-file.bin")
    assert not [name for name in os.listdir(cache) if "SESSION0123456789" in name]
    assert "SESSION0123456789" not in caplog.text
    plain = cache.parent / "x;token=PLAINSECRET"
    plain.write_bytes(b"local")
    assert "PLAINSECRET" not in manager.cached_path(plain).name
