"""Run a benchmark command and keep its output as a recorded result, headed by what it ran on.

Usage: python benchmarks/record.py NAME [--dir DIR] -- COMMAND [ARG ...]

Runs COMMAND, prints its output as it comes, and writes ``DIR/NAME.txt`` (DIR: ``$OUT``, else
``benchmarks/results``): the header (the command, the commit tensorcomm runs from, the machine,
the load average, the date, every ``TENSORCOMM_*`` setting), the output, then the load after.
``{out}`` in an argument stands for ``DIR/NAME``, so a command's own files land beside it::

    python benchmarks/record.py allreduce_vs_peers -- tensorcomm bench all_reduce -n 2 \\
        --compare gloo,mpi --json {out}.json

Exits with COMMAND's status; the file is written whatever the status (a failure is a result too).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Sequence

import numpy as np

from tensorcomm.bench import report

RESULTS = os.path.join("benchmarks", "results")


def header(command: Sequence[str], commit: str) -> list[str]:
    """The lines that head a recorded result: command, commit, machine, load, date, settings."""
    machine = report.machine_info(os.environ, {})
    settings = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("TENSORCOMM_"))
    return [
        f"# command: {shlex.join(command)}",
        f"# commit: {commit}",
        f"{report.machine_line(machine)}; Python {platform.python_version()}, numpy {np.__version__}",
        *report.load_lines(machine),
        f"# date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
        f"# settings: {settings or 'no TENSORCOMM_* variable set'}",
    ]


def footer() -> str:
    """The line that closes a recorded result: the load once the command is done."""
    one, five, fifteen = os.getloadavg()
    return f"# load after: {one:.2f} (1 min), {five:.2f} (5 min), {fifteen:.2f} (15 min)"


def this_commit() -> str:
    """The commit tensorcomm runs from here, and where it was imported from."""
    import tensorcomm

    where = os.path.dirname(os.path.dirname(os.path.abspath(tensorcomm.__file__)))
    return f"{report.source_revision() or 'not a git checkout'} (tensorcomm from {where})"


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """``argv`` split at its first ``--``: this script's options, and the command to run."""
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


def record(name: str, command: list[str], directory: str) -> int:
    """Run ``command`` and write ``directory/name.txt``; its exit status."""
    out = os.path.join(directory, name)
    command = [arg.replace("{out}", out) for arg in command]
    os.makedirs(directory, exist_ok=True)
    lines = header(command, this_commit())
    print("\n".join(lines), flush=True)
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as run:
        assert run.stdout is not None
        for line in run.stdout:
            print(line, end="", flush=True)
            lines.append(line.rstrip("\n"))
    lines.append(footer())
    print(lines[-1])
    with open(out + ".txt", "w", encoding="utf-8") as file:
        file.write("\n".join(lines) + "\n")
    return run.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     usage="%(prog)s NAME [--dir DIR] -- COMMAND [ARG ...]")
    parser.add_argument("name", help="the result's name: what it measures (results/NAME.txt)")
    parser.add_argument("--dir", default=os.environ.get("OUT", RESULTS), help="where it goes")
    options, command = split_command(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(options)
    if not command:
        parser.error("no command given: record.py NAME -- COMMAND [ARG ...]")
    return record(args.name, command, args.dir)


if __name__ == "__main__":
    sys.exit(main())
