"""First-party readers: `"jsonl"`, `"text"` and `"csv"`.

Each reader shards the raw records (lines or rows) *before* the costly part of
reading them (JSON parsing, tokenizing, type conversion), so each worker process and
each distributed rank does only its own share of the work; that is why they set
both `manual_*_sharding` flags and call `shard_iterable` themselves. Files are read as
they are: plain, `.gz` or `.zst` (`framework_plugins.compressed`); every worker reads a
compressed file from its start and keeps its own records, as with a plain one.

Every instance is a dict that the default collator batches as it is: strings and
lists of strings stay lists, numbers become tensors, and token ids (`"text"` with
`num_buckets` or `vocabulary`) are 1-D `long` tensors padded with 0.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import zlib
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from pathlib import Path, PurePath
from typing import Annotated, Any, BinaryIO, Generic, Optional, TextIO, TypeVar, Union

from framework_plugins.compressed import open_data_file

from framework.config import AtLeast, ConfigChecks
from framework.data.reader import DatasetReader, DatasetReaderInput
from framework.data.shard_files import ShardFiles

__all__ = ["CsvReader", "JsonlReader", "TextReader"]

PathLike = Union[str, Path]
Tokenizer = Callable[[str], Sequence[str]]

_R = TypeVar("_R")

PADDING_ID = 0
UNKNOWN_ID = 1


def open_text(path: PathLike) -> TextIO:
    """Open `path` for reading text (UTF-8, a byte-order mark skipped); `.gz` and `.zst`
    files are decompressed on the fly."""
    return io.TextIOWrapper(open_binary(path), encoding="utf-8-sig", newline="")


def open_binary(path: PathLike) -> BinaryIO:
    """Open `path` for reading bytes; `.gz` and `.zst` files are decompressed on the fly
    (and seek, by offsets into the decompressed bytes): see `framework_plugins.compressed`."""
    return open_data_file(path)


def data_files(file_path: DatasetReaderInput) -> Sequence[str]:
    """The files behind `file_path`: one path, or a list of paths read in order, or the
    remote shards the loader streams (`ShardFiles`: each fetched when it is reached)."""
    if isinstance(file_path, ShardFiles):
        return file_path
    if isinstance(file_path, (str, PurePath)):
        return [str(file_path)]
    if isinstance(file_path, list) and all(isinstance(p, (str, PurePath)) for p in file_path):
        return [str(p) for p in file_path]
    raise TypeError(f"expected a path or a list of paths, got {file_path!r}")


class FileRecords(Generic[_R]):
    """The records of one or more files, in order, resumable by byte offset.

    The loader's resume hook (`framework.data._shards.Seekable`): `tell()` is
    `[file index, byte offset, line number]` of the record after the last one
    yielded, and `seek(token)` starts the next iteration there, so a resumed epoch
    opens the file at that offset instead of reading what came before it.
    """

    __framework_seekable__ = True  # opts into the hook

    def __init__(self, file_path: DatasetReaderInput) -> None:
        self.names = data_files(file_path)
        self.position = [0, 0, 0]

    def tell(self) -> list[int]:
        return [self.position[0], self._offset, self._number] if self._reading else list(self.position)

    _reading = False  # inside a file: the offset and line number are the attributes below
    _offset = 0
    _number = 0

    def seek(self, token: Any) -> None:
        if not (
            isinstance(token, list) and len(token) == 3 and all(isinstance(x, int) and x >= 0 for x in token)
        ):
            raise ValueError(
                f"a resume token of {type(self).__name__} is [file index, byte offset, line "
                f"number], got {token!r}; pass the state the loader saved"
            )
        self.position = list(token)

    def __iter__(self) -> Iterator[_R]:
        first, offset, number = self.position
        for index in range(first, len(self.names)):
            name = self.names[index]
            if index != first:
                offset, number = 0, 0
            with open_binary(name) as handle:
                yield from self._records(index, name, handle, offset, number)
            self.position = [index + 1, 0, 0]

    def _lines(self, index: int, handle: BinaryIO, offset: int, number: int) -> Generator[str, None, None]:
        """The decoded lines (with their newlines) from `offset`, keeping `position` after each.

        Lines end at `\n`, `\r\n` or a lone `\r` (universal newlines, as text mode
        with `newline=""` reads them). A UTF-8 byte-order mark at the file's start is
        skipped (`utf-8-sig`); anywhere else it is text.
        """
        if offset:
            # A resume offset starts a line, or is the end of a file whose last line has
            # no newline: else the file changed since it was saved.
            handle.seek(offset - 1)
            before = handle.read(1)
            if before == b"" or (before not in (b"\n", b"\r") and handle.read(1) != b""):
                raise ValueError(
                    f"{self.names[index]}: the resume offset {offset} is not the start of a "
                    "line (or is past the end): the file changed since the state was saved. "
                    "Resume with the unchanged file, or start the epoch afresh"
                )
        self.position = [index, offset, number]
        self._offset, self._number, self._reading = offset, number, True
        bom = not offset  # a UTF-8 byte-order mark may open the file: not part of its text
        try:
            yield from self._decoded(index, handle, bom)
        finally:
            self.position = [index, self._offset, self._number]
            self._reading = False

    def _decoded(self, index: int, handle: BinaryIO, bom: bool) -> Generator[str, None, None]:
        try:
            for raw in handle:  # split at b"\n"; a mid-line b"\r" is rare, so split again only then
                if bom:
                    bom = False
                    if raw.startswith(codecs.BOM_UTF8):
                        self._offset += len(codecs.BOM_UTF8)
                        raw = raw[len(codecs.BOM_UTF8) :]
                cr = raw.find(b"\r")
                size = len(raw)
                if cr == -1 or cr == size - 1 or (cr == size - 2 and raw[-1:] == b"\n"):
                    self._offset += size
                    self._number += 1
                    yield raw.decode("utf-8")
                    continue
                for piece in raw.splitlines(keepends=True):  # bytes: only \r, \n, \r\n
                    self._offset += len(piece)
                    self._number += 1
                    yield piece.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{self.names[index]}: line {self._number} is not UTF-8 text ({error}); is "
                "the file compressed in a form not read here (the readers decompress .gz and "
                ".zst), or compressed twice?"
            ) from None

    def _records(self, index: int, name: str, handle: BinaryIO, offset: int, number: int) -> Iterator[_R]:
        raise NotImplementedError


class Lines(FileRecords[tuple[str, str]]):
    """(`file:line`, line without its newline) for every non-blank line of every file."""

    def _records(
        self, index: int, name: str, handle: BinaryIO, offset: int, number: int
    ) -> Iterator[tuple[str, str]]:
        for line in self._lines(index, handle, offset, number):
            line = line.rstrip("\r\n")
            if line.strip():
                yield f"{name}:{self._number}", line


def _resolve_tokenizer(tokenizer: Optional[str]) -> Optional[Tokenizer]:
    if tokenizer is None:
        return None
    target = _import_tokenizer(tokenizer)
    if isinstance(target, type):
        target = target()  # a class: its instances are the callables
    if not callable(target):
        raise ValueError(f"tokenizer {tokenizer!r} is {target!r}, which is not callable")
    function: Tokenizer = target
    return function


def _import_tokenizer(tokenizer: str) -> Any:
    """The object at the dotted path `tokenizer`; ValueError if it cannot be imported or called."""
    from framework.registry import describe_error, import_target

    try:  # the one import gate: refused under FRAMEWORK_REGISTERED_TYPES_ONLY=1
        target = import_target(tokenizer)
    except (Exception, SystemExit) as error:  # the module is someone else's code
        reason = str(error) if isinstance(error, ImportError) else describe_error(error)
        raise ValueError(
            f"tokenizer {tokenizer!r} could not be imported ({reason}); give a dotted path "
            "to a callable like 'package.module:tokenize' taking a string and returning "
            "a list of strings"
        ) from error
    if not callable(target):
        raise ValueError(f"tokenizer {tokenizer!r} is {target!r}, which is not callable")
    return target


def _sharding_problems(arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [
        (flag, f"{flag} cannot be turned off: this reader shards its own lines")
        for flag in ("manual_multiprocess_sharding", "manual_distributed_sharding")
        if arguments.get(flag, True) is not True
    ]


class _ShardedReader(DatasetReader):
    """Shards raw records itself, before parsing them."""

    deals_with_shard_iterable = True

    config_checks = DatasetReader.config_checks.extended(
        _sharding_problems,
        {
            "properties": {
                "manual_multiprocess_sharding": {"const": True},
                "manual_distributed_sharding": {"const": True},
            }
        },
    )

    def __init__(
        self,
        *,
        manual_multiprocess_sharding: bool = True,
        manual_distributed_sharding: bool = True,
        **kwargs: Any,
    ) -> None:
        ConfigChecks(_sharding_problems).enforce(
            {
                "manual_multiprocess_sharding": manual_multiprocess_sharding,
                "manual_distributed_sharding": manual_distributed_sharding,
            }
        )
        super().__init__(manual_multiprocess_sharding=True, manual_distributed_sharding=True, **kwargs)


class JsonlReader(_ShardedReader):
    """One JSON object a line; blank lines are skipped.

    Args:
        fields: keep only these keys of each object (a missing key is an error
            naming the file and line); all keys when not given.
    """

    def __init__(self, fields: Optional[list[str]] = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fields = list(fields) if fields is not None else None

    def _read(self, file_path: DatasetReaderInput) -> Iterator[dict[str, Any]]:
        for where, line in self.shard_iterable(Lines(file_path)):
            yield self.parse_line(line, where)

    def parse_line(self, line: str, where: str = "<line>") -> dict[str, Any]:
        """One line to one instance; errors name `where` (`file:line`)."""
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from error
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
        if self.fields is None:
            return record
        missing = [name for name in self.fields if name not in record]
        if missing:
            raise ValueError(
                f"{where}: missing field(s) {', '.join(map(repr, missing))}; "
                f"the object has {', '.join(map(repr, record)) or 'no keys'}"
            )
        return {name: record[name] for name in self.fields}


def _text_problems(arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    found = []
    if arguments.get("num_buckets") is not None and arguments.get("vocabulary") is not None:
        found.append(("vocabulary", "give num_buckets or vocabulary, not both"))
    # `framework config validate` refuses a tokenizer path that construction would: one
    # the import switch (FRAMEWORK_REGISTERED_TYPES_ONLY) refuses, or that cannot be
    # imported (importing it, as a "type"'s dotted path is; a class is not made here)
    tokenizer = arguments.get("tokenizer")
    if isinstance(tokenizer, str):
        try:
            _import_tokenizer(tokenizer)
        except ValueError as error:
            found.append(("tokenizer", str(error)))
    return found


class TextReader(_ShardedReader):
    """Lines of text; each becomes `{"text": line, "tokens": [...]}`.

    Args:
        tokenizer: dotted path (`"pkg.mod:function"`) to a callable taking a string
            and returning a list of strings (a class is instantiated first); splits
            on whitespace when not given.
        lowercase: lowercase each line before tokenizing.
        max_tokens: keep at most this many tokens of each line.
        num_buckets: also produce `"token_ids"`, a `long` tensor of token ids by
            a stable hash (crc32) into `[2, num_buckets)`; 0 is padding.
        vocabulary: also produce `"token_ids"` from a vocabulary file (one token a
            line; a line's number from 2 up is the token's id, 1 is for unknown
            tokens, 0 is padding). A URL is fetched through `framework.cached_path`.
        keep_text: include the `"text"` field.
    """

    config_checks = _ShardedReader.config_checks.extended(
        _text_problems,
        {
            "not": {
                "properties": {"num_buckets": {"type": "integer"}, "vocabulary": {"type": "string"}},
                "required": ["num_buckets", "vocabulary"],
            }
        },
    )

    def __init__(
        self,
        tokenizer: Optional[str] = None,
        lowercase: bool = False,
        max_tokens: Optional[Annotated[int, AtLeast(1)]] = None,  # limits: config validate checks them too
        num_buckets: Optional[Annotated[int, AtLeast(3)]] = None,
        vocabulary: Optional[str] = None,
        keep_text: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        ConfigChecks(_text_problems).enforce({"num_buckets": num_buckets, "vocabulary": vocabulary})
        if num_buckets is not None and num_buckets < 3:
            raise ValueError(f"num_buckets must be at least 3 (0 is padding, 1 unknown), got {num_buckets}")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        self.tokenizer = tokenizer
        self.lowercase = lowercase
        self.max_tokens = max_tokens
        self.num_buckets = num_buckets
        self.vocabulary = vocabulary
        self.keep_text = keep_text
        self._tokenize = _resolve_tokenizer(tokenizer)
        self._vocab: Optional[dict[str, int]] = None

    def __getstate__(self) -> dict[str, Any]:
        # Spawned workers re-import the tokenizer by its path rather than pickling it.
        state = dict(self.__dict__)
        state["_tokenize"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._tokenize = _resolve_tokenizer(self.tokenizer)

    def _load_vocabulary(self) -> dict[str, int]:
        if self._vocab is None:
            assert self.vocabulary is not None
            path: PathLike = self.vocabulary
            if "://" in self.vocabulary:
                from framework import cached_path

                path = cached_path(self.vocabulary, progress=False)
            vocab: dict[str, int] = {}
            with open_text(path) as handle:
                for line in handle:
                    token = line.rstrip("\r\n")
                    if token and token not in vocab:
                        vocab[token] = len(vocab) + 2
            self._vocab = vocab
        return self._vocab

    def tokenize(self, text: str) -> list[str]:
        if self.lowercase:
            text = text.lower()
        tokens = list(self._tokenize(text)) if self._tokenize is not None else text.split()
        if self.max_tokens is not None:
            tokens = tokens[: self.max_tokens]
        return tokens

    def token_ids(self, tokens: Sequence[str]) -> list[int]:
        if self.num_buckets is not None:
            span = self.num_buckets - 2
            return [zlib.crc32(token.encode("utf-8")) % span + 2 for token in tokens]
        vocab = self._load_vocabulary()
        return [vocab.get(token, UNKNOWN_ID) for token in tokens]

    def text_to_instance(self, text: str) -> dict[str, Any]:
        tokens = self.tokenize(text)
        instance: dict[str, Any] = {"tokens": tokens}
        if self.keep_text:
            instance["text"] = text
        if self.num_buckets is not None or self.vocabulary is not None:
            import torch

            instance["token_ids"] = torch.tensor(self.token_ids(tokens), dtype=torch.long)
        return instance

    def _read(self, file_path: DatasetReaderInput) -> Iterator[dict[str, Any]]:
        for _, line in self.shard_iterable(Lines(file_path)):
            yield self.text_to_instance(line)


_CONVERTERS: dict[str, Callable[[str], Any]] = {"str": str, "int": int, "float": float}


class _Rows(FileRecords[tuple[list[str], str, list[str]]]):
    """(header, `file:line`, row) for every row of every file; each file has a header."""

    def __init__(self, file_path: DatasetReaderInput, reader: CsvReader) -> None:
        super().__init__(file_path)
        self.reader = reader

    def _records(
        self, index: int, name: str, handle: BinaryIO, offset: int, number: int
    ) -> Iterator[tuple[list[str], str, list[str]]]:
        delimiter = self.reader.delimiter
        lines = self._lines(index, handle, 0, 0)
        header = next(csv.reader(lines, delimiter=delimiter), None)
        lines.close()  # sets `position` to just after the header
        if header is None:
            return
        self.reader._check_header(header, name)
        if not offset:  # else resuming past the header: rows from there
            offset, number = self.position[1], self.position[2]
        # csv takes lines one at a time, so the position is right after each row's last line.
        rows = csv.reader(self._lines(index, handle, offset, number), delimiter=delimiter)
        for row in rows:
            if row:
                yield header, f"{name}:{self._number}", row


def _csv_problems(arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    found = []
    field_types = arguments.get("field_types")
    if isinstance(field_types, Mapping):
        unknown = {k: v for k, v in field_types.items() if not (isinstance(v, str) and v in _CONVERTERS)}
        if unknown:
            found.append(("field_types", f"unknown type(s) {unknown}; use one of {', '.join(_CONVERTERS)}"))
    delimiter = arguments.get("delimiter", ",")
    if not (isinstance(delimiter, str) and len(delimiter) == 1):
        found.append(("delimiter", f"delimiter must be one character, got {delimiter!r}"))
    return found


class CsvReader(_ShardedReader):
    """A CSV file with a header row; each row becomes a dict keyed by the header.

    Args:
        fields: keep only these columns (each must be in the header).
        field_types: convert columns: `{"label": "int", "score": "float"}`
            (`"str"`, `"int"` or `"float"`); numbers batch into tensors.
        delimiter: the column separator (`"\\t"` for TSV).
    """

    config_checks = _ShardedReader.config_checks.extended(
        _csv_problems,
        {
            "properties": {
                "field_types": {"additionalProperties": {"enum": list(_CONVERTERS)}},
                "delimiter": {"minLength": 1, "maxLength": 1},
            }
        },
    )

    def __init__(
        self,
        fields: Optional[list[str]] = None,
        field_types: Optional[dict[str, str]] = None,
        delimiter: str = ",",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.fields = list(fields) if fields is not None else None
        ConfigChecks(_csv_problems).enforce({"field_types": field_types, "delimiter": delimiter})
        self.field_types = dict(field_types or {})
        self.delimiter = delimiter

    def _read(self, file_path: DatasetReaderInput) -> Iterator[dict[str, Any]]:
        for header, where, row in self.shard_iterable(_Rows(file_path, self)):
            yield self.row_to_instance(header, row, where)

    def _check_header(self, header: list[str], file_path: str) -> None:
        wanted = list(self.fields or []) + list(self.field_types)
        missing = [name for name in dict.fromkeys(wanted) if name not in header]
        if missing:
            raise ValueError(
                f"{file_path}: column(s) {', '.join(map(repr, missing))} not in the header "
                f"({', '.join(map(repr, header))})"
            )

    def row_to_instance(self, header: list[str], row: list[str], where: str) -> dict[str, Any]:
        if len(row) != len(header):
            raise ValueError(f"{where}: {len(row)} values for {len(header)} columns")
        record = dict(zip(header, row))
        if self.fields is not None:
            record = {name: record[name] for name in self.fields}
        for name, type_name in self.field_types.items():
            if name not in record:
                continue
            try:
                record[name] = _CONVERTERS[type_name](record[name])
            except ValueError:
                raise ValueError(
                    f"{where}: column {name!r} should be {type_name}, got {record[name]!r}"
                ) from None
        return record
