"""When tensorcomm.MPI starts and ends tensorcomm, and the environment calls (``Wtime``,
``Get_processor_name``, versions). The first use of a communicator initialises tensorcomm (as
importing mpi4py initialises MPI) unless the program did; the world is whatever the launcher
says (``tensorcomm run``, mpiexec, torchrun) or this one process. Imports ``core`` and
``frontends.process_group``."""

from __future__ import annotations

import atexit
import socket
import sys
import threading
import time

from .. import config
from ..core.lifecycle import current_world, is_initialized
from ..core.world import World
from ..frontends import process_group
from . import p2p

_lock = threading.Lock()
_started_here = False
_finalized = False


def world() -> World:
    """The current world, initialising tensorcomm on first use.

    Raises:
        RuntimeError: ``Finalize`` was called.
    """
    global _started_here
    if is_initialized():
        return current_world()
    with _lock:
        if _finalized:
            raise RuntimeError("tensorcomm.MPI: MPI.Finalize() was called; no communication after it")
        if not is_initialized():
            process_group.init()
            _started_here = True
            atexit.register(Finalize)
    return current_world()


def world_rank() -> int:
    """This process's global rank."""
    return world().rank


def Init() -> None:
    """Initialise (already done on first use; a no-op)."""
    world()


def Init_thread(required: int = 3) -> int:
    """Initialise; the thread level provided (``THREAD_MULTIPLE``)."""
    world()
    return 3


def Query_thread() -> int:
    """The thread level provided (``THREAD_MULTIPLE``)."""
    return 3


def Is_thread_main() -> bool:
    """Whether this is the main thread."""
    return threading.current_thread() is threading.main_thread()


def Is_initialized() -> bool:
    """True: the module initialises on first use, as mpi4py does at import."""
    return True


def Is_finalized() -> bool:
    """Whether ``Finalize`` was called."""
    return _finalized


def Finalize() -> None:
    """End tensorcomm if this module started it (also run at exit)."""
    global _finalized
    with _lock:
        if _finalized:
            return
        _finalized = True
    if _started_here and is_initialized():
        p2p.settle_all()
        process_group.destroy()


def Wtime() -> float:
    """Seconds on a monotonic clock."""
    return time.perf_counter()


def Wtick() -> float:
    """The resolution of ``Wtime``, in seconds."""
    return time.get_clock_info("perf_counter").resolution


def Get_processor_name() -> str:
    """This host's name."""
    return socket.gethostname()


def Get_version() -> tuple[int, int]:
    """The MPI standard version the module follows: (4, 1)."""
    return 4, 1


def Get_library_version() -> str:
    """tensorcomm's name and version."""
    return f"tensorcomm {config.VERSION} (tensorcomm.MPI, no MPI library)"


def get_vendor() -> tuple[str, tuple[int, int, int]]:
    """``("tensorcomm", version)``."""
    parts = [int(p) for p in config.VERSION.split(".")[:3] if p.isdigit()]
    return "tensorcomm", tuple([*parts, 0, 0, 0][:3])  # type: ignore[return-value]


def Abort_process(errorcode: int) -> None:
    """End this process at once with ``errorcode`` (the launcher stops the others)."""
    sys.stderr.write(f"tensorcomm.MPI: Abort({errorcode}) called on rank "
                     f"{current_world().rank if is_initialized() else 0}\n")
    sys.stderr.flush()
    import os
    os._exit(errorcode)
