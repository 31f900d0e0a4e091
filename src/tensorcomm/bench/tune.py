"""``tensorcomm tune``: time the algorithm rows on this host and write the tuning file.

For each transport (``shm``: the group's shared-memory domain; ``tcp``: sockets on loopback),
member count and collective that has more than one row there, every row runs as its own
``tensorcomm`` bench job, forced through ``TENSORCOMM_ALGORITHMS``, and ``runner.sweep`` times
them side by side, size by size (a row is timed only at sizes it can run: ``select.fits``). The
file's rows (``algorithms/tuning.py``), which selection uses from then on, are the fewest size
bands whose row is within ``WITHIN`` of the fastest at every measured size (``winners``), so
that noise between near-equal rows does not make the choice flicker.

``--check`` writes nothing: it times the rows again, with one more job that selects as a user's
job does (from the file), and reports at each size the row the file chooses against the fastest
forced row of the same run; it fails where the chosen row is more than ``CHECK_WITHIN`` slower,
or where the selecting job ran another row than the chosen one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, cast

from .. import __version__, config
from ..algorithms import select, tuning
from ..algorithms.base import Team
from ..launch.env import LaunchConfigError
from ..rendezvous import private
from ..transports.shm import cma
from ..transports.shm.domain import SLOT_BYTES
from . import check, runner
from .control import JobFailed
from .formulas import COLLECTIVES
from .options import BenchOptions, parse_size, size_sweep
from .peers.base import Task
from .results import Row

HELP = "measure the algorithms on this host and write the tuning file selection uses"
DTYPE, OP = "float32", "sum"
ITEMSIZE = check.DTYPES[DTYPE].itemsize
WITHIN = 1.05  # a band's row is at most this much slower than the fastest at each size
CHECK_WITHIN = 1.10  # --check: the chosen row at most this much slower than the best
AUTO = "(selected)"  # --check's job that selects as users' jobs do
DEFAULT_TIMEOUT = 120.0


class _Slots:
    """What the predicates read of a shared-memory domain (``select._shm_direct``,
    ``select._can_read``): CMA is taken to work where libc offers it (the jobs tune runs find
    out for sure)."""

    def __init__(self, size: int) -> None:
        self.size, self.slot_bytes, self.cma, self.shared = size, SLOT_BYTES, cma.available(), False


class _Links:
    """What the predicates read of a transport (``select._pair``): a tuned job's TCP sends
    arrays as they are."""

    wire_dtype = None


def model_team(members: int, transport: str) -> Team:
    """A group of ``members`` on this host over ``transport``, as selection sees it (no links)."""
    return Team(cast(Any, _Links()), tuple(range(members)), 0, 0, 1.0, ("",) * members,
                shm=_Slots(members) if transport == "shm" else None)


def candidates(collective: str, transport: str) -> list[str]:
    """The rows of ``collective`` that can run over ``transport`` on one host."""
    return [name for name in select.names(collective) if name != "hierarchical"
            and name.startswith("shm_") == (transport == "shm")]


def winners(measured: Mapping[int, Mapping[str, float]]) -> tuning.Rows:
    """The file's rows from ``{nbytes: {row: µs}}``: the fewest size bands such that at every
    measured size its band's row is within ``WITHIN`` of the fastest there (greedy from the
    smallest size: each band takes the row that stays good longest, the faster on a tie)."""
    sizes = [size for size in sorted(measured) if measured[size]]

    def good(name: str, size: int) -> bool:
        times = measured[size]
        return name in times and times[name] <= WITHIN * min(times.values())

    def reach(name: str, start: int) -> int:
        end = start
        while end < len(sizes) and good(name, sizes[end]):
            end += 1
        return end

    rows: list[tuple[int | None, str]] = []  # the last ends at the largest size measured
    start = 0
    while start < len(sizes):
        times = measured[sizes[start]]
        name = max((n for n in times if good(n, sizes[start])),
                   key=lambda n: (reach(n, start), -times[n]))
        start = reach(name, start)
        rows.append((sizes[start - 1], name))
    return tuple(rows)


def default_counts(cores: int) -> list[int]:
    """Every count from 2 to ``cores`` up to 8 cores; beyond, the powers of two and ``cores``
    (selection takes the nearest tuned count for the others)."""
    cores = max(2, cores)
    if cores <= 8:
        return list(range(2, cores + 1))
    return sorted({1 << k for k in range(1, cores.bit_length()) if 1 << k <= cores} | {cores})


def _ranks(text: str | None) -> list[int]:
    if text is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return default_counts(cores or 2)
    out: list[int] = []
    for item in text.split(","):
        low, sep, high = item.strip().partition("-")
        try:
            out += range(int(low), int(high) + 1) if sep else [int(low)]
        except ValueError:
            raise LaunchConfigError(f"-n: expected counts such as 2,4 or 2-8, got {text!r}") from None
    if not out or min(out) < 2:
        raise LaunchConfigError(f"-n: expected member counts of at least 2, got {text!r}")
    return sorted(set(out))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``tensorcomm tune`` flags to ``parser``."""
    parser.description = (
        "Time every algorithm of each collective on this host (shared memory and TCP, at each "
        "member count) and write the tuning file that selection reads from then on "
        "(docs/tuning.md). --check times them again and compares the file's choices.")
    parser.add_argument("collectives", nargs="*", metavar="COLLECTIVE",
                        help="what to tune (default: every collective with a choice)")
    parser.add_argument("-n", "--ranks", metavar="COUNTS",
                        help="member counts, e.g. 2,4 or 2-8 (default 2 up to this process's cores: "
                             "all up to 8, then powers of two and the core count)")
    parser.add_argument("-b", "--minbytes", default="1K", metavar="SIZE", help="smallest size (default 1K)")
    parser.add_argument("-e", "--maxbytes", default="16M", metavar="SIZE", help="largest size (default 16M)")
    parser.add_argument("-f", "--stepfactor", type=float, default=4.0, metavar="F",
                        help="multiply the size by F (default 4)")
    parser.add_argument("--transport", default=",".join(tuning.TRANSPORTS), metavar="LIST",
                        help="shm, tcp or both (default shm,tcp)")
    parser.add_argument("--iters", type=int, metavar="N", help="timed calls per size and row")
    parser.add_argument("-w", "--warmup", type=int, metavar="N", help="warm-up calls per size and row")
    parser.add_argument("--time-budget", type=float, default=0.05, metavar="S",
                        help="seconds of timed calls per size, row and round (default 0.05)")
    parser.add_argument("--rounds", type=int, default=3, metavar="R",
                        help="time every size R times per row, alternating the order (default 3)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                        help=f"give up on a job after S seconds on one size (default {DEFAULT_TIMEOUT:g})")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="the tuning file (default: the one selection reads, docs/tuning.md)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; compare the file's choice at each size with the "
                             f"fastest row, failing beyond {CHECK_WITHIN:g}x")


def _options(args: argparse.Namespace, collective: str, members: int) -> BenchOptions:
    sizes = size_sweep(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor)
    return BenchOptions(
        collectives=(collective,), ranks=members, sizes=sizes, dtype=DTYPE, op=OP, check=False,
        iters=args.iters, warmup=args.warmup, budget=args.time_budget, compare=(),
        rounds=args.rounds, timeout=args.timeout, csv=None, json=None, plot=None)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _measure(args: argparse.Namespace, transport: str, collective: str, members: int,
             names: Sequence[str], path: str | None) -> tuple[dict[int, dict[str, float]], dict[int, str]]:
    """``{nbytes: {row: µs}}`` of every row in ``names`` (and ``AUTO`` when ``path``), interleaved,
    and ``{nbytes: the algorithm AUTO's ranks ran}``."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env[config.ENV_TRANSPORT] = "auto" if transport == "shm" else "tcp"
    env[config.ENV_TUNING_FILE] = tuning.OFF
    env.pop(config.ENV_ALGORITHMS, None)
    envs = {name: {**env, config.ENV_ALGORITHMS: f"{collective}={name}"} for name in names}
    if path is not None:  # the file's choice, as a job makes it before it learns from its calls
        envs[AUTO] = {**env, config.ENV_TUNING_FILE: path, config.ENV_LEARN: "off"}
    options = _options(args, collective, members)
    team = model_team(members, transport)
    jobs = {name: runner.PeerJob("tensorcomm", members, job_env, args.timeout)
            for name, job_env in envs.items()}
    try:
        for job in jobs.values():
            job.ready()

        def run_of(name: str, job: runner.PeerJob) -> runner.Run:
            def run(task: Task) -> dict[str, Any]:
                if name != AUTO and not select.fits(collective, name, team, task.count * ITEMSIZE):
                    return {"unsupported": "does not fit"}
                return job.run(task, options.plan())
            return run

        runs = {name: run_of(name, job) for name, job in jobs.items()}
        rows: list[Row] = runner.sweep(options, members, runs, _say, lambda step: None,
                                       lambda size_rows: None)
    finally:
        for job in jobs.values():
            job.stop()
    measured: dict[int, dict[str, float]] = {}
    for row in rows:
        times = measured.setdefault(row.size, {})
        if row.time_us is not None:
            times[row.library] = row.time_us
    ran = {row.size: row.algorithm.partition("/")[0] for row in rows if row.library == AUTO}
    return measured, ran


def _plan(args: argparse.Namespace) -> list[tuple[str, int, str, list[str]]]:
    """``(transport, members, collective, rows)`` for everything to time, the flags checked.

    Raises:
        LaunchConfigError: a bad flag; the message names it.
    """
    transports = [t.strip() for t in args.transport.split(",") if t.strip()]
    bad = [t for t in transports if t not in tuning.TRANSPORTS]
    if bad or not transports:
        raise LaunchConfigError(f"--transport: expected some of {', '.join(tuning.TRANSPORTS)}, "
                                f"got {args.transport!r}")
    timed = [c for c in select.collectives() if c in COLLECTIVES]  # those bench can time
    wanted = args.collectives or timed
    unknown = [c for c in wanted if c not in timed]
    if unknown:
        raise LaunchConfigError(f"COLLECTIVE: unknown {', '.join(unknown)}; expected some of "
                                f"{', '.join(timed)}")
    size_sweep(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor)  # checks them
    for value, flag in ((args.iters, "--iters"), (args.rounds, "--rounds"),
                        (args.time_budget, "--time-budget"), (args.timeout, "--timeout")):
        if value is not None and not value > 0:
            raise LaunchConfigError(f"{flag}: expected a positive number, got {value}")
    if args.warmup is not None and args.warmup < 0:
        raise LaunchConfigError(f"--warmup: expected a non-negative count, got {args.warmup}")
    return [(t, n, c, candidates(c, t)) for t in transports for n in _ranks(args.ranks)
            for c in wanted if len(candidates(c, t)) > 1]


def _existing(path: str) -> list[dict[str, Any]]:
    """The choices of a usable file at ``path`` (kept where this run does not measure)."""
    known = {c: select.names(c) for c in select.collectives()}
    try:
        data = tuning.read_json(path)
        tuning.parse(data, known)
        return list(data["choices"])
    except (FileNotFoundError, tuning.Ignored):
        return []


def _write(path: str, choices: list[dict[str, Any]], measured: list[dict[str, Any]]) -> None:
    """Replace the file at ``path`` (never following a link there; readers see the old file or
    the new one, never half of one), in a directory only this user may write in (made 0700 if
    missing; else a PermissionError says why)."""
    data = {"format": tuning.FORMAT, "tensorcomm": __version__, "host": tuning.fingerprint(),
            "choices": choices, "measured": measured}
    dir_fd = private.trusted_dir(os.path.dirname(os.path.abspath(path)), create=True,
                                 what="tuning file directory")
    try:
        private.write_replacing(dir_fd, os.path.basename(path),
                                json.dumps(data, indent=1).encode(), 0o644)
    finally:
        os.close(dir_fd)


def _tune(args: argparse.Namespace, path: str, work: list[tuple[str, int, str, list[str]]]) -> int:
    keys = {(t, c, n) for t, n, c, _ in work}
    choices = [e for e in _existing(path) if (e["transport"], e["collective"], e["members"]) not in keys]
    measured_out: list[dict[str, Any]] = []
    for transport, members, collective, names in work:
        _say(f"tune: {collective}, {members} members over {transport}: {', '.join(names)}")
        measured, _ = _measure(args, transport, collective, members, names, None)
        rows = winners(measured)
        if not rows:
            _say(f"tune: {collective}: nothing measured, left to the built-in thresholds")
            continue
        choices.append({"transport": transport, "collective": collective, "members": members,
                        "rows": [list(r) for r in rows]})
        measured_out.append({"transport": transport, "collective": collective, "members": members,
                             "times_us": {str(s): t for s, t in sorted(measured.items())}})
        print(f"{transport} {members} {collective}: " + ", ".join(
            f"{name} up to {bound} B" for bound, name in rows))
    _write(path, choices, measured_out)
    print(f"wrote {path}")
    return 0


def _check(args: argparse.Namespace, path: str, work: list[tuple[str, int, str, list[str]]]) -> int:
    known = {c: select.names(c) for c in select.collectives()}
    try:
        table = tuning.load(path, known)
    except (FileNotFoundError, tuning.Ignored) as exc:
        _say(f"tune --check: no usable tuning file at {path} ({exc}); run `tensorcomm tune` first")
        return 1
    failed = strays = 0
    print(f"{'transport':9} {'n':>2} {'collective':14} {'bytes':>9} {'chosen':18} {'µs':>9} "
          f"{'best':18} {'µs':>9} {'ratio':>5} {'selected µs':>11}  ok    selected ran")
    for transport, members, collective, names in work:
        measured, ran = _measure(args, transport, collective, members, names, path)
        team = model_team(members, transport)
        for size, times in sorted(measured.items()):
            forced = {k: v for k, v in times.items() if k != AUTO}
            if not forced:
                continue
            tuned = tuning.lookup(table, transport, collective, members, size)
            chosen = select.choose(collective, team, size, tuned).name
            best = min(forced, key=forced.__getitem__)
            mine = forced.get(chosen)
            ratio = mine / forced[best] if mine is not None else float("inf")
            ok = ratio <= CHECK_WITHIN
            failed += not ok
            auto, auto_ran = times.get(AUTO), ran.get(size, "")
            strays += bool(auto_ran) and auto_ran != chosen
            print(f"{transport:9} {members:>2} {collective:14} {size:>9} {chosen:18} "
                  f"{mine or float('nan'):>9.1f} {best:18} {forced[best]:>9.1f} {ratio:>5.2f} "
                  f"{auto or float('nan'):>11.1f}  {'ok' if ok else 'SLOW':5} {auto_ran or '?'}"
                  f"{'' if not auto_ran or auto_ran == chosen else ' (not the chosen row)'}")
    print(f"tune --check: {failed} size(s) where the chosen row is more than {CHECK_WITHIN:g}x the "
          f"fastest, {strays} where the selecting job ran another row; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 1 if failed or strays else 0


def main(args: argparse.Namespace) -> int:
    """Run ``tensorcomm tune``; 0 when done (``--check``: when every choice is within bounds)."""
    work = _plan(args)
    path = args.output or tuning.default_path()
    if path is None:
        raise LaunchConfigError(f"{config.ENV_TUNING_FILE}={tuning.OFF}: name the file with -o")
    if not work:
        _say("tune: nothing to choose between for these collectives and transports")
        return 0
    try:
        if not args.check:  # refused before measuring, not after
            os.close(private.trusted_dir(os.path.dirname(os.path.abspath(path)), create=True,
                                         what="tuning file directory"))
        return _check(args, path, work) if args.check else _tune(args, path, work)
    except JobFailed as exc:
        _say(f"tune: a job failed: {exc}")
        return 1
    except private.Untrusted as exc:
        _say(f"tune: {exc}")
        return 1
