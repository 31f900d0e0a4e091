"""Interleaved A/B: one benchmark command run over two source trees, in alternating rounds.

Usage: python benchmarks/ab.py A B [--rounds 6] [--env-a VAR=VALUE] [--env-b VAR=VALUE]
           [--record NAME] -- COMMAND [ARG ...]

A and B are source trees (a directory holding ``src/tensorcomm``: a checkout, a worktree) or git
revisions (``main``, a commit), which are checked out with ``git worktree add --detach`` in a
temporary directory and removed afterwards. Each round runs COMMAND once with A's tensorcomm and
once with B's (``PYTHONPATH=TREE/src``; the benchmark script itself is always this checkout's),
A first in odd rounds and B first in even ones, so that neither tree always runs right after
the other (an even number of rounds gives each as many firsts). The order effect line says how
much going first moved the figures. On the project's 2-core VM an A/A run of 1-4 MiB broadcast
and all_gather (``. . --env-b SAME_TREE=1 --rounds 8``) gave 0.74-0.91 with A always first and,
alternating, 0.85-1.03 with an order effect of 0.99 (``results/ab_order_effect.txt``): single jobs
there differ so much that an A/B of 8 rounds resolves differences of about 15 %, not 5 %.
``{json}`` in an argument stands for the file the command writes its figures to: the ``--json``
of ``tensorcomm bench`` (each row's median time in µs, named "collective size library") or of
this directory's scripts (an object of figure name -> number). A machine whose speed drifts
affects both trees alike: compare the A/B column, not tables of different runs; a peer's rows
(the same code in both trees) show how far the machine drifted. E.g.::

    python benchmarks/ab.py main . -- python -m tensorcomm bench all_reduce -n 2 -b 8 -e 1M -f 8 \\
        --compare mpi --json {json}
    python benchmarks/ab.py main . --rounds 8 -- python benchmarks/small_calls.py --json {json}

``--env-a`` / ``--env-b`` (repeatable) set variables for one side's runs only, so one tree can
be compared with itself under two settings (``. . --env-b TENSORCOMM_KEEP_GOING=1``).

Printed per figure: the median over the rounds for A and for B and A / B (above 1: B's figure is
smaller), the order effect (the first run's figure over the second's, median over figures and
rounds), and the load average before each run. ``--record NAME`` also keeps that table as
``benchmarks/results/NAME.txt`` with record.py's header.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from record import RESULTS, footer, header, split_command  # same directory

from tensorcomm.bench import report


def checkout(spec: str, cleanup: contextlib.ExitStack) -> str:
    """The source tree ``spec`` names: a directory as it is, a git revision checked out for the run."""
    if os.path.isdir(os.path.join(spec, "src", "tensorcomm")):
        return os.path.abspath(spec)
    path = tempfile.mkdtemp(prefix="tensorcomm-ab-")
    subprocess.run(["git", "worktree", "add", "--detach", "--quiet", path, spec], check=True)
    cleanup.callback(subprocess.run, ["git", "worktree", "remove", "--force", path], check=False)
    return path


def figures(document: Any) -> dict[str, float]:
    """The named numbers of one run's JSON: bench's rows' times, or the object itself."""
    if isinstance(document, dict) and "rows" in document and "options" in document:
        return {f"{r['collective']} {r['size']} {r['library']}": r["time_us"]
                for r in document["rows"] if r["time_us"] is not None}
    return {str(name): float(value) for name, value in document.items()}


def run_once(command: list[str], tree: str, path: str,
             settings: dict[str, str] | None = None) -> dict[str, float]:
    """Run ``command`` with ``tree``'s tensorcomm (and the variables ``settings``); the figures
    it wrote to ``path``."""
    env = dict(os.environ, PYTHONPATH=os.path.join(tree, "src"), **(settings or {}))
    subprocess.run([arg.replace("{json}", path) for arg in command], env=env, check=True)
    with open(path, encoding="utf-8") as file:
        return figures(json.load(file))


def table(names: tuple[str, str], found: dict[str, list[dict[str, float]]]) -> list[str]:
    """Median per figure and tree, and A / B, for the figures both trees have."""
    a, b = found.values()
    keys = [k for k in a[0] if k in b[0]]
    width = max([len(k) for k in keys] + [6])
    lines = [f"{'figure':<{width}} {names[0][-18:]:>18} {names[1][-18:]:>18} {'A/B':>6}"]
    for key in keys:
        med_a = statistics.median(run[key] for run in a)
        med_b = statistics.median(run[key] for run in b)
        ratio = f"{med_a / med_b:6.2f}" if med_b else f"{'-':>6}"
        lines.append(f"{key:<{width}} {med_a:18.2f} {med_b:18.2f} {ratio}")
    return lines


def order_effect(found: dict[str, list[dict[str, float]]]) -> str:
    """The median, over the figures both trees have and the rounds, of the figure of the run that
    went first in its round over the one that went second: how much going first moved a figure
    (1.00: not at all)."""
    a, b = found.values()
    ratios = [(x[k] / y[k] if i % 2 == 0 else y[k] / x[k])
              for i, (x, y) in enumerate(zip(a, b, strict=True)) for k in x
              if k in y and x[k] > 0 and y[k] > 0]
    if not ratios:
        return "# order effect: no figures"
    return (f"# order effect: first run of a round / second, median over figures and rounds: "
            f"{statistics.median(ratios):.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     usage="%(prog)s A B [--rounds R] [--record NAME] -- COMMAND [ARG ...]")
    parser.add_argument("a", metavar="A", help="source tree or git revision")
    parser.add_argument("b", metavar="B", help="source tree or git revision")
    parser.add_argument("--rounds", type=int, default=6,
                        help="runs per tree; even, so each tree goes first as often")
    parser.add_argument("--record", metavar="NAME", help="also write benchmarks/results/NAME.txt")
    for side in "ab":
        parser.add_argument(f"--env-{side}", action="append", default=[], metavar="VAR=VALUE",
                            help=f"a variable for {side.upper()}'s runs only (repeatable)")
    options, command = split_command(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(options)
    if not any("{json}" in arg for arg in command):
        parser.error("the command must write its figures to {json}, e.g. ... --json {json}")
    settings = [dict(item.split("=", 1) for item in items) for items in (args.env_a, args.env_b)]
    names = (" ".join([args.a, *args.env_a]), " ".join([args.b, *args.env_b]))
    if names[0] == names[1]:
        parser.error("A and B are the same tree with the same settings")
    found: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    loads = []
    with contextlib.ExitStack() as cleanup:
        trees = {name: checkout(spec, cleanup) for name, spec in zip(names, (args.a, args.b), strict=True)}
        commits = "; ".join(f"{label} = {name}: {report.source_revision(os.path.join(tree, 'src'))}"
                            for label, (name, tree) in zip("AB", trees.items(), strict=True))
        lines = header(command, commits)
        work = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="tensorcomm-ab-json-"))
        sides = list(zip(trees.items(), settings, strict=True))
        for round_ in range(args.rounds):
            for (name, tree), env in sides if round_ % 2 == 0 else sides[::-1]:  # A B, B A, ...
                loads.append(f"# round {round_ + 1}, {name}: load {os.getloadavg()[0]:.2f}")
                print(loads[-1], flush=True)
                found[name].append(run_once(command, tree, os.path.join(work, "figures.json"), env))
    order = f"# {args.rounds} rounds, A first in odd rounds, B first in even ones; medians over the rounds"
    lines += [*loads, order, *table(names, found), order_effect(found), footer()]
    print("\n".join(lines))
    if args.record:
        os.makedirs(RESULTS, exist_ok=True)
        with open(os.path.join(RESULTS, args.record + ".txt"), "w", encoding="utf-8") as file:
            file.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
