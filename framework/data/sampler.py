"""`BatchSampler`: groups instance indices into batches, and the first-party samplers.

`BucketBatchSampler` (`"bucket"`) and `MaxTokensBatchSampler` (`"max_tokens"`)
sort instances by the length of their sorting keys (with a little noise, so batches
differ between epochs) to keep padding small. They are registered through
`framework_plugins.builtin:samplers`, the same hook path a third-party plugin uses.
This module must not import torch at import time.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Annotated, Any, Optional

from framework.config import AtLeast
from framework.registry import Registrable

__all__ = [
    "BatchSampler",
    "BucketBatchSampler",
    "MaxTokensBatchSampler",
    "add_noise",
    "field_length",
    "guess_sorting_keys",
]

logger = logging.getLogger(__name__)


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
        keys, `"type"` left out), or None: a loader's config is checked against it
        (`max_instances_in_memory`) before anything is built. A sampler with a fixed
        batch size taken from its arguments says which."""
        return None


def field_length(instance: Any, key: str) -> int:
    """The length of field `key` of a dict instance: `len()`, a tensor's first dim."""
    if not isinstance(instance, Mapping):
        raise TypeError(
            f"sorting keys name fields of dict instances, but the instance is a "
            f"{type(instance).__qualname__}; give the sampler dict instances"
        )
    if key not in instance:
        raise ValueError(
            f"sorting key {key!r} is not a field of the instance; its fields are {sorted(map(str, instance))}"
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


def add_noise(value: float, noise: float) -> float:
    """`value` moved by up to `noise * value` either way, uniformly at random."""
    spread = value * noise
    return value + random.uniform(-spread, spread)


class BucketBatchSampler(BatchSampler):
    """Batches of `batch_size` instances of similar length.

    Args:
        batch_size: instances per batch.
        sorting_keys: dict fields whose lengths to sort by (`len()`, a tensor's first
            dimension); None guesses the longest field from the first instances.
        padding_noise: relative noise added to lengths before sorting (0 sorts exactly).
        drop_last: drop a final batch smaller than `batch_size`.
        shuffle: shuffle the order of the batches.
    """

    def __init__(
        self,
        batch_size: Annotated[int, AtLeast(1)],  # limits: config validate checks them too
        sorting_keys: Optional[list[str]] = None,
        padding_noise: float = 0.1,
        drop_last: bool = False,
        shuffle: bool = True,
    ) -> None:
        if batch_size < 1 and batch_size != -1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.batch_size = batch_size
        self.sorting_keys = list(sorting_keys) if sorting_keys else None
        self.padding_noise = padding_noise
        self.drop_last = drop_last
        self.shuffle = shuffle

    def _argsort_by_padding(self, instances: Sequence[Any]) -> tuple[list[int], list[list[int]]]:
        """Indices sorted by noisy lengths, and the true lengths in that order."""
        if not self.sorting_keys:
            self.sorting_keys = guess_sorting_keys(instances)
        keyed = []
        for index, instance in enumerate(instances):
            lengths = [field_length(instance, key) for key in self.sorting_keys]
            noisy = [add_noise(length, self.padding_noise) for length in lengths]
            keyed.append((noisy, index, lengths))
        keyed.sort(key=lambda item: item[0])
        return [item[1] for item in keyed], [item[2] for item in keyed]

    def get_batch_indices(self, instances: Sequence[Any]) -> Iterator[list[int]]:
        indices, _ = self._argsort_by_padding(instances)
        batches = [indices[i : i + self.batch_size] for i in range(0, len(indices), self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        if self.shuffle:
            random.shuffle(batches)
        yield from batches

    def get_num_batches(self, instances: Sequence[Any]) -> int:
        count = len(instances) / self.batch_size
        return math.floor(count) if self.drop_last else math.ceil(count)

    def get_batch_size(self) -> Optional[int]:
        return self.batch_size

    @classmethod
    def config_batch_size(cls, arguments: Mapping[str, Any]) -> Optional[int]:
        size = arguments.get("batch_size")
        if isinstance(size, float) and size.is_integer():  # 2.0 is 2 to a config, as to JSON
            size = int(size)
        return size if isinstance(size, int) and not isinstance(size, bool) and size >= 1 else None


class MaxTokensBatchSampler(BucketBatchSampler):
    """Batches of similar-length instances holding at most `max_tokens` padded tokens.

    A batch's size in tokens is its longest instance's length times its number of
    instances. An instance longer than `max_tokens` gets a batch of its own (with a
    warning). Batches come out in random order.

    Args:
        max_tokens: the most padded tokens a batch holds (its longest instance's length
            times its number of instances).
    """

    def __init__(
        self,
        max_tokens: Annotated[int, AtLeast(1)],
        sorting_keys: Optional[list[str]] = None,
        padding_noise: float = 0.1,
    ) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        super().__init__(-1, sorting_keys, padding_noise, drop_last=False, shuffle=True)
        self.max_tokens = max_tokens

    def _groups(self, indices: list[int], sizes: list[int]) -> Iterator[list[int]]:
        group: list[int] = []
        longest = 0
        for index, size in zip(indices, sizes):
            if size > self.max_tokens:
                logger.warning(
                    "instance %d has %d tokens, more than max_tokens=%d: it gets a batch of its own",
                    index,
                    size,
                    self.max_tokens,
                )
            if group and max(size, longest) * (len(group) + 1) > self.max_tokens:
                yield group
                group, longest = [], 0
            group.append(index)
            longest = max(longest, size)
        if group:
            yield group

    def get_batch_indices(self, instances: Sequence[Any]) -> Iterator[list[int]]:
        indices, lengths = self._argsort_by_padding(instances)
        batches = list(self._groups(indices, [max(length) for length in lengths]))
        random.shuffle(batches)
        yield from batches

    def get_num_batches(self, instances: Sequence[Any]) -> int:
        # Grouping depends on the (noisy) order, so count by grouping.
        return sum(1 for _ in self.get_batch_indices(instances))

    def get_batch_size(self) -> Optional[int]:
        return None

    @classmethod
    def config_batch_size(cls, arguments: Mapping[str, Any]) -> Optional[int]:
        return None
