"""`DataLoader`: the registrable base of loaders (`"multiprocess"` by default).

It must not import torch at import time: plugin listing imports this module.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Dict, Optional, Union

from framework.registry import Registrable

if TYPE_CHECKING:
    import torch

__all__ = ["DataLoader", "TensorDict", "move_to_device"]

TensorDict = Dict[str, Any]
"""A batch: field names to tensors (or lists, nested dicts)."""


class DataLoader(Registrable):
    """Yields batches for one epoch per `iter()`; `len()` is the number of batches."""

    default_implementation: ClassVar[Optional[str]] = "multiprocess"
    # from_config(config, reader=..., data_path=...): a config need not give these
    config_given: ClassVar[tuple[str, ...]] = ("reader", "data_path")

    def __len__(self) -> int:
        raise TypeError(f"{type(self).__name__} does not know its number of batches")

    def __iter__(self) -> Iterator[TensorDict]:
        raise NotImplementedError

    def iter_instances(self) -> Iterator[Any]:
        """Yield every instance (after `apply_token_indexers`), without batching."""
        raise NotImplementedError

    def set_target_device(self, device: Union[int, str, torch.device]) -> None:
        """Put every later batch on `device`."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Where iteration stands, for `load_state_dict` to resume from."""
        raise NotImplementedError

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a `state_dict()`: the next batches are the ones that would have come."""
        raise NotImplementedError


def move_to_device(obj: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """`obj` with every tensor inside (dicts, lists, tuples) moved to `device`."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj if obj.device == device else obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, dict):
        return {key: move_to_device(value, device, non_blocking) for key, value in obj.items()}
    if isinstance(obj, list):
        return [move_to_device(value, device, non_blocking) for value in obj]
    if isinstance(obj, tuple):
        return tuple(move_to_device(value, device, non_blocking) for value in obj)
    return obj


def pin_memory(obj: Any) -> Any:
    """`obj` with every CPU tensor inside copied to pinned (page-locked) memory."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.pin_memory() if obj.device.type == "cpu" else obj
    if isinstance(obj, dict):
        return {key: pin_memory(value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [pin_memory(value) for value in obj]
    if isinstance(obj, tuple):
        return tuple(pin_memory(value) for value in obj)
    return obj
