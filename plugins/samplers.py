"""First-party batch samplers: ``"bucket"`` and ``"max_tokens"``.

Registered through `framework_plugins.builtin:samplers`, the same hook path a
third-party plugin uses. Both sort instances by the length of their sorting keys
(with a little noise, so batches differ between epochs) to keep padding small.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Annotated, Any, Optional

from framework.config import AtLeast
from framework.data.sampler import BatchSampler, field_length, guess_sorting_keys

__all__ = ["BucketBatchSampler", "MaxTokensBatchSampler"]

logger = logging.getLogger(__name__)


def add_noise(value: float, noise: float) -> float:
    """`value` moved by up to ``noise * value`` either way, uniformly at random."""
    spread = value * noise
    return value + random.uniform(-spread, spread)


class BucketBatchSampler(BatchSampler):
    """Batches of `batch_size` instances of similar length.

    Args:
        batch_size: instances per batch.
        sorting_keys: dict fields whose lengths to sort by (``len()``, a tensor's first
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
