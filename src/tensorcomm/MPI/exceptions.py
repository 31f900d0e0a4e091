"""``MPI.Exception`` and the error classes: how tensorcomm's errors look to an mpi4py program.

Every error the module raises about the job is still tensorcomm's own (``PeerLostError`` naming
the rank, ``CollectiveMismatchError`` on every rank...) and is also an ``MPI.Exception``: its
class is swapped for a subclass of both (``as_mpi``), so ``except MPI.Exception`` and
``except tensorcomm.PeerLostError`` both catch it. Errors MPI reports and a program may catch
(a message longer than the receive buffer, a bad rank or tag) are ``MPI.Exception`` with the
error class MPI gives them, and leave the communicator usable. Imports only ``errors``.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from ..errors import CollectiveMismatchError, CommError, CommTimeoutError, PeerLostError

SUCCESS = 0
ERR_BUFFER = 1
ERR_COUNT = 2
ERR_TYPE = 3
ERR_TAG = 4
ERR_COMM = 5
ERR_RANK = 6
ERR_REQUEST = 7
ERR_ROOT = 8
ERR_GROUP = 9
ERR_OP = 10
ERR_TOPOLOGY = 11
ERR_DIMS = 12
ERR_ARG = 13
ERR_UNKNOWN = 14
ERR_TRUNCATE = 15
ERR_OTHER = 16
ERR_INTERN = 17
ERR_IN_STATUS = 18
ERR_PENDING = 19
ERR_NOT_SAME = 35
ERR_UNSUPPORTED_OPERATION = 52
ERR_PROC_FAILED = 75
ERR_REVOKED = 77
ERR_LASTCODE = 0x3FFFFFFF

_STRINGS = {
    SUCCESS: "No MPI error", ERR_BUFFER: "Invalid buffer pointer", ERR_COUNT: "Invalid count",
    ERR_TYPE: "Invalid datatype", ERR_TAG: "Invalid tag", ERR_COMM: "Invalid communicator",
    ERR_RANK: "Invalid rank", ERR_REQUEST: "Invalid request", ERR_ROOT: "Invalid root",
    ERR_GROUP: "Invalid group", ERR_OP: "Invalid MPI_Op", ERR_ARG: "Invalid argument",
    ERR_UNKNOWN: "Unknown error", ERR_TRUNCATE: "Message truncated", ERR_OTHER: "Other MPI error",
    ERR_INTERN: "Internal MPI error", ERR_IN_STATUS: "See the MPI_ERROR field in MPI_Status",
    ERR_PENDING: "Pending request", ERR_NOT_SAME: "Collective argument mismatch",
    ERR_UNSUPPORTED_OPERATION: "Unsupported operation", ERR_PROC_FAILED: "Process failed",
    ERR_REVOKED: "Communicator revoked",
}


def Get_error_string(errorcode: int) -> str:
    """The text of an error class or code."""
    return _STRINGS.get(int(errorcode), f"Unknown error code {errorcode}")


def Get_error_class(errorcode: int) -> int:
    """The error class of an error code (they are the same here)."""
    return int(errorcode)


class Exception(builtins.RuntimeError):  # noqa: A001 - mpi4py's name
    """mpi4py's ``MPI.Exception``: an error with an MPI error class.

    Args:
        ierr: the error class (``MPI.ERR_...``).
    """

    error_class = ERR_OTHER

    def __init__(self, ierr: int = ERR_OTHER, *args: Any) -> None:
        if isinstance(ierr, int) and not isinstance(ierr, bool):
            self.error_class = ierr
            super().__init__(*(args or (Get_error_string(ierr),)))
        else:
            super().__init__(ierr, *args)

    @property
    def error_code(self) -> int:
        """The error code (equal to the class)."""
        return self.Get_error_code()

    @property
    def error_string(self) -> str:
        """The error's text."""
        return self.Get_error_string()

    def Get_error_class(self) -> int:
        """The MPI error class."""
        return self.error_class

    def Get_error_code(self) -> int:
        """The MPI error code."""
        return self.error_class

    def Get_error_string(self) -> str:
        """The MPI text of the error class."""
        return Get_error_string(self.error_class)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, int):
            return self.error_class == other
        return builtins.Exception.__eq__(self, other)

    def __hash__(self) -> int:
        return hash(self.error_class)

    def __int__(self) -> int:
        return self.error_class


class ArgumentError(Exception, builtins.ValueError):
    """A bad argument: an ``MPI.Exception`` (its MPI error class) and a ``ValueError``."""


_ARGUMENT_CLASSES = frozenset({ERR_BUFFER, ERR_COUNT, ERR_TYPE, ERR_TAG, ERR_RANK, ERR_ROOT,
                               ERR_GROUP, ERR_OP, ERR_ARG, ERR_COMM, ERR_REQUEST})


def error(ierr: int, message: str) -> Exception:
    """An ``MPI.Exception`` of class ``ierr`` with tensorcomm's explanation (also a
    ``ValueError`` for a bad argument), raised on this rank before anything is sent."""
    kind = ArgumentError if ierr in _ARGUMENT_CLASSES else Exception
    return kind(ierr, f"{Get_error_string(ierr)}: {message}")


def _class_of(error: BaseException) -> int:
    if isinstance(error, PeerLostError):
        return ERR_PROC_FAILED
    if isinstance(error, CollectiveMismatchError):
        return ERR_NOT_SAME
    if isinstance(error, CommTimeoutError):
        return ERR_PENDING
    return ERR_OTHER


_DUALS: dict[type, type] = {}


def as_mpi(error: BaseException) -> BaseException:
    """``error`` itself, made an ``MPI.Exception`` as well (its class swapped for a subclass of
    both, once per class), so either ``except`` catches it."""
    if isinstance(error, Exception):
        return error
    kind = type(error)
    dual = _DUALS.get(kind)
    if dual is None:
        dual = type(kind.__name__, (kind, Exception), {"__module__": kind.__module__,
                                                        "__init__": kind.__init__})
        _DUALS[kind] = dual
    try:
        error.__class__ = dual
    except TypeError:  # a layout that cannot take it: leave it as it is
        return error
    error.error_class = _class_of(error)  # type: ignore[attr-defined]
    return error


F = TypeVar("F", bound=Callable[..., Any])


def translated(fn: F) -> F:
    """Make tensorcomm's job errors raised by ``fn`` also ``MPI.Exception``s."""
    @wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CommError as exc:
            raise as_mpi(exc) from None
    return call  # type: ignore[return-value]
