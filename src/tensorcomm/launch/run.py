"""``tensorcomm run``: its options and what it does (the work is in ``spawner``).

``tensorcomm.cli`` builds the command line from this module's ``HELP``, ``add_arguments`` and
``main``, as it does for ``demo`` and ``bench``. Bad arguments raise
``launch.env.LaunchConfigError``; the command line then prints the usage and the message and
returns 2, as argparse does for its own errors.
"""

from __future__ import annotations

import argparse
import os
import sys

from tensorcomm.launch import env as launch_env
from tensorcomm.launch import spawner

HELP = "start N ranks of a script, module or program"
# One spelling of "ranks on this node" for run, demo and bench: ours, mpiexec's and torchrun's.
NPROCS_FLAGS = ("-n", "-np", "--nproc-per-node", "--nproc_per_node")


def add_nprocs_argument(parser: argparse.ArgumentParser, dest: str, text: str,
                        *also: str, default: int | None = None) -> None:
    """Add the ranks-per-node option under every spelling of ``NPROCS_FLAGS`` (and ``also``)."""
    parser.add_argument(*NPROCS_FLAGS, *also, dest=dest, type=int, metavar="N", default=default,
                        help=text)


def _local_ranks(text: str) -> frozenset[int]:
    """``--local-ranks-filter``'s value, e.g. ``0,2``."""
    try:
        ranks = frozenset(int(item) for item in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected local ranks separated by commas, such as 0,2; "
                                         f"got {text!r}") from None
    if any(rank < 0 for rank in ranks):
        raise argparse.ArgumentTypeError(f"expected non-negative local ranks, got {text!r}")
    return ranks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``tensorcomm run``'s options and arguments to ``parser``."""
    # Written out because argparse would show TARGET as optional (see the note at "target").
    parser.usage = ("%(prog)s [-h] [-n N] [--nnodes K] [--node-rank R] [--master HOST:PORT]\n"
                    "       [--master-addr HOST] [--master-port PORT] [--timeout S] [--keep-going]\n"
                    "       [--no-prefix] [--local-ranks-filter LIST] [--log-dir DIR]\n"
                    "       [-m | --no-python] TARGET [ARGS ...]")
    parser.description = (
        "Start N ranks of a Python script (or module, or any command) on this node, with "
        "RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and "
        "TENSORCOMM_SECRET set for each. Output lines are prefixed with '[rank N] ' (unless "
        "--no-prefix). When one "
        "rank fails, the others are stopped and its exit code is returned (unless --keep-going). "
        "Flags not given fall back to the TENSORCOMM_* variables named below (see docs/env.md).")
    add_nprocs_argument(parser, "nprocs", f"ranks to start on this node (env "
                                          f"{launch_env.ENV_NPROCS}; default 1)")
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
    parser.add_argument("--master-addr", "--master_addr", metavar="HOST",
                        help="the host part of --master, as torchrun's (env MASTER_ADDR)")
    parser.add_argument("--master-port", "--master_port", type=int, metavar="PORT",
                        help="the port part of --master (env MASTER_PORT; default a free one)")
    parser.add_argument("--timeout", type=float, metavar="S",
                        help=f"stop the job after S seconds and exit 124 "
                             f"(env {launch_env.ENV_JOB_TIMEOUT}; default none)")
    parser.add_argument("--keep-going", action="store_true",
                        help="a rank that fails does not stop the others (for jobs whose "
                             "survivors go on: Group.shrink, docs/elastic.md), and the ranks' "
                             "failed calls leave in-place arrays untouched or complete "
                             "(TENSORCOMM_KEEP_GOING=1); the job succeeds if any rank succeeds")
    parser.add_argument("--no-prefix", dest="prefix", action="store_false",
                        help="relay the ranks' lines as they are, without '[rank N] '")
    parser.add_argument("--local-ranks-filter", "--local_ranks_filter", type=_local_ranks,
                        metavar="LIST", help="show only these local ranks' output, e.g. 0 or 0,2 "
                                             "(the others' still goes to --log-dir)")
    parser.add_argument("--log-dir", metavar="DIR",
                        help="also write each rank's output to DIR/rank<N>.stdout and "
                             "DIR/rank<N>.stderr (N: its global rank)")
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


def main(args: argparse.Namespace) -> int:
    """Run ``tensorcomm run`` with its parsed arguments; return the job's exit code."""
    if args.target is None:
        raise launch_env.LaunchConfigError(
            "TARGET is required: a script, a module (-m) or a program (--no-python)")
    settings = launch_env.resolve_settings(
        os.environ, nprocs=args.nprocs, nnodes=args.nnodes, node_rank=args.node_rank,
        master=args.master, master_addr=args.master_addr, master_port=args.master_port,
        timeout=args.timeout)
    shown = None
    if args.local_ranks_filter is not None:
        beyond = sorted(r for r in args.local_ranks_filter if r >= settings.nprocs)
        if beyond:
            raise launch_env.LaunchConfigError(
                f"--local-ranks-filter: local ranks are 0..{settings.nprocs - 1}, got {beyond}")
        shown = frozenset(launch_env.global_rank(settings, r) for r in args.local_ranks_filter)
    output = spawner.Output(prefix=args.prefix, shown=shown, log_dir=args.log_dir)
    return spawner.launch(settings, rank_command(args), keep_going=args.keep_going, output=output)
