"""``MPI.Datatype``: the predefined datatypes as numpy dtypes, and contiguous derived ones.

A datatype is a numpy dtype (its element) and a multiplicity: ``Create_contiguous(n)`` of a type
is ``n`` of its elements back to back. Every other constructor of derived datatypes (vector,
indexed, struct, subarray, darray, resized) raises ``NotImplementedError`` naming the call:
tensorcomm moves contiguous memory only. Imports numpy and ``MPI.exceptions``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import exceptions


def _unsupported(call: str) -> NotImplementedError:
    return NotImplementedError(f"MPI.Datatype.{call}: tensorcomm.MPI offers contiguous datatypes "
                               "only (Create_contiguous); see docs/mpi.md")


class Datatype:
    """An MPI datatype: ``count`` elements of the numpy dtype ``dtype`` (None: DATATYPE_NULL)."""

    __slots__ = ("dtype", "count", "name", "committed", "base", "__weakref__")

    def __init__(self, datatype: Datatype | None = None) -> None:
        self.dtype: np.dtype | None = None if datatype is None else datatype.dtype
        self.count: int = 1 if datatype is None else datatype.count
        self.name: str = "MPI_DATATYPE_NULL" if datatype is None else datatype.name
        self.committed = True
        self.base: Datatype | None = None if datatype is None else datatype.base

    @classmethod
    def _make(cls, name: str, dtype: Any, count: int = 1, base: Datatype | None = None) -> Datatype:
        made = cls()
        made.dtype, made.count, made.name, made.base = np.dtype(dtype), count, name, base
        return made

    def __bool__(self) -> bool:
        return self.dtype is not None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Datatype):
            return NotImplemented
        return (self.dtype, self.count, self.name) == (other.dtype, other.count, other.name)

    def __hash__(self) -> int:
        return hash((self.name, self.count))

    def __repr__(self) -> str:
        return f"<MPI.Datatype {self.name}>"

    @property
    def size(self) -> int:
        """Bytes of data in one element of this type."""
        return self.Get_size()

    @property
    def extent(self) -> int:
        """Bytes one element of this type spans."""
        return self.Get_size()

    @property
    def lb(self) -> int:
        """Lower bound (always 0 here)."""
        return 0

    @property
    def ub(self) -> int:
        """Upper bound (the extent here)."""
        return self.Get_size()

    @property
    def true_lb(self) -> int:
        """True lower bound (0)."""
        return 0

    @property
    def true_extent(self) -> int:
        """True extent (the size)."""
        return self.Get_size()

    @property
    def is_predefined(self) -> bool:
        """Whether the type is one of the named ones."""
        return self.base is None

    def _checked(self) -> np.dtype:
        if self.dtype is None:
            raise exceptions.error(exceptions.ERR_TYPE, "the datatype is MPI.DATATYPE_NULL")
        return self.dtype

    def Get_size(self) -> int:
        """Bytes of data in one element of this type."""
        return self._checked().itemsize * self.count

    def Get_extent(self) -> tuple[int, int]:
        """``(lb, extent)`` of this type."""
        return 0, self.Get_size()

    def Get_true_extent(self) -> tuple[int, int]:
        """``(true_lb, true_extent)`` of this type."""
        return 0, self.Get_size()

    def Get_name(self) -> str:
        """The type's name."""
        return self.name

    def Set_name(self, name: str) -> None:
        """Rename the type."""
        self.name = str(name)

    def Dup(self) -> Datatype:
        """A copy of this type."""
        return Datatype._make(self.name, self._checked(), self.count, self.base or self)

    def Create_contiguous(self, count: int) -> Datatype:
        """``count`` elements of this type back to back."""
        if count < 0:
            raise exceptions.error(exceptions.ERR_COUNT, f"count must be >= 0, got {count}")
        made = Datatype._make(f"contiguous({count}, {self.name})", self._checked(), self.count * count,
                              self)
        made.committed = False
        return made

    def Commit(self) -> Datatype:
        """Make the type usable in communication; returns it."""
        self.committed = True
        return self

    def Free(self) -> None:
        """Release a derived type (a predefined one cannot be freed)."""
        if self.base is None:
            raise exceptions.error(exceptions.ERR_TYPE, f"cannot free the predefined {self.name}")
        self.dtype = None

    def tocode(self) -> str:
        """The numpy type character of the element."""
        return self._checked().char

    def Create_vector(self, *args: Any) -> Datatype:
        """Not offered: raises NotImplementedError."""
        raise _unsupported("Create_vector")

    def Create_hvector(self, *args: Any) -> Datatype:
        """Not offered: raises NotImplementedError."""
        raise _unsupported("Create_hvector")

    def Create_indexed(self, *args: Any) -> Datatype:
        """Not offered: raises NotImplementedError."""
        raise _unsupported("Create_indexed")

    def Create_hindexed(self, *args: Any) -> Datatype:
        """Not offered: raises NotImplementedError."""
        raise _unsupported("Create_hindexed")

    def Create_indexed_block(self, *args: Any) -> Datatype:
        """Not offered: raises NotImplementedError."""
        raise _unsupported("Create_indexed_block")

    def Create_hindexed_block(self, *args: Any) -> Datatype:
        """Not offered: raises NotImplementedError."""
        raise _unsupported("Create_hindexed_block")

    def Create_subarray(self, *args: Any) -> Datatype:
        """Not offered: raises NotImplementedError."""
        raise _unsupported("Create_subarray")

    def Create_darray(self, *args: Any) -> Datatype:
        """Not offered: raises NotImplementedError."""
        raise _unsupported("Create_darray")

    def Create_resized(self, *args: Any) -> Datatype:
        """Not offered: raises NotImplementedError."""
        raise _unsupported("Create_resized")

    @classmethod
    def Create_struct(cls, *args: Any) -> Datatype:
        """Not offered: raises NotImplementedError."""
        raise _unsupported("Create_struct")

    def Pack(self, *args: Any) -> int:
        """Not offered: raises NotImplementedError."""
        raise _unsupported("Pack")

    def Unpack(self, *args: Any) -> int:
        """Not offered: raises NotImplementedError."""
        raise _unsupported("Unpack")


def _pair(value: str) -> np.dtype:
    return np.dtype([("value", value), ("index", "i4")], align=True)


DATATYPE_NULL = Datatype()
_TABLE: dict[str, Any] = {
    "CHAR": "S1", "WCHAR": "U1", "SIGNED_CHAR": "i1", "UNSIGNED_CHAR": "u1", "SHORT": "h",
    "UNSIGNED_SHORT": "H", "INT": "i", "UNSIGNED": "I", "UNSIGNED_INT": "I", "LONG": "l",
    "UNSIGNED_LONG": "L", "LONG_LONG": "q", "UNSIGNED_LONG_LONG": "Q", "LONG_LONG_INT": "q",
    "FLOAT": "f", "DOUBLE": "d", "LONG_DOUBLE": "g", "C_BOOL": "?", "BOOL": "?", "CXX_BOOL": "?",
    "INT8_T": "i1", "INT16_T": "i2", "INT32_T": "i4", "INT64_T": "i8", "UINT8_T": "u1",
    "UINT16_T": "u2", "UINT32_T": "u4", "UINT64_T": "u8", "C_COMPLEX": "F", "C_FLOAT_COMPLEX": "F",
    "C_DOUBLE_COMPLEX": "D", "C_LONG_DOUBLE_COMPLEX": "G", "CXX_FLOAT_COMPLEX": "F",
    "CXX_DOUBLE_COMPLEX": "D", "CXX_LONG_DOUBLE_COMPLEX": "G", "BYTE": "u1", "PACKED": "u1",
    "AINT": "i8", "OFFSET": "i8", "COUNT": "i8", "SHORT_FLOAT": "e", "FLOAT16_T": "e",
    "CHARACTER": "S1", "LOGICAL": "i4", "INTEGER": "i4", "REAL": "f4", "DOUBLE_PRECISION": "f8",
    "COMPLEX": "c8", "DOUBLE_COMPLEX": "c16", "LOGICAL1": "i1", "LOGICAL2": "i2", "LOGICAL4": "i4",
    "LOGICAL8": "i8", "INTEGER1": "i1", "INTEGER2": "i2", "INTEGER4": "i4", "INTEGER8": "i8",
    "REAL2": "e", "REAL4": "f4", "REAL8": "f8", "COMPLEX8": "c8", "COMPLEX16": "c16",
    "SHORT_INT": _pair("h"), "TWOINT": _pair("i"), "INT_INT": _pair("i"), "LONG_INT": _pair("l"),
    "FLOAT_INT": _pair("f"), "DOUBLE_INT": _pair("d"), "LONG_DOUBLE_INT": _pair("g"),
    "TWOREAL": [("v", "f4"), ("i", "f4")], "TWODOUBLE_PRECISION": [("v", "f8"), ("i", "f8")],
    "TWOINTEGER": [("v", "i4"), ("i", "i4")],
}
PREDEFINED: dict[str, Datatype] = {name: Datatype._make(f"MPI_{name}", dtype)
                                   for name, dtype in _TABLE.items()}
PREDEFINED["TWOINT"].name = PREDEFINED["INT_INT"].name = "MPI_2INT"

# numpy type character -> the datatype a buffer of it gets when the message names none
_BY_CHAR: dict[str, Datatype] = {}
for _name in ("C_BOOL", "SIGNED_CHAR", "UNSIGNED_CHAR", "SHORT", "UNSIGNED_SHORT", "INT", "UNSIGNED",
              "LONG", "UNSIGNED_LONG", "LONG_LONG", "UNSIGNED_LONG_LONG", "FLOAT", "DOUBLE",
              "LONG_DOUBLE", "C_FLOAT_COMPLEX", "C_DOUBLE_COMPLEX", "C_LONG_DOUBLE_COMPLEX",
              "SHORT_FLOAT", "CHAR", "WCHAR"):
    _type = PREDEFINED[_name]
    assert _type.dtype is not None
    _BY_CHAR.setdefault(_type.dtype.char, _type)


def of_dtype(dtype: np.dtype) -> Datatype:
    """The datatype of a buffer of ``dtype`` given without one (bytes for anything unnamed)."""
    found = _BY_CHAR.get(dtype.char)
    if found is not None and found.dtype == dtype:
        return found
    if dtype.isbuiltin and dtype.kind in "biufc":
        for candidate in _BY_CHAR.values():
            if candidate.dtype == dtype:
                return candidate
    return Datatype._make(f"bytes({dtype.itemsize})", np.dtype(np.uint8), dtype.itemsize, PREDEFINED["BYTE"])
