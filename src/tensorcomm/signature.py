"""What a collective call is, as a few small integers every rank can compare cheaply.

Each call carries a ``Signature``; transports and shared-memory algorithms compare the peers'
signatures with their own, so ranks that called different collectives, sizes, dtypes, ops or
roots at the same step raise ``CollectiveMismatchError`` instead of exchanging garbage. Integers
(not strings) keep the per-call cost to building one tuple; ``describe`` turns one into text
only when there is an error to report.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .types import DTYPE_CODE, SUPPORTED_DTYPES, PremulSum, ReduceOp

COLLECTIVES = ("none", "all_reduce", "reduce", "broadcast", "all_gather", "gather", "scatter",
               "reduce_scatter", "all_to_all", "barrier", "scan", "exscan", "split")
_COLLECTIVE_CODE = {name: code for code, name in enumerate(COLLECTIVES)}
_OPS = (None, *ReduceOp)
_OP_CODE = {op: code for code, op in enumerate(_OPS)}
NO_ROOT = -1
UNCHECKED = -1  # a count that may legitimately differ between ranks (uneven all_to_all)
# The code of a persistent collective's creation (``all_reduce_init``) is its collective's plus
# this: every member checks that the others create the same call, and any other call at that
# step differs from it.
INIT = 64


class Signature(NamedTuple):
    """``(collective, dtype, elements, op, root)`` codes; equal on every rank of a matching call.

    ``elements`` is the call's element count (``count`` would hide ``tuple.count``).
    """

    collective: int
    dtype: int
    elements: int
    op: int
    root: int

    def describe(self) -> str:
        """Readable form, e.g. ``all_reduce(float32[4], op=sum)``."""
        code, suffix = (self.collective - INIT, "_init") if self.collective >= INIT else (self.collective, "")
        name = COLLECTIVES[code] + suffix if 0 <= code < len(COLLECTIVES) else "?"
        dtype = SUPPORTED_DTYPES[self.dtype - 1].name if 0 < self.dtype <= len(SUPPORTED_DTYPES) else "?"
        shape = "" if self.elements == UNCHECKED else f"[{self.elements}]"
        parts = [f"{dtype}{shape}"] if self.dtype else []
        if self.op:
            parts.append(f"op={_OPS[self.op].value if 0 < self.op < len(_OPS) else '?'}")
        if self.root != NO_ROOT:
            parts.append(f"root={self.root}")
        return f"{name}({', '.join(parts)})"


NO_SIGNATURE = Signature(0, 0, 0, 0, NO_ROOT)


def creation(sig: Signature) -> Signature:
    """The signature of creating a persistent call of ``sig`` (``all_reduce_init(...)``)."""
    return sig._replace(collective=sig.collective + INIT)


def signature(collective: str, dtype: np.dtype | None = None, count: int = 0,
              op: ReduceOp | PremulSum | None = None, root: int = NO_ROOT) -> Signature:
    """The signature of one call (``op`` may be a PremulSum: it counts as PREMUL_SUM)."""
    if isinstance(op, PremulSum):
        op = ReduceOp.PREMUL_SUM
    # A dtype's code is its position in SUPPORTED_DTYPES plus one: 0 is "no dtype".
    return Signature(_COLLECTIVE_CODE[collective], DTYPE_CODE.get(dtype, -1) + 1 if dtype is not None else 0,
                     count, _OP_CODE[op], root)
