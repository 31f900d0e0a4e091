"""tensorcomm with MPI carrying its messages (``init(backend="mpi")``) as the benchmark peer
``tc-mpi`` (short enough for the table's library column).

Ranks are started by the host's ``mpiexec`` exactly as the ``mpi`` peer's are, with
``TENSORCOMM_BACKEND=mpi``; otherwise it is the ``tensorcomm`` peer (its public API only). On one
host its groups use shared memory as the ``tensorcomm`` peer's do: run the bench with
``TENSORCOMM_TRANSPORT=tcp`` to have MPI carry every message.
"""

from __future__ import annotations

from ...config import ENV_BACKEND
from . import Command
from .mpi4py_ import commands as mpi_commands
from .mpi4py_ import library_version
from .tensorcomm_ import TensorcommPeer


def commands(ranks: int, worker: list[str], env: dict[str, str]) -> list[Command]:
    """The ``mpi`` peer's ``mpiexec`` command, with the MPI backend chosen."""
    return mpi_commands(ranks, worker, {**env, ENV_BACKEND: "mpi"})


class TensorcommMpiPeer(TensorcommPeer):
    """tensorcomm joined through ``tc.init()`` under mpiexec, over MPI."""

    name = "tc-mpi"

    def __init__(self) -> None:
        super().__init__()
        self.version = f"{self.version} over {library_version()}"


def open(init_method: str | None = None) -> TensorcommMpiPeer:  # noqa: A001 - the peer contract
    """Join the mpiexec job, MPI carrying tensorcomm's messages."""
    return TensorcommMpiPeer()
