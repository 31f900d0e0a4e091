"""mpi4py over the host's MPI (MPICH or Open MPI: shared memory within a host, C) as a benchmark peer.

Ranks are started by that MPI's own ``mpiexec``, the way it wants them on one host (``launcher``):
MPICH's Hydra with the fork launcher and the loopback interface; Open MPI oversubscribed (more
ranks than cores is how the 2-core machine runs 4), unbound, over its shared-memory transport,
and allowed to run as root when it is root. All-reduce runs in place (``MPI.IN_PLACE``), as
tensorcomm's and torch's do. Collectives that only move data send raw bytes, so every dtype
works; reductions need an MPI type: MPICH has none for bfloat16, and its float16 reductions abort
(MPICH 4.0), so those are refused.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from ..check import ROOT
from ..formulas import COLLECTIVES
from ..timing import Case
from . import Command
from .base import ArrayCase, Peer, Task, ping_pong, require

_REDUCIBLE = ("float32", "float64", "int8", "uint8", "int32", "int64")
_VERSION = re.compile(r"(\d+(?:\.\d+)+)")


@dataclass(frozen=True)
class Launcher:
    """An MPI implementation's ``mpiexec`` and the flags that start its ranks on this host."""

    program: str
    implementation: str  # "MPICH", "Open MPI", "Intel MPI" or "unknown"
    version: str  # "" when ``--version`` does not say
    flags: tuple[str, ...]

    def argv(self, ranks: int, command: list[str]) -> list[str]:
        """``mpiexec <flags> -n ranks command...``."""
        return [self.program, *self.flags, "-n", str(ranks), *command]


def parse_launcher(program: str, version_text: str, root: bool) -> Launcher:
    """The launcher whose ``mpiexec --version`` printed ``version_text``.

    Args:
        program: the ``mpiexec`` path.
        version_text: what ``mpiexec --version`` printed (stdout and stderr).
        root: whether ranks would run as root (Open MPI refuses that unless told).
    """
    found = _VERSION.search(version_text.split("Version:", 1)[-1])
    version = found.group(1) if found else ""
    if "Open MPI" in version_text or "OpenRTE" in version_text:
        major = int(version.split(".")[0]) if version else 4
        # Open MPI 5 renamed its shared-memory transport from "vader" to "sm".
        flags = ["--oversubscribe", "--bind-to", "none",
                 "--mca", "btl", "self,vader" if major < 5 else "self,sm"]
        if root:
            flags.append("--allow-run-as-root")
        return Launcher(program, "Open MPI", version, tuple(flags))
    if "HYDRA" in version_text or "MPICH" in version_text or "Intel(R) MPI" in version_text:
        name = "Intel MPI" if "Intel(R) MPI" in version_text else "MPICH"
        return Launcher(program, name, version, ("-launcher", "fork", "-iface", "lo"))
    return Launcher(program, "unknown", version, ())


@lru_cache(maxsize=1)
def launcher() -> Launcher:
    """This host's ``mpiexec``, asked what it is (``mpiexec --version``)."""
    program = shutil.which("mpiexec") or "mpiexec"
    try:
        done = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
        text = done.stdout + done.stderr
    except (OSError, subprocess.TimeoutExpired):
        text = ""
    return parse_launcher(program, text, os.geteuid() == 0)


def commands(ranks: int, worker: list[str], env: dict[str, str]) -> list[Command]:
    """``mpiexec -n ranks`` on this host only, started the way its implementation wants."""
    return [Command(launcher().argv(ranks, [sys.executable, *worker[1:]]), env)]


def library_version() -> str:
    """``"mpi4py 4.1.2 (MPICH 4.0.2)"``: mpi4py and the MPI library it runs on (imports MPI)."""
    import mpi4py
    from mpi4py import MPI

    # First line only, e.g. "MPICH Version:\t4.0.2" or "Open MPI v4.1.4, package: ...".
    first = MPI.Get_library_version().strip().splitlines()[0]
    library = " ".join(first.replace("Version:", "").split(",")[0].split())
    return f"mpi4py {mpi4py.__version__} ({library})"


class MpiPeer(Peer):
    """MPI.COMM_WORLD of the mpiexec job."""

    name = "mpi"

    def __init__(self) -> None:
        from mpi4py import MPI

        self.MPI, self.comm = MPI, MPI.COMM_WORLD
        self.version = library_version()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.ops = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}

    def case(self, task: Task) -> Case:
        MPI, comm = self.MPI, self.comm
        reduces = COLLECTIVES[task.collective].reduces
        if reduces:
            require(task.op in self.ops, f"mpi: MPI has no {task.op} reduction")
            require(task.dtype in _REDUCIBLE, f"mpi: no {task.dtype} reductions in MPI")
        case = ArrayCase(task, self.size, self.rank)
        x, out = case.input, case.output
        op = self.ops.get(task.op, MPI.OP_NULL)  # OP_NULL: the collective does not reduce
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
        if task.collective == "send_recv":
            calls["send_recv"] = ping_pong(self.rank, self.size, lambda peer: comm.Send(xb, peer),
                                           lambda peer: comm.Recv(xb, peer))
        case.run = calls[task.collective]
        return case

    def barrier(self) -> None:
        self.comm.Barrier()

    def close(self) -> None:
        """MPI finalizes at exit (mpi4py's default)."""


def open(init_method: str | None = None) -> MpiPeer:  # noqa: A001 - the peer contract
    """Join MPI.COMM_WORLD (MPI is initialised when mpi4py.MPI is imported)."""
    return MpiPeer()
