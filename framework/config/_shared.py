"""How much larger a config is as walked than as written: nodes it shares (YAML aliases).

`a: &x [...]` then `b: [*x, *x]` writes a list once and uses it twice: the loaded
config holds one list object at two places. Ten such levels of ten aliases are a few
hundred bytes of YAML and 10**10 values to any walk that visits each place. Counting
the places costs one visit per distinct node, so a check can refuse such a config
before walking it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["MAX_SHARED_EXPANSION", "shared_expansion"]

MAX_SHARED_EXPANSION = 100_000  # values met again through shared nodes: more is an attack


def shared_expansion(value: Any, max_depth: int) -> int:
    """How many more values a walk of `value` meets than `value` holds: every value
    under a node reached along several paths counts once per path. Visits each
    distinct mapping and list once; stops at `max_depth` and at a node that contains
    itself (the walk reports those)."""
    sizes: dict[int, int] = {}  # a node's id: its values as walked
    inside: set[int] = set()
    held = 0  # values as written: each distinct node's own items once

    def walked(node: Any, depth: int) -> int:
        nonlocal held
        if not isinstance(node, (Mapping, list, tuple)):
            return 1
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in inside or depth > max_depth:
            return 1
        inside.add(key)
        items = list(node.values()) if isinstance(node, Mapping) else list(node)
        held += 1 + sum(1 for item in items if not isinstance(item, (Mapping, list, tuple)))
        total = 1 + sum(walked(item, depth + 1) for item in items)
        inside.discard(key)
        sizes[key] = total
        return total

    total = walked(value, 0)
    return max(0, total - max(held, 1))
