"""Every exception the framework raises, in one tree.

```
FrameworkError
 ├── RegistryError
 │    ├── UnknownNameError      (also a LookupError)
 │    ├── DuplicateNameError
 │    └── PluginError           a plugin or a lazy target failed to load
 ├── ConfigError                (also a ValueError)
 ├── ResumeError                (also a ValueError) a saved state cannot resume exactly
 ├── WorkerError                a loader worker raised, died or was killed
 ├── CollateError               (also a TypeError) a field the collator cannot batch
 ├── RanksOutOfStepError        (also a RuntimeError) ranks called state_dict() at other steps
 └── DownloadError              names the URL; nothing is published
      ├── HTTPStatusError       a status that is final, or still bad after retries
      ├── NetworkError          connection failures after retries
      ├── ChecksumError         size or sha256 did not match
      ├── UnsafeArchiveError    an archive member would escape or explode
      ├── CorruptArchiveError   an archive that is truncated or damaged
      ├── OfflineError          FRAMEWORK_OFFLINE=1 and the file is not cached
      ├── InvalidArgumentError  (also a ValueError) refused before any request
      │    └── ListingUnsupportedError a glob on a backend that cannot list objects
      ├── ShardError            a streamed shard could not be fetched (which one, and why)
      ├── ShardSpecError        (also a ValueError) shards named wrongly: a brace, a manifest line
      ├── MissingDependencyError (also an ImportError) a backend's package is not installed
      ├── LockTimeoutError      another process held the lock for too long
      ├── BulkDownloadError     files of a `cached_paths` call failed (the others are published)
      └── StepTimeoutError      a rank of a distributed call hung in one step
```

Each exception keeps its context in fields; the message is made from them, so
callers can branch on the fields and people can read the message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from framework._redact import redact_url

__all__ = [
    "BulkDownloadError",
    "ChecksumError",
    "CollateError",
    "ConfigError",
    "CorruptArchiveError",
    "DownloadError",
    "DuplicateNameError",
    "FrameworkError",
    "HTTPStatusError",
    "InvalidArgumentError",
    "ListingUnsupportedError",
    "LockTimeoutError",
    "MissingDependencyError",
    "NetworkError",
    "OfflineError",
    "PluginError",
    "RanksOutOfStepError",
    "RegistryError",
    "ResumeError",
    "ShardError",
    "ShardSpecError",
    "StepTimeoutError",
    "UnknownNameError",
    "UnsafeArchiveError",
    "WorkerError",
]


class FrameworkError(Exception):
    """The root of every error raised by the framework."""


class RegistryError(FrameworkError):
    """Something went wrong looking up or registering a component."""


class UnknownNameError(RegistryError, LookupError):
    """A name that no component of `base` is registered under."""

    def __init__(
        self,
        base: str,
        name: str,
        available: Sequence[str],
        suggestions: Sequence[str] = (),
        note: str = "",
    ) -> None:
        self.base = base
        self.name = name
        self.available = list(available)
        self.suggestions = list(suggestions)
        message = f"{name!r} is not a registered name for {base}."
        if self.suggestions:
            message += " Did you mean " + " or ".join(repr(s) for s in self.suggestions) + "?"
        listed = ", ".join(repr(a) for a in self.available) or "none"
        message += f" Available: {listed}."
        message += " A dotted path such as 'package.module:ClassName' also works."
        if note:
            message += " " + note
        super().__init__(message)


class DuplicateNameError(RegistryError):
    """Two components claim the same name on the same base."""

    def __init__(
        self, base: str, name: str, existing: str, new: str, existing_provider: str, new_provider: str
    ) -> None:
        self.base = base
        self.name = name
        self.existing = existing
        self.new = new
        self.existing_provider = existing_provider
        self.new_provider = new_provider
        super().__init__(
            f"Cannot register {new} (from {new_provider}) as {name!r} for {base}: "
            f"{existing} (from {existing_provider}) already has that name. "
            "Pick another name, or pass exist_ok=True to replace it on purpose."
        )


class PluginError(RegistryError):
    """A plugin, or the import target of one of its components, failed to load."""

    def __init__(self, plugin: str, message: str) -> None:
        self.plugin = plugin
        super().__init__(message)


class ConfigError(FrameworkError, ValueError):
    """A config value that does not fit; `path` is the dotted path of the bad key.

    `errors` holds every error found in the same config (just this one, unless a
    check found several: then this is the first and its message counts the rest).
    """

    def __init__(self, path: str, message: str, expected: str = "", got: Any = None) -> None:
        self.path = path
        self.expected = expected
        self.got = got
        self.reason = message
        self.errors: list[ConfigError] = [self]
        super().__init__(f"{path or '<root>'}: {message}")

    def __reduce__(self) -> Any:
        return (type(self), (self.path, self.reason, self.expected, self.got))


class ResumeError(FrameworkError, ValueError):
    """`load_state_dict()` refused a state because resuming from it would repeat or skip
    instances. `reason` says why, one of:

    - `"malformed"`: not what `state_dict()` returned, or another format version;
    - `"files_changed"`: a data file is gone or its content differs;
    - `"settings_differ"`: the loader's reader, data or batch settings differ;
    - `"not_deterministic"`: the reader yields other instances than when it was saved;
    - `"other_split"`: the reader cannot be dealt over another num_workers or world size.
    """

    def __init__(self, message: str, reason: str) -> None:
        self.message = message
        self.reason = reason
        super().__init__(message)

    def __reduce__(self) -> Any:
        return (type(self), (self.message, self.reason))


class WorkerError(FrameworkError):
    """Loader code failed while iterating, in a worker or in the main process (`worker_id`
    None); `str()` shows the message and the traceback, `__cause__` is the original error
    when it could be rebuilt."""

    def __init__(
        self,
        message: str,
        worker_id: Optional[int] = None,
        traceback: str = "",
        signal: Optional[str] = None,
        exitcode: Optional[int] = None,
    ) -> None:
        self.message = message
        self.worker_id = worker_id
        self.traceback = traceback
        self.signal = signal
        self.exitcode = exitcode
        super().__init__(message)

    def __str__(self) -> str:
        if not self.traceback:
            return self.message
        where = "the worker" if self.worker_id is not None else "the main process"
        return f"{self.message}\n\nTraceback from {where}:\n{self.traceback.rstrip()}"

    def __reduce__(self) -> Any:
        return (
            type(self),
            (self.message, self.worker_id, self.traceback, self.signal, self.exitcode),
        )


class RanksOutOfStepError(FrameworkError, RuntimeError):
    """Under torch.distributed, ranks met in the loader's collectives at different steps:
    some in `call` (`"state_dict()"`) while others took a batch, or in it after
    different numbers of batches (`batches`: the fewest and the most, else None)."""

    def __init__(
        self, message: str, call: str = "state_dict()", batches: Optional[tuple[int, int]] = None
    ) -> None:
        self.message = message
        self.call = call
        self.batches = batches
        super().__init__(message)

    def __reduce__(self) -> Any:
        return (type(self), (self.message, self.call, self.batches))


class CollateError(FrameworkError, TypeError):
    """The collator cannot batch `field` (a dotted path into the instances); `reason` says why."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"cannot batch field {field or '<instance>'!r}: {reason}")

    def __reduce__(self) -> Any:
        return (type(self), (self.field, self.reason))


class DownloadError(FrameworkError):
    """Fetching `url` failed; nothing was published at the destination.

    `url` is the URL as given; the message (and `reason`) show it, and any URL they
    quote, through `redact_url`, so passwords and tokens in URLs are never printed.
    """

    def __init__(self, url: str, message: str) -> None:
        self.url = url
        self.reason = redact_url(message)
        super().__init__(f"{self.reason} ({redact_url(url)})")

    def __reduce__(self) -> Any:
        return (_rebuild, (type(self), self.__dict__, self.args))


def _rebuild(cls: type[Exception], state: dict[str, Any], args: tuple[Any, ...]) -> Exception:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class HTTPStatusError(DownloadError):
    """The server answered with a status that is final, or still failing after retries.
    `retry_after`: the seconds its `Retry-After` asked to wait, when it said."""

    def __init__(self, url: str, status: int, message: str = "", retry_after: Optional[float] = None) -> None:
        self.status = status
        self.retry_after = retry_after
        super().__init__(url, message or f"HTTP {status}")


class NetworkError(DownloadError):
    """The connection failed (refused, reset, timed out, cut short) after retries."""


class ChecksumError(DownloadError):
    """The bytes did not match the expected size or sha256."""

    def __init__(self, url: str, expected: str, actual: str, what: str = "sha256") -> None:
        self.expected = expected
        self.actual = actual
        self.what = what
        super().__init__(url, f"{what} mismatch: expected {expected}, got {actual}")


class UnsafeArchiveError(DownloadError):
    """An archive member that would land outside the target or exceed the size caps."""

    def __init__(self, url: str, member: str, why: str) -> None:
        self.member = member
        self.why = why
        super().__init__(url, f"refusing to extract archive member {member!r}: {why}")


class CorruptArchiveError(DownloadError):
    """An archive that cannot be read to the end: truncated, a bad CRC, a broken stream."""

    def __init__(self, url: str, why: str) -> None:
        self.why = why
        super().__init__(
            url,
            f"the archive is damaged or truncated ({why}); nothing was extracted. "
            "If the download itself was damaged, fetch it again with force=True (--force)",
        )


class OfflineError(DownloadError):
    """Offline mode is on and the file is not in the cache."""


class InvalidArgumentError(DownloadError, ValueError):
    """An argument of the call that cannot be right (say, a sha256 that is not 64 hex
    digits); raised before any request is made."""


class ListingUnsupportedError(InvalidArgumentError):
    """A glob (or a `list` call) for a scheme whose backend cannot list objects (its
    `supports_listing` is False: HTTP has no listing). `scheme` is the URL's scheme,
    `backend` the backend's class name; the message says how to name the shards instead."""

    def __init__(self, url: str, scheme: str, backend: str) -> None:
        self.scheme = scheme
        self.backend = backend
        super().__init__(
            url,
            f"{backend} cannot list {scheme}:// objects (its supports_listing is False), so a glob "
            "cannot name them; name the shards instead: a brace range "
            "(train-{00000..00255}.jsonl.gz), a list, or a manifest (manifest:URL, one URL a line)",
        )


class ShardSpecError(DownloadError, ValueError):
    """Shards named in a way that cannot be resolved: a malformed brace, a glob matching
    nothing, a bad manifest line, a shard named twice. `url` is the spec (or the
    manifest's URL), `line` the manifest's line number (1-based) when one is at fault,
    `why` what was wrong."""

    def __init__(self, url: str, why: str, line: Optional[int] = None) -> None:
        self.why = why
        self.line = line
        super().__init__(url, f"line {line}: {why}" if line is not None else why)


class ShardError(DownloadError):
    """Shard `index` (0-based) of the `count` a streamed `data_path` names could not be
    had: its fetch failed (`cause`, also the `__cause__`: a 404, a checksum mismatch,
    offline and not cached). Nothing was published for it."""

    def __init__(self, url: str, index: int, count: int, cause: BaseException) -> None:
        self.index = index
        self.count = count
        self.cause = cause
        reason = getattr(cause, "reason", None) or str(cause)
        super().__init__(url, f"shard {index + 1} of {count} could not be fetched: {reason}")


class MissingDependencyError(DownloadError, ImportError):
    """The backend for the URL's scheme needs a package that is not installed; the
    message says what to `pip install`."""


class LockTimeoutError(DownloadError):
    """Another process held the download lock for longer than the timeout."""

    def __init__(self, url: str, lock_path: str, timeout: float, holder: str = "", advice: str = "") -> None:
        self.lock_path = lock_path
        self.timeout = timeout
        self.holder = holder
        who = f" (held by {holder})" if holder else ""
        advice = (
            advice or "If no process is downloading, the lock is stale: delete it, or raise the lock timeout"
        )
        super().__init__(url, f"timed out after {timeout:g}s waiting for the lock {lock_path}{who}. {advice}")


class BulkDownloadError(DownloadError):
    """Files of one `DownloadManager.cached_paths` call failed; every other file of the
    call was fetched and published. `failures`: each failed URL as given (`os.fspath` of
    a path; the first spelling of a file given twice) and its error (an error other than
    a `DownloadError` wrapped in one, as its `__cause__`); `url` is the first of them."""

    def __init__(self, failures: dict[str, DownloadError], total: int) -> None:
        self.failures = dict(failures)
        self.total = total
        shown = [f"{redact_url(url)}: {error.reason}" for url, error in list(self.failures.items())[:5]]
        more = f"; and {len(self.failures) - 5} more" if len(self.failures) > 5 else ""
        super().__init__(
            next(iter(self.failures)),
            f"{len(self.failures)} of {total} files failed, the others are published: "
            + "; ".join(shown)
            + more,
        )


class StepTimeoutError(DownloadError):
    """A rank of `cached_path(distributed=True)` spent longer than the process group's
    timeout in one local step without progress (a hung disk or mount); every rank raises it."""

    def __init__(self, url: str, rank: int, step: str, timeout: float) -> None:
        self.rank = rank
        self.step = step
        self.timeout = timeout
        super().__init__(
            url,
            f"rank {rank} made no progress {step} for longer than the process group's timeout "
            f"({timeout:g}s): its disk or filesystem may hang (a hard NFS mount, a full or failing "
            "disk). Every rank gave up; check that rank's cache folder, or raise the timeout "
            "(init_process_group(timeout=...))",
        )
