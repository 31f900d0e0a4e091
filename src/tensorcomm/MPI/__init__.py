"""``from tensorcomm import MPI``: a module shaped like ``mpi4py.MPI``, over tensorcomm.

An mpi4py program runs with its import changed from ``from mpi4py import MPI`` and started by
``tensorcomm run -n N`` (or mpiexec, srun, torchrun, or plain ``python`` for one process); no
MPI library is needed. The first use of a communicator initialises tensorcomm, unless the
program called ``tensorcomm.init()`` itself. docs/mpi.md lists what is offered, call by call,
and what raises ``NotImplementedError``.

The package: ``comm`` (communicators), ``pt2pt`` and ``p2p`` (point-to-point and its matching),
``collectives`` (buffer collectives), ``objects`` (object collectives), ``buffers`` (message
specifications), ``datatype``, ``op``, ``request``, ``status``, ``group``, ``exceptions``,
``constants``, ``runtime`` (initialisation, clocks, versions).
"""

from __future__ import annotations

import pickle as _pickle
from typing import Any

from .buffers import BOTTOM, IN_PLACE
from .comm import COMM_NULL, COMM_SELF, COMM_WORLD, Comm, Intracomm
from .constants import (
    ANY_SOURCE,
    ANY_TAG,
    COMM_TYPE_HW_GUIDED,
    COMM_TYPE_HW_UNGUIDED,
    COMM_TYPE_RESOURCE_GUIDED,
    COMM_TYPE_SHARED,
    CONGRUENT,
    ERRORS_ABORT,
    ERRORS_ARE_FATAL,
    ERRORS_RETURN,
    IDENT,
    KEYVAL_INVALID,
    MAX_ERROR_STRING,
    MAX_LIBRARY_VERSION_STRING,
    MAX_PROCESSOR_NAME,
    PROC_NULL,
    ROOT,
    SIMILAR,
    SUBVERSION,
    TAG_UB,
    THREAD_FUNNELED,
    THREAD_MULTIPLE,
    THREAD_SERIALIZED,
    THREAD_SINGLE,
    UNDEFINED,
    UNEQUAL,
    VERSION,
)
from .datatype import DATATYPE_NULL, PREDEFINED, Datatype
from .exceptions import (
    ERR_ARG,
    ERR_BUFFER,
    ERR_COMM,
    ERR_COUNT,
    ERR_GROUP,
    ERR_IN_STATUS,
    ERR_INTERN,
    ERR_LASTCODE,
    ERR_NOT_SAME,
    ERR_OP,
    ERR_OTHER,
    ERR_PENDING,
    ERR_PROC_FAILED,
    ERR_RANK,
    ERR_REQUEST,
    ERR_REVOKED,
    ERR_ROOT,
    ERR_TAG,
    ERR_TOPOLOGY,
    ERR_TRUNCATE,
    ERR_TYPE,
    ERR_UNKNOWN,
    ERR_UNSUPPORTED_OPERATION,
    SUCCESS,
    Exception,  # noqa: A004 - mpi4py's name
    Get_error_class,
    Get_error_string,
)
from .group import GROUP_EMPTY, GROUP_NULL, Group
from .info import INFO_ENV, INFO_NULL, Info
from .memory import BSEND_OVERHEAD, BUFFER_AUTOMATIC, PROCESS, Alloc_mem, Free_mem, buffer
from .op import (
    BAND,
    BOR,
    BXOR,
    LAND,
    LOR,
    LXOR,
    MAX,
    MAXLOC,
    MIN,
    MINLOC,
    NO_OP,
    OP_NULL,
    PROD,
    REPLACE,
    SUM,
    Op,
)
from .pt2pt import Message
from .request import Grequest, Prequest, Request
from .runtime import (
    Finalize,
    Get_library_version,
    Get_processor_name,
    Get_version,
    Init,
    Init_thread,
    Is_finalized,
    Is_initialized,
    Is_thread_main,
    Query_thread,
    Wtick,
    Wtime,
    get_vendor,
)
from .status import Status

REQUEST_NULL = Request()
MESSAGE_NULL = Message()
MESSAGE_NO_PROC = Message()
ERRHANDLER_NULL = None
ERRORS_RETURN_HANDLER = ERRORS_RETURN

globals().update(PREDEFINED)  # MPI.INT, MPI.DOUBLE, ... (each in __all__ below)
globals()["2INT"] = PREDEFINED["TWOINT"]


def Get_hw_resource_info() -> Any:
    """Not offered: raises NotImplementedError."""
    raise NotImplementedError("MPI.Get_hw_resource_info is not offered by tensorcomm.MPI")


class Pickle:
    """How the object calls pickle: ``dumps``/``loads`` with the highest protocol. **``loads``
    runs code the data chose**: use among trusted processes only."""

    PROTOCOL = _pickle.HIGHEST_PROTOCOL

    def __init__(self, dumps: Any = None, loads: Any = None, protocol: int | None = None) -> None:
        self._dumps = dumps or _pickle.dumps
        self._loads = loads or _pickle.loads
        self.PROTOCOL = self.PROTOCOL if protocol is None else protocol

    def dumps(self, obj: Any) -> bytes:
        """``obj`` pickled."""
        return self._dumps(obj, self.PROTOCOL)

    def loads(self, data: Any) -> Any:
        """The object ``data`` holds."""
        return self._loads(data)


pickle = Pickle()


def Get_abi_version() -> tuple[int, int]:
    """(0, 0): no MPI ABI is implemented."""
    return 0, 0


def Pcontrol(level: int) -> None:
    """Profiling control: a no-op."""


def _unsupported(name: str, what: str) -> type:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"MPI.{name}: {what} are not offered by tensorcomm.MPI; see docs/mpi.md")

    return type(name, (), {"__init__": refuse, "__doc__": f"Not offered: {what}.",
                           "__init_subclass__": classmethod(lambda cls: None)})


Intercomm = _unsupported("Intercomm", "intercommunicators")
Cartcomm = _unsupported("Cartcomm", "process topologies")
Graphcomm = _unsupported("Graphcomm", "process topologies")
Distgraphcomm = _unsupported("Distgraphcomm", "process topologies")
Topocomm = _unsupported("Topocomm", "process topologies")
Win = _unsupported("Win", "one-sided windows")
File = _unsupported("File", "MPI-IO files")
Session = _unsupported("Session", "MPI sessions")
Errhandler = _unsupported("Errhandler", "error handler objects")


def Open_port(*args: Any) -> str:
    """Not offered: raises NotImplementedError."""
    raise NotImplementedError("MPI.Open_port: dynamic processes are not offered by tensorcomm.MPI")


def Attach_buffer(buf: Any) -> None:
    """Keep ``buf`` as the process's buffered-send buffer (not needed here)."""
    PROCESS.attach(buf)


def Detach_buffer() -> Any:
    """The buffer attached, handed back."""
    return PROCESS.detach()


def Flush_buffer() -> None:
    """Buffered sends are complete once started here: a no-op."""


__all__ = [  # every name the package offers (the datatypes come from PREDEFINED)
    "AINT", "ANY_SOURCE", "ANY_TAG", "Alloc_mem", "Attach_buffer", "BAND", "BOOL", "BOR", "BOTTOM",
    "BSEND_OVERHEAD", "BUFFER_AUTOMATIC", "BXOR", "BYTE", "CHAR", "CHARACTER", "COMM_NULL",
    "COMM_SELF", "COMM_TYPE_HW_GUIDED", "COMM_TYPE_HW_UNGUIDED", "COMM_TYPE_RESOURCE_GUIDED",
    "COMM_TYPE_SHARED", "COMM_WORLD", "COMPLEX", "COMPLEX16", "COMPLEX8", "CONGRUENT", "COUNT",
    "CXX_BOOL", "CXX_DOUBLE_COMPLEX", "CXX_FLOAT_COMPLEX", "CXX_LONG_DOUBLE_COMPLEX", "C_BOOL",
    "C_COMPLEX", "C_DOUBLE_COMPLEX", "C_FLOAT_COMPLEX", "C_LONG_DOUBLE_COMPLEX", "Cartcomm", "Comm",
    "DATATYPE_NULL", "DOUBLE", "DOUBLE_COMPLEX", "DOUBLE_INT", "DOUBLE_PRECISION", "Datatype",
    "Detach_buffer", "Distgraphcomm", "ERRHANDLER_NULL", "ERRORS_ABORT", "ERRORS_ARE_FATAL",
    "ERRORS_RETURN", "ERRORS_RETURN_HANDLER", "ERR_ARG", "ERR_BUFFER", "ERR_COMM", "ERR_COUNT",
    "ERR_GROUP", "ERR_INTERN", "ERR_IN_STATUS", "ERR_LASTCODE", "ERR_NOT_SAME", "ERR_OP",
    "ERR_OTHER", "ERR_PENDING", "ERR_PROC_FAILED", "ERR_RANK", "ERR_REQUEST", "ERR_REVOKED",
    "ERR_ROOT", "ERR_TAG", "ERR_TOPOLOGY", "ERR_TRUNCATE", "ERR_TYPE", "ERR_UNKNOWN",
    "ERR_UNSUPPORTED_OPERATION", "Errhandler", "Exception", "FLOAT", "FLOAT16_T", "FLOAT_INT",
    "File", "Finalize", "Flush_buffer", "Free_mem", "GROUP_EMPTY", "GROUP_NULL", "Get_abi_version",
    "Get_error_class", "Get_error_string", "Get_hw_resource_info", "Get_library_version",
    "Get_processor_name", "Get_version", "Graphcomm", "Grequest", "Group", "IDENT", "INFO_ENV",
    "INFO_NULL", "INT", "INT16_T", "INT32_T", "INT64_T", "INT8_T", "INTEGER", "INTEGER1",
    "INTEGER2", "INTEGER4", "INTEGER8", "INT_INT", "IN_PLACE", "Info", "Init", "Init_thread",
    "Intercomm", "Intracomm", "Is_finalized", "Is_initialized", "Is_thread_main", "KEYVAL_INVALID",
    "LAND", "LOGICAL", "LOGICAL1", "LOGICAL2", "LOGICAL4", "LOGICAL8", "LONG", "LONG_DOUBLE",
    "LONG_DOUBLE_INT", "LONG_INT", "LONG_LONG", "LONG_LONG_INT", "LOR", "LXOR", "MAX", "MAXLOC",
    "MAX_ERROR_STRING", "MAX_LIBRARY_VERSION_STRING", "MAX_PROCESSOR_NAME", "MESSAGE_NO_PROC",
    "MESSAGE_NULL", "MIN", "MINLOC", "Message", "NO_OP", "OFFSET", "OP_NULL", "Op", "Open_port",
    "PACKED", "PREDEFINED", "PROC_NULL", "PROD", "Pcontrol", "Pickle", "Prequest", "Query_thread",
    "REAL", "REAL2", "REAL4", "REAL8", "REPLACE", "REQUEST_NULL", "ROOT", "Request", "SHORT",
    "SHORT_FLOAT", "SHORT_INT", "SIGNED_CHAR", "SIMILAR", "SUBVERSION", "SUCCESS", "SUM", "Session",
    "Status", "TAG_UB", "THREAD_FUNNELED", "THREAD_MULTIPLE", "THREAD_SERIALIZED", "THREAD_SINGLE",
    "TWODOUBLE_PRECISION", "TWOINT", "TWOINTEGER", "TWOREAL", "Topocomm", "UINT16_T", "UINT32_T",
    "UINT64_T", "UINT8_T", "UNDEFINED", "UNEQUAL", "UNSIGNED", "UNSIGNED_CHAR", "UNSIGNED_INT",
    "UNSIGNED_LONG", "UNSIGNED_LONG_LONG", "UNSIGNED_SHORT", "VERSION", "WCHAR", "Win", "Wtick",
    "Wtime", "buffer", "get_vendor", "pickle",
]
