"""``tensorcomm trace merge DIR`` and ``tensorcomm trace analyze DIR`` (docs/tracing.md)."""

from __future__ import annotations

import argparse
import sys

from .analyze import analyze
from .merge import merge

HELP = "merge the ranks' timelines into one; analyze the ranks' flight records"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``trace`` subcommand's own subcommands."""
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    merging = actions.add_parser("merge", help="one Perfetto/Chrome trace from the rank<R>.trace.json "
                                 "files TENSORCOMM_TRACE wrote, on rank 0's clock")
    merging.add_argument("directory")
    merging.add_argument("-o", "--output", help="where to write it (default DIRECTORY/merged.trace.json)")
    analysing = actions.add_parser("analyze", help="say which rank stopped where, and which call "
                                   "diverged, from the rank<R>.json flight records")
    analysing.add_argument("directory", help="where the records are (TENSORCOMM_FLIGHT_DIR)")


def main(args: argparse.Namespace) -> int:
    """Run ``trace merge`` or ``trace analyze``; 1 when the directory holds nothing readable."""
    try:
        if args.action == "merge":
            path, offsets = merge(args.directory, args.output)
            shown = ", ".join(f"rank {rank} {offset:+.1f} us" for rank, offset in offsets.items())
            print(f"wrote {path} ({len(offsets)} ranks; clock offsets {shown})")
        else:
            print(analyze(args.directory))
    except (OSError, ValueError) as exc:
        print(f"tensorcomm trace {args.action}: {exc}", file=sys.stderr)
        return 1
    return 0
