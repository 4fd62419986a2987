"""Sizes as people write them: `parse_size("50GB")` and `format_size(1536)`.

Used wherever a user gives a disk budget (`framework cache prune --max-size`). KB,
MB, GB, TB and PB are powers of 1000 (as disks are sold); KiB, MiB, GiB, TiB and PiB
powers of 1024; units in any case. A bare number is bytes.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Final, Union

__all__ = ["format_size", "parse_size"]

_UNITS: Final = {
    "": 1,
    "b": 1,
    **{f"{prefix}b": 1000 ** (power + 1) for power, prefix in enumerate("kmgtp")},
    **{f"{prefix}ib": 1024 ** (power + 1) for power, prefix in enumerate("kmgtp")},
}
_SIZE: Final = re.compile(r"\s*(?P<number>[0-9]+(?:\.[0-9]+)?|\.[0-9]+)\s*(?P<unit>[A-Za-z]*)\s*")
_HELP: Final = (
    "write bytes (1000000) or a number and a unit: 500MB, 50GB, 1.5TiB "
    "(KB, MB, GB, TB: powers of 1000; KiB, MiB, GiB, TiB: of 1024)"
)


def parse_size(value: Union[str, int]) -> int:
    """`value` in bytes: a whole number of bytes, or a string such as "50GB", "500MiB",
    "1.5TB" or "4096" (a fraction of a byte is dropped). A `ValueError` that says how
    to write one otherwise (a negative number, an unknown unit, not a number)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"a size is a number of bytes or a string such as '50GB', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative, got {value}")
        return value
    if value.strip().startswith("-"):
        raise ValueError(f"a size cannot be negative, got {value!r}")
    found = _SIZE.fullmatch(value)
    unit = _UNITS.get(found["unit"].lower()) if found is not None else None
    if found is None or unit is None:
        raise ValueError(f"not a size: {value!r}; {_HELP}")
    return int(Decimal(found["number"]) * unit)


def format_size(size: int) -> str:
    """`size` bytes for people, in powers of 1024: "512 B", "1.5 KiB", "3.0 GiB"."""
    if size < 1024:
        return f"{size} B"
    scaled, unit = size / 1024, "KiB"
    for larger in ("MiB", "GiB", "TiB", "PiB"):
        if scaled < 1024:
            break
        scaled, unit = scaled / 1024, larger
    return f"{scaled:.1f} {unit}"
