"""Small collectives at 2 ranks beside busy processes, tensorcomm and mpi4py on MPICH interleaved,
with how often the two ranks shared a core.

    python benchmarks/busy_cores.py [--busy 2] [--rounds 3] [--calls 2000] [--batches 9]
        [--no-mpi] [--json FILE]

Starts ``--busy`` processes that only spin (``python -c 'while True: pass'``: a data loader,
another job), then in each round one job of ``tensorcomm run -n 2`` and one of ``mpiexec -n 2``
(alternating which goes first). Each job times in-place float32 ``all_reduce`` and ``broadcast``
(root 0) at 8 B, 2 KiB and 32 KiB, and a ping-pong of a small dict (``send``/``recv`` through
``tensorcomm.MPI`` and mpi4py: a round trip per call): ``--batches`` batches of ``--calls`` calls
back to back, each after a barrier; a batch counts the slower rank. Per batch it also notes whether
the two ranks ran on the same core at its start or end (``/proc/self/stat``'s processor field):
ranks that wait for each other on one core while the busy processes hold the rest lose a scheduler
turn per call (``transports/shm/apart.py``). Prints per collective and size the median time per
call over all batches of all rounds, the share of batches on a shared core, tensorcomm's speed over
MPICH's, and the load average. Nothing is asserted: numbers depend on the host and its load.
``--json FILE`` writes each figure as a number ("COLLECTIVE SIZE LIBRARY us", "... shared"), the
form ``benchmarks/ab.py`` compares across two source trees::

    python benchmarks/ab.py main . -- python benchmarks/busy_cores.py --rounds 1 --json {json}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mpi_module import SMALL, round_trip, two_rank_job  # same directory

Runs = dict[str, list[dict[str, list[list[float]]]]]  # per library, per round: case -> batches

CASES = [("all_reduce", 8), ("broadcast", 8), ("all_reduce", 2048), ("broadcast", 2048),
         ("all_reduce", 32768), ("broadcast", 32768), ("ping-pong", 0)]


def _core() -> int:
    """The core this process runs on now."""
    with open("/proc/self/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[36])


def rank_job(kind: str, calls: int, batches: int, out: Path) -> None:
    """One rank of a job: time every case; rank 0 writes per case the batches' (seconds per
    call, shared core) to ``out``."""
    import numpy as np

    if kind == "tc":
        import tensorcomm as tc

        tc.init()
        from tensorcomm import MPI

        rank, barrier = tc.get_rank(), tc.barrier
        ops = {"all_reduce": tc.all_reduce, "broadcast": lambda x: tc.broadcast(x, src=0)}

        def gather(value: Any) -> list[Any]:
            everyone: list[Any] = [None, None]
            tc.all_gather_object(everyone, value)
            return everyone
    else:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        rank, barrier, gather = comm.Get_rank(), comm.Barrier, comm.allgather
        ops = {"all_reduce": lambda x: comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM),
               "broadcast": lambda x: comm.Bcast(x, root=0)}
    world = MPI.COMM_WORLD
    ops["ping-pong"] = lambda _: round_trip(world, rank, SMALL)
    results = {}
    for name, nbytes in CASES:
        call, x = ops[name], np.ones(nbytes // 4, np.float32)
        for _ in range(200):
            call(x)
        mine = []
        for _ in range(batches):
            barrier()
            first = _core()
            start = time.perf_counter()
            for _ in range(calls):
                call(x)
            mine.append(((time.perf_counter() - start) / calls, first, _core()))
        zero, one = gather(mine)
        results[f"{name} {nbytes}"] = [(max(a[0], b[0]), a[1] == b[1] or a[2] == b[2])
                                       for a, b in zip(zero, one, strict=True)]
    if rank == 0:
        out.write_text(json.dumps(results))


def _job(kind: str, args: argparse.Namespace, out: Path) -> dict[str, list[list[float]]]:
    me = [str(Path(__file__).resolve()), "--rank-job", kind, "--calls", str(args.calls),
          "--batches", str(args.batches), "--out", str(out)]
    return two_rank_job(kind, me, out, timeout=900)  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=2, help="busy processes beside the ranks")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2000, help="calls per batch")
    parser.add_argument("--batches", type=int, default=9)
    parser.add_argument("--no-mpi", action="store_true", help="tensorcomm alone")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--rank-job", choices=["tc", "mpi4py"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_job:
        rank_job(args.rank_job, args.calls, args.batches, args.out)
        return
    kinds = ["tc"]
    if not args.no_mpi:
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            sys.exit("mpi4py is not installed (pip install mpi4py, built against the host's MPI), "
                     "or give --no-mpi")
        kinds.append("mpi4py")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    runs: Runs = {kind: [] for kind in kinds}
    try:
        print(f"{args.busy} busy processes; load before: {os.getloadavg()}")
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.rounds):
                for kind in (kinds if i % 2 == 0 else kinds[::-1]):
                    runs[kind].append(_job(kind, args, Path(tmp) / f"{kind}{i}.json"))
        print(f"load after: {os.getloadavg()}")
    finally:
        for process in busy:
            process.kill()
            process.wait()
    _report(runs)
    if args.json is not None:
        args.json.write_text(json.dumps(_table(runs), indent=1))


def _figures(runs: Runs, kind: str, case: str) -> tuple[float, float]:
    """Median µs per call over every batch of every round, and the share of batches on one core."""
    rows = [row for run in runs[kind] for row in run[case]]
    return statistics.median(r[0] for r in rows) * 1e6, sum(1 for r in rows if r[1]) / len(rows)


def _table(runs: Runs) -> dict[str, float]:
    table = {}
    for name, nbytes in CASES:
        case = f"{name} {nbytes}"
        for kind in runs:
            us, shared = _figures(runs, kind, case)
            table[f"{case} {kind} us"] = us
            table[f"{case} {kind} shared"] = shared
    return table


def _report(runs: Runs) -> None:
    print(f"{'case':18} {'tensorcomm':>11} {'shared':>7}" + (
        f" {'mpi4py':>9} {'shared':>7} {'speed':>6}" if "mpi4py" in runs else ""))
    for name, nbytes in CASES:
        case = f"{name} {nbytes}"
        us, shared = _figures(runs, "tc", case)
        line = f"{case:18} {us:9.2f}us {shared:7.0%}"
        if "mpi4py" in runs:
            theirs, their_shared = _figures(runs, "mpi4py", case)
            line += f" {theirs:7.2f}us {their_shared:7.0%} {theirs / us:5.2f}x"
        print(line)


if __name__ == "__main__":
    main()
