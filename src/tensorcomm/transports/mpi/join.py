"""Meet the ranks of an MPI job: rank 0 serves the store, MPI hands out its address and secret.

Under mpirun (or srun, or any MPI launcher) the ranks have no ``MASTER_ADDR``, but they have MPI:
rank 0 serves tensorcomm's store (which shared memory and groups still need) and broadcasts
where it listens over MPI. The job secret is ``TENSORCOMM_SECRET`` when set; otherwise rank 0
generates one and MPI broadcasts it too, so a job spanning hosts needs no variable at all. The
secret then crosses the network inside the MPI job's own traffic, which carries the job's data
anyway (docs/mpi.md). Imports ``rendezvous`` and this package's ``comm``.

Where rank 0 listens: ``MASTER_ADDR``/``MASTER_PORT`` when set; else, when every rank runs on
rank 0's host (same ``TENSORCOMM_HOST_ID`` or host name), loopback on a free port; else every
interface, reached by rank 0's host name.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import socket
from typing import Any

from ...config import ENV_SECRET
from ...errors import RendezvousError
from ...rendezvous.auth import JobKey, generate_secret, secret_bytes
from ...rendezvous.discovery import discover
from ...rendezvous.init_method import Rendezvous
from ...rendezvous.tcp_store import TCPStore, TCPStoreServer
from . import comm as mpi_comm


def rendezvous(rank: int | None, world_size: int | None, timeout: float) -> Rendezvous:
    """Connect this MPI rank to the store rank 0 serves for the job.

    Args:
        rank, world_size: if given, must be MPI's (``MPI_COMM_WORLD``'s rank and size).
        timeout: seconds for the whole meeting.

    Raises:
        ImportError: mpi4py is missing.
        ValueError: ``rank``/``world_size`` disagree with MPI's.
        RendezvousError: a rank did not arrive in time, or rank 0 could not serve the store.
    """
    comm = mpi_comm.duplicate(timeout)
    try:
        mpi_rank, mpi_size = comm.Get_rank(), comm.Get_size()
        check_ranks(rank, world_size, mpi_rank, mpi_size)
        _check_launcher(mpi_rank, mpi_size)
        return _meet(comm, mpi_rank, mpi_size, timeout)
    finally:
        comm.Free()


def check_ranks(rank: int | None, world_size: int | None, mpi_rank: int, mpi_size: int) -> None:
    """Refuse a rank or world size that is not MPI's.

    Raises:
        ValueError: names both values.
    """
    if (rank is not None and rank != mpi_rank) or (world_size is not None and world_size != mpi_size):
        raise ValueError(f"backend='mpi': MPI_COMM_WORLD says rank {mpi_rank} of {mpi_size}, but "
                         f"rank={rank} and world_size={world_size} were given; with MPI the ranks "
                         "are MPI's (leave rank and world_size out)")


def _check_launcher(mpi_rank: int, mpi_size: int) -> None:
    """Refuse an MPI whose ranks are not its launcher's: mpi4py built for another MPI (or a
    launcher that is not MPI's, such as srun without PMI) makes each process a world of its own.

    Raises:
        RendezvousError: names both and the fix.
    """
    info = discover()
    if info.world_size is not None and (info.rank, info.world_size) != (mpi_rank, mpi_size):
        raise RendezvousError(
            f"MPI: the launcher ({info.source}) says rank {info.rank} of {info.world_size}, "
            f"but mpi4py's MPI_COMM_WORLD says rank {mpi_rank} of {mpi_size}: is mpi4py built "
            f"against another MPI than the launcher's? Rebuild it (pip install --no-binary mpi4py "
            f"--force-reinstall mpi4py), use the mpiexec of the MPI it was built with, or (a plain "
            f"init()) set MASTER_ADDR and MASTER_PORT to meet without MPI")


def _meet(comm: object, rank: int, size: int, timeout: float) -> Rendezvous:
    info = discover()
    # Checked (and stretched) on every rank before any message, so a refused secret stops them all.
    given = None if info.secret is None else secret_bytes(info.secret, ENV_SECRET)
    digest = hashlib.sha256(info.host_id.encode()).digest()
    hosts = _gather_hosts(comm, digest, size, timeout)
    server = None
    announcement, bind = b"", ""
    if rank == 0:
        secret = secret_bytes(generate_secret()) if given is None else given
        one_host = all(h == digest for h in hosts)
        bind = info.master_addr or ("127.0.0.1" if one_host else "0.0.0.0")
        reach = info.master_addr or ("127.0.0.1" if one_host else socket.gethostname())
        try:
            server = TCPStoreServer(bind, info.master_port or 0, secret)
            fields = {"host": reach, "port": server.port,
                      "secret": None if info.secret is not None else secret.hex()}
        except RendezvousError as exc:
            fields = {"error": str(exc)}
        announcement = json.dumps(fields).encode()
    fields = json.loads(mpi_comm.broadcast(comm, announcement, timeout, "meeting rank 0"))
    if "error" in fields:
        raise RendezvousError(f"backend='mpi': rank 0 could not serve the store: {fields['error']}")
    if fields["secret"] is not None:
        secret = JobKey(bytes.fromhex(fields["secret"]))
    elif given is None:
        raise RendezvousError("backend='mpi': TENSORCOMM_SECRET is set on rank 0 but not on rank "
                              f"{rank}; set it on every rank or on none")
    else:
        secret = given
    host = fields["host"]
    if server is not None and bind == "0.0.0.0" and not _routable(host):
        # Rank 0 reaches its own store on loopback when its host name gives no other address.
        # Otherwise it dials that name like everyone: tensorcomm's TCP mesh (a plain init()
        # under mpirun) listens where the store is reached, which other hosts must reach too.
        host = "127.0.0.1"
    try:
        store = TCPStore(host, int(fields["port"]), secret, timeout)
    except BaseException:
        if server is not None:
            server.close()
        raise
    return Rendezvous(store, rank, size, info.local_rank, info.host_id, secret, server)


def _routable(host: str) -> bool:
    """Whether ``host`` resolves to an address that is not loopback."""
    try:
        return not ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def _gather_hosts(comm: Any, digest: bytes, size: int, timeout: float) -> list[bytes]:
    """Every rank's host-identity digest, in rank order (``comm``: an mpi4py communicator)."""
    gathered = bytearray(len(digest) * size)
    mpi_comm.wait(comm.Iallgather(bytearray(digest), gathered), timeout,
                  "gathering the ranks' hosts")
    return [bytes(gathered[i * len(digest):(i + 1) * len(digest)]) for i in range(size)]
