"""The backend contract: one call shape, `end` only for a backend that declares
`supports_ranges`, and the how-to's complete backend passes `check_backend`."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Optional

import pytest

from framework.download import DownloadManager
from framework.download.backend import ByteStream, DownloadBackend, RemoteInfo
from framework.errors import DownloadError, InvalidArgumentError, NetworkError
from framework.testing import MemoryBackend, check_backend

HOWTO = Path(__file__).resolve().parents[2] / "docs" / "howto" / "download-backend.md"
DATA = bytes(range(256)) * 4096  # 1 MiB: more than one part at the sizes below


class _Ranged(DownloadBackend):
    """Serves DATA at any URL and honours `end`; records each call's arguments."""

    supports_ranges: ClassVar[bool] = True

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.calls: list[tuple[int, Optional[int], Optional[str]]] = []

    def open(
        self, url: str, offset: int = 0, *, end: Optional[int] = None, if_range: Optional[str] = None
    ) -> ByteStream:
        self.calls.append((offset, end, if_range))
        if offset > len(DATA):
            return ByteStream(iter(()), start=offset, size=len(DATA), etag='"v1"', status=416)
        stop = len(DATA) if end is None else min(end, len(DATA))
        status = 206 if (offset or end is not None) else 200
        return ByteStream(iter([DATA[offset:stop]]), start=offset, size=len(DATA), etag='"v1"', status=status)


class _OneStream(_Ranged):
    """The same object over one stream only: `end` must never come."""

    supports_ranges: ClassVar[bool] = False

    def open(
        self, url: str, offset: int = 0, *, end: Optional[int] = None, if_range: Optional[str] = None
    ) -> ByteStream:
        assert end is None, "a backend without supports_ranges was asked for a bounded range"
        return super().open(url, offset, if_range=if_range)


class _Legacy(DownloadBackend):
    """Written against the older signature: no `end` keyword at all."""

    def open(self, url: str, offset: int = 0, *, if_range: Optional[str] = None) -> ByteStream:
        return ByteStream(iter([DATA[offset:]]), start=offset, size=len(DATA), etag='"v1"')


def _manager(tmp_path: Path, backend: DownloadBackend) -> DownloadManager:
    return DownloadManager(
        tmp_path, connections=4, part_size=64 << 10, progress=False, backends={"contract": backend}
    )


def test_a_backend_without_ranges_is_never_given_end(tmp_path: Path) -> None:
    backend = _OneStream()
    assert _manager(tmp_path, backend).cached_path("contract://one/x.bin").read_bytes() == DATA
    assert backend.calls and all(end is None for _offset, end, _if_range in backend.calls)


def test_a_backend_with_ranges_is_fetched_in_parts_through_the_one_call_shape(tmp_path: Path) -> None:
    backend = _Ranged()
    assert _manager(tmp_path, backend).cached_path("contract://ranged/x.bin").read_bytes() == DATA
    ends = [end for _offset, end, _if_range in backend.calls]
    # The parallel path: every request bounded (the first asks to past any end; the ramp
    # may keep that one stream alone when it is fast).
    assert ends and all(end is not None for end in ends)
    assert all(if_range == '"v1"' for offset, _end, if_range in backend.calls if offset)


class _Oldest(DownloadBackend):
    """Written against the first signature: no keywords at all."""

    def open(self, url: str, offset: int = 0) -> ByteStream:  # type: ignore[override]
        return ByteStream(iter([DATA[offset:]]), start=offset, size=len(DATA), etag='"v1"')


@pytest.mark.parametrize("backend", [_Legacy(), _Oldest()], ids=["without-end", "without-keywords"])
def test_a_backend_of_another_signature_is_a_clear_error_before_any_byte(
    tmp_path: Path, backend: DownloadBackend
) -> None:
    """The manager calls `open` in one shape, `open(url, offset, end=, if_range=)`: a
    backend written for another signature is told what to change, at its first call."""
    with pytest.raises(
        InvalidArgumentError, match=r"open\(self, url, offset=0, \*, end=None, if_range=None\)"
    ):
        _manager(tmp_path, backend).cached_path("contract://legacy/x.bin")
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and not p.name.endswith(".lock")]


def test_a_type_error_inside_open_stays_a_type_error(tmp_path: Path) -> None:
    class Broken(_OneStream):
        def open(
            self, url: str, offset: int = 0, *, end: Optional[int] = None, if_range: Optional[str] = None
        ) -> ByteStream:
            raise TypeError("a bug inside the backend")

    with pytest.raises(Exception, match="a bug inside the backend") as info:
        _manager(tmp_path, Broken()).cached_path("contract://broken/x.bin")
    assert not isinstance(info.value, InvalidArgumentError)


def test_asking_a_one_stream_backend_for_a_range_is_a_clear_error() -> None:
    from framework.download._stream import open_stream

    with pytest.raises(DownloadError, match="does not serve bounded byte ranges"):
        open_stream(MemoryBackend(), "mem://x", 0, end=10)
    with pytest.raises(DownloadError, match="supports_ranges is False"):
        MemoryBackend().open("mem://x", 0, end=10)


def test_check_backend_passes_the_first_party_test_backends() -> None:
    MemoryBackend.objects["mem://contract"] = DATA
    try:
        check_backend(MemoryBackend(), "mem://contract", DATA)
    finally:
        MemoryBackend.reset()
    check_backend(_Ranged(), "contract://x", DATA)
    check_backend(_OneStream(), "contract://x", DATA)


def test_check_backend_catches_an_end_that_is_not_honoured() -> None:
    class IgnoresEnd(_Ranged):
        supports_ranges: ClassVar[bool] = True  # an override keeps the promise only by saying so

        def open(
            self, url: str, offset: int = 0, *, end: Optional[int] = None, if_range: Optional[str] = None
        ) -> ByteStream:
            return super().open(url, offset, if_range=if_range)

    with pytest.raises(AssertionError, match=r"asked for \[0, 1\)"):
        check_backend(IgnoresEnd(), "contract://x", DATA)


def test_check_backend_catches_a_signature_without_end() -> None:
    with pytest.raises(AssertionError, match="must take"):
        check_backend(_Legacy(), "contract://x", DATA)


def test_check_backend_catches_a_wrong_stat() -> None:
    class WrongStat(_Ranged):
        def stat(self, url: str) -> RemoteInfo:
            return RemoteInfo(size=len(DATA) + 1)

    with pytest.raises(AssertionError, match="stat says"):
        check_backend(WrongStat(), "contract://x", DATA)


def _howto_namespace() -> dict[str, Any]:
    """Run the how-to's Python blocks in order, as a reader would paste them."""
    blocks = re.findall(r"```python\n(.*?)```", HOWTO.read_text(), re.S)
    backend = next(block for block in blocks if "class NumbersBackend" in block)
    check = next(block for block in blocks if "check_backend(" in block)
    namespace: dict[str, Any] = {"__name__": "howto_backend"}
    exec(compile(backend, str(HOWTO), "exec"), namespace)
    exec(compile(check, str(HOWTO), "exec"), namespace)  # raises if the check fails
    return namespace


def test_the_howto_backend_passes_check_backend() -> None:
    namespace = _howto_namespace()
    cls = namespace["NumbersBackend"]
    assert cls.supports_ranges is True
    body = "".join(f"{n}\n" for n in range(50_000)).encode()
    check_backend(cls(), "numbers://50000", body)


def test_the_howto_backend_serves_the_manager_in_parts(tmp_path: Path) -> None:
    cls = _howto_namespace()["NumbersBackend"]

    class Counting(cls):  # type: ignore[misc, valid-type]
        ends: ClassVar[list[Optional[int]]] = []
        supports_ranges: ClassVar[bool] = True

        def open(self, url: str, offset: int = 0, **keywords: Any) -> ByteStream:
            self.ends.append(keywords.get("end"))
            return super().open(url, offset, **keywords)  # type: ignore[no-any-return]

    body = "".join(f"{n}\n" for n in range(200_000)).encode()
    manager = DownloadManager(
        tmp_path, connections=4, part_size=64 << 10, progress=False, backends={"numbers": Counting()}
    )
    path = manager.cached_path("numbers://200000")
    assert path.read_bytes() == body
    assert Counting.ends and all(end is not None for end in Counting.ends)  # the parallel path


def test_the_first_party_backends_pass_check_backend(http_server: Any, s3_env: str, tmp_path: Path) -> None:
    import boto3
    from framework_plugins.http import HttpBackend
    from framework_plugins.local import LocalBackend
    from framework_plugins.s3 import S3Backend

    from tests.support.download import unique_path

    url = http_server.add(unique_path("contract"), DATA, etag='"contract"')
    with HttpBackend(backoff_factor=0.01) as http:
        assert http.supports_ranges
        check_backend(http, url, DATA)
    bucket = f"contract-{os.getpid()}-{os.urandom(3).hex()}"
    client = boto3.client("s3", endpoint_url=s3_env)
    client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key="contract.bin", Body=DATA)
    with S3Backend() as s3:
        assert s3.supports_ranges
        check_backend(s3, f"s3://{bucket}/contract.bin", DATA)
    local = tmp_path / "contract.bin"
    local.write_bytes(DATA)
    assert not LocalBackend.supports_ranges
    check_backend(LocalBackend(), local.as_uri(), DATA)


def test_the_example_plugins_backend_passes_check_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    package = Path(__file__).resolve().parents[2] / "examples" / "framework-example-plugin"
    monkeypatch.syspath_prepend(str(package))
    from framework_example_plugin.backend import NumbersBackend

    body = "".join(f"{n}\n" for n in range(1000)).encode()
    check_backend(NumbersBackend(), "numbers://1000", body)


def test_check_backend_catches_bytes_past_the_end_not_answered_416() -> None:
    class NoStatus(_Ranged):
        supports_ranges: ClassVar[bool] = True

        def open(
            self, url: str, offset: int = 0, *, end: Optional[int] = None, if_range: Optional[str] = None
        ) -> ByteStream:
            if offset > len(DATA):
                return ByteStream(iter(()), start=offset, size=len(DATA), etag='"v1"')
            return super().open(url, offset, end=end, if_range=if_range)

    with pytest.raises(AssertionError, match="not 416"):
        check_backend(NoStatus(), "contract://x", DATA)


def test_a_subclass_of_the_http_backend_keeps_supports_ranges(tmp_path: Path) -> None:
    """A user's HttpBackend subclass overriding `open` with the contract's signature
    inherits `supports_ranges`: the object comes in parts over several connections."""
    from framework_plugins.http import HttpBackend

    from framework.download import DownloadManager
    from tests.support.download import PART, SLOW, FaultServer, serving, unique_path

    class LoggingHttp(HttpBackend):
        opened: list[int] = []

        def open(
            self, url: str, offset: int = 0, *, end: Optional[int] = None, if_range: Optional[str] = None
        ) -> ByteStream:
            self.opened.append(offset)
            return super().open(url, offset, end=end, if_range=if_range)

    data = os.urandom(12 * PART)
    with serving(FaultServer()) as server:
        url = server.add(unique_path("contract-subclass"), data, etag='"v1"', **SLOW)
        manager = DownloadManager(
            tmp_path, connections=4, part_size=PART, progress=False, backoff_factor=0.01,
            backends={"http": LoggingHttp(backoff_factor=0.01)},
        )  # fmt: skip
        assert manager.cached_path(url).read_bytes() == data
    assert LoggingHttp.supports_ranges and len(LoggingHttp.opened) > 1


def test_a_mixin_open_of_another_signature_before_http_backend_is_a_clear_error() -> None:
    """The mixin's `open` (no `end`) is the one called; `supports_ranges` is HttpBackend's
    True, as declared: the call tells what to change instead of a bare TypeError."""
    from framework_plugins.http import HttpBackend

    class LoggingOpen:
        def open(self, url: str, offset: int = 0, *, if_range: Optional[str] = None) -> ByteStream:
            return super().open(url, offset, if_range=if_range)  # type: ignore[misc, no-any-return]

    class Mine(LoggingOpen, HttpBackend):
        pass

    from framework.download._stream import open_stream

    with pytest.raises(InvalidArgumentError, match="cannot be called as the DownloadBackend contract"):
        open_stream(Mine(), "http://127.0.0.1:9/x", 0, end=10)


_BODY = bytes(range(256)) * 64


class _RecordingBackend(DownloadBackend):
    """One stream (no ranges); the first body breaks off halfway; records the keywords
    each `open` is called with."""

    supports_ranges: ClassVar[bool] = False
    shapes: ClassVar[list[tuple[str, ...]]] = []

    def open(self, url: str, offset: int = 0, **keywords: Any) -> ByteStream:  # type: ignore[override]
        self.shapes.append(tuple(sorted(keywords)))
        first = len(self.shapes) == 1

        def chunks() -> Iterator[bytes]:
            if first:
                yield _BODY[offset : len(_BODY) // 2]
                raise NetworkError(url, "connection reset")
            yield _BODY[offset:]

        status = 206 if offset else 200
        return ByteStream(chunks(), start=offset, size=len(_BODY), etag='"v1"', status=status)


def test_the_manager_calls_open_in_one_shape(tmp_path: Path) -> None:
    _RecordingBackend.shapes = []
    with DownloadManager(
        tmp_path, progress=False, backoff_factor=0.0, backends={"rec": _RecordingBackend()}
    ) as manager:
        assert manager.cached_path("rec://object").read_bytes() == _BODY
    assert len(_RecordingBackend.shapes) >= 2  # the break was resumed
    assert set(_RecordingBackend.shapes) == {("end", "if_range")}, _RecordingBackend.shapes


class _RangedBody(DownloadBackend):
    supports_ranges: ClassVar[bool] = True

    def open(
        self, url: str, offset: int = 0, *, end: Optional[int] = None, if_range: Optional[str] = None
    ) -> ByteStream:
        stop = len(_BODY) if end is None else min(end, len(_BODY))
        return ByteStream(iter([_BODY[offset:stop]]), start=offset, size=len(_BODY), etag='"v1"', status=206)


def test_a_subclass_keeping_the_declared_open_keeps_supports_ranges() -> None:
    class WithHeader(_RangedBody):
        def open(
            self, url: str, offset: int = 0, *, end: Optional[int] = None, if_range: Optional[str] = None
        ) -> ByteStream:
            return super().open(url, offset, end=end, if_range=if_range)

    assert WithHeader.supports_ranges
