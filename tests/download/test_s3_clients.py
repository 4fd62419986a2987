"""One boto3 client per settings in a process, and refusals raised at once when a
parallel fetch asks: counted at moto's server or a fake S3 server on 127.0.0.1."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import pytest

from framework.download import DownloadManager
from framework.download.backend import refusals_at_once
from framework.errors import HTTPStatusError
from tests.support.download import FORK, FaultServer

pytestmark = pytest.mark.timeout(60)


def test_s3_refusal_is_raised_at_once_when_asked(
    http_server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 503 with Retry-After from an S3 server: inside `refusals_at_once` it is raised
    at once with its Retry-After (botocore would wait it out holding the part); outside,
    botocore's retries still wait it out."""
    from framework_plugins.s3 import S3Backend

    for name, value in (
        ("AWS_ACCESS_KEY_ID", "t"),
        ("AWS_SECRET_ACCESS_KEY", "t"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)
    data = os.urandom(1000)
    http_server.add("/bucket/refusing.bin", data, fail_statuses=[503], retry_after="2")
    route = http_server.routes["/bucket/refusing.bin"]
    backend = S3Backend(endpoint_url=http_server.base, retries=3, backoff_factor=0.01)
    with refusals_at_once(), pytest.raises(HTTPStatusError) as caught:
        backend.open("s3://bucket/refusing.bin", 0, end=100)
    assert (caught.value.status, caught.value.retry_after, route.gets) == (503, 2.0, 1)
    route.fail_statuses = [503]
    with backend.open("s3://bucket/refusing.bin", 0, end=100) as stream:
        assert b"".join(stream.chunks) == data[:100]
    assert route.gets == 3  # refused once more, then served: retried inside botocore


@pytest.fixture
def counted_clients(monkeypatch: pytest.MonkeyPatch) -> list[Optional[str]]:
    """The endpoints of the boto3 clients made from now on, with no client kept yet."""
    import boto3
    from framework_plugins import s3

    monkeypatch.setattr(s3, "_CLIENTS", {})
    made: list[Optional[str]] = []
    real = boto3.session.Session.client

    def counting(self: Any, *args: Any, **options: Any) -> Any:
        made.append(options.get("endpoint_url"))
        return real(self, *args, **options)

    monkeypatch.setattr(boto3.session.Session, "client", counting)
    return made


def test_one_s3_client_across_calls_and_managers(
    s3_env: str, tmp_path: Path, counted_clients: list[Optional[str]]
) -> None:
    import boto3

    bucket = f"clients-{uuid.uuid4().hex[:8]}"
    setup = boto3.client("s3", endpoint_url=s3_env)
    setup.create_bucket(Bucket=bucket)
    for key in ("a.bin", "b.bin"):
        setup.put_object(Bucket=bucket, Key=key, Body=key.encode() * 100)
    counted_clients.clear()  # the setup client above is not the backend's
    for number, key in enumerate(("a.bin", "b.bin")):
        with DownloadManager(tmp_path / str(number), progress=False) as manager:  # closes its backends
            assert manager.cached_path(f"s3://{bucket}/{key}").read_bytes() == key.encode() * 100
    assert counted_clients == [s3_env]


def test_a_forked_child_makes_its_own_s3_client(s3_env: str, counted_clients: list[Optional[str]]) -> None:
    from framework_plugins.s3 import S3Backend

    parent = S3Backend().client
    receive, send = FORK.Pipe(duplex=False)

    def child() -> None:
        from framework_plugins import s3

        kept = len(s3._CLIENTS)
        client = S3Backend().client
        send.send((kept, client is parent, S3Backend().client is client, len(counted_clients)))

    process = FORK.Process(target=child)
    process.start()
    answer = receive.recv()
    process.join()
    # the child kept none of the parent's, made one, and reused it; the parent made one
    assert answer == (0, False, True, 2)
    assert S3Backend().client is parent and counted_clients == [s3_env]


def test_a_changed_environment_replaces_the_client_it_made(
    s3_env: str, counted_clients: list[Optional[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys rotated in the environment sign the next call with a new client, which
    replaces the old one: five rotations leave one client, not five."""
    from framework_plugins import s3
    from framework_plugins.s3 import S3Backend

    first = S3Backend().client
    for rotation in range(5):
        monkeypatch.setenv("AWS_SESSION_TOKEN", f"rotated-{rotation}")
        client = S3Backend().client
        assert client is not first and S3Backend().client is client
        first = client
    assert len(counted_clients) == 6 and len(s3._CLIENTS) == 1


@pytest.fixture
def fresh_s3_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    """No boto3 client kept from another test, and no AWS setting of the machine."""
    pytest.importorskip("boto3")
    from framework_plugins import s3

    monkeypatch.setattr(s3, "_CLIENTS", {})
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)


def _access_key_sent(headers: dict[str, str]) -> str:
    authorization = headers.get("Authorization", "")
    return authorization.split("Credential=", 1)[1].split("/", 1)[0] if "Credential=" in authorization else ""


def _keys_sent(http_server: FaultServer, name: str, rotate: Callable[[str], None]) -> list[str]:
    """The access key each of two calls signs with, `rotate(key)` run before each."""
    from framework_plugins.s3 import S3Backend

    data = os.urandom(1000)
    http_server.add(f"/bucket/{name}", data)
    route = http_server.routes[f"/bucket/{name}"]
    sent = []
    for key in ("FIRSTKEY", "SECONDKEY"):
        rotate(key)
        with S3Backend(endpoint_url=http_server.base, retries=1).open(f"s3://bucket/{name}") as stream:
            assert b"".join(stream.chunks) == data
        sent.append(_access_key_sent(route.headers[-1]))
    return sent


def test_s3_keys_rotated_in_the_credentials_file_are_the_ones_sent(
    http_server: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_s3_clients: None
) -> None:
    """The docs: "honours ... the usual credential chain": tools such as `aws configure`,
    saml2aws or a Vault agent rewrite `~/.aws/credentials` with new (short-lived) keys;
    the next call signs with them, as a fresh boto3 client would, not with the keys the
    process-wide client read at its first call (expired by then)."""
    credentials = tmp_path / "credentials"
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))

    def rotate(key: str) -> None:
        credentials.write_text(
            f"[default]\naws_access_key_id = {key}\naws_secret_access_key = {key.lower()}\n"
        )

    assert _keys_sent(http_server, "rotated-file.bin", rotate) == ["FIRSTKEY", "SECONDKEY"]


def test_an_s3_setting_changed_in_the_environment_is_the_one_used(
    http_server: FaultServer, monkeypatch: pytest.MonkeyPatch, fresh_s3_clients: None
) -> None:
    """`S3Backend.client`: one client "while the environment boto3's chain reads stays the
    same". A MinIO or Ceph user told to set `AWS_RESPONSE_CHECKSUM_VALIDATION=when_required`
    sets it in the notebook and calls again: that call must not ask for checksums."""
    from framework_plugins.s3 import S3Backend

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    data = os.urandom(1000)
    http_server.add("/bucket/checksum-mode.bin", data)
    route = http_server.routes["/bucket/checksum-mode.bin"]
    asked = []
    for validation in ("when_supported", "when_required"):
        monkeypatch.setenv("AWS_RESPONSE_CHECKSUM_VALIDATION", validation)
        with S3Backend(endpoint_url=http_server.base, retries=1).open(
            "s3://bucket/checksum-mode.bin"
        ) as stream:
            assert b"".join(stream.chunks) == data
        asked.append(
            {name.lower(): value for name, value in route.headers[-1].items()}.get("x-amz-checksum-mode")
        )
    assert asked == ["ENABLED", None]


def test_s3_keys_set_in_the_environment_later_are_the_ones_sent(
    http_server: FaultServer, monkeypatch: pytest.MonkeyPatch, fresh_s3_clients: Any
) -> None:
    """Credentials come from boto3's chain, the environment first: keys rotated there
    (a notebook that sets them after a `NoCredentialsError`, a job refreshing a session
    token) sign the next call, not the keys a process-wide client read first."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)

    def rotate(key: str) -> None:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key.lower())

    assert _keys_sent(http_server, "rotated.bin", rotate) == ["FIRSTKEY", "SECONDKEY"]


def test_an_s3_refusal_with_a_retry_after_date_is_waited_as_asked(
    http_server: FaultServer, monkeypatch: pytest.MonkeyPatch, fresh_s3_clients: Any
) -> None:
    """Retry-After is delay-seconds or an HTTP-date (RFC 9110 10.2.3); a refused part
    waits what the server asked, as over HTTP, not the backoff: a date 30 s ahead is
    about 30 s (never more than 60), a date in the past is no wait."""
    from email.utils import formatdate

    from framework_plugins.s3 import S3Backend

    from framework.download.backend import refusals_at_once
    from framework.errors import HTTPStatusError

    for name, value in (
        ("AWS_ACCESS_KEY_ID", "t"),
        ("AWS_SECRET_ACCESS_KEY", "t"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)
    http_server.add("/bucket/dated.bin", os.urandom(1000))
    route = http_server.routes["/bucket/dated.bin"]
    backend = S3Backend(endpoint_url=http_server.base, retries=3)
    waits = []
    for ahead in (30, -3600):
        route.fail_statuses, route.retry_after = [503], formatdate(time.time() + ahead, usegmt=True)
        with refusals_at_once(), pytest.raises(HTTPStatusError) as caught:
            backend.open("s3://bucket/dated.bin", 0, end=100)
        waits.append(caught.value.retry_after)
    assert waits[0] is not None and 20 <= waits[0] <= 31
    assert waits[1] == 0.0


def _models_read_by_a_new_client(queue: Any) -> None:
    """In a forked child: how many model files a client for other settings reads."""
    import botocore.loaders
    from framework_plugins.s3 import S3Backend

    reads = []
    original = botocore.loaders.JSONFileLoader.load_file

    def counted(self: Any, file_path: str) -> Any:
        reads.append(file_path)
        return original(self, file_path)

    botocore.loaders.JSONFileLoader.load_file = counted  # type: ignore[method-assign]
    S3Backend(region="eu-west-1").client  # noqa: B018 (made on first use)
    queue.put(len(reads))


def test_a_forked_worker_makes_its_client_from_the_parents_parsed_models(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each loader worker streaming S3 shards makes its own client (sockets are not
    shared across fork); the service models the parent parsed are not read again."""
    pytest.importorskip("boto3")
    from framework_plugins.s3 import S3Backend

    for name, value in (("AWS_ACCESS_KEY_ID", "t"), ("AWS_SECRET_ACCESS_KEY", "t")):
        monkeypatch.setenv(name, value)
    S3Backend(region="us-east-1").client  # noqa: B018 (the parent's, as listing a glob makes it)
    queue = FORK.Queue()
    child = FORK.Process(target=_models_read_by_a_new_client, args=(queue,))
    child.start()
    reads = queue.get(timeout=30)
    child.join(timeout=30)
    assert reads == 0
