"""The "bucket" and "max_tokens" batch samplers (ported from AllenNLP's sampler tests)."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from framework.data.sampler import BatchSampler, guess_sorting_keys

pytestmark = pytest.mark.timeout(30)


def instances() -> list[dict[str, Any]]:
    # Lengths of "text": 5, 3, 6, 2, 4 ; "short" is always shorter.
    lengths = [5, 3, 6, 2, 4]
    return [
        {"text": torch.arange(n), "short": [0] * (n // 2 + 1), "label": i}
        for i, n in enumerate(lengths)
    ]


def bucket(**kwargs: Any) -> Any:
    return BatchSampler.by_name("bucket")(**kwargs)


def test_samplers_come_from_the_plugin_path() -> None:
    from framework_plugins.samplers import BucketBatchSampler, MaxTokensBatchSampler

    assert BatchSampler.by_name("bucket") is BucketBatchSampler
    assert BatchSampler.by_name("max_tokens") is MaxTokensBatchSampler
    assert BatchSampler.registry_entries()["bucket"].plugin == "samplers"
    built = BatchSampler.from_config({"type": "bucket", "batch_size": 3, "sorting_keys": ["x"]})
    assert isinstance(built, BucketBatchSampler) and built.batch_size == 3


def test_samplers_are_importable_from_framework_data() -> None:
    import framework_plugins.samplers

    import framework.data
    from framework.data import BucketBatchSampler, MaxTokensBatchSampler

    assert BatchSampler.by_name("bucket") is BucketBatchSampler
    assert BatchSampler.by_name("max_tokens") is MaxTokensBatchSampler
    assert framework_plugins.samplers.BucketBatchSampler is BucketBatchSampler  # the old path
    assert framework_plugins.samplers.MaxTokensBatchSampler is MaxTokensBatchSampler
    assert {"BucketBatchSampler", "MaxTokensBatchSampler"} <= set(framework.data.__all__)
    assert framework.data.__all__ == sorted(framework.data.__all__)


def test_the_core_never_imports_the_plugins_package() -> None:
    import ast
    from pathlib import Path

    import framework

    root = Path(framework.__file__).parent
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            assert not any(n.split(".")[0] == "framework_plugins" for n in names), path


def test_bucket_groups_instances_of_similar_length() -> None:
    sampler = bucket(batch_size=2, sorting_keys=["text"], padding_noise=0, shuffle=False)
    batches = list(sampler.get_batch_indices(instances()))
    assert batches == [[3, 1], [4, 0], [2]]  # lengths (2, 3), (4, 5), (6)


def test_bucket_shuffles_batches_not_their_contents() -> None:
    random.seed(3)
    sampler = bucket(batch_size=2, sorting_keys=["text"], padding_noise=0)
    batches = [sorted(b) for b in sampler.get_batch_indices(instances())]
    assert sorted(batches) == sorted([[1, 3], [0, 4], [2]])


def test_bucket_guesses_the_longest_field() -> None:
    sampler = bucket(batch_size=2, padding_noise=0, shuffle=False)
    list(sampler.get_batch_indices(instances()))
    assert sampler.sorting_keys == ["text"]
    assert guess_sorting_keys(instances()) == ["text"]


def test_bucket_drop_last_and_counts() -> None:
    keep = bucket(batch_size=2, sorting_keys=["text"], shuffle=False)
    drop = bucket(batch_size=2, sorting_keys=["text"], shuffle=False, drop_last=True)
    assert keep.get_num_batches(instances()) == 3 == len(list(keep.get_batch_indices(instances())))
    assert drop.get_num_batches(instances()) == 2 == len(list(drop.get_batch_indices(instances())))
    assert all(len(b) == 2 for b in drop.get_batch_indices(instances()))
    assert keep.get_batch_size() == 2


def test_bucket_unknown_sorting_key_lists_the_fields() -> None:
    sampler = bucket(batch_size=2, sorting_keys=["nope"])
    with pytest.raises(ValueError, match=r"'nope'.*\['label', 'short', 'text'\]"):
        list(sampler.get_batch_indices(instances()))


def test_bucket_noise_changes_order_but_keeps_every_index() -> None:
    sampler = bucket(batch_size=1, sorting_keys=["text"], padding_noise=0.5, shuffle=False)
    random.seed(0)
    indices = [b[0] for b in sampler.get_batch_indices(instances() * 4)]
    assert sorted(indices) == list(range(20))


def test_max_tokens_respects_the_budget() -> None:
    sampler = BatchSampler.by_name("max_tokens")(max_tokens=8, sorting_keys=["text"], padding_noise=0)
    data = instances()
    batches = list(sampler.get_batch_indices(data))
    assert sorted(i for b in batches for i in b) == list(range(5))
    for batch in batches:
        longest = max(len(data[i]["text"]) for i in batch)
        assert longest * len(batch) <= 8
    assert sorted(map(sorted, batches)) == [[0], [1, 3], [2], [4]]
    assert sampler.get_num_batches(data) == 4
    assert sampler.get_batch_size() is None


def test_max_tokens_gives_an_oversized_instance_its_own_batch() -> None:
    sampler = BatchSampler.by_name("max_tokens")(max_tokens=3, sorting_keys=["text"], padding_noise=0)
    batches = list(sampler.get_batch_indices(instances()))
    assert all(batch for batch in batches)  # never an empty batch
    assert sorted(len(b) for b in batches) == [1, 1, 1, 1, 1]


def test_invalid_sampler_arguments() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        bucket(batch_size=0)
    with pytest.raises(ValueError, match="max_tokens"):
        BatchSampler.by_name("max_tokens")(max_tokens=0)
