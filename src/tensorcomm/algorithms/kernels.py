"""Reduction kernels: each ``ReduceOp`` is a numpy ufunc applied with ``out=``, plus the dtype rules.

Owns which (op, dtype) pairs are defined, the accumulation rule for half precision, and the
``Reduction`` descriptor of a call shape, and the ``prepare``/``finish`` pair that turns AVG and
PREMUL_SUM into a plain SUM around an algorithm.
Imports numpy and ``types`` only (bfloat16 through ``types``); it must not import ``core``.

Accumulation rule: float16 and bfloat16 SUM, AVG, PREMUL_SUM and PROD accumulate in float32.
``prepare`` upcasts the caller's buffer once, every partial result travels and is combined in
float32, and ``finish`` rounds once at the end, so a half-precision reduction is never less
accurate than a float32 accumulation of the same inputs (summing in float16 instead rounds every
partial to 11 bits: 1000 ranks adding float16(0.1) one after another reach 105.2, not 99.98). The
price is twice the bytes on the wire for half-precision reductions. MIN and MAX are exact in any
dtype and stay in half precision.

bool follows numpy's own ufunc semantics: SUM is logical or, PROD logical and, MIN and, MAX or;
BAND/BOR/BXOR are the logical and/or/xor; AVG counts (True where every term is True, the truncated
mean of ones and zeros). Integer SUM and PROD wrap around on overflow, as numpy does, so the result
does not depend on the order of reduction. Integer AVG is the (wrapped) sum divided by the member
count and rounded toward zero, as NCCL computes it and torch programs (Lightning's counters)
expect; ``divide`` is that one rule.

Floating-point reductions give the IEEE result without a warning: a sum that overflows is inf,
inf - inf is nan, as torch.distributed and MPI give them. numpy's "overflow encountered"
RuntimeWarnings from tensorcomm's own reductions are filtered out (only those: the filter matches
warnings raised in ``tensorcomm.algorithms``), since they would point users at tensorcomm's
internals rather than at their data; ``np.isfinite`` on the result tells. (``np.errstate``
around each reduction would do the same at several microseconds per call.)
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np

from ..types import SUPPORTED_DTYPES, PremulSum, ReduceOp, is_bfloat16

warnings.filterwarnings("ignore", message=r"(overflow|invalid value|underflow) encountered",
                        category=RuntimeWarning, module=r"tensorcomm\.algorithms\.")


_FLOAT32 = np.dtype(np.float32)
_FLOAT16 = np.dtype(np.float16)
_BOOL = np.dtype(np.bool_)
_INT64 = np.dtype(np.int64)

_UFUNCS = {
    ReduceOp.SUM: np.add,
    ReduceOp.PROD: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.BAND: np.bitwise_and,
    ReduceOp.BOR: np.bitwise_or,
    ReduceOp.BXOR: np.bitwise_xor,
}
_UFUNC_OF_VALUE = {op._value_: fn for op, fn in _UFUNCS.items()}
_BITWISE = (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)
# Complex numbers have no order; PROD is refused too, as torch.distributed refuses it, so that a
# program behaves the same under both libraries.
_NOT_COMPLEX = (ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PROD)
# PREMUL_SUM's factor is real-valued: no exact integer result. (AVG on integers is the sum divided
# by the member count, rounded toward zero, as NCCL computes it: ``divide``.)
_NEEDS_FLOAT = (ReduceOp.PREMUL_SUM,)
_WIDENED = (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PREMUL_SUM, ReduceOp.PROD)


def _base(op: ReduceOp | PremulSum) -> ReduceOp:
    return ReduceOp.PREMUL_SUM if isinstance(op, PremulSum) else op


def _kind(dtype: np.dtype) -> str:
    """numpy's kind letter, with bfloat16 (kind 'V' in ml_dtypes) counted as a float."""
    return "f" if is_bfloat16(dtype) else dtype.kind


def floating(dtype: np.dtype | type) -> bool:
    """Whether ``dtype`` is a floating-point or complex dtype (bfloat16 included)."""
    return _kind(np.dtype(dtype)) in "fc"


def check_op_dtype(op: ReduceOp | PremulSum, dtype: np.dtype | type, argument: str = "op") -> None:
    """Check that ``op`` is defined on arrays of ``dtype``.

    Args:
        op: the reduction.
        dtype: the element type of the arrays to reduce.
        argument: the caller's name for ``op``, used in messages.

    Raises:
        TypeError: ``dtype`` is not one of ``SUPPORTED_DTYPES``.
        ValueError: ``op`` is not defined for ``dtype`` (bitwise ops on floats, MIN/MAX/PROD on
            complex, PREMUL_SUM on integers or bool or without a factor).
    """
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(t) for t in SUPPORTED_DTYPES)
        raise TypeError(f"cannot reduce arrays of dtype {dtype}; supported dtypes: {names}")
    if op is ReduceOp.PREMUL_SUM:
        raise ValueError(f"{argument}: use ReduceOp.premul_sum(factor) to give PREMUL_SUM its factor")
    base, kind = _base(op), _kind(dtype)
    if base in _BITWISE and kind in "fc":
        raise ValueError(f"{argument}: {base.name} is not defined for {dtype}; bitwise reductions "
                         "need a bool or integer dtype")
    if base in _NOT_COMPLEX and kind == "c":
        raise ValueError(f"{argument}: {base.name} is not defined for {dtype}")
    if base in _NEEDS_FLOAT and kind in "biu":
        raise ValueError(f"{argument}: {base.name} is not defined for {dtype}: there is no exact "
                         "integer result; use SUM and divide, or a floating-point dtype")


def accumulation_dtype(op: ReduceOp | PremulSum, dtype: np.dtype | type) -> np.dtype:
    """The dtype partial results of ``op`` over ``dtype`` are kept in (see the module docstring)."""
    dtype = np.dtype(dtype)
    if (dtype == _FLOAT16 or is_bfloat16(dtype)) and _base(op) in _WIDENED:
        return _FLOAT32
    if dtype == _BOOL and op is ReduceOp.AVG:  # counted, so that the mean is True where all are
        return _INT64
    return dtype


def divide(x: np.ndarray, count: int) -> None:
    """Divide ``x`` by ``count`` in place, as AVG does: floats as IEEE division, integers rounded
    toward zero (NCCL's integer AVG; numpy's ``floor_divide`` rounds negative quotients down)."""
    if floating(x.dtype):
        np.divide(x, count, out=x)
    elif x.dtype.kind == "u":
        np.floor_divide(x, count, out=x)
    else:  # signed: take C's remainder (the dividend's sign) off first, so the division is exact
        np.subtract(x, np.fmod(x, count), out=x)
        np.floor_divide(x, count, out=x)


def ufunc(op: ReduceOp) -> np.ufunc:
    """The numpy ufunc of a base op (SUM, PROD, MIN, MAX, BAND, BOR, BXOR).

    Raises:
        ValueError: ``op`` is AVG or PREMUL_SUM, which ``prepare`` turns into SUM first.
    """
    # Keyed by the member's value: Enum.__hash__ runs Python code, a string hashes in C.
    found = _UFUNC_OF_VALUE.get(op._value_) if type(op) is ReduceOp else None
    if found is None:
        raise ValueError(f"{op.name} has no kernel; run kernels.prepare() to turn it into SUM")
    return found


def combine(op: ReduceOp, left: np.ndarray, right: np.ndarray, out: np.ndarray) -> None:
    """Write ``left op right`` into ``out`` element-wise (``out`` may alias either operand).

    Algorithms that need bit-identical results on every rank call this with a fixed operand
    order: IEEE ``min(0.0, -0.0)`` and NaN payloads depend on which operand comes first.

    Raises:
        ValueError: ``op`` is AVG or PREMUL_SUM, which ``prepare`` turns into SUM first.
    """
    ufunc(op)(left, right, out=out)


class Reduction(NamedTuple):
    """How to reduce arrays of one dtype with one op, following the accumulation rule: the one
    descriptor of a reduction, made once per call shape (``Plan.reduction``) and read by the
    shared-memory and the transport algorithms alike.

    Attributes:
        op: the base op the terms are combined with (AVG and PREMUL_SUM become SUM).
        ufunc: the ufunc of ``op``.
        acc: the dtype terms travel and combine in (``accumulation_dtype``).
        factor: the PREMUL_SUM factor every term is multiplied by first, else None.
        average: divide the result by the number of members (AVG).
        raw: the caller's bytes are the terms as they are (same dtype, no factor).
        in_acc: the caller's dtype is the accumulation dtype (results can be built in place).
        positional: ``ufunc`` may take ``out`` positionally, which numpy parses faster (it
            deprecates that for maximum and minimum).
    """

    op: ReduceOp
    ufunc: np.ufunc
    acc: np.dtype
    factor: float | None
    average: bool
    raw: bool
    in_acc: bool
    positional: bool


def reduction(op: ReduceOp | PremulSum, dtype: np.dtype | type) -> Reduction:
    """How to reduce ``dtype`` arrays with ``op`` (``check_op_dtype`` must accept the pair: the
    core checks once per call shape)."""
    dtype = np.dtype(dtype)
    acc = accumulation_dtype(op, dtype)
    if isinstance(op, PremulSum):
        factor: float | None = op.factor
        base = ReduceOp.SUM
    else:
        factor = None
        base = ReduceOp.SUM if op is ReduceOp.AVG else op
    fn = ufunc(base)
    return Reduction(base, fn, acc, factor, op is ReduceOp.AVG, acc == dtype and factor is None,
                     acc == dtype, fn is not np.maximum and fn is not np.minimum)


def load(red: Reduction, dst: np.ndarray, src: np.ndarray) -> None:
    """Write ``src`` into ``dst`` (same shape, in ``red.acc``) as terms: converted and
    premultiplied."""
    if red.raw:
        dst[...] = src
        return
    np.copyto(dst, src, casting="unsafe")
    if red.factor is not None:
        np.multiply(dst, red.factor, out=dst)


def prepare(red: Reduction, data: np.ndarray, work: np.ndarray | None = None,
            copy: bool = True) -> np.ndarray:
    """The values to reduce for reducing ``data`` (flat) with ``red``; combine them with ``red.op``.

    The values are a copy in ``red.acc``, premultiplied by the factor of a PREMUL_SUM (``load``):
    ``work`` when given (of that size and dtype; reused memory costs no page faults), else a
    fresh array. The copy keeps the caller's array untouched if the collective fails midway.
    With ``copy=False``, ``data`` itself is returned when it needs no conversion (``red.raw``):
    for algorithms that only read their input. ``finish`` completes the reduction.
    """
    if not copy and red.raw:
        return data.reshape(-1)
    if work is None:
        work = np.empty(data.size, dtype=red.acc)
    load(red, work, data.reshape(-1))
    return work


def finish(red: Reduction, work: np.ndarray, out: np.ndarray, size: int) -> None:
    """Complete a reduction prepared by ``prepare``: divide by ``size`` for AVG, round into ``out``.

    Args:
        red: the reduction given to ``prepare``.
        work: the reduced working buffer.
        out: C-contiguous destination of any shape with ``work.size`` elements.
        size: the number of ranks that contributed.

    Raises:
        ValueError: ``out`` does not hold ``work.size`` elements or is not C-contiguous.
    """
    if out.size != work.size or not out.flags.c_contiguous:
        raise ValueError(f"out: expected a C-contiguous array of {work.size} elements, got "
                         f"{out.size} elements (c_contiguous={out.flags.c_contiguous})")
    if red.average:
        divide(work, size)
    if red.in_acc:
        out.reshape(-1)[...] = work
    else:  # the one rounding of the accumulation rule happens here, hence the unsafe cast
        np.copyto(out.reshape(-1), work, casting="unsafe")
