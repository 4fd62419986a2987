"""Helpers for the reader tests: read a file as every shard of a worker/rank grid would."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from framework.data.reader import DatasetReader
from framework.testing import read_shards

ShardReader = Callable[[DatasetReader, str, int, int], list[list[Any]]]


@pytest.fixture
def shard_reader() -> ShardReader:
    return read_shards
