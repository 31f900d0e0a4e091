"""``tensorcomm bench``: the subcommand's entry point (``HELP``, ``add_arguments`` and ``main`` are
used by ``tensorcomm.cli``).

Two ways to run, chosen from the environment:

- ``-n RANKS`` (or no launcher around): start a job per library (``runner.PeerJob``) and drive
  them from here, interleaved per size.
- Under ``tensorcomm run``, torchrun or mpirun without ``-n``: this process is one rank; tensorcomm
  is measured in place and rank 0 prints.

Exit code: 0, or 1 when tensorcomm returned a wrong element or could not run.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from ..launch.env import LaunchConfigError
from ..rendezvous.discovery import discover
from . import bound, copyrate, peers, report, runner
from . import options as bench_options
from .options import BenchOptions
from .progress import progress
from .results import TENSORCOMM, Row

DEFAULT_RANKS = 2


def _discard(rows: list[Row]) -> None:
    """The table of a rank that prints none."""


def _say(message: str) -> None:
    print(f"tensorcomm bench: {message}", file=sys.stderr, flush=True)


def _footer(rows: Sequence[Row]) -> list[str]:
    """nccl-tests' closing lines: wrong elements, and the average busbw per library."""
    lines = []
    for library in dict.fromkeys(r.library for r in rows):
        mine = [r for r in rows if r.library == library and r.busbw is not None]
        wrong = sum(r.wrong or 0 for r in mine)
        busbws = [r.busbw for r in mine if r.busbw is not None]
        average = statistics.fmean(busbws) if busbws else 0.0
        lines.append(f"# {library}: wrong elements {wrong} ({'OK' if wrong == 0 else 'WRONG'}),"
                     f" average busbw {average:.3f} GB/s over {len(mine)} sizes")
    return lines


def _finish(opts: BenchOptions, rows: list[Row], machine: Mapping[str, Any],
            ranks: int, beside: bound.Beside | None = None) -> int:
    """Print the summary, write the requested files; return the exit code."""
    found = beside.found() if beside is not None else None
    if beside is not None and beside.error:
        _say(beside.error)
    for line in report.ratio_summary(rows) + bound.summary(rows, ranks, opts.shared, found) + _footer(rows):
        print(line)
    try:
        if opts.csv:
            report.write_csv(opts.csv, rows)
        if opts.json:
            report.write_json(opts.json, machine, opts, rows)
    except OSError as exc:  # private.replace_file's: names the file
        _say(f"cannot write {exc.filename}: {exc.strerror}")
        return 1
    if opts.plot:
        from .plot import PlotUnavailable, plot
        try:
            transport = machine["env"]["TENSORCOMM_TRANSPORT"]
            load = machine.get("load")
            plot(rows, opts.plot, f"tensorcomm bench: {ranks} ranks, {opts.dtype}, "
                                  f"{machine['cpu']}, {machine['cores']} cores"
                                  + (f", load {load[0]:.1f}" if load else "")
                                  + (f", TENSORCOMM_TRANSPORT={transport}" if transport else "")
                                  + "; bands: fastest to slowest batch")
        except PlotUnavailable as exc:
            _say(str(exc))
            return 1
        except OSError as exc:
            _say(f"cannot write {exc.filename}: {exc.strerror}")
            return 1
    return _exit_code(rows)


def _exit_code(rows: Sequence[Row]) -> int:
    """1 when tensorcomm returned a wrong element or failed, else 0 (peers' troubles are shown,
    not fatal)."""
    ours = [r for r in rows if r.library == TENSORCOMM]
    return 1 if any(r.wrong or r.note.startswith("failed") for r in ours) else 0


def _steps(opts: BenchOptions, ranks: int, libraries: int) -> int:
    return len(runner.tasks(opts, ranks)) * opts.rounds * libraries


def _launched(opts: BenchOptions, ranks: int) -> int:
    env = dict(os.environ)
    # One compute thread per rank, as torchrun sets it: here ranks share the cores.
    env.setdefault("OMP_NUM_THREADS", "1")
    names = [TENSORCOMM]
    for name in opts.compare:
        reason = peers.missing(name)
        if reason:
            print(f"# {name} {reason}")
        else:
            names.append(name)
    jobs: dict[str, runner.PeerJob] = {}
    cross_core = copyrate.measure()  # before any thread starts: it forks
    try:
        with progress(_steps(opts, ranks, len(names)), sys.stdout.isatty()) as advance:
            advance(f"starting {', '.join(names)}")
            jobs = runner.start_jobs(names, ranks, env, opts.timeout, _say)
            if TENSORCOMM not in jobs:
                return 1
            machine = report.machine_info(env, {n: j.version for n, j in jobs.items()})
            machine["cross_core"] = cross_core
            print("\n".join(report.header(opts, ranks, machine)))
            runs: dict[str, runner.Run] = {n: partial(j.run, plan=opts.plan())
                                           for n, j in jobs.items()}
            table = report.TableWriter(sys.stdout)
            beside = bound.Beside(ranks, opts.shared)
            rows = runner.sweep(opts, ranks, runs, _say, advance, table.emit, beside)
    finally:
        for job in jobs.values():
            job.stop()
    return _finish(opts, rows, machine, ranks, beside)


def _in_process(opts: BenchOptions) -> int:
    from .peers import tensorcomm_

    if opts.compare:
        _say("--compare needs bench to start the ranks (-n); measuring tensorcomm only")
    peer = tensorcomm_.open()
    leader = peer.rank == 0
    emit: Callable[[list[Row]], None] = _discard
    try:
        machine = report.machine_info(os.environ, {TENSORCOMM: peer.version})
        if leader:
            print("\n".join(report.header(opts, peer.size, machine)))
            emit = report.TableWriter(sys.stdout).emit
        runs = {TENSORCOMM: runner.local_run(peer, opts.plan())}
        rows = runner.sweep(opts, peer.size, runs, _say, lambda step: None, emit)
    finally:
        peer.close()
    # Every rank holds the same rows; only rank 0 prints and writes files.
    return _finish(opts, rows, machine, peer.size) if leader else _exit_code(rows)


HELP = "time collectives nccl-tests style, optionally side by side with gloo, mpi and mindspore"
add_arguments = bench_options.add_arguments


def check_dependencies(opts: BenchOptions) -> None:
    """Refuse, before anything runs, a run that would miss what it was asked for: matplotlib for
    ``--plot``, a library named in ``--compare`` (``--compare all`` skips the missing ones).

    Raises:
        LaunchConfigError: names what is missing and how to install it.
    """
    if opts.plot and importlib.util.find_spec("matplotlib") is None:
        raise LaunchConfigError("--plot needs matplotlib: pip install 'tensorcomm[bench]' (or leave "
                                "--plot out)")
    if opts.compare_all:
        return
    for name in opts.compare:
        reason = peers.missing(name)
        if reason:
            raise LaunchConfigError(f"--compare {name}: {reason.removeprefix('skipped: ')}; "
                                    f"install it or leave {name} out")


def main(args: argparse.Namespace) -> int:
    """Run ``tensorcomm bench`` with its parsed arguments; return its exit code."""
    opts = bench_options.from_args(args)
    check_dependencies(opts)
    try:
        under_launcher = discover().world_size is not None
    except ValueError as exc:  # a malformed launcher variable
        raise LaunchConfigError(str(exc)) from None
    try:
        if opts.ranks is None and under_launcher:
            return _in_process(opts)
        return _launched(opts, opts.ranks or DEFAULT_RANKS)
    except BrokenPipeError:
        # Output closed (piped into `head`): stop quietly, as a shell tool killed by SIGPIPE,
        # and keep the interpreter's final flush from raising again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
