"""Parallel fetch: a large object comes as byte-range parts over several connections.

Built on the partial file (`framework.download._partial`) and the single-stream path
(`framework.download._stream`), never on the dispatcher above it. The design is in
`_fetch`; the plan and its record in `_parts`, the ramp in `_ramp`, the threads that
hash and record in `_followers`, the engine's threads in `_engine`.
"""

from __future__ import annotations

from framework.download.parallel._fetch import (
    DEFAULT_CONNECTIONS,
    DEFAULT_PART_SIZE,
    MIN_PART_SIZE,
    connections_chosen,
    connections_from,
    fetch_parts,
)
from framework.download.parallel._parts import Resumed, adopt_parts

__all__ = [
    "DEFAULT_CONNECTIONS",
    "DEFAULT_PART_SIZE",
    "MIN_PART_SIZE",
    "Resumed",
    "adopt_parts",
    "connections_chosen",
    "connections_from",
    "fetch_parts",
]
