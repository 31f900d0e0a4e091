"""Enumerations and small value types shared by every layer.

Strings such as ``"sum"`` are accepted only at the frontend edge and normalised once through
:meth:`ReduceOp.parse`; everything below the frontends sees enum members.
"""

from __future__ import annotations

import enum
import numbers
from dataclasses import dataclass

import ml_dtypes
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

# Every dtype tensorcomm moves and reduces; bfloat16 comes from ml_dtypes.
SUPPORTED_DTYPES: tuple[np.dtype, ...] = tuple(np.dtype(t) for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.complex64, np.complex128))


class TransportKind(enum.Enum):
    """How two ranks exchange bytes: ``TCP`` or ``SHM`` (shared memory)."""

    TCP = "tcp"
    SHM = "shm"
