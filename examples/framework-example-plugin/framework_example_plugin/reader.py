"""A reader: one integer a line becomes ``{"x": n, "y": n * n}`` (floats, or ints)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from framework.data.reader import DatasetReader, DatasetReaderInput


class SquaresReader(DatasetReader):
    """Reads integers, one a line, and yields ``{"x": n, "y": n * n}``.

    Args:
        as_float: yield floats (batched into float tensors) rather than ints.
    """

    def __init__(self, as_float: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.as_float = as_float

    def _read(self, file_path: DatasetReaderInput) -> Iterator[dict[str, Any]]:
        # No sharding code needed: read() gives each worker and rank its own share.
        with open(str(file_path), encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    n = int(line)
                    if self.as_float:
                        yield {"x": float(n), "y": float(n * n)}
                    else:
                        yield {"x": n, "y": n * n}
