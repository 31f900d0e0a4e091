"""numpy references for collective results and deterministic per-rank test data."""

from __future__ import annotations

from collections.abc import Sequence

import ml_dtypes
import numpy as np

from ..algorithms import kernels
from ..types import PremulSum, ReduceOp

_UFUNC = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply, ReduceOp.MIN: np.minimum,
          ReduceOp.MAX: np.maximum, ReduceOp.BAND: np.bitwise_and, ReduceOp.BOR: np.bitwise_or,
          ReduceOp.BXOR: np.bitwise_xor}


def rank_data(rank: int, shape: int | Sequence[int], dtype: np.dtype | type, salt: int = 0,
              op: ReduceOp | PremulSum = ReduceOp.SUM) -> np.ndarray:
    """Deterministic data for ``rank``: small integers, so float sums are exact in any order."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(1000 * rank + salt)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    low, high = (1, 3) if op is ReduceOp.PROD else (0, 10)
    values = rng.integers(low, high, shape)
    if dtype.kind == "c":
        return (values + 1j * rng.integers(low, high, shape)).astype(dtype)
    return values.astype(dtype)


def reduce_reference(op: ReduceOp | PremulSum, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The reduction of ``arrays`` (one per rank, rank order), in float64/complex128 for floats."""
    dtype = arrays[0].dtype
    wide = np.complex128 if dtype.kind == "c" else np.float64 if dtype.kind == "f" or \
        dtype == ml_dtypes.bfloat16 else dtype
    stack = [a.astype(wide) for a in arrays]
    if isinstance(op, PremulSum):
        stack = [a * op.factor for a in stack]
        op = ReduceOp.SUM
    if op is ReduceOp.AVG:
        return _average(stack, dtype)
    result = stack[0].copy()
    for other in stack[1:]:
        _UFUNC[op](result, other, out=result)
    return result.astype(dtype)


def _average(stack: list[np.ndarray], dtype: np.dtype) -> np.ndarray:
    """AVG: the mean for floats; for integers the (wrapped) sum divided by the count and rounded
    toward zero, in Python integers; for bool True where every term is."""
    if dtype.kind == "b":
        return np.logical_and.reduce(stack)
    total = np.add.reduce(np.stack(stack), axis=0, dtype=stack[0].dtype)  # wraps as the kernels do
    if dtype.kind not in "iu":
        return (total / len(stack)).astype(dtype)
    quotients = [abs(v) // len(stack) * (-1 if v < 0 else 1) for v in total.reshape(-1).tolist()]
    return np.array(quotients, dtype=dtype).reshape(total.shape)


def reduces(op: ReduceOp | PremulSum, dtype: np.dtype | type) -> bool:
    """Whether the reductions (all_reduce, reduce, reduce_scatter, scan) take ``op`` on arrays of
    ``dtype``: what a test iterating over ops and dtypes keeps."""
    try:
        kernels.check_op_dtype(op, np.dtype(dtype))
    except (TypeError, ValueError):
        return False
    return True
