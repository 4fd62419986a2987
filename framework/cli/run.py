"""`framework run [CONFIG]`: fetch the data, read it, batch it, and report.

A config names a `dataset_reader`, a `data_path` (a URL any download backend
serves, or a local path), a `data_loader` (`"multiprocess"` by default) and
`epochs`. A local path (or a `file://` URL) is read in place; a URL of any other
scheme is fetched into the cache once. Everything is built, and so checked, before
any data is fetched or read: a config error prints the dotted path of the bad key and
stops. Without CONFIG the bundled example (`framework/examples/default.json`) runs
on a bundled corpus. Under torchrun, rank 0 prints the job's summary.

A relative `data_path` written in a config file is relative to that file's folder (so
a config and its data move together); one given with `--override` is relative to the
current folder, like any path typed on a command line.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit
from urllib.request import url2pathname

from framework.cli._summary import batch_size, combined, peak_memory_mib, print_summary, rates
from framework.errors import ConfigError, FrameworkError

__all__ = ["TOP_LEVEL_KEYS", "add_parser", "deep_merge", "load_run_config", "main"]

TOP_LEVEL_KEYS = ("dataset_reader", "data_path", "data_loader", "epochs")
DEFAULT_CONFIG = "default.json"


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help="fetch a dataset, read and batch it for some epochs, and report throughput",
        description="Fetch the data named by CONFIG through the download manager, build the "
        "reader and data loader by name, iterate the epochs, and print a summary. Without "
        "CONFIG, runs the bundled example on a bundled corpus (no network needed).",
    )
    parser.add_argument(
        "config",
        nargs="?",
        help="a JSON or YAML config file (default: the bundled example); a relative data_path "
        "in it is relative to the file's folder",
    )
    parser.add_argument(
        "-o",
        "--override",
        action="append",
        default=[],
        metavar="JSON",
        help='JSON deep-merged into the config, e.g. \'{"data_loader": {"num_workers": 2}}\' '
        "(may be repeated); a relative data_path given here is relative to the current folder",
    )
    parser.add_argument("--device", help="move batches to this torch device, e.g. cuda:0")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (download and epochs)")
    parser.set_defaults(handler=main)


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `override` merged in: mappings merge key by key, anything else replaces.

    A component written as its name alone (`"dataset_reader": "text"`) is the mapping
    `{"type": "text"}`: a mapping without `"type"` merges into it."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and "type" not in value and isinstance(merged.get(key), str):
            merged[key] = {"type": merged[key]}
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _bundled_examples() -> Path:
    return Path(str(resources.files("framework") / "examples"))


def load_run_config(config_path: Optional[str], overrides: list[str]) -> tuple[dict[str, Any], Path]:
    """The merged, checked config and the folder a relative `data_path` resolves against:
    the config file's folder for a path written in the file, the current folder for one
    given in an `--override`."""
    from framework.config import MAX_DEPTH, load_config
    from framework.config import shown as _shown

    file = _bundled_examples() / DEFAULT_CONFIG if config_path is None else Path(config_path)
    config = load_config(file)
    base_dir = file.resolve().parent
    for index, text in enumerate(overrides):
        try:
            override = json.loads(text)
        except ValueError as error:  # a JSONDecodeError, or an int too long to convert
            reason = error.msg if isinstance(error, json.JSONDecodeError) else str(error)
            raise ConfigError(
                "", f"--override #{index + 1} is not valid JSON ({reason}): {_shown(text)}"
            ) from error
        except RecursionError:
            raise ConfigError(
                "",
                f"--override #{index + 1} nests too deep to read (more than {MAX_DEPTH} levels is a mistake)",
            ) from None
        if not isinstance(override, dict):
            raise ConfigError("", f"--override #{index + 1} must be a JSON object, got {_shown(text)}")
        try:
            config = deep_merge(config, override)
        except RecursionError:  # copying a config nested too deep
            raise ConfigError("", f"{file} nests too deep to merge --override #{index + 1} into") from None
        if "data_path" in override:
            base_dir = Path.cwd()
    _check_top_level(config)
    return _converted(config), base_dir


def _check_top_level(config: Mapping[str, Any]) -> None:
    """Every error in the config at once (keys, types, names), before anything is built."""
    from framework.config import check

    check(config)


def _converted(config: dict[str, Any]) -> dict[str, Any]:
    """`config` (checked) with its plain top-level values as their annotations make them
    (`"epochs": 2.0` is the int 2, as JSON and the schema read it): the run uses the
    values `validate` judged, never the raw ones. Components are built later, from
    their configs, by the same walk."""
    from framework.cli.run_config import run_config
    from framework.config import construct, signature_of

    parameters = signature_of(run_config).parameters
    for key in ("data_path", "epochs"):
        if key in config:
            config[key] = construct(parameters[key].annotation, config[key], path=key)
    return config


def _prefixed(prefix: str, error: ConfigError) -> ConfigError:
    path = f"{prefix}.{error.path}" if error.path else prefix
    return ConfigError(path, error.reason, error.expected, error.got)


def _build_loader(loader_config: Mapping[str, Any], reader: Any, data_path: Any) -> Any:
    """The loader, through the run config's own annotation of `data_loader`: `reader`
    and `data_path` are passed as the run's, so a config that sets them is rejected."""
    from framework.cli.run_config import LOADER
    from framework.config import construct

    return construct(
        LOADER, loader_config, path="data_loader", extras={"reader": reader, "data_path": data_path}
    )


def _loader_parameters(loader_config: Mapping[str, Any]) -> set[str]:
    """The config keys of the loader type the config names (empty if unknown): its
    constructor's parameters, with those it forwards through `**kwargs` to its parent."""
    from framework.config import signature_of
    from framework.data import DataLoader

    type_name = loader_config.get("type", DataLoader.default_implementation)
    try:
        factory = DataLoader.by_name(type_name) if isinstance(type_name, str) else None
        return set(signature_of(factory).parameters) if factory is not None else set()
    except (FrameworkError, LookupError, TypeError, ValueError):
        return set()  # from_config reports a bad type with its path


_LAZY_KEY = "max_instances_in_memory"


def _preflight_loader(loader_config: Mapping[str, Any], reader: Any, data_path: Any) -> None:
    """Build the loader once without reading anything, so a bad key fails before any work.

    An eager loader reads all its data while it is built; this one is built lazy (with
    an unbounded `max_instances_in_memory`), which checks every key, value and
    combination the same way and reads nothing until iterated. It is then dropped. The
    config was checked as the user wrote it (`validate`) already: an error about the key
    set here is about this stand-in, never the user's, and is not reported.
    """
    config = copy.deepcopy(dict(loader_config))
    injected = _LAZY_KEY in _loader_parameters(config) and config.get(_LAZY_KEY) is None
    if injected:
        config[_LAZY_KEY] = 2**62
    try:
        _build_loader(config, reader, data_path)
    except ConfigError as error:
        if not injected:
            raise
        ours = f"data_loader.{_LAZY_KEY}"
        kept = [each for each in error.errors if each.path != ours]
        if kept:
            from framework.config import combined_errors as _combined

            raise _combined(kept) from None


def _resolve_data_path(data_path: Any, base_dir: Path) -> Any:
    """`data_path` with each relative local path (a glob's too) taken from `base_dir`."""
    if isinstance(data_path, list):
        return [_resolve_data_path(item, base_dir) for item in data_path]
    if data_path.startswith("manifest:"):  # the manifest's own path, when it is a local one
        return "manifest:" + _resolve_data_path(data_path[len("manifest:") :], base_dir)
    if "://" in data_path:
        return data_path
    try:
        path = Path(data_path).expanduser()
    except RuntimeError as error:  # "~someone" names no user of this machine
        raise ConfigError("data_path", f"cannot expand {data_path!r}: {error}") from None
    if not path.is_absolute():
        path = base_dir / path
    return str(path)


def _local_path(data_path: str) -> Optional[Path]:
    """The file or folder a plain path or a `file://` URL (of this host) names; None
    for any other URL, which the download manager fetches. A `file://` URL of another
    host is refused here, before the download manager takes a lock in the cache."""
    if "://" not in data_path:
        return Path(data_path)
    parts = urlsplit(data_path)
    if parts.scheme.lower() != "file":
        return None
    if parts.netloc not in ("", "localhost"):
        raise ConfigError("data_path", f"file:// URLs on another host ({parts.netloc}) are not supported")
    return Path(url2pathname(parts.path))  # which percent-decodes, once


def _shards_read(loader: Any) -> str:
    """Where a streamed `data_path`'s shards went: the loader's cache folder."""
    from framework.download import default_cache_dir

    return f"(shards streamed through {getattr(loader, 'cache_dir', None) or default_cache_dir()})"


def _data_to_read(data_path: str, *, progress: bool, distributed: bool) -> Path:
    """Where the data is read from: a local file or folder in place (copying it into the
    cache would only double it), anything else fetched into the cache."""
    local = _local_path(data_path)
    if local is not None:
        return local
    from framework.download import cached_path

    return cached_path(data_path, progress=progress, distributed=distributed)


def _torch_device(name: Optional[str]) -> Any:
    """The torch device `--device` names (None without one); a bad name or an absent
    CUDA is an error of `--device`."""
    if not name:
        return None
    import torch

    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ConfigError("--device", f"{error}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device", f"{name} asked for, but CUDA is not available")
    return device


def _reader_and_loader_config(config: Mapping[str, Any], *, progress: bool) -> tuple[Any, dict[str, Any]]:
    """The reader, built, and the loader's config as a mapping with a `"type"`."""
    from framework.data import DatasetReader

    reader_config = config["dataset_reader"]
    try:
        reader = DatasetReader.from_config(
            {"type": reader_config} if isinstance(reader_config, str) else reader_config
        )
    except ConfigError as error:
        raise _prefixed("dataset_reader", error) from None
    loader_config = config.get("data_loader", {})
    loader_config = {"type": loader_config} if isinstance(loader_config, str) else dict(loader_config)
    if not progress and "quiet" in _loader_parameters(loader_config):
        loader_config.setdefault("quiet", True)
    return reader, loader_config


def _iterate(loader: Any, epochs: int, start: float, *, progress: bool) -> tuple[int, int, Optional[float]]:
    """Instances and batches over `epochs`, and the seconds from `start` to the first batch."""
    from tqdm import tqdm

    instances = batches = 0
    first_batch: Optional[float] = None
    for epoch in range(epochs):
        try:
            total: Optional[int] = len(loader)
        except (TypeError, OverflowError):  # lazy without batches_per_epoch; a length past sys.maxsize
            total = None
        bar = tqdm(
            loader,
            total=total,
            desc=f"epoch {epoch + 1}/{epochs}",
            unit="batch",
            disable=not progress,
            file=sys.stderr,
        )
        for batch in bar:
            if first_batch is None:
                first_batch = time.perf_counter() - start
            batches += 1
            instances += batch_size(batch)
    return instances, batches, first_batch


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _job_summary(summary: dict[str, Any], distributed: bool) -> Optional[dict[str, Any]]:
    """Under torchrun, the job's summary on rank 0 and None on the others (so one
    summary is printed, not one per rank); `summary` itself otherwise."""
    if not distributed:
        return summary
    import torch.distributed as dist

    rank = dist.get_rank()
    gathered: Optional[list[Any]] = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(summary, gathered, dst=0)
    return combined(gathered) if gathered is not None else None


def main(args: argparse.Namespace) -> int:
    config, base_dir = load_run_config(args.config, args.override)
    progress = not args.no_progress
    device = _torch_device(args.device)

    # Build everything before any work: a bad key fails here, before the download.
    reader, loader_config = _reader_and_loader_config(config, progress=progress)
    data_path = _resolve_data_path(config["data_path"], base_dir)
    from framework.data.shard_files import names_shards

    streamed = names_shards(data_path, one_url=False)  # one URL: fetched first, once per job
    if not streamed:
        # Streamed shards download nothing before the loader is built, which checks the
        # same keys: building it twice would list them (and ask their sizes) twice.
        _preflight_loader(loader_config, reader, data_path)
    epochs: int = config.get("epochs", 1)
    if not streamed and (local := _local_path(data_path)) is not None and not local.exists():
        raise FileNotFoundError(f"data_path: {local} does not exist")

    from framework.distributed import torchrun_group

    # Under torchrun: join the job's group (gloo), so ranks read disjoint shards and the
    # whole job fetches data_path once (docs/howto/torchrun.md).
    distributed = torchrun_group()
    # Shards stream through the cache as they are read; one file is fetched whole first.
    data = data_path
    if not streamed:
        data = str(_data_to_read(data_path, progress=progress, distributed=distributed))

    start = time.perf_counter()  # eager loaders read everything while being built
    loader = _build_loader(loader_config, reader, data)
    if device is not None:
        import torch

        loader.set_target_device(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
    instances, batches, first_batch = _iterate(loader, epochs, start, progress=progress and _rank() == 0)
    elapsed = time.perf_counter() - start

    summary: dict[str, Any] = {
        "config": args.config or f"(bundled) {_bundled_examples() / DEFAULT_CONFIG}",
        "data_path": data_path,
        "cached_at": _shards_read(loader) if streamed else data,
        "epochs": epochs,
        "instances": instances,
        "batches": batches,
        "seconds": round(elapsed, 3),
        **rates(instances, batches, elapsed),
        "time_to_first_batch_s": round(first_batch, 4) if first_batch is not None else None,
        "peak_memory": peak_memory_mib(),
    }
    if device is not None:
        summary["device"] = str(device)
        if device.type == "cuda":
            import torch

            summary["peak_memory"]["cuda_mib"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    job = _job_summary(summary, distributed)
    if job is not None and args.json:
        print(json.dumps(job, indent=2))
    elif job is not None:
        print_summary(job)
    return 0
