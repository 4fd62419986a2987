"""`framework config schema [BASE]` and `framework config validate CONFIG`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_parser"]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "config",
        help="print the JSON Schema of configs, or check a config without running anything",
        description="Work with run configs without running them: print their JSON Schema "
        "(for editor completion and checking), or check one and list every error.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    schema = actions.add_parser(
        "schema",
        help="print the JSON Schema (draft 2020-12) of run configs, or of one base",
        description="Print the JSON Schema of `framework run` configs, made from the "
        "registered components (installed plugins included) and their constructors' "
        "annotations. With BASE (e.g. DatasetReader), the schema of that base's configs. "
        "Components that cannot be described are named on stderr.",
    )
    schema.add_argument("base", nargs="?", metavar="BASE", help="a Registrable base, e.g. DatasetReader")
    schema.add_argument(
        "--given",
        action="append",
        default=[],
        metavar="NAME",
        help="an argument that code passes with the config (from_config's extras), so the "
        "schema does not require it (may be repeated; a base's usual ones, such as "
        "DataLoader's reader and data_path, are given already)",
    )
    schema.set_defaults(handler=print_schema)
    validate = actions.add_parser(
        "validate",
        help="check a run config: print every error, one a line, and exit 1; or say it is valid",
        description="Check CONFIG as `framework run` would, without building, downloading "
        "or reading anything: print every error (dotted path, what is wrong, a did-you-mean) "
        "one a line and exit 1, or say that the config is valid and exit 0.",
    )
    validate.add_argument("config", help="a JSON or YAML run config")
    validate.add_argument(
        "-o",
        "--override",
        action="append",
        default=[],
        metavar="JSON",
        help="JSON deep-merged into the config, as for `framework run` (may be repeated)",
    )
    validate.set_defaults(handler=check_config)


def print_schema(args: argparse.Namespace) -> int:
    from framework.config import json_schema

    schema = json_schema(args.base, given=args.given)
    for item in schema.get("x-framework-undescribed", []):
        print(
            f"framework config schema: warning: not described: {item['component']}: {item['reason']}",
            file=sys.stderr,
        )
    print(json.dumps(schema, indent=2))
    return 0


def check_config(args: argparse.Namespace) -> int:
    from framework.cli._text import one_line
    from framework.cli.run import load_run_config
    from framework.errors import ConfigError

    try:
        load_run_config(args.config, args.override)  # merges the overrides, then checks
    except ConfigError as error:
        for each in error.errors:  # one line each, so a line count is an error count
            print(one_line(str(each)))
        return 1
    except Exception as error:  # the check itself failed (a component's rules, a bug)
        if args.verbose:
            raise
        # like every other failure of this command: one line on stdout, exit status 1
        print(one_line(f"<root>: the config could not be checked: {type(error).__name__}: {error}"))
        return 1
    print(f"{args.config}: valid")
    return 0
