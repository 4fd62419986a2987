"""The shape of a `framework run` config, as a signature that checks and schemas read.

Importing this module installs it in `framework.config` (`use_run_config`), which
checks and describes run configs by it but sits below the CLI and the loader it names.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, List, Union

from framework.config import AtLeast, Given, use_run_config
from framework.data import DataLoader, DatasetReader

__all__ = ["LOADER", "run_config"]

_NO_OPTIONS: Mapping[str, Any] = MappingProxyType({})

# `framework run` passes the loader its reader and data_path: a config may not set them
LOADER = Annotated[DataLoader, Given(("reader", "data_path"))]


def run_config(
    dataset_reader: DatasetReader,
    data_path: Union[Annotated[str, AtLeast(1)], List[Annotated[str, AtLeast(1)]]],
    data_loader: LOADER = _NO_OPTIONS,  # type: ignore[assignment]
    epochs: Annotated[int, AtLeast(1)] = 1,
) -> None:
    """A `framework run` config: what to read, from where, how to batch it, how many times.

    Args:
        dataset_reader: the reader, by registered name: `{"type": "jsonl", ...}`.
        data_path: a URL that a download backend serves (`https://...`, `s3://...`)
            or a local file or folder; or many shards, streamed while they are read:
            a list of paths and URLs, a glob (`s3://bucket/train/*.jsonl.gz`), a brace
            range (`https://host/train-{000..255}.jsonl.gz`) or `manifest:URL`.
        data_loader: the loader (`"multiprocess"` when it has no `"type"`); its
            `reader` and `data_path` come from the keys above, and may not be set here.
        epochs: how many passes over the data.
    """


use_run_config(run_config)
