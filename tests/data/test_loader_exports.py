"""The public names of the loader engine, at top level and in framework.data."""

from __future__ import annotations

import pytest

import framework
import framework.data

pytestmark = pytest.mark.timeout(30)


ENGINE = {
    "BatchSampler", "DataCollator", "DataLoader", "DatasetReader", "DefaultDataCollator",
    "DistributedInfo", "MultiProcessDataLoader", "WorkerInfo",
}
SAMPLERS = {"BucketBatchSampler", "MaxTokensBatchSampler"}  # `from framework.data import ...`, as in AllenNLP
WARNINGS = {"UnshardedReadWarning"}  # to filter it: `from framework.data import UnshardedReadWarning`
STREAMING = {"ShardFiles"}  # what a reader gets for remote shards, to test for in `_read`


def test_data_package_exports_exactly_the_engine() -> None:
    assert set(framework.data.__all__) == ENGINE | SAMPLERS | WARNINGS | STREAMING
    assert framework.data.__all__ == sorted(framework.data.__all__)
    for name in ENGINE:
        assert getattr(framework.data, name) is getattr(framework, name)
    for name in SAMPLERS:
        assert getattr(framework.data, name).__module__ == "framework.data.sampler"
    for name in WARNINGS:
        assert getattr(framework.data, name).__module__ == "framework.data.reader"
        assert issubclass(getattr(framework.data, name), UserWarning)
    assert framework.data.ShardFiles.__module__ == "framework.data.shard_files"


def test_loader_is_the_default_and_registered_through_the_plugin_path() -> None:
    from framework.data.loader import DataLoader

    assert DataLoader.default_implementation == "multiprocess"
    assert DataLoader.by_name("multiprocess") is framework.MultiProcessDataLoader
    assert DataLoader.registry_entries()["multiprocess"].plugin == "core"
