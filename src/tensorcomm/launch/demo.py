"""``tensorcomm demo``: start N local ranks of ``tensorcomm.demo`` on the embedded default.

No server, MPI or configuration: the launcher hosts the store on loopback, as ``tensorcomm run``
does. Kept apart from the demo body so ``launch`` imports no core module.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import env as launch_env
from . import run as launch_run
from . import spawner

HELP = "run every collective on N local ranks and check it against numpy"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``tensorcomm demo``'s options to ``parser``."""
    launch_run.add_nprocs_argument(parser, "nprocs", "number of local ranks (default 4)", "--nprocs",
                                   default=4)
    parser.add_argument("--sizes", type=int, nargs="+", help="float32 element counts per collective")
    parser.add_argument("--iterations", type=int, help="timed calls per row")


def main(args: argparse.Namespace) -> int:
    """Run ``tensorcomm demo`` with its parsed arguments; return the job's exit code."""
    settings = launch_env.resolve_settings(os.environ, nprocs=args.nprocs, nnodes=1, node_rank=0)
    command = [sys.executable, "-m", "tensorcomm.demo"]
    if args.sizes:
        command += ["--sizes", *map(str, args.sizes)]
    if args.iterations:
        command += ["--iterations", str(args.iterations)]
    return spawner.launch(settings, command)
