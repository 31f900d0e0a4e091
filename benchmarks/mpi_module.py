"""tensorcomm.MPI beside mpi4py on MPICH, 2 ranks on one host, jobs interleaved round by round.

    python benchmarks/mpi_module.py [--rounds 3] [--json FILE]

Each round runs one job of ``tensorcomm run -n 2`` (``from tensorcomm import MPI``) and one of
``mpiexec -n 2`` (``from mpi4py import MPI``), alternating which goes first. Every job times:
object ``send``/``recv`` ping-pong of a small dict and of a 1 MiB pickle (time per one-way
message: half a round trip), and in-place float32 ``Allreduce`` at several sizes; the tensorcomm
job also times ``tensorcomm.all_reduce`` on the same array, batch by batch alternating with
``MPI.Allreduce``, to show what the mapping adds. Prints medians over batches and rounds, the
ratios, and the load average. Nothing is asserted: numbers depend on the host and its load.
``--json FILE`` writes each figure as a number, named "MEASURE LIBRARY us" (and "MEASURE
ratio"), the form ``benchmarks/ab.py`` compares across two source trees::

    python benchmarks/ab.py main . -- python benchmarks/mpi_module.py --rounds 1 --json {json}
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

SIZES = [8, 64 << 10, 1 << 20, 16 << 20]
SMALL = {"step": 12, "loss": 0.25, "name": "worker", "ok": True}


def _pingpong(MPI, obj, repeat: int) -> float:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(repeat):
        round_trip(comm, rank, obj)
    return (time.perf_counter() - start) / repeat / 2


def round_trip(comm: Any, rank: int, obj: Any) -> None:
    """Rank 0 sends ``obj`` to rank 1 (tag 1), which sends it back (tag 2)."""
    if rank == 0:
        comm.send(obj, dest=1, tag=1)
        comm.recv(source=1, tag=2)
    else:
        comm.recv(source=0, tag=1)
        comm.send(obj, dest=0, tag=2)


def _batches(fn, repeat: int, batches: int) -> list[float]:
    out = []
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        out.append((time.perf_counter() - start) / repeat)
    return out


def rank_job(kind: str, out: Path) -> None:
    """One rank of a job: time everything, rank 0 writes the medians to ``out``."""
    import numpy as np

    if kind == "tc":
        from tensorcomm import MPI
    else:
        from mpi4py import MPI
    comm = MPI.COMM_WORLD
    big = {"payload": np.random.default_rng(0).bytes(1 << 20)}
    results: dict[str, float] = {}
    _pingpong(MPI, SMALL, 50)  # warm up
    results["send/recv small dict"] = statistics.median(_pingpong(MPI, SMALL, 200) for _ in range(7))
    _pingpong(MPI, big, 3)
    results["send/recv 1 MiB pickle"] = statistics.median(_pingpong(MPI, big, 10) for _ in range(7))
    for nbytes in SIZES:
        x = np.ones(nbytes // 4, np.float32)
        repeat = max(3, min(500, (8 << 20) // max(nbytes, 1 << 14)))

        def mpi_call(x=x) -> None:
            comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)

        mpi_call()
        if kind == "tc":
            import tensorcomm as tc

            def tc_call(x=x) -> None:
                tc.all_reduce(x)

            tc_call()
            mine, theirs = [], []
            for _ in range(7):  # batch by batch, alternating
                mine += _batches(mpi_call, repeat, 1)
                theirs += _batches(tc_call, repeat, 1)
                comm.Barrier()
            results[f"tc.all_reduce {nbytes} B"] = statistics.median(theirs)
        else:
            mine = _batches(mpi_call, repeat, 7)
        results[f"Allreduce {nbytes} B"] = statistics.median(mine)
    if comm.Get_rank() == 0:
        out.write_text(json.dumps(results))


def two_rank_job(kind: str, script: list[str], out: Path, timeout: float = 600) -> Any:
    """Run ``script`` (a Python file and its arguments) on 2 ranks, under ``tensorcomm run`` for
    ``kind`` "tc", else under MPICH's ``mpiexec``; return the JSON it wrote to ``out``."""
    if kind == "tc":
        command = [sys.executable, "-m", "tensorcomm", "run", "-n", "2", *script]
    else:
        command = ["mpiexec", "-n", "2", sys.executable, *script]
    subprocess.run(command, check=True, timeout=timeout, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def _job(kind: str, out: Path) -> dict[str, float]:
    return two_rank_job(kind, [str(Path(__file__).resolve()), "--rank-job", kind, "--out", str(out)], out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--rank-job", choices=["tc", "mpi4py"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_job:
        rank_job(args.rank_job, args.out)
        return
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        sys.exit("mpi4py is not installed: pip install mpi4py (built against the host's MPI)")
    runs: dict[str, list[dict[str, float]]] = {"tc": [], "mpi4py": []}
    print(f"load before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for kind in (("tc", "mpi4py") if i % 2 == 0 else ("mpi4py", "tc")):
                runs[kind].append(_job(kind, Path(tmp) / f"{kind}{i}.json"))
    print(f"load after: {os.getloadavg()}")

    def median(kind: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[kind])

    print(f"{'measure':28} {'tensorcomm.MPI':>15} {'mpi4py+MPICH':>13} {'ratio':>7} "
          f"{'tc.all_reduce':>14} {'MPI/tc':>7}")
    table = {}
    for key in runs["tc"][0]:
        if key.startswith("tc."):
            continue
        ours, theirs = median("tc", key), median("mpi4py", key)
        table.update({f"{key} tensorcomm.MPI us": ours * 1e6, f"{key} mpi4py us": theirs * 1e6,
                      f"{key} ratio": ours / theirs})
        line = f"{key:28} {ours * 1e6:13.1f}us {theirs * 1e6:11.1f}us {ours / theirs:7.2f}"
        native = f"tc.all_reduce {key.split()[1]} B"
        if key.startswith("Allreduce") and native in runs["tc"][0]:
            direct = median("tc", native)
            table[f"{key} tc.all_reduce us"] = direct * 1e6
            line += f" {direct * 1e6:12.1f}us {ours / direct:7.2f}"
        print(line)
    if args.json is not None:
        args.json.write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
