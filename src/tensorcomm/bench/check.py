"""Benchmark buffers: their per-rank layout, the data written into them, the count of wrong results.

Every rank's input repeats a short pattern that depends on the rank (values are small integers, so
sums, products, minima and maxima are exact in every dtype and every order). The expected output
then repeats a pattern too, computed once by ``tensorcomm.testing.reference`` on pattern-sized
arrays, and a whole buffer is checked against it through a reshape, without materialising the
expected buffer (which matters at 256 MiB). A result counts as wrong element by element, as
nccl-tests' ``-c`` does. ``avg`` is checked with a tolerance of a few units in the last place,
since libraries may divide before or after summing.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tensorcomm.testing.reference import reduce_reference
from tensorcomm.types import ReduceOp

PERIOD = 8  # length of every rank's repeating pattern
ROOT = 0  # the root of rooted collectives

DTYPES: dict[str, np.dtype] = {name: np.dtype(t) for name, t in (
    ("float32", np.float32), ("float64", np.float64), ("float16", np.float16),
    ("bfloat16", ml_dtypes.bfloat16), ("int8", np.int8), ("uint8", np.uint8),
    ("int32", np.int32), ("int64", np.int64))}
OPS = ("sum", "prod", "min", "max", "avg")


def layout(collective: str, count: int, ranks: int, rank: int) -> tuple[int, int | None]:
    """Elements of this rank's (input, output) buffers; output ``None``: the result is in place.

    ``count`` is the whole buffer (see ``formulas``); a rank without a part (a non-root's output
    of gather, input of scatter) gets 0 elements.
    """
    block = count // ranks
    root = rank == ROOT
    return {
        "all_reduce": (count, None), "broadcast": (count, None), "reduce": (count, None),
        "all_gather": (block, count), "reduce_scatter": (count, block),
        "all_to_all": (count, count),
        "gather": (block, count if root else 0), "scatter": (count if root else 0, block),
        "send_recv": (count, None),
    }[collective]


def _pattern(rank: int, dtype: np.dtype, op: str) -> np.ndarray:
    """Rank ``rank``'s repeating pattern; products use 1 and 2 only so they stay exact."""
    steps = (np.arange(PERIOD) + rank) % (2 if op == "prod" else PERIOD)
    return (steps + (1 if op == "prod" else 0)).astype(dtype)


def _tile(pattern: np.ndarray, start: int, length: int) -> np.ndarray:
    """``length`` elements of the infinite repetition of ``pattern``, from index ``start``."""
    return np.resize(np.roll(pattern, -(start % PERIOD)), length)


def fill_input(collective: str, op: str, dtype: np.dtype, count: int, ranks: int,
               rank: int) -> np.ndarray:
    """The input this rank starts with: its pattern over the whole input buffer.

    The root's input of scatter is block ``i`` = rank ``i``'s pattern, so each rank can check
    its own block.
    """
    length = layout(collective, count, ranks, rank)[0]
    if collective == "scatter" and length:
        block = count // ranks
        return np.concatenate([_tile(_pattern(r, dtype, op), 0, block) for r in range(ranks)])
    return _tile(_pattern(rank, dtype, op), 0, length)


def _mismatches(actual: np.ndarray, pattern: np.ndarray, start: int, tolerance: float) -> int:
    """How many elements of ``actual`` differ from the repetition of ``pattern`` from ``start``."""
    shifted = np.roll(pattern, -(start % PERIOD))
    whole = actual.size // PERIOD * PERIOD
    parts = ((actual[:whole].reshape(-1, PERIOD), shifted),
             (actual[whole:], shifted[:actual.size - whole]))
    if tolerance == 0:
        return sum(int(np.count_nonzero(a != e)) for a, e in parts)
    return sum(int(np.count_nonzero(~(np.abs(a.astype(np.float64) - e.astype(np.float64))
                                      <= tolerance))) for a, e in parts)


def _tolerance(op: str, dtype: np.dtype) -> float:
    if op != "avg":
        return 0.0
    # A few ulps at the largest pattern value, for a division done before or after the sum.
    return 4 * float(ml_dtypes.finfo(dtype).eps) * PERIOD


def count_wrong(collective: str, op: str, dtype: np.dtype, count: int, ranks: int, rank: int,
                result: np.ndarray) -> int:
    """Wrong elements in this rank's ``result`` (the output buffer, or the input if in place).

    Ranks with nothing to check (non-roots of reduce and gather) return 0.
    """
    result = result.reshape(-1)
    block = count // ranks
    tol = _tolerance(op, dtype)
    patterns = [_pattern(r, dtype, op) for r in range(ranks)]
    if collective == "all_reduce" or (collective == "reduce" and rank == ROOT):
        return _mismatches(result, reduce_reference(ReduceOp.parse(op), patterns), 0, tol)
    if collective == "reduce_scatter":
        return _mismatches(result, reduce_reference(ReduceOp.parse(op), patterns), rank * block, tol)
    if collective == "broadcast" or (collective == "send_recv" and rank in (0, 1)):
        # send_recv: rank 1 received rank 0's buffer and sent it back
        return _mismatches(result, patterns[ROOT], 0, 0)
    if collective == "scatter":
        return _mismatches(result, patterns[rank], 0, 0)
    if collective in ("all_gather", "all_to_all") or (collective == "gather" and rank == ROOT):
        # Block i came from rank i: for all_gather (and gather) its whole input, for all_to_all
        # the block of its input that was addressed to this rank.
        start = rank * block if collective == "all_to_all" else 0
        blocks = result.reshape(ranks, block)
        return sum(_mismatches(b, patterns[i], start, 0) for i, b in enumerate(blocks))
    return 0
