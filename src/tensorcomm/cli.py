"""The ``tensorcomm`` command: ``run``, ``demo``, ``bench``, ``tune`` and ``trace``, each defined
beside its work.

A subcommand is a module with ``HELP`` (one line for ``tensorcomm --help``),
``add_arguments(parser)`` and ``main(args) -> exit code``. A ``main`` reports bad arguments by
raising ``launch.env.LaunchConfigError``: the subcommand's usage and the message are printed and
2 returned, as argparse does for its own errors.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Protocol

from tensorcomm import __version__
from tensorcomm.bench import cli as bench_cli
from tensorcomm.bench import tune as bench_tune
from tensorcomm.launch import demo as launch_demo
from tensorcomm.launch import run as launch_run
from tensorcomm.launch.env import LaunchConfigError
from tensorcomm.trace import cli as trace_cli


class Subcommand(Protocol):
    """What a subcommand module provides."""

    HELP: str

    def add_arguments(self, parser: argparse.ArgumentParser, /) -> None: ...

    def main(self, args: argparse.Namespace, /) -> int: ...


SUBCOMMANDS: dict[str, Subcommand] = {"run": launch_run, "demo": launch_demo, "bench": bench_cli,
                                       "tune": bench_tune, "trace": trace_cli}


def build_parser() -> argparse.ArgumentParser:
    """The ``tensorcomm`` parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="tensorcomm", description="tensorcomm: collective communication for Python.")
    parser.add_argument("--version", action="version", version=f"tensorcomm {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, subcommand in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=subcommand.HELP)
        subcommand.add_arguments(sub)
        sub.set_defaults(handler=subcommand.main, usage_error=sub.error)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``tensorcomm`` with ``argv`` (default ``sys.argv[1:]``); return the exit code.

    Usage errors print argparse's message and return 2 rather than raising ``SystemExit``, so
    callers (and the console script, which calls ``sys.exit(main())``) only handle an int.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.error("a command is required")
        try:
            code: int = args.handler(args)
            return code
        except LaunchConfigError as exc:
            args.usage_error(str(exc))  # prints the subcommand's usage, raises SystemExit(2)
            raise  # not reached
    except SystemExit as exc:  # from argparse (usage error, --help) or a handler's sys.exit()
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Ctrl-C before the ranks' signal handling is in place (e.g. while hosting the store).
        return 130
