"""Internal helpers shared by the loader and the cluster fetch: shipping an error
across ranks, and joining the process group torchrun describes.

A rank's failure reaches the other ranks as plain values, so every rank raises the
same typed error: `encode_error` / `decode_error` name the error's nearest class in
`framework.errors` (a plugin's own subclass arrives as the framework class it derives
from) with its fields as plain values; `portable_error` keeps the pickled error too,
when it can be rebuilt, for errors of any type (a reader's own `ValueError`).
Every value shipped is picklable, so a collective never hangs on one.

Not part of the public API. Imports torch only inside `torchrun_group`.
"""

from __future__ import annotations

import atexit
import os
import pickle
from typing import Any, Optional, TypeVar, Union

import framework.errors
from framework.errors import FrameworkError, _rebuild

__all__ = ["EncodedError", "decode_error", "encode_error", "portable_error", "torchrun_group"]

# An error as plain values: (the name of its class in `framework.errors`, its fields, its args).
EncodedError = tuple[str, dict[str, Any], tuple[Any, ...]]

_Error = TypeVar("_Error", bound=FrameworkError)


def encode_error(error: FrameworkError) -> EncodedError:
    """`error` as the name of its nearest class in `framework.errors`, its fields and
    args, each a plain value (a plugin's field, a response or a lock, may not pickle,
    and the other ranks may not be able to import its class)."""
    cls = next(c for c in type(error).__mro__ if getattr(framework.errors, c.__name__, None) is c)
    state = {k: _plain(v) for k, v in vars(error).items() if k != "__notes__"}
    return cls.__name__, state, tuple(a if isinstance(a, str) else repr(a) for a in error.args)


def decode_error(encoded: EncodedError, base: type[_Error]) -> _Error:
    """The error `encode_error` encoded, rebuilt as its class if that is a `base`, else
    as `base`."""
    name, state, args = encoded
    cls = getattr(framework.errors, name, base)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        cls = base
    error = _rebuild(cls, state, args)
    assert isinstance(error, base)
    return error


def _plain(value: Any) -> Union[str, int, float, bool, None]:
    return value if value is None or isinstance(value, (str, int, float, bool)) else repr(value)


def portable_error(error: BaseException) -> tuple[str, str, Optional[bytes]]:
    """(type name, message, pickled error or None): always picklable, so never a hang;
    the pickle only when it can be rebuilt here (some exceptions pickle but cannot)."""
    try:
        text = str(error)
    except Exception:
        text = "<str() of the error failed>"
    try:
        blob = pickle.dumps(error)
        pickle.loads(blob)
    except Exception:
        return type(error).__name__, text, None
    return type(error).__name__, text, blob


def torchrun_group() -> bool:
    """Join the process group torchrun describes (gloo, `env://`) unless one exists;
    whether a group of more than one rank is there. A group joined here is left at exit."""
    import torch.distributed as dist

    if not dist.is_available():
        return False
    if not dist.is_initialized():
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or "MASTER_ADDR" not in os.environ:
            return False
        dist.init_process_group("gloo")
        atexit.register(dist.destroy_process_group)
    return dist.get_world_size() > 1
