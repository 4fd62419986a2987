"""The `framework` command: `plugins`, `download`, `cache`, `run` and `config`.

Each subcommand lives in its own module with `add_parser(subparsers)`; heavy
imports happen inside the handlers, so `--help` and `plugins` start fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import warnings
from collections.abc import Sequence
from typing import NoReturn, Optional, Union

from framework._version import __version__
from framework.cli._text import one_line

__all__ = ["build_parser", "main", "one_line"]

_COMMANDS = (
    "framework.cli.plugins",
    "framework.cli.download",
    "framework.cli.cache",
    "framework.cli.run",
    "framework.cli.config",
)


class _Parser(argparse.ArgumentParser):
    """Every bad command line is one line on stderr, like every other failure, and exit
    status 2; subcommand parsers are of this class too (argparse makes them so)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="framework",
        description="Fetch research data safely and feed it to PyTorch fast.",
    )
    parser.add_argument("--version", action="version", version=f"framework {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in _COMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name != module_name:
                raise
            continue
        module.add_parser(subparsers)
    return parser


def _one_line_warning(
    message: Union[Warning, str],
    category: type[Warning],
    filename: str,
    lineno: int,
    line: Optional[str] = None,
) -> str:
    """A warning on the command line is one line, like an error, without source lines."""
    return f"framework: warning: {category.__name__}: {one_line(str(message))}\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    command = " ".join(p for p in ("framework", args.command, getattr(args, "action", None)) if p)
    if extra:  # named by the command they were given to, not by the top-level parser
        print(f"{command}: error: unrecognized arguments: {one_line(' '.join(extra))} "
              f"(see {command} --help)", file=sys.stderr)  # fmt: skip
        return 2
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    warnings.formatwarning = _one_line_warning
    if not getattr(args, "handler", None):
        commands = ", ".join(sorted(module.rpartition(".")[2] for module in _COMMANDS))
        print(f"framework: error: give a command: {commands} (see framework --help)", file=sys.stderr)
        return 2
    from framework.errors import ConfigError, FrameworkError, WorkerError

    def error(message: str) -> None:
        print(f"framework {args.command}: error: {one_line(message)}", file=sys.stderr)

    # One way for every subcommand to fail: one line that says what, no traceback.
    try:
        code: int = args.handler(args)
    except ConfigError as exc:  # the dotted path of the bad key says it all
        for each in exc.errors:  # a checked config: every error, one line each
            error(str(each))
        return 2
    except FileNotFoundError as exc:
        error(str(exc))
        return 1
    except WorkerError as exc:  # its message names the original type; str() adds a traceback
        if args.verbose:
            raise
        error(f"WorkerError: {exc.message} (run with -v for the traceback)")
        return 1
    except (FrameworkError, OSError, ValueError, ImportError) as exc:
        error(f"{type(exc).__name__}: {exc}")
        return 1
    except KeyboardInterrupt:
        error("interrupted")
        return 130
    except SystemExit as exc:  # our handlers return their code: this came from other code
        error(f"stopped by SystemExit({exc.code!r}) raised inside a component or plugin")
        return exc.code if isinstance(exc.code, int) and exc.code != 0 else 1
    except Exception as exc:  # a component's own failure: one line, the traceback on -v
        if args.verbose:
            raise
        error(f"{type(exc).__name__}: {exc} (run with -v for the traceback)")
        return 1
    return code
