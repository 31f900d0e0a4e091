"""The ``tensorcomm`` command line: argument parsing only; the work is in ``spawner``.

Subcommands live in a small registry so other parts of tensorcomm can add theirs without editing
this file. ``run`` is registered here. Every module named in ``PLUGIN_MODULES`` is imported when
the parser is built and must expose ``register(register_subcommand)``, for example::

    # tensorcomm/launch/demo.py
    def register(register_subcommand):
        register_subcommand("demo", "run the demo", _add_arguments, _main)

A plugin module that does not exist (yet) is skipped; any other import error is raised. A handler
reports bad arguments by raising ``launch.env.LaunchConfigError``: ``main`` then prints the
subcommand's usage and the message and returns 2, as argparse does for its own errors.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from tensorcomm.launch import env as launch_env
from tensorcomm.launch import spawner

AddArguments = Callable[[argparse.ArgumentParser], None]
Handler = Callable[[argparse.Namespace], int]

# name -> (one-line help, adds the subcommand's arguments to its parser, runs it -> exit code)
SUBCOMMANDS: dict[str, tuple[str, AddArguments, Handler]] = {}

# Modules that register further subcommands (`demo`, `bench`); imported lazily, in this order.
PLUGIN_MODULES = ("tensorcomm.launch.demo", "tensorcomm.bench.cli")

USAGE_EXIT_CODE = 2  # as argparse


def register_subcommand(name: str, help: str, add_arguments: AddArguments,
                        handler: Handler) -> None:
    """Add ``tensorcomm <name>``; registering the same name and handler again is a no-op.

    Args:
        name: the subcommand word.
        help: one line for ``tensorcomm --help``.
        add_arguments: adds the subcommand's options to the ``ArgumentParser`` it is given.
        handler: runs the subcommand from the parsed arguments and returns its exit code.

    Raises:
        ValueError: ``name`` is already registered with a different handler.
    """
    existing = SUBCOMMANDS.get(name)
    if existing is not None and existing[2] is not handler:
        raise ValueError(f"subcommand {name!r} is already registered by "
                         f"{existing[2].__module__}.{existing[2].__qualname__}")
    SUBCOMMANDS[name] = (help, add_arguments, handler)


def _load_plugins() -> None:
    for module_name in PLUGIN_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # Only "this module (or its package) does not exist" is expected; a missing
            # dependency *inside* an existing plugin is a real error.
            if exc.name is not None and (module_name == exc.name
                                         or module_name.startswith(exc.name + ".")):
                continue
            raise
        module.register(register_subcommand)


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    # Written out because argparse would show TARGET as optional (see the note at "target").
    parser.usage = ("%(prog)s [-h] [-n N] [--nnodes K] [--node-rank R] [--master HOST:PORT]\n"
                    "       [--timeout S] [--keep-going] [-m | --no-python] TARGET [ARGS ...]")
    parser.description = (
        "Start N ranks of a Python script (or module, or any command) on this node, with "
        "RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and "
        "TENSORCOMM_SECRET set for each. Output lines are prefixed with '[rank N] '. When one "
        "rank fails, the others are stopped and its exit code is returned (unless --keep-going). "
        "Flags not given fall back to the TENSORCOMM_* variables named below (see docs/env.md).")
    parser.add_argument("-n", "--nproc-per-node", dest="nprocs", type=int, metavar="N",
                        help=f"ranks to start on this node (env {launch_env.ENV_NPROCS}; "
                             "default 1)")
    parser.add_argument("--nnodes", type=int, metavar="K",
                        help=f"nodes in the job, one launcher each (env {launch_env.ENV_NNODES}; "
                             "default 1)")
    parser.add_argument("--node-rank", type=int, metavar="R",
                        help=f"this node's index 0..K-1 (env {launch_env.ENV_NODE_RANK}; "
                             "default 0)")
    parser.add_argument("--master", metavar="HOST:PORT",
                        help=f"where node 0 hosts the store (env {launch_env.ENV_MASTER}); "
                             "required with --nnodes > 1; default on one node: 127.0.0.1, "
                             "a free port")
    parser.add_argument("--timeout", type=float, metavar="S",
                        help=f"stop the job after S seconds and exit 124 "
                             f"(env {launch_env.ENV_JOB_TIMEOUT}; default none)")
    parser.add_argument("--keep-going", action="store_true",
                        help="a rank that fails does not stop the others (for jobs whose "
                             "survivors go on: Group.shrink, docs/elastic.md); the job succeeds "
                             "if any rank succeeds")
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("-m", "--module", action="store_true",
                      help="TARGET is a module, run as python -m TARGET")
    kind.add_argument("--no-python", action="store_true",
                      help="TARGET is a program, run as is (not with this Python)")
    # Optional for argparse only: a required TARGET followed by REMAINDER makes argparse report
    # "required: TARGET, ARGS" although ARGS may be empty; _run reports a missing TARGET itself.
    parser.add_argument("target", metavar="TARGET", nargs="?",
                        help="script.py, module or program")
    parser.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="passed to every rank")


def rank_command(args: argparse.Namespace) -> list[str]:
    """The command line every rank of ``tensorcomm run`` runs, from its parsed arguments.

    Python targets run with the launcher's own interpreter (``sys.executable``), so ranks see the
    same installed packages as the launcher.
    """
    if args.no_python:
        return [args.target, *args.args]
    if args.module:
        return [sys.executable, "-m", args.target, *args.args]
    return [sys.executable, args.target, *args.args]


def _run(args: argparse.Namespace) -> int:
    if args.target is None:
        raise launch_env.LaunchConfigError(
            "TARGET is required: a script, a module (-m) or a program (--no-python)")
    settings = launch_env.resolve_settings(
        os.environ, nprocs=args.nprocs, nnodes=args.nnodes, node_rank=args.node_rank,
        master=args.master, timeout=args.timeout)
    return spawner.launch(settings, rank_command(args), keep_going=args.keep_going)


register_subcommand("run", "start N ranks of a script, module or program", _add_run_arguments,
                    _run)


def build_parser() -> argparse.ArgumentParser:
    """The ``tensorcomm`` parser with every registered subcommand (plugins loaded first)."""
    _load_plugins()
    parser = argparse.ArgumentParser(
        prog="tensorcomm", description="tensorcomm: collective communication for Python.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, add_arguments, handler) in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=help_text)
        add_arguments(sub)
        sub.set_defaults(handler=handler, usage_error=sub.error)
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
        handler: Handler = args.handler
        try:
            return handler(args)
        except launch_env.LaunchConfigError as exc:
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
