"""Collators turn a list of instances into one batch.

`DefaultDataCollator` (registered as `"default"`) understands dicts (nested too)
of tensors, numbers, strings and lists of those. torch is imported inside the
functions: this module is imported by plugin listing, which must stay fast.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from framework.errors import CollateError
from framework.registry import Registrable

if TYPE_CHECKING:
    import torch

__all__ = ["DataCollator", "DefaultDataCollator"]

_SUPPORTED = (
    "DefaultDataCollator batches tensors (padded with 0 and stacked), numbers, strings, "
    "lists of numbers or strings, and dicts of those"
)


class DataCollator(Registrable):
    """Turns a list of instances into a batch; `__call__` is the only method.

    Collators run inside loader workers, so they must be picklable (under "spawn").
    """

    default_implementation: ClassVar[Optional[str]] = "default"

    def __call__(self, instances: list[Any]) -> Any:
        raise NotImplementedError


class DefaultDataCollator(DataCollator):
    """Batch dict instances field by field.

    - tensors: padded with `padding_value` to the longest in each dimension, stacked;
    - bools, ints, floats: one tensor (floats give a float tensor);
    - strings: a list; lists of strings: passed through as a list of lists;
    - lists of numbers: a padded tensor; dicts: batched recursively; all-None: a list.

    Anything else raises `CollateError` naming the field and what it held.

    Args:
        padding_value: what shorter tensors and lists of numbers are padded with.
    """

    def __init__(self, padding_value: int = 0) -> None:
        self.padding_value = padding_value

    def __call__(self, instances: list[Any]) -> Any:
        if not instances:
            raise CollateError("", "got an empty list of instances")
        return self._collate(list(instances), "")

    def _collate(self, values: list[Any], field: str) -> Any:
        import torch

        first = values[0]
        if isinstance(first, torch.Tensor):
            return self._tensors(_same_kind(values, torch.Tensor, field), field)
        if isinstance(first, Mapping):
            maps = _same_kind(values, Mapping, field)
            keys = list(first.keys())
            for i, value in enumerate(maps):
                if value.keys() != first.keys():
                    missing = set(keys) ^ set(value.keys())
                    raise CollateError(
                        field,
                        f"instance {i} has keys {sorted(map(str, value.keys()))} but instance "
                        f"0 has {sorted(map(str, keys))} (differing: {sorted(map(str, missing))}); "
                        "every instance needs the same fields",
                    )
            return {k: self._collate([v[k] for v in maps], _join(field, k)) for k in keys}
        if isinstance(first, str):
            return list(_same_kind(values, str, field))
        if isinstance(first, (bool, int, float)):
            return self._numbers(values, field)
        if isinstance(first, (list, tuple)):
            return self._lists(values, field)
        if first is None and all(v is None for v in values):
            return list(values)
        if type(first).__module__ == "numpy" and hasattr(first, "__array__"):
            return self._tensors([torch.as_tensor(v) for v in values], field)
        raise CollateError(
            field,
            f"values of type {type(first).__qualname__} ({_short(first)}); {_SUPPORTED}. "
            "Convert it in the reader, attach it in DatasetReader.apply_token_indexers(), "
            "or pass a collate_fn that knows it",
        )

    def _numbers(self, values: list[Any], field: str) -> torch.Tensor:
        import torch

        for i, value in enumerate(values):
            if not isinstance(value, (bool, int, float)):
                raise CollateError(
                    field,
                    f"instance 0 holds a number but instance {i} holds "
                    f"{type(value).__qualname__} ({_short(value)})",
                )
        if all(isinstance(v, bool) for v in values):
            return torch.tensor(values, dtype=torch.bool)
        if any(isinstance(v, float) for v in values):
            return torch.tensor(values, dtype=torch.get_default_dtype())
        return torch.tensor(values, dtype=torch.int64)

    def _lists(self, values: list[Any], field: str) -> Any:
        import torch

        lists = _same_kind(values, (list, tuple), field)
        items = [item for value in lists for item in value]
        if all(isinstance(item, str) for item in items) and items:
            return [list(value) for value in lists]
        if all(isinstance(item, (bool, int, float)) for item in items):
            dtype = torch.int64
            if any(isinstance(item, float) for item in items):
                dtype = torch.get_default_dtype()
            elif items and all(isinstance(item, bool) for item in items):
                dtype = torch.bool
            longest = max(len(value) for value in lists)
            pad = self.padding_value
            rows = [list(value) + [pad] * (longest - len(value)) for value in lists]
            return torch.tensor(rows, dtype=dtype).reshape(len(rows), longest)
        try:
            return self._tensors([torch.as_tensor(value) for value in lists], field)
        except (TypeError, ValueError, RuntimeError) as error:
            raise CollateError(
                field,
                f"lists holding {sorted({type(i).__qualname__ for i in items})} cannot become "
                f"tensors ({error}); {_SUPPORTED}",
            ) from None

    def _tensors(self, tensors: list[torch.Tensor], field: str) -> torch.Tensor:
        import torch

        shape = tensors[0].shape
        if all(t.shape == shape for t in tensors):
            return torch.stack(tensors)
        ndim = tensors[0].dim()
        for i, tensor in enumerate(tensors):
            if tensor.dim() != ndim:
                raise CollateError(
                    field,
                    f"instance 0 holds a {ndim}-d tensor but instance {i} a {tensor.dim()}-d "
                    f"one (shapes {tuple(shape)} and {tuple(tensor.shape)}); padding needs the "
                    "same number of dimensions",
                )
        if ndim == 1:
            # pad_sequence is one C++ call: the common case (token ids) stays fast.
            from torch.nn.utils.rnn import pad_sequence

            return pad_sequence(tensors, batch_first=True, padding_value=self.padding_value)
        sizes = [max(t.shape[d] for t in tensors) for d in range(ndim)]
        dtype = tensors[0].dtype
        out = torch.full((len(tensors), *sizes), self.padding_value, dtype=dtype)
        for i, tensor in enumerate(tensors):
            index: tuple[Any, ...] = (i, *(slice(0, n) for n in tensor.shape))
            out[index] = tensor
        return out


def _same_kind(values: list[Any], kind: Any, field: str) -> list[Any]:
    for i, value in enumerate(values):
        if not isinstance(value, kind):
            raise CollateError(
                field,
                f"instance 0 holds {type(values[0]).__qualname__} ({_short(values[0])}) but "
                f"instance {i} holds {type(value).__qualname__} ({_short(value)}); every "
                "instance needs the same type in a field",
            )
    return values


def _join(field: str, key: Any) -> str:
    return f"{field}.{key}" if field else str(key)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def batch_size_of(batch: Any) -> Optional[int]:
    """The number of instances in a collated batch, if it can be told."""
    if isinstance(batch, Mapping):
        for value in batch.values():
            size = batch_size_of(value)
            if size is not None:
                return size
        return None
    if isinstance(batch, Sequence) and not isinstance(batch, str):
        return len(batch)
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    return None
