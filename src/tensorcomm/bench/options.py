"""``tensorcomm bench`` options: the flags, their checks, and the sweep of message sizes.

Flag names follow nccl-tests (``-b -e -f -i -d -o -c -w -n``; here ``-n`` is the rank count, as in
``tensorcomm run``, and ``--iters`` the timed calls). Sizes accept K, M, G suffixes in powers of
1024 (``256M`` = 256 MiB), with an optional ``B``/``iB``. Pure: no I/O, no processes.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..launch import run as launch_run
from ..launch.env import LaunchConfigError
from . import check, peers
from .formulas import COLLECTIVES
from .timing import Plan

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]?)(i?b)?\s*$", re.IGNORECASE)
DEFAULT_COLLECTIVES = ("all_reduce",)
DEFAULT_BUDGET = 0.2  # seconds of timed calls per size and library
DEFAULT_TIMEOUT = 300.0  # seconds per size and library before a peer job counts as hung
BARRIERS = ("batch", "each")  # --barrier: how calls are timed


@dataclass(frozen=True)
class BenchOptions:
    """Everything ``tensorcomm bench`` was asked to do, checked."""

    collectives: tuple[str, ...]
    ranks: int | None  # None: run in this process, under an existing launcher
    sizes: tuple[int, ...]  # bytes, ascending
    dtype: str
    op: str
    check: bool
    iters: int | None
    warmup: int | None
    budget: float
    compare: tuple[str, ...]
    rounds: int
    timeout: float
    csv: str | None
    json: str | None
    plot: str | None
    compare_all: bool = False  # --compare all: the libraries missing here are skipped, not refused
    shared: bool = False  # --shared-arrays: tensorcomm's buffers are tensorcomm.zeros arrays
    barrier: str = "batch"  # --barrier: "batch" (calls back to back) or "each" (one at a time)

    def plan(self) -> Plan:
        """How each size is timed (the same on every rank and library)."""
        return Plan(budget=self.budget, warmup=self.warmup, iters=self.iters, check=self.check,
                    each=self.barrier == "each")


def parse_size(text: str) -> int:
    """Bytes in ``text`` such as ``8``, ``64K``, ``256M``, ``1GiB``.

    Raises:
        LaunchConfigError: not a size.
    """
    match = _SIZE.match(text)
    if match is None:
        raise LaunchConfigError(f"expected a size such as 8, 64K, 256M or 1G, got {text!r}")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def size_sweep(minbytes: int, maxbytes: int, factor: float | None = None,
               step: int | None = None) -> tuple[int, ...]:
    """``minbytes``, then times ``factor`` (or plus ``step``), up to ``maxbytes`` inclusive.

    As nccl-tests: a factor wins over a step; with neither, the factor is 2.

    Raises:
        LaunchConfigError: an empty range, a factor not above 1 or a step below 1.
    """
    if minbytes < 1 or maxbytes < minbytes:
        raise LaunchConfigError(f"-b/-e: expected 1 <= min <= max, got {minbytes} and {maxbytes}")
    if factor is not None and factor <= 1:
        raise LaunchConfigError(f"-f: expected a factor above 1, got {factor:g}")
    if step is not None and step < 1:
        raise LaunchConfigError(f"-i: expected a step of at least 1 byte, got {step}")
    sizes, size = [], minbytes
    while size <= maxbytes:
        sizes.append(size)
        # max(): a factor such as 1.1 must still move a small size on.
        size = size + step if factor is None and step is not None else \
            max(size + 1, int(size * (factor or 2)))
    return tuple(sizes)


def _names(text: str, known: Mapping[str, object], flag: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise LaunchConfigError(f"{flag}: unknown {', '.join(unknown)}; "
                                f"expected some of {', '.join(known)}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``tensorcomm bench`` flags to ``parser``."""
    parser.description = (
        "Time collectives nccl-tests style: per size, the median time per call (with min and "
        "max across batches), algbw, busbw and the number of wrong result elements. With -n it "
        "starts the ranks itself; without -n under a launcher tensorcomm.init() reads "
        "(tensorcomm run, mpirun) it runs in that job's ranks. --compare runs other libraries on "
        "the same sizes, interleaved.")
    parser.add_argument("collectives", nargs="*", metavar="COLLECTIVE",
                        help=f"what to time (default all_reduce): {', '.join(COLLECTIVES)}, "
                             "or all")
    launch_run.add_nprocs_argument(parser, "ranks", "local ranks to start (default 2; omit under an "
                                   "existing launcher to run in its ranks)", "--ranks")
    parser.add_argument("-b", "--minbytes", default="8", metavar="SIZE",
                        help="smallest size, e.g. 8, 64K, 1M (default 8)")
    parser.add_argument("-e", "--maxbytes", default="64M", metavar="SIZE",
                        help="largest size (default 64M)")
    parser.add_argument("-f", "--stepfactor", type=float, metavar="F",
                        help="multiply the size by F (default 2)")
    parser.add_argument("-i", "--stepbytes", metavar="SIZE", help="or add SIZE per step")
    parser.add_argument("-d", "--dtype", default="float32", choices=sorted(check.DTYPES),
                        metavar="DTYPE", help=f"{', '.join(check.DTYPES)} (default float32)")
    parser.add_argument("-o", "--op", default="sum", choices=check.OPS, metavar="OP",
                        help=f"{', '.join(check.OPS)} (default sum)")
    parser.add_argument("-c", "--check", type=int, choices=(0, 1), default=1,
                        help="count wrong result elements against numpy (default 1)")
    parser.add_argument("--iters", type=int, metavar="N", help="timed calls per size (default: what fits "
                        "the time budget)")
    parser.add_argument("-w", "--warmup", type=int, metavar="N", help="warm-up calls per size (default: a "
                        "fifth of the time budget)")
    parser.add_argument("--time-budget", type=float, default=DEFAULT_BUDGET, metavar="S",
                        help=f"seconds of timed calls per size and library "
                             f"(default {DEFAULT_BUDGET:g})")
    parser.add_argument("--compare", default="", metavar="LIBS",
                        help="also run these, interleaved with tensorcomm: "
                             f"{','.join(p for p in peers.PEERS if p != 'tensorcomm')} or all")
    parser.add_argument("--shared-arrays", action="store_true",
                        help="tensorcomm's buffers are shared arrays (tensorcomm.zeros, on a group "
                             "made for each size); the other libraries keep plain arrays")
    parser.add_argument("--barrier", choices=BARRIERS, default="batch",
                        help="batch (default): time calls back to back, in batches after a barrier "
                             "(nccl-tests); each: a barrier before each timed call, which is timed "
                             "alone (OSU), as programs that compute between calls make them")
    parser.add_argument("--rounds", type=int, default=1, metavar="R",
                        help="measure every size R times per library, alternating the order")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                        help="give up on a library after S seconds on one size "
                             f"(default {DEFAULT_TIMEOUT:g})")
    parser.add_argument("--csv", metavar="FILE", help="also write the rows as CSV")
    parser.add_argument("--json", metavar="FILE", help="also write machine, rows, ratios as JSON")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="busbw and time against size, log-log (needs matplotlib)")


def _positive(value: float | None, flag: str, allow_zero: bool = False) -> None:
    if value is not None and not (value >= 0 if allow_zero else value > 0):
        raise LaunchConfigError(f"{flag}: expected a {'non-negative' if allow_zero else 'positive'}"
                                f" number, got {value:g}")


def from_args(args: argparse.Namespace) -> BenchOptions:
    """Check the parsed flags and build the options.

    Raises:
        LaunchConfigError: a bad value; the message names the flag.
    """
    wanted = [c.lower() for c in args.collectives] or list(DEFAULT_COLLECTIVES)
    collectives = tuple(COLLECTIVES) if "all" in wanted else _names(
        ",".join(wanted), COLLECTIVES, "COLLECTIVE")
    others = {p: info for p, info in peers.PEERS.items() if p != "tensorcomm"}
    compare_text = args.compare.strip().lower()
    compare = tuple(others) if compare_text == "all" else _names(compare_text, others, "--compare")
    for value, flag in ((args.ranks, "-n"), (args.iters, "--iters"), (args.rounds, "--rounds"),
                        (args.time_budget, "--time-budget"), (args.timeout, "--timeout")):
        _positive(value, flag)
    _positive(args.warmup, "--warmup", allow_zero=True)
    step = parse_size(args.stepbytes) if args.stepbytes is not None else None
    sizes = size_sweep(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor, step)
    return BenchOptions(
        collectives=collectives, ranks=args.ranks, sizes=sizes, dtype=args.dtype, op=args.op,
        check=bool(args.check), iters=args.iters, warmup=args.warmup, budget=args.time_budget,
        compare=compare, rounds=args.rounds, timeout=args.timeout, csv=args.csv, json=args.json,
        plot=args.plot, compare_all=compare_text == "all", shared=args.shared_arrays,
        barrier=args.barrier)
