"""Parameter checks for MultiProcessDataLoader: each bad value a ValueError saying what to change."""

from __future__ import annotations

import inspect
import math
import multiprocessing
import sys
from collections.abc import Mapping
from typing import Any, Optional

from framework.config import ConfigChecks
from framework.data._transfer import TRANSFERS
from framework.data.reader import DatasetReader, current_distributed_info
from framework.data.sampler import BatchSampler
from framework.download.sizes import parse_size
from framework.errors import ConfigError

__all__ = [
    "TRANSFERS",
    "config_checks",
    "describe",
    "no_instances",
    "problems",
    "stream_problems",
    "validate",
]


def no_instances(reader: DatasetReader, data_path: Any) -> ValueError:
    info = current_distributed_info()
    if info is not None and info.world_size > 1:
        return ValueError(
            f"{type(reader).__name__} read no instances from {data_path!r} on rank "
            f"{info.global_rank} of {info.world_size} (each rank reads its own shard; with "
            "fewer instances than ranks some shards are empty). Use fewer ranks or more "
            "data, and check the path and that _read() yields."
        )
    return ValueError(
        f"{type(reader).__name__} read no instances from {data_path!r}. Is the path right, "
        "and does _read() yield? (With max_instances=0 or an empty file this is expected.)"
    )


def problems(
    *,
    batch_size: Optional[int],
    drop_last: bool,
    shuffle: bool,
    batch_sampler: Any,
    batches_per_epoch: Optional[int],
    num_workers: int,
    max_instances_in_memory: Optional[int],
    start_method: str,
    persistent_workers: bool,
    transfer: str,
    timeout: Optional[float],
    cuda_device: Any = None,
    cache_limit: Any = None,
    prefetch: Any = 2,
) -> list[tuple[str, str]]:
    """Every bad setting as `(key, what to change)`; empty when the settings are good.

    The constructor raises them (`validate`) and `framework.config.validate` reports
    them from a config (`config_checks`), so one rule serves both. There
    `batch_sampler` is still its config (a mapping or a name), not a `BatchSampler`.
    """
    found: list[tuple[str, str]] = []
    if num_workers is None or num_workers < 0:
        found.append(("num_workers", f"num_workers must be 0 or more, got {num_workers}"))
    found += _batching_problems(batch_size, drop_last, shuffle, batch_sampler, batches_per_epoch)
    if max_instances_in_memory is not None:
        found += _memory_problems(max_instances_in_memory, batch_size, batch_sampler)
    if start_method not in multiprocessing.get_all_start_methods():
        found.append(
            (
                "start_method",
                f"start_method must be one of {multiprocessing.get_all_start_methods()}, "
                f"got {start_method!r}",
            )
        )
    if persistent_workers and num_workers == 0:
        found.append(("persistent_workers", "persistent_workers=True needs num_workers > 0"))
    if transfer not in TRANSFERS:
        found.append(("transfer", f"transfer must be one of {TRANSFERS}, got {transfer!r}"))
    if timeout is not None and not (timeout > 0 and math.isfinite(timeout)):
        found.append(
            ("timeout", f"timeout must be a finite positive number of seconds or None, got {timeout}")
        )
    problem = device_problem(cuda_device)
    if problem is not None:
        found.append(("cuda_device", problem))
    return found + stream_problems(cache_limit, prefetch)


def stream_problems(cache_limit: Any, prefetch: Any) -> list[tuple[str, str]]:
    """A streamed dataset's settings: a size that parses, a whole number of shards ahead."""
    found: list[tuple[str, str]] = []
    if cache_limit is not None:
        try:
            if parse_size(cache_limit) < 1:
                found.append(("cache_limit", f"cache_limit must be at least 1 byte, got {cache_limit!r}"))
        except ValueError as error:
            found.append(("cache_limit", f"cache_limit: {error}"))
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        found.append(("prefetch", f"prefetch must be a whole number of shards, 0 or more, got {prefetch!r}"))
    return found


def _batching_problems(
    batch_size: Optional[int],
    drop_last: bool,
    shuffle: bool,
    batch_sampler: Any,
    batches_per_epoch: Optional[int],
) -> list[tuple[str, str]]:
    """The batch settings' problems: sizes, and a sampler against the settings it replaces."""
    found: list[tuple[str, str]] = []
    if batch_size is not None and batch_size < 1:
        found.append(("batch_size", f"batch_size must be at least 1, got {batch_size}"))
    if batch_sampler is not None:
        for name, value in (("batch_size", batch_size), ("drop_last", drop_last), ("shuffle", shuffle)):
            if value:
                found.append(
                    (
                        name,
                        f"batch_sampler is mutually exclusive with {name}: set {name} on the "
                        "sampler, or drop batch_sampler",
                    )
                )
    elif batch_size is None:
        found.append(("batch_size", "batch_size is required when batch_sampler is not given"))
    if batches_per_epoch is not None and batches_per_epoch < 1:
        found.append(("batches_per_epoch", f"batches_per_epoch must be at least 1, got {batches_per_epoch}"))
    elif batches_per_epoch is not None and batches_per_epoch > sys.maxsize:  # len() could not say it
        found.append(
            ("batches_per_epoch", f"batches_per_epoch must be at most {sys.maxsize}, got {batches_per_epoch}")
        )
    return found


def _memory_problems(
    max_instances_in_memory: int, batch_size: Optional[int], batch_sampler: Any
) -> list[tuple[str, str]]:
    """Lazy mode's problems: a chunk must hold at least one whole batch."""
    found: list[tuple[str, str]] = []
    if max_instances_in_memory < 1:
        found.append(
            (
                "max_instances_in_memory",
                f"max_instances_in_memory must be at least 1, got {max_instances_in_memory}",
            )
        )
    elif batch_size is not None and batch_size >= 1 and max_instances_in_memory < batch_size:
        found.append(
            (
                "max_instances_in_memory",
                f"max_instances_in_memory ({max_instances_in_memory}) must be at least "
                f"batch_size ({batch_size}); raise it (10x batch_size is a good start)",
            )
        )
    # A lazy sampler sees max_instances_in_memory instances at a time, so it could
    # only make smaller batches (or none, with drop_last).
    sampler_size = _sampler_batch_size(batch_sampler)
    if sampler_size is not None and 1 <= max_instances_in_memory < sampler_size:
        found.append(
            (
                "max_instances_in_memory",
                f"max_instances_in_memory ({max_instances_in_memory}) must be at least the "
                f"batch_sampler's batch size ({sampler_size}): the sampler sees that many "
                "instances at a time. Raise max_instances_in_memory (10x the batch size is a "
                "good start) or lower the sampler's batch_size",
            )
        )
    return found


def device_problem(device: Any) -> Optional[str]:
    """What is wrong with `device` as a loader's target device, or None: a
    `torch.device`, a CUDA index of 0 or more (`cuda:N`, as in AllenNLP), or a
    device string torch parses (`"cuda:0"`, `"cuda"`, `"cpu"`). Whether that
    device exists here is not asked: a config may be checked on another machine."""
    import torch

    if device is None or isinstance(device, torch.device):
        return None
    device = _integral(device)
    if isinstance(device, bool) or not isinstance(device, (int, str)):
        return f"cuda_device must be a device index or a device string, got {device!r}"
    if isinstance(device, int) and device < 0:
        return (
            f"cuda_device must be a CUDA index of 0 or more, got {device} (for the CPU, "
            'leave cuda_device out or give "cpu")'
        )
    try:
        parsed = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    except (RuntimeError, ValueError, OverflowError) as error:
        return (
            f"cuda_device {device!r} is not a device torch knows ({error}); give an index such "
            'as 0, or a device string such as "cuda:0", "cuda" or "cpu"'
        )
    index = device if isinstance(device, int) else device.rpartition(":")[2] if ":" in device else None
    if parsed.index != (None if index is None else int(index)):  # torch keeps an index in 8 bits
        return f"cuda_device {device!r} has a device index beyond what torch can address"
    return None


def _integral(value: Any) -> Any:
    """2.0 as 2, as a config's walk reads it (and JSON); anything else as it is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def as_device(device: Any) -> Any:
    """`device` (checked by `device_problem`) as a `torch.device`: an index is CUDA's."""
    import torch

    problem = device_problem(device)
    if problem is not None:
        raise ConfigError("cuda_device", problem)
    if isinstance(device, torch.device):
        return device
    device = _integral(device)
    return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)


def _sampler_batch_size(batch_sampler: Any) -> Optional[int]:
    """The sampler's fixed batch size: asked of a `BatchSampler`, or read from its config
    (a name or a mapping, as `framework.config.validate` sees it) by its class's
    `BatchSampler.config_batch_size`; None when it has none or cannot say."""
    if isinstance(batch_sampler, BatchSampler):
        return batch_sampler.get_batch_size()
    config = {"type": batch_sampler} if isinstance(batch_sampler, str) else batch_sampler
    if not isinstance(config, Mapping):
        return None
    name = config.get("type", BatchSampler.default_implementation)
    if not isinstance(name, str):
        return None
    try:
        cls, constructor = BatchSampler.resolve_class_name(name)
    except Exception:  # an unknown name: the walk reports it at the sampler's own path
        return None
    if constructor is not None:  # the config is a named constructor's, not __init__'s
        return None
    arguments = {key: value for key, value in config.items() if key != "type"}
    return cls.config_batch_size(arguments)


def validate(**settings: Any) -> None:
    """`ConfigError` (a ValueError) naming every bad setting (see `problems`)."""
    ConfigChecks(lambda _: problems(**settings)).enforce({})


def _config_problems(arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    return problems(**{name: arguments[name] for name in _PROBLEM_KEYS})


_PROBLEM_KEYS = tuple(inspect.signature(problems).parameters)


def _has(key: str, value: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema: `key` is given, and its value is `value`."""
    return {"required": [key], "properties": {key: value}}


# `problems` of a loader config's arguments, and what of them JSON Schema can say
config_checks = ConfigChecks(
    _config_problems,
    {
        "anyOf": [  # one of them, and not null
            _has(key, {"not": {"type": "null"}}) for key in ("batch_size", "batch_sampler")
        ],
        "allOf": [
            {  # a sampler batches: the loader's own batching keys stay off
                "if": _has("batch_sampler", {"not": {"type": "null"}}),
                "then": {
                    "properties": {
                        "batch_size": {"type": "null"},
                        "drop_last": {"const": False},
                        "shuffle": {"const": False},
                    }
                },
            },
            {  # persistent workers need workers
                "if": _has("persistent_workers", {"const": True}),
                "then": {"required": ["num_workers"], "properties": {"num_workers": {"minimum": 1}}},
            },
        ],
        # each parameter's own limits, shown with it by editors
        "properties": {
            "num_workers": {"minimum": 0},
            "batch_size": {"minimum": 1},
            "batches_per_epoch": {"minimum": 1, "maximum": sys.maxsize},
            "max_instances_in_memory": {"minimum": 1},
            "start_method": {"enum": multiprocessing.get_all_start_methods()},
            "transfer": {"enum": list(TRANSFERS)},
            "timeout": {"exclusiveMinimum": 0, "maximum": sys.float_info.max},
            "prefetch": {"minimum": 0},
        },
    },
)

# what the schema can say of `device_problem` (looser than torch's parser: the rest is validate's)
config_checks = config_checks.extended(
    lambda _: (),
    {
        "properties": {
            "cuda_device": {
                "anyOf": [
                    {"type": "integer", "minimum": 0, "maximum": 127},
                    {"type": "string", "pattern": "^[a-z_]+(:([0-9]|[1-9][0-9]|1[01][0-9]|12[0-7]))?$"},
                    {"type": "null"},
                ]
            }
        }
    },
)


def describe(component: Any) -> dict[str, Any]:
    """A component's type and its plain public settings, as JSON data (for `state_dict`).

    Numbers, flags, strings, None, and lists or tuples of those (as lists). A None may
    be filled in on first use (a sampler's guessed sorting keys), so it matches any
    value when states are compared (`check_settings`).
    """
    kind = type(component)
    settings = {
        name: list(value) if isinstance(value, tuple) else value
        for name, value in sorted(vars(component).items())
        if not name.startswith("_") and _plain(value)
    }
    return {"type": f"{kind.__module__}.{kind.__qualname__}", **settings}


def _plain(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(isinstance(item, (bool, int, float, str)) for item in value)
    return value is None or isinstance(value, (bool, int, float, str))
