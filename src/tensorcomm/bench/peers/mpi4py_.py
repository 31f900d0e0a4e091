"""mpi4py over MPICH (shared memory within a host, C) as a benchmark peer.

Ranks are started by MPICH's ``mpiexec`` (Hydra) with the fork launcher and the loopback
interface. All-reduce runs in place (``MPI.IN_PLACE``), as tensorcomm's and torch's do. Collectives
that only move data send raw bytes, so every dtype works; reductions need an MPI type: MPICH has
none for bfloat16, and its float16 reductions abort (MPICH 4.0), so those are refused.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from ..check import ROOT
from ..formulas import COLLECTIVES
from ..timing import Case
from . import Command
from .base import ArrayCase, Peer, Task, require

_REDUCIBLE = ("float32", "float64", "int8", "uint8", "int32", "int64")


def commands(ranks: int, worker: list[str], env: dict[str, str]) -> list[Command]:
    """``mpiexec -n ranks`` on this host only, over loopback."""
    mpiexec = shutil.which("mpiexec") or "mpiexec"
    return [Command([mpiexec, "-launcher", "fork", "-iface", "lo", "-n", str(ranks),
                     sys.executable, *worker[1:]], env)]


class MpiPeer(Peer):
    """MPI.COMM_WORLD of the mpiexec job."""

    name = "mpi"

    def __init__(self) -> None:
        import mpi4py
        from mpi4py import MPI

        self.MPI, self.comm = MPI, MPI.COMM_WORLD
        # First line only, e.g. "MPICH Version:\t4.0.2" or "Open MPI v4.1.4, package: ...".
        first = MPI.Get_library_version().strip().splitlines()[0]
        library = " ".join(first.replace("Version:", "").split(",")[0].split())
        self.version = f"mpi4py {mpi4py.__version__} ({library})"
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.ops = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}

    def case(self, task: Task) -> Case:
        MPI, comm = self.MPI, self.comm
        reduces = COLLECTIVES[task.collective].reduces
        if reduces:
            require(task.op in self.ops, f"mpi: MPI has no {task.op} reduction")
            require(task.dtype in _REDUCIBLE, f"mpi: no {task.dtype} reductions in MPICH")
        case = ArrayCase(task, self.size, self.rank)
        x, out = case.input, case.output
        op = self.ops.get(task.op)
        root = self.rank == ROOT

        def raw(a: np.ndarray | None) -> Any:
            return None if a is None else [a.view(np.uint8), MPI.BYTE]

        xb, ob = raw(x), raw(out)
        calls: dict[str, Callable[[], Any]] = {
            "all_reduce": lambda: comm.Allreduce(MPI.IN_PLACE, x, op),
            "broadcast": lambda: comm.Bcast(xb, ROOT),
            "reduce": ((lambda: comm.Reduce(MPI.IN_PLACE, x, op, ROOT)) if root
                       else (lambda: comm.Reduce(x, None, op, ROOT))),
            "all_gather": lambda: comm.Allgather(xb, ob),
            "reduce_scatter": lambda: comm.Reduce_scatter_block(x, out, op),
            "all_to_all": lambda: comm.Alltoall(xb, ob),
            "gather": lambda: comm.Gather(xb, ob if root else None, ROOT),
            "scatter": lambda: comm.Scatter(xb if root else None, ob, ROOT),
        }
        case.run = calls[task.collective]
        return case

    def barrier(self) -> None:
        self.comm.Barrier()

    def close(self) -> None:
        """MPI finalizes at exit (mpi4py's default)."""


def open(init_method: str | None = None) -> MpiPeer:  # noqa: A001 - the peer contract
    """Join MPI.COMM_WORLD (MPI is initialised when mpi4py.MPI is imported)."""
    return MpiPeer()
