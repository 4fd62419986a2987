"""`S3Backend`: `s3://bucket/key` through boto3 (`pip install framework[s3]`).

Credentials come from boto3's usual chain (environment, profiles, instance roles),
or from the profile given; `endpoint_url` (else `AWS_ENDPOINT_URL`) points it at
any S3-speaking server. The key is everything after `s3://bucket/`, taken
literally as the AWS CLI does: `?`, `#`, `%` and `//` are part of it.
"""

from __future__ import annotations

import builtins
import hashlib
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, Final, Optional

from framework_plugins.http import retry_after_seconds

from framework.download.backend import (
    POOL_SIZE,
    ByteStream,
    DownloadBackend,
    ListedObject,
    ReadPace,
    RemoteInfo,
    range_place,
    refusals_wanted_at_once,
)
from framework.errors import (
    ChecksumError,
    DownloadError,
    HTTPStatusError,
    InvalidArgumentError,
    MissingDependencyError,
    NetworkError,
)

__all__ = ["S3Backend"]

# What a body that checks a checksum as it reads is read by: each read waits for all of
# it, so small (64 KiB comes in 4 ms at 16 MiB/s).
CHECKED_CHUNK_SIZE: Final = 64 << 10


_NEEDS_BOTO3: Final = "s3:// URLs need boto3: pip install 'framework[s3]'"
# Statuses a refusal comes with: raised at once inside `refusals_at_once` (see `_refuse_at_once`).
_REFUSALS: Final = frozenset({429, 503})

# One boto3 client per (profile, endpoint, region, retries, timeout) in this process:
# making one costs ~0.1 s of CPU and a new connection pool, and a client is thread-safe.
# A forked child starts with none (a parent's pooled sockets are never shared). A client
# keeps what boto3's chain gave when it was made (credentials, region, botocore's
# settings): a digest of every `AWS_*` environment variable, and the stat of the shared
# credentials and config files, is kept beside it, so keys set or rotated in either (a
# credential helper rewriting `~/.aws/credentials`) sign the next call with a new client,
# which replaces the old one (a process whose settings keep changing holds one client per
# settings, not one per change). A hit costs two stats and a hash of the environment.
_CHAIN_FILES: Final = (
    ("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"),
    ("AWS_CONFIG_FILE", "~/.aws/config"),
)
_CLIENTS: dict[tuple[Any, ...], tuple[str, Any]] = {}  # settings -> (environment digest, client)
_CLIENTS_LOCK = threading.Lock()


def _forget_clients() -> None:
    """In a forked child: the parent's clients (and their sockets) are not this process's."""
    global _CLIENTS_LOCK
    _CLIENTS.clear()
    _CLIENTS_LOCK = threading.Lock()  # a parent's thread may have held it at the fork


os.register_at_fork(after_in_child=_forget_clients)

_LOADER: Optional[Any] = None  # botocore's parsed service models, kept across fork


def _botocore_session() -> Any:
    """A fresh botocore session (its own credentials and config, read anew) that shares
    one loader of service models: a client then costs ~15 ms instead of ~150 ms, which
    each forked loader worker streaming S3 shards pays before its first fetch."""
    global _LOADER
    import botocore.loaders
    import botocore.session

    if _LOADER is None:
        _LOADER = botocore.loaders.create_loader()
    # boto3 adds its own data folder to the loader's search path for every session.
    _LOADER.search_paths[:] = list(dict.fromkeys(_LOADER.search_paths))
    session = botocore.session.Session()
    session.register_component("data_loader", _LOADER)
    return session


class _Refused(Exception):
    """A request refused (429, 503) that is not to be retried here (`_refuse_at_once`)."""

    def __init__(self, status: int, code: str, retry_after: Optional[float]) -> None:
        super().__init__(f"S3 {code or status}")
        self.status, self.code, self.retry_after = status, code, retry_after


def _refuse_at_once(response: Any = None, **_: Any) -> None:
    """botocore's `needs-retry` hook, first in line: inside `refusals_at_once`, a 429 or
    503 is raised at once (with its Retry-After) instead of retried after a backoff, so
    that a parallel fetch hands the part to a connection the server serves."""
    if response is None or not refusals_wanted_at_once():
        return
    http, parsed = response
    status = getattr(http, "status_code", 0)
    if status not in _REFUSALS:
        return
    retry_after = retry_after_seconds((getattr(http, "headers", None) or {}).get("Retry-After"))
    code = (parsed or {}).get("Error", {}).get("Code", "") if isinstance(parsed, dict) else ""
    raise _Refused(status, code, retry_after)


def _chain_environment() -> str:
    """A digest of what boto3's chain reads when a client is made: every `AWS_*`
    environment variable, and the identity of the shared credentials and config files
    (never the secrets themselves in the key)."""
    digest = hashlib.sha256()
    for name, value in sorted(item for item in os.environ.items() if item[0].startswith("AWS_")):
        digest.update(f"{name}={value}\0".encode("utf-8", "surrogateescape"))
    for variable, default in _CHAIN_FILES:
        digest.update(f"{_file_identity(os.environ.get(variable) or default)}\0".encode())
    return digest.hexdigest()


def _file_identity(path: str) -> tuple[int, ...]:
    """What changes when a file is rewritten (inode, size, mtime); () when it is missing."""
    try:
        info = os.stat(os.path.expanduser(path))
    except (OSError, ValueError):  # missing, unreadable, or a name with a NUL
        return ()
    return info.st_ino, info.st_size, info.st_mtime_ns


def _split(url: str) -> tuple[str, str]:
    """(bucket, key); not `urlsplit`, which would cut the key at `?` or `#`."""
    bucket, _, key = url.partition("://")[2].partition("/")
    if "@" in bucket or ":" in bucket:
        # s3://KEY:SECRET@bucket/...: never quote it (botocore would, unredacted).
        raise InvalidArgumentError(
            url,
            "an S3 URL carries no credentials or port (s3://bucket/key); "
            "give keys through a profile or the environment, an endpoint through endpoint_url",
        )
    if not bucket or not key:
        raise InvalidArgumentError(url, "an S3 URL looks like s3://bucket/key")
    return bucket, key


def _split_prefix(prefix: str) -> tuple[str, str]:
    """(bucket, key prefix) of `s3://bucket/prefix`; the key prefix may be empty, the
    bucket may not (a listing never spans buckets)."""
    bucket, slash, key = prefix.partition("://")[2].partition("/")
    if not slash or not bucket:
        raise InvalidArgumentError(
            prefix, "an S3 listing names one bucket: s3://bucket/ or s3://bucket/prefix (no glob in it)"
        )
    _split(f"{prefix}-" if not key else prefix)  # no credentials or port, as in a URL
    return bucket, key


def _checksum_error(url: str, error: Exception) -> DownloadError:
    """S3's checksum of a whole object did not match the bytes (botocore checked it)."""
    found = re.search(r"Expected checksum (\S+) did not match calculated checksum: (\S+)", str(error))
    if found is None:
        return DownloadError(url, f"the bytes do not match S3's checksum of the object: {error}")
    return ChecksumError(url, found[1], found[2], what="S3 checksum")


@contextmanager
def _s3_errors(url: str) -> Iterator[None]:
    """botocore's and the client's failures inside the block as `DownloadError`s naming
    `url` (an `InvalidRange` is raised as it is: `open` reports it as a 416)."""
    try:
        from botocore import exceptions as bce

        yield
    except ImportError as error:
        raise MissingDependencyError(url, _NEEDS_BOTO3) from error
    except _Refused as error:
        message = f"S3 {error.code or error.status}"
        raise HTTPStatusError(url, error.status, message, error.retry_after) from error
    except bce.ClientError as error:
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
        code = error.response.get("Error", {}).get("Code", "")
        if status == 416 or code == "InvalidRange":
            raise
        raise HTTPStatusError(url, status, f"S3 {code or status}: {error}") from error
    except bce.NoCredentialsError as error:
        raise DownloadError(
            url, "no AWS credentials found: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile"
        ) from error
    except (bce.EndpointConnectionError, bce.ConnectionError, bce.ReadTimeoutError) as error:
        raise NetworkError(url, str(error)) from error
    except bce.ParamValidationError as error:  # e.g. a bucket name S3 cannot have
        raise InvalidArgumentError(url, f"S3 refused the request before sending it: {error}") from error
    except bce.BotoCoreError as error:  # a missing profile or region, bad settings
        raise DownloadError(url, f"S3: {type(error).__name__}: {error}") from error


class S3Backend(DownloadBackend):
    """S3 objects, read with ranged `GetObject` calls.

    Args:
        profile: a profile of `~/.aws/config`; `None` for boto3's default chain.
        endpoint_url: an S3-speaking server (MinIO, Ceph...); `None` reads
            `AWS_ENDPOINT_URL`.
        region: the bucket's region; `None` for boto3's default.
        retries, backoff_factor, timeout: as in `DownloadManager`.
    """

    schemes: ClassVar[tuple[str, ...]] = ("s3",)
    supports_ranges: ClassVar[bool] = True  # a parallel fetch asks for parts (`end`)
    supports_listing: ClassVar[bool] = True
    # Keys per ListObjectsV2 page: S3 answers at most 1000.
    list_page_size: ClassVar[int] = 1000

    def __init__(
        self,
        *,
        profile: Optional[str] = None,
        endpoint_url: Optional[str] = None,
        region: Optional[str] = None,
        retries: int = 5,
        backoff_factor: float = 0.5,
        timeout: float = 60.0,
    ) -> None:
        super().__init__(retries=retries, backoff_factor=backoff_factor, timeout=timeout)
        self.profile = profile
        self.endpoint_url = endpoint_url
        self.region = region

    @property
    def client(self) -> Any:
        """The boto3 client for these settings: one per process, shared by every backend
        with the same profile, endpoint, region, retries and timeout, while what boto3's
        chain reads stays the same: every `AWS_*` environment variable, and the shared
        credentials and config files (see `_CLIENTS`)."""
        try:
            import boto3  # checked at each use: a cached client needs boto3 too
        except ImportError as error:
            raise ImportError(_NEEDS_BOTO3) from error
        endpoint = self.endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None
        key = (self.profile, endpoint, self.region, self.retries, self.timeout)
        environment = _chain_environment()
        kept = _CLIENTS.get(key)
        if kept is None or kept[0] != environment:
            with _CLIENTS_LOCK:
                kept = _CLIENTS.get(key)
                if kept is None or kept[0] != environment:
                    # An old client is dropped, not closed: a call in flight may still use it.
                    kept = _CLIENTS[key] = (environment, self._new_client(boto3, endpoint))
        return kept[1]

    def _new_client(self, boto3: Any, endpoint: Optional[str]) -> Any:
        """A client (credentials are read now, from boto3's chain or the profile)."""
        from botocore.config import Config

        config = Config(
            max_pool_connections=POOL_SIZE,  # botocore keeps 10: fewer than one object's connections
            retries={"max_attempts": self.retries, "mode": "standard"},
            connect_timeout=self.timeout,
            read_timeout=self.timeout,
        )
        session = boto3.session.Session(
            botocore_session=_botocore_session(), profile_name=self.profile, region_name=self.region
        )
        client = session.client("s3", endpoint_url=endpoint, config=config)
        client.meta.events.register_first("needs-retry.s3.GetObject", _refuse_at_once)
        return client

    def close(self) -> None:
        """Nothing to release: the client is the process's, kept for the next call (its
        pooled connections close with the process)."""

    def _call(self, url: str, method: str, **kwargs: Any) -> Any:
        with _s3_errors(url):
            return getattr(self.client, method)(**kwargs)

    def check_url(self, url: str) -> None:
        _split(url)

    def open(
        self, url: str, offset: int = 0, *, end: Optional[int] = None, if_range: Optional[str] = None
    ) -> ByteStream:
        # S3 has no If-Range, and every answer's ETag names the version its bytes belong
        # to, which the manager compares. A part of a parallel fetch (`end`, exclusive)
        # goes further: `if_range` (the plan's ETag) is sent as IfMatch, so another
        # version is refused (412) before a byte of it is sent.
        from botocore.exceptions import ClientError

        bucket, key = _split(url)
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if offset or end is not None:
            kwargs["Range"] = f"bytes={offset}-{'' if end is None else end - 1}"
        if end is not None and if_range:
            kwargs["IfMatch"] = if_range
        try:
            response = self._call(url, "get_object", **kwargs)
        except ClientError:  # InvalidRange (416): reported as is; the manager decides
            return ByteStream(iter(()), start=offset, status=416)
        start, size = 0, response.get("ContentLength")
        range_header = response.get("ContentRange")
        if range_header:
            start, size = range_place(range_header, size)
        body = response["Body"]
        modified = response.get("LastModified")
        pace = ReadPace()
        return ByteStream(
            self._chunks(body, url, response.get("ContentLength"), pace),
            start=start,
            size=size,
            etag=response.get("ETag"),
            last_modified=modified.isoformat() if modified is not None else None,
            status=206 if range_header else 200,
            close_callback=body.close,
            pace=pace,
        )

    def _chunks(self, body: Any, url: str, length: Optional[int], pace: ReadPace) -> Iterator[bytes]:
        import urllib3.exceptions
        from botocore import exceptions as bce
        from botocore.response import StreamingBody

        # Read as `pace` says, as the HTTP backend reads: what has arrived while a parallel
        # fetch's ramp times each write, larger reads once it is steady. botocore's body
        # checks the length as it reads; its urllib3 response, read here, does not. A body
        # of another class (one checking S3's checksum of a whole object) is read through
        # its own reads, so that its check is kept.
        raw = getattr(body, "_raw_stream", None)
        received = 0
        try:
            if getattr(raw, "read1", None) is None or type(body) is not StreamingBody:
                yield from body.iter_chunks(CHECKED_CHUNK_SIZE)
                return
            while chunk := pace.read(raw.read1, raw.read, None if length is None else length - received):
                received += len(chunk)
                yield chunk
        except bce.FlexibleChecksumError as error:  # wrong bytes: never kept to resume after
            raise _checksum_error(url, error) from error
        except (bce.BotoCoreError, urllib3.exceptions.HTTPError, OSError) as error:
            raise NetworkError(url, f"S3 stream broke off: {error}") from error
        if length is not None and received != length:
            raise NetworkError(url, f"S3 stream broke off after {received} of {length} bytes")

    def list(self, prefix: str, *, recursive: bool = True) -> builtins.list[ListedObject]:
        """The objects whose key starts with the prefix's, `list_page_size` keys per
        ListObjectsV2 call, with their sizes and ETags; `recursive=False` lists one level
        (keys with no `/` after the prefix)."""
        bucket, key_prefix = _split_prefix(prefix)
        options: dict[str, Any] = {"Bucket": bucket, "Prefix": key_prefix}
        if not recursive:
            options["Delimiter"] = "/"  # the folders below come as CommonPrefixes, not read
        found = []
        with _s3_errors(prefix):
            paginator = self.client.get_paginator("list_objects_v2")
            pages = paginator.paginate(**options, PaginationConfig={"PageSize": self.list_page_size})
            for page in pages:
                for item in page.get("Contents", ()):
                    if item["Key"].endswith("/"):  # a folder marker ("Create folder", sync tools): no object
                        continue
                    modified = item.get("LastModified")
                    found.append(
                        ListedObject(
                            prefix + item["Key"][len(key_prefix) :],
                            size=item.get("Size"),
                            etag=item.get("ETag"),
                            last_modified=modified.isoformat() if modified is not None else None,
                        )
                    )
        return sorted(found, key=lambda listed: listed.url)

    def stat(self, url: str) -> RemoteInfo:
        bucket, key = _split(url)
        response = self._call(url, "head_object", Bucket=bucket, Key=key)
        size: Optional[int] = response.get("ContentLength")
        modified = response.get("LastModified")
        return RemoteInfo(size, response.get("ETag"), modified.isoformat() if modified is not None else None)
