"""The first-party readers through the real loader: worker processes, the default
collator, samplers. Every instance arrives exactly once, and batches are tensors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from framework import DataLoader, DatasetReader

pytestmark = pytest.mark.timeout(60)


def build(reader: dict[str, Any], path: Path, **loader: Any) -> DataLoader:
    return DataLoader.from_config(
        {"quiet": True, **loader},
        reader=DatasetReader.from_config(reader),
        data_path=str(path),
    )


@pytest.mark.parametrize("lazy", [False, True])
def test_text_reader_batches_into_padded_tensors(tmp_path: Path, lazy: bool) -> None:
    lines = [" ".join(f"w{j}" for j in range(1 + i % 9)) + f" line{i}" for i in range(101)]
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    loader = build(
        {"type": "text", "num_buckets": 1000},
        path,
        batch_sampler={"type": "bucket", "batch_size": 8, "sorting_keys": ["token_ids"]},
        num_workers=2,
        max_instances_in_memory=40 if lazy else None,
    )
    seen = []
    for batch in loader:
        ids, tokens = batch["token_ids"], batch["tokens"]
        assert ids.dtype == torch.long and ids.dim() == 2
        assert isinstance(tokens, list) and len(tokens) == ids.shape[0]
        for row, toks in zip(ids, tokens):
            assert int((row != 0).sum()) == len(toks)  # padded with 0 past each line's end
        seen += batch["text"]
    assert sorted(seen) == sorted(lines)


def test_jsonl_reader_with_workers_and_field_selection(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text(
        "".join(json.dumps({"id": i, "score": i / 4, "note": "x"}) + "\n" for i in range(77)),
        encoding="utf-8",
    )
    loader = build({"type": "jsonl", "fields": ["id", "score"]}, path, batch_size=10, num_workers=3)
    batches = list(loader)
    assert set(batches[0]) == {"id", "score"}
    assert batches[0]["score"].dtype.is_floating_point
    assert sorted(i for b in batches for i in b["id"].tolist()) == list(range(77))


def test_csv_reader_with_workers_and_types(tmp_path: Path) -> None:
    path = tmp_path / "data.csv"
    path.write_text("id,label,text\n" + "".join(f'{i},{i % 3},"t {i}"\n' for i in range(45)))
    loader = build(
        {"type": "csv", "field_types": {"id": "int", "label": "int"}},
        path,
        batch_size=4,
        num_workers=2,
        max_instances_in_memory=8,
    )
    batches = list(loader)
    assert batches[0]["label"].dtype == torch.long and isinstance(batches[0]["text"], list)
    assert sorted(i for b in batches for i in b["id"].tolist()) == list(range(45))


def test_a_bad_line_in_a_worker_is_a_worker_error_naming_the_line(tmp_path: Path) -> None:
    from framework.errors import WorkerError

    path = tmp_path / "data.jsonl"
    path.write_text("".join('{"i": 1}\n' for _ in range(9)) + "{oops\n", encoding="utf-8")
    with pytest.raises(WorkerError, match=r"data\.jsonl:10: not valid JSON"):
        list(build({"type": "jsonl"}, path, batch_size=2, num_workers=2))  # eager: reads in build


def test_text_reader_with_a_tokenizer_under_spawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the tokenizer travels by its dotted path, and is imported again in each worker
    path = tmp_path / "t.txt"
    path.write_text("".join(f"ab{i}\n" for i in range(20)), encoding="utf-8")
    loader = build(
        {"type": "text", "tokenizer": "tests.support.tokenizers:char_tokenize", "num_buckets": 64},
        path,
        batch_size=5,
        num_workers=2,
        start_method="spawn",
    )
    batches = list(loader)
    assert sum(len(b["tokens"]) for b in batches) == 20
    assert batches[0]["tokens"][0][:2] == ["a", "b"]
