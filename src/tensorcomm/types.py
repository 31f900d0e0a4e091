"""Enumerations and small value types shared by every layer.

Strings such as ``"sum"`` are accepted only at the frontend edge and normalised once through
:meth:`ReduceOp.parse`; everything below the frontends sees enum members.
"""

from __future__ import annotations

import enum
import numbers
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np


class ReduceOp(enum.Enum):
    """Element-wise reduction applied by all_reduce, reduce and reduce_scatter.

    Members: ``SUM``, ``PROD``, ``MIN``, ``MAX``, ``AVG``, ``BAND``, ``BOR``, ``BXOR`` and
    ``PREMUL_SUM``; a member's name as a string, in any case (``"sum"``, ``"MAX"``), works too.
    ``AVG`` divides the sum by the group size and needs a float or complex dtype. ``PREMUL_SUM``
    multiplies every input by a factor before summing; build it with ``ReduceOp.premul_sum``.
    Bool arrays reduce logically (``SUM``/``MAX`` are "or", ``PROD``/``MIN`` are "and"); ``MIN``,
    ``MAX`` and ``PROD`` are not defined for complex dtypes.
    """

    SUM = "sum"
    PROD = "prod"
    MIN = "min"
    MAX = "max"
    AVG = "avg"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"
    PREMUL_SUM = "premul_sum"

    @staticmethod
    def premul_sum(factor: float) -> PremulSum:
        """Return a SUM that first multiplies each rank's input by ``factor``.

        Raises:
            TypeError: ``factor`` is not a real number.
        """
        if isinstance(factor, bool) or not isinstance(factor, numbers.Real):
            raise TypeError(f"premul_sum: factor must be a real number, got {type(factor).__name__}")
        return PremulSum(float(factor))

    @classmethod
    def parse(cls, op: ReduceOpLike, argument: str = "op") -> ReduceOp | PremulSum:
        """Normalise a ``ReduceOp``, ``PremulSum`` or name such as ``"sum"``/``"MAX"``.

        Raises:
            TypeError: ``op`` is neither a ReduceOp nor a string.
            ValueError: the string names no reduction.
        """
        if isinstance(op, (ReduceOp, PremulSum)):
            if op is ReduceOp.PREMUL_SUM:
                raise ValueError(f"{argument}: use ReduceOp.premul_sum(factor) to give PREMUL_SUM its factor")
            return op
        if isinstance(op, str):
            try:
                return cls(op.lower())
            except ValueError:
                names = ", ".join(m.value for m in cls if m is not cls.PREMUL_SUM)
                raise ValueError(f"{argument}: unknown reduction {op!r}; expected one of {names}") from None
        raise TypeError(f"{argument}: expected a tensorcomm.ReduceOp or a string such as 'sum', "
                        f"got {type(op).__name__}")


@dataclass(frozen=True)
class PremulSum:
    """A SUM whose inputs are first multiplied by ``factor`` (see ``ReduceOp.premul_sum``)."""

    factor: float

    @property
    def value(self) -> str:
        """``"premul_sum(<factor>)"``, as a ``ReduceOp`` member's ``value`` names it."""
        return f"premul_sum({self.factor})"


ReduceOpLike = ReduceOp | PremulSum | str

class _DtypeTable(Sequence[np.dtype]):
    """Every dtype tensorcomm moves and reduces, in the order of their codes. bfloat16 comes from
    ml_dtypes, imported only when first needed (``bfloat16``): it costs more to import than all
    of tensorcomm, and an array of bfloat16 exists only once some module imported it."""

    def __init__(self, entries: Sequence[np.dtype | None]) -> None:
        self._entries = list(entries)  # None: bfloat16, not looked up yet

    def __len__(self) -> int:
        return len(self._entries)

    @overload
    def __getitem__(self, index: int) -> np.dtype: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[np.dtype]: ...

    def __getitem__(self, index: int | slice) -> np.dtype | Sequence[np.dtype]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        entry = self._entries[index]
        return bfloat16() if entry is None else entry

    def __iter__(self) -> Iterator[np.dtype]:
        return (self[i] for i in range(len(self)))

    def __contains__(self, dtype: object) -> bool:
        return dtype in SUPPORTED or is_bfloat16(dtype)

    def names(self) -> list[str]:
        """Every dtype's name, in order (without importing ml_dtypes)."""
        return ["bfloat16" if entry is None else entry.name for entry in self._entries]

    def index(self, dtype: object, start: int = 0, stop: int | None = None) -> int:
        """The code (position) of ``dtype``; ValueError if it is not supported."""
        if is_bfloat16(dtype):
            return self._entries.index(bfloat16(), start, len(self) if stop is None else stop)
        return self._entries.index(dtype, start, len(self) if stop is None else stop)  # type: ignore[arg-type]


_BFLOAT16_CODE = 10
SUPPORTED_DTYPES = _DtypeTable([np.dtype(t) if t is not None else None for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, None, np.float32, np.float64, np.complex64, np.complex128)])
# The dtypes known so far, for a membership test without Python frames on the hot path
# (bfloat16 joins once looked up), and each one's position in ``SUPPORTED_DTYPES``.
SUPPORTED: set[np.dtype] = {t for t in SUPPORTED_DTYPES._entries if t is not None}
DTYPE_CODE: dict[np.dtype, int] = {t: code for code, t in enumerate(SUPPORTED_DTYPES._entries)
                                   if t is not None}


def bfloat16() -> np.dtype:
    """ml_dtypes' bfloat16 (imported now if nobody did), from now on in ``SUPPORTED``."""
    dtype = SUPPORTED_DTYPES._entries[_BFLOAT16_CODE]
    if dtype is None:
        import ml_dtypes

        dtype = np.dtype(ml_dtypes.bfloat16)
        SUPPORTED_DTYPES._entries[_BFLOAT16_CODE] = dtype
        DTYPE_CODE[dtype] = _BFLOAT16_CODE
        SUPPORTED.add(dtype)
    return dtype


def is_bfloat16(dtype: object) -> bool:
    """Whether ``dtype`` is ml_dtypes' bfloat16; imports ml_dtypes only if it is loaded already
    (an array of bfloat16 cannot exist otherwise)."""
    return (getattr(dtype, "name", None) == "bfloat16" and "ml_dtypes" in sys.modules
            and dtype == bfloat16())


if "ml_dtypes" in sys.modules:  # loaded already: costs nothing
    bfloat16()


class TransportKind(enum.Enum):
    """How two ranks exchange bytes: ``TCP`` or ``SHM`` (shared memory)."""

    TCP = "tcp"
    SHM = "shm"
