"""`BatchSampler`: groups instance indices into batches (``"bucket"``, ``"max_tokens"``).

The first-party samplers live in `framework_plugins.samplers` and are registered
through the plugin hook; this module holds the base class and the length helpers
they share. It must not import torch at import time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional

from framework.registry import Registrable

__all__ = ["BatchSampler", "field_length", "guess_sorting_keys"]


class BatchSampler(Registrable):
    """Chooses which instances go together in each batch.

    Under a lazy loader (`max_instances_in_memory` set) the sampler sees one chunk of
    instances at a time; indices refer to positions in the sequence it is given.
    Randomness should come from the `random` module: the loader seeds it per chunk.
    """

    def get_batch_indices(self, instances: Sequence[Any]) -> Iterable[list[int]]:
        """Yield lists of positions in `instances`, one list per batch."""
        raise NotImplementedError

    def get_num_batches(self, instances: Sequence[Any]) -> int:
        """How many batches `get_batch_indices(instances)` yields."""
        raise NotImplementedError

    def get_batch_size(self) -> Optional[int]:
        """The fixed batch size, or None when batches vary in size."""
        return None

    @classmethod
    def config_batch_size(cls, arguments: Mapping[str, Any]) -> Optional[int]:
        """What `get_batch_size()` returns for a sampler built from `arguments` (a config's
        keys, ``"type"`` left out), or None: a loader's config is checked against it
        (``max_instances_in_memory``) before anything is built. A sampler with a fixed
        batch size taken from its arguments says which."""
        return None


def field_length(instance: Any, key: str) -> int:
    """The length of field `key` of a dict instance: ``len()``, a tensor's first dim."""
    if not isinstance(instance, Mapping):
        raise TypeError(
            f"sorting keys name fields of dict instances, but the instance is a "
            f"{type(instance).__qualname__}; give the sampler dict instances"
        )
    if key not in instance:
        raise ValueError(
            f"sorting key {key!r} is not a field of the instance; its fields are "
            f"{sorted(map(str, instance))}"
        )
    return _length(instance[key], key)


def _length(value: Any, key: str) -> int:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) > 0 else 1
    try:
        return len(value)
    except TypeError:
        raise ValueError(
            f"field {key!r} holds a {type(value).__qualname__}, which has no length; "
            "sort by a field holding a sequence or a tensor"
        ) from None


def guess_sorting_keys(instances: Sequence[Any], num_instances: int = 10) -> list[str]:
    """The name of the longest field among the first `num_instances` instances."""
    longest: Optional[str] = None
    best = -1
    for instance in instances[:num_instances]:
        if not isinstance(instance, Mapping):
            raise TypeError(
                "cannot guess sorting keys: instances are "
                f"{type(instance).__qualname__}, not dicts; pass sorting_keys"
            )
        for key, value in instance.items():
            shape = getattr(value, "shape", None)
            sized = len(shape) > 0 if shape is not None else hasattr(value, "__len__")
            if isinstance(value, (str, bytes)) or not sized:
                continue  # strings and scalars are not what padding cares about
            length = _length(value, str(key))
            if length > best:
                best, longest = length, str(key)
    if longest is None:
        raise ValueError(
            "cannot guess sorting keys: no field of the instances holds a sequence or a "
            "tensor; pass sorting_keys naming the field to sort by"
        )
    return [longest]
