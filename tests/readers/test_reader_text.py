"""The first-party "text" reader: tokenizers, indexing into tensors, sharding."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest
import torch

from framework import DatasetReader
from framework.data.multiprocess import MultiProcessDataLoader
from framework.errors import ConfigError
from framework.testing import assert_reader_shards_exactly_once

LINES = [f"sentence number {i} " + "word " * (i % 7) for i in range(31)]


@pytest.fixture
def corpus(tmp_path: Path) -> str:
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(LINES) + "\n\n", encoding="utf-8")
    return str(path)


@pytest.fixture
def fresh_tokenizers_module() -> None:
    sys.modules.pop("tests.support.tokenizers", None)  # imported again by name, as a config does


def test_whitespace_tokens_and_text(corpus: str) -> None:
    reader = DatasetReader.from_config({"type": "text"})
    instances = list(reader.read(corpus))
    assert len(instances) == len(LINES)  # the blank line is skipped
    assert instances[3] == {"tokens": LINES[3].split(), "text": LINES[3]}


def test_lowercase_max_tokens_keep_text(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("The Quick  Brown Fox\n", encoding="utf-8")
    reader = DatasetReader.from_config(
        {"type": "text", "lowercase": True, "max_tokens": 3, "keep_text": False}
    )
    assert list(reader.read(str(path))) == [{"tokens": ["the", "quick", "brown"]}]


@pytest.mark.usefixtures("fresh_tokenizers_module")
def test_tokenizer_by_dotted_path_function_and_class(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("a b, c\n", encoding="utf-8")
    by_function = DatasetReader.from_config(
        {"type": "text", "tokenizer": "tests.support.tokenizers:char_tokenize"}
    )
    assert next(iter(by_function.read(str(path))))["tokens"] == ["a", "b", ",", "c"]
    by_class = DatasetReader.from_config(
        {"type": "text", "tokenizer": "tests.support.tokenizers.CommaTokenizer"}
    )
    assert next(iter(by_class.read(str(path))))["tokens"] == ["a b", "c"]


@pytest.mark.usefixtures("fresh_tokenizers_module")
def test_bad_tokenizer_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="tokenizer 'no_such_module:tokenize' could not be imported"):
        DatasetReader.from_config({"type": "text", "tokenizer": "no_such_module:tokenize"})
    with pytest.raises(ConfigError, match="is 42, which is not callable"):
        DatasetReader.from_config({"type": "text", "tokenizer": "tests.support.tokenizers:NOT_CALLABLE"})


def test_bad_options_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="num_buckets or vocabulary, not both"):
        DatasetReader.from_config({"type": "text", "num_buckets": 100, "vocabulary": "v.txt"})
    with pytest.raises(ConfigError, match="num_buckets: expected int of at least 3"):
        DatasetReader.from_config({"type": "text", "num_buckets": 2})
    with pytest.raises(ConfigError, match=r"^max_tokens: expected int"):
        DatasetReader.from_config({"type": "text", "max_tokens": "many"})


def test_hashed_token_ids_are_stable_long_tensors(corpus: str) -> None:
    reader = DatasetReader.from_config({"type": "text", "num_buckets": 50})
    instances = list(reader.read(corpus))
    ids = instances[5]["token_ids"]
    assert ids.dtype == torch.long and ids.shape == (len(LINES[5].split()),)
    assert int(ids.min()) >= 2 and int(ids.max()) < 50  # 0 is padding, 1 unknown
    # the same token gets the same id everywhere (crc32, not the salted hash())
    again = list(DatasetReader.from_config({"type": "text", "num_buckets": 50}).read(corpus))
    assert torch.equal(again[5]["token_ids"], ids)
    assert int(instances[0]["token_ids"][0]) == int(instances[1]["token_ids"][0])  # "sentence"


def test_vocabulary_file(tmp_path: Path) -> None:
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("the\ncat\nsat\n", encoding="utf-8")
    data = tmp_path / "d.txt"
    data.write_text("the cat sat on the mat\n", encoding="utf-8")
    reader = DatasetReader.from_config({"type": "text", "vocabulary": str(vocab)})
    (instance,) = reader.read(str(data))
    assert instance["token_ids"].tolist() == [2, 3, 4, 1, 2, 1]


@pytest.mark.usefixtures("fresh_tokenizers_module")
def test_reader_with_tokenizer_pickles_by_path(tmp_path: Path) -> None:
    reader = DatasetReader.from_config(
        {"type": "text", "tokenizer": "tests.support.tokenizers:char_tokenize"}
    )
    clone = pickle.loads(pickle.dumps(reader))
    assert clone.tokenize("a b") == ["a", "b"]


def test_shards_are_disjoint_and_complete(corpus: str) -> None:
    reader = DatasetReader.by_name("text")()
    instances = assert_reader_shards_exactly_once(reader, corpus, key=lambda i: i["text"])
    assert sorted(i["text"] for i in instances) == sorted(LINES)


@pytest.mark.parametrize(
    "data", [b"alpha\rbeta\rgamma\r", b"alpha\r\nbeta\rgamma", b"alpha\nbeta\r\ngamma\n"]
)
def test_lines_end_at_a_lone_cr_too(tmp_path: Path, data: bytes) -> None:
    # Universal newlines, as the text-mode readers before byte offsets (newline="").
    path = tmp_path / "a.txt"
    path.write_bytes(data)
    loader = MultiProcessDataLoader(DatasetReader.by_name("text")(), str(path), batch_size=8, quiet=True)
    got = [x for b in loader for x in b["text"]]
    assert got == ["alpha", "beta", "gamma"]


def test_a_resume_after_a_lone_cr_line_seeks_to_the_next_line(tmp_path: Path) -> None:
    from framework_plugins.readers import Lines

    path = tmp_path / "a.txt"
    path.write_bytes(b"a\rb\nc\r\nd\re")
    records = Lines(str(path))
    iterator = iter(records)
    assert next(iterator)[1] == "a"
    token = records.tell()
    again = Lines(str(path))
    again.seek(token)
    assert [line for _, line in again] == ["b", "c", "d", "e"]
