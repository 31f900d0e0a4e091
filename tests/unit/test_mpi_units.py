"""The MPI backend's pieces that need no MPI job: the message header, abort encoding, the choice
of backend, the error without mpi4py, and how the bench starts each MPI implementation's ranks."""

from __future__ import annotations

import sys

import pytest

import tensorcomm as tc
from tensorcomm.bench.peers.mpi4py_ import parse_launcher
from tensorcomm.errors import CollectiveMismatchError, CommTimeoutError, GroupAbortedError, PeerLostError
from tensorcomm.rendezvous.discovery import discover
from tensorcomm.signature import signature
from tensorcomm.transports.base import decode_abort, encode_abort
from tensorcomm.transports.mpi import framing

MPICH_VERSION = """HYDRA build details:
    Version:                                 4.0.2
    Release Date:                            Thu Apr  7 12:34:45 CDT 2022
"""
OPEN_MPI_4 = "mpiexec (OpenRTE) 4.1.6\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
OPEN_MPI_5 = "mpiexec (Open MPI) 5.0.3\n\nReport bugs to https://www.open-mpi.org/community/help/\n"


def test_header_round_trip():
    import numpy as np

    sig = signature("all_reduce", np.dtype(np.float32), 12, tc.ReduceOp.MAX, 3)
    tag = (5 << 48) | (7 << 16) | 2
    out = framing.frame(framing.DATA, tag, b"payload!", sig)
    assert len(out) == framing.HEADER.size + 8
    assert framing.parse(out) == (framing.DATA, tag, 8, 0, sig)
    bulk = framing.frame(framing.BULK, tag, memoryview(bytearray(1 << 20)), None, bulk=99)
    assert len(bulk) == framing.HEADER.size
    assert framing.parse(bulk) == (framing.BULK, tag, 1 << 20, 99, None)
    with pytest.raises(ValueError, match="shorter than a tensorcomm header"):
        framing.parse(bytearray(3))


@pytest.mark.parametrize("error", [PeerLostError(3, "it exited"), CollectiveMismatchError("x vs y"),
                                   CommTimeoutError("late"), GroupAbortedError("stop")])
def test_abort_causes_keep_their_class(error):
    decoded = decode_abort(1, memoryview(encode_abort(error, framing.MAX_ABORT_BYTES)))
    assert type(decoded) is type(error)
    assert "(reported by rank 1)" in str(decoded)
    if isinstance(error, PeerLostError):
        assert decoded.rank == 3 and "it exited" in str(decoded)


def test_backend_variable():
    assert discover({}).backend == "tensorcomm"
    assert discover({"TENSORCOMM_BACKEND": " MPI "}).backend == "mpi"
    with pytest.raises(ValueError, match="TENSORCOMM_BACKEND='nccl': expected one of 'tensorcomm', 'mpi'"):
        discover({"TENSORCOMM_BACKEND": "nccl"})


def test_init_refuses_an_unknown_backend():
    with pytest.raises(ValueError, match="init: backend must be one of 'tensorcomm', 'mpi', got 'gloo'"):
        tc.init(backend="gloo")
    assert not tc.is_initialized()


def test_mpi_backend_without_mpi4py_says_how_to_install(monkeypatch):
    from tensorcomm.transports.mpi import comm

    monkeypatch.setitem(sys.modules, "mpi4py", None)
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", None)
    with pytest.raises(ImportError, match=r"pip install 'tensorcomm\[mpi\]'"):
        comm.load()


@pytest.mark.parametrize("text, root, implementation, version, flags", [
    (MPICH_VERSION, True, "MPICH", "4.0.2", ("-launcher", "fork", "-iface", "lo")),
    (OPEN_MPI_4, False, "Open MPI", "4.1.6",
     ("--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader")),
    (OPEN_MPI_4, True, "Open MPI", "4.1.6",
     ("--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader", "--allow-run-as-root")),
    (OPEN_MPI_5, False, "Open MPI", "5.0.3",
     ("--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,sm")),
    ("Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619", False, "Intel MPI",
     "2021.10", ("-launcher", "fork", "-iface", "lo")),
    ("", False, "unknown", "", ()),
])
def test_each_mpi_starts_its_ranks_its_way(text, root, implementation, version, flags):
    launcher = parse_launcher("/usr/bin/mpiexec", text, root)
    assert (launcher.implementation, launcher.version, launcher.flags) == (implementation, version, flags)
    assert launcher.argv(4, ["python", "w.py"]) == ["/usr/bin/mpiexec", *flags, "-n", "4", "python", "w.py"]
