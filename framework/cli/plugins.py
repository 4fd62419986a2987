"""`framework plugins`: what is registered, under which name, from which package."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plugins",
        help="list registered components and the packages that provide them",
        description="List every registered component (base, name, target, provider). "
        "Nothing is imported to list it.",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from framework.registry import get_registry

    registry = get_registry()
    rows = [
        {
            "base": entry.base.__name__,
            "name": entry.name,
            "target": entry.target_path,
            "provider": entry.provider,
        }
        for entry in registry.all_entries()
    ]
    failures = {name: f"{type(e).__name__}: {e}" for name, e in registry.failures().items()}
    if args.json:
        print(json.dumps({"components": rows, "failed_plugins": failures}, indent=2))
        return 0
    headers = ("base", "name", "target", "provider")
    widths = [max([len(h)] + [len(row[h]) for row in rows]) for h in headers]
    print("  ".join(h.upper().ljust(w) for h, w in zip(headers, widths)).rstrip())
    for row in rows:
        print("  ".join(row[h].ljust(w) for h, w in zip(headers, widths)).rstrip())
    for name, message in failures.items():
        print(f"failed plugin {name}: {message}")
    return 0
