"""``MPI.Op``: the predefined reductions and ``Op.Create`` for a Python function.

An op reduces numpy arrays locally (``Reduce_local``, and the rank-ordered fallback of
``collectives.py``) and Python objects (the lowercase ``reduce``/``allreduce``); ``native``
says which ``tensorcomm.ReduceOp`` runs it inside tensorcomm's own reductions for a dtype, when
one does. Imports numpy, ``types`` and the MPI package's ``buffers``, ``datatype`` and
``exceptions``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from ..types import SUPPORTED_DTYPES, ReduceOp
from . import buffers, exceptions
from .datatype import Datatype

_SUPPORTED = SUPPORTED_DTYPES  # its ``in`` looks bfloat16 up only when one is seen (types.py)
# on bool arrays the logical ops are tensorcomm's own reductions
_LOGICAL_ON_BOOL = {"MPI_LAND": ReduceOp.MIN, "MPI_LOR": ReduceOp.MAX, "MPI_LXOR": ReduceOp.BXOR}


def _loc(better: Callable[[Any, Any], bool]) -> Callable[[Any, Any], Any]:
    def pick(x: Any, y: Any) -> Any:
        (xv, xi), (yv, yi) = x, y
        if better(xv, yv) or (xv == yv and xi < yi):
            return x
        return y
    return pick


def _loc_arrays(better: np.ufunc) -> Callable[[np.ndarray, np.ndarray], None]:
    def reduce(left: np.ndarray, right: np.ndarray) -> None:
        names = right.dtype.names
        assert names is not None
        value, index = names
        lv, li, rv, ri = left[value], left[index], right[value], right[index]
        take = better(lv, rv) | ((lv == rv) & (li < ri))
        right[take] = left[take]
    return reduce


def _logical(ufunc: np.ufunc) -> Callable[[np.ndarray, np.ndarray], None]:
    def reduce(left: np.ndarray, right: np.ndarray) -> None:
        right[...] = ufunc(left, right)
    return reduce


def _ufunc(ufunc: np.ufunc) -> Callable[[np.ndarray, np.ndarray], None]:
    def reduce(left: np.ndarray, right: np.ndarray) -> None:
        ufunc(left, right, out=right)
    return reduce


def _replace(left: np.ndarray, right: np.ndarray) -> None:
    right[...] = left


def _no_op(left: np.ndarray, right: np.ndarray) -> None:
    pass


class Op:
    """An MPI reduction operation (``Op()`` is ``OP_NULL``; ``Op(op)`` is the same op)."""

    __slots__ = ("_name", "_arrays", "_objects", "_user", "_commute", "_native", "_origin", "_by_dtype")

    def __init__(self, op: Op | None = None) -> None:
        self._name: str = "MPI_OP_NULL" if op is None else op._name
        self._arrays: Callable[[np.ndarray, np.ndarray], None] | None = None if op is None else op._arrays
        self._objects: Callable[[Any, Any], Any] | None = None if op is None else op._objects
        self._user: Callable[..., Any] | None = None if op is None else op._user
        self._commute: bool = True if op is None else op._commute
        self._native: ReduceOp | None = None if op is None else op._native
        self._origin: object = None if op is None else op._origin  # which Op.Create made it
        self._by_dtype: dict[np.dtype, ReduceOp | None] = {}  # ``native``'s answers

    @classmethod
    def _predefined(cls, name: str, arrays: Callable[[np.ndarray, np.ndarray], None],
                    objects: Callable[[Any, Any], Any], native: ReduceOp | None) -> Op:
        op = cls()
        op._name, op._arrays, op._objects, op._native = f"MPI_{name}", arrays, objects, native
        return op

    @classmethod
    def Create(cls, function: Callable[..., Any], commute: bool = False) -> Op:
        """An op from ``function(inbuf, inoutbuf, datatype)``, which writes ``inbuf op inoutbuf``
        into ``inoutbuf`` (byte buffers; ``datatype`` None for Python objects)."""
        if not callable(function):
            raise TypeError(f"Op.Create: function must be callable, got {type(function).__name__}")
        op = cls()
        op._name = f"user:{getattr(function, '__name__', 'op')}"
        op._user, op._commute = function, bool(commute)
        op._origin = object()
        return op

    def __bool__(self) -> bool:
        return self._arrays is not None or self._user is not None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Op):
            return NotImplemented
        return self._name == other._name and self._origin is other._origin

    def __hash__(self) -> int:
        return hash(self._name)

    def __repr__(self) -> str:
        return f"<MPI.Op {self._name}>"

    @property
    def is_predefined(self) -> bool:
        """Whether the op is one of MPI's own."""
        return self._user is None

    @property
    def is_commutative(self) -> bool:
        """Whether the op commutes."""
        return self._commute

    def Is_commutative(self) -> bool:
        """Whether the op commutes."""
        return self._commute

    def Free(self) -> None:
        """Release a user op (a predefined one cannot be freed)."""
        if self._user is None:
            raise exceptions.error(exceptions.ERR_OP, f"cannot free the predefined {self._name}")
        self._user = self._origin = None
        self._name = "MPI_OP_NULL"

    def _check(self) -> None:
        if not self:
            raise exceptions.error(exceptions.ERR_OP, "the op is MPI.OP_NULL")

    def native(self, dtype: np.dtype) -> ReduceOp | None:
        """The tensorcomm reduction that computes this op on ``dtype`` arrays, if one does."""
        try:
            return self._by_dtype[dtype]
        except KeyError:
            found = self._by_dtype[dtype] = self._find_native(dtype)
            return found

    def _find_native(self, dtype: np.dtype) -> ReduceOp | None:
        native = self._native
        if native is None or dtype not in _SUPPORTED:
            if self._name in ("MPI_LAND", "MPI_LOR", "MPI_LXOR") and dtype == np.bool_:
                return _LOGICAL_ON_BOOL[self._name]
            return None
        kind = dtype.kind
        if kind == "c" and native is not ReduceOp.SUM:
            return None
        if kind in "fc" and native in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR):
            return None
        return native

    def reduce_arrays(self, left: np.ndarray, right: np.ndarray, datatype: Datatype) -> None:
        """``right = left op right``, element-wise, in place.

        Raises:
            MPI.Exception: ERR_OP, the op is not defined on the datatype.
        """
        self._check()
        if self._user is not None:
            incoming = bytearray(left.view(np.uint8).tobytes())
            inout = bytearray(right.view(np.uint8).tobytes())
            self._user(incoming, inout, datatype)
            right.view(np.uint8)[...] = np.frombuffer(inout, np.uint8)
            return
        assert self._arrays is not None
        try:
            self._arrays(left, right)
        except (TypeError, ValueError) as exc:
            raise exceptions.error(exceptions.ERR_OP, f"{self._name} is not defined on "
                                   f"{datatype.name}: {exc}") from None

    def __reduce__(self) -> Any:
        for name, op in _NAMED.items():
            if self is op:
                return name
        if self._user is not None:
            return Op.Create, (self._user, self._commute)
        return Op, (_NAMED.get(self._name.removeprefix("MPI_"), OP_NULL),)

    def __call__(self, x: Any, y: Any) -> Any:
        """``x op y`` on Python objects (a user op gets ``(x, y, None)``)."""
        if not self:
            raise ValueError("MPI.OP_NULL cannot be applied")
        if self._user is not None:
            return self._user(x, y, None)
        assert self._objects is not None
        return self._objects(x, y)

    def Reduce_local(self, inbuf: Any, inoutbuf: Any) -> None:
        """``inoutbuf = inbuf op inoutbuf``, element-wise, on this process."""
        left = buffers.message(inbuf, "Reduce_local", False)
        right = buffers.message(inoutbuf, "Reduce_local", True)
        if left.array.nbytes != right.array.nbytes:
            raise ValueError(f"Reduce_local: inbuf holds {left.length} elements and inoutbuf {right.length}")
        self.reduce_arrays(left.array.view(right.array.dtype), right.array, right.datatype)


OP_NULL = Op()
SUM = Op._predefined("SUM", _ufunc(np.add), operator.add, ReduceOp.SUM)
PROD = Op._predefined("PROD", _ufunc(np.multiply), operator.mul, ReduceOp.PROD)
MAX = Op._predefined("MAX", _ufunc(np.maximum), lambda x, y: y if y > x else x, ReduceOp.MAX)
MIN = Op._predefined("MIN", _ufunc(np.minimum), lambda x, y: y if y < x else x, ReduceOp.MIN)
LAND = Op._predefined("LAND", _logical(np.logical_and), lambda x, y: bool(x and y), None)
LOR = Op._predefined("LOR", _logical(np.logical_or), lambda x, y: bool(x or y), None)
LXOR = Op._predefined("LXOR", _logical(np.logical_xor), lambda x, y: bool(x) != bool(y), None)
BAND = Op._predefined("BAND", _ufunc(np.bitwise_and), operator.and_, ReduceOp.BAND)
BOR = Op._predefined("BOR", _ufunc(np.bitwise_or), operator.or_, ReduceOp.BOR)
BXOR = Op._predefined("BXOR", _ufunc(np.bitwise_xor), operator.xor, ReduceOp.BXOR)
MAXLOC = Op._predefined("MAXLOC", _loc_arrays(np.greater), _loc(operator.gt), None)
MINLOC = Op._predefined("MINLOC", _loc_arrays(np.less), _loc(operator.lt), None)
REPLACE = Op._predefined("REPLACE", _replace, lambda x, y: y, None)
NO_OP = Op._predefined("NO_OP", _no_op, lambda x, y: x, None)
_NAMED = {name: op for name, op in globals().items() if isinstance(op, Op)}
