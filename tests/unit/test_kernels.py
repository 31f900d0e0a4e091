"""Reduction kernels: every op x dtype against numpy, the validity table, and the accumulation rule."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest

from tensorcomm.algorithms import kernels
from tensorcomm.testing.reference import reduce_reference
from tensorcomm.types import ReduceOp

BF16 = np.dtype(ml_dtypes.bfloat16)
INTEGERS = [np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64,
                                  np.uint8, np.uint16, np.uint32, np.uint64)]
FLOATS = [np.dtype(np.float16), BF16, np.dtype(np.float32), np.dtype(np.float64)]
COMPLEX = [np.dtype(np.complex64), np.dtype(np.complex128)]
BOOL = np.dtype(np.bool_)
ALL_DTYPES = [BOOL, *INTEGERS, *FLOATS, *COMPLEX]
OPS = [ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG,
       ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR, ReduceOp.premul_sum(0.5)]
UFUNCS = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply, ReduceOp.MIN: np.minimum,
          ReduceOp.MAX: np.maximum, ReduceOp.BAND: np.bitwise_and, ReduceOp.BOR: np.bitwise_or,
          ReduceOp.BXOR: np.bitwise_xor}


def op_id(op) -> str:
    return op.value


def defined(op, dtype: np.dtype) -> bool:
    """The validity table, written independently of kernels.py."""
    base = ReduceOp.PREMUL_SUM if not isinstance(op, ReduceOp) else op
    floating = dtype in FLOATS or dtype in COMPLEX
    if base in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR) and floating:
        return False
    if base in (ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PROD) and dtype in COMPLEX:
        return False
    return base is not ReduceOp.PREMUL_SUM or floating  # its factor needs a float or complex dtype


def sample(dtype: np.dtype, seed: int, count: int = 17) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == BOOL:
        return rng.random(count) < 0.5
    if dtype in INTEGERS:
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)
    values = rng.uniform(0.5, 2.0, count) * rng.choice([-1, 1], count)
    if dtype in COMPLEX:
        values = values + 1j * rng.uniform(0.5, 2.0, count)
    return values.astype(dtype)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS, ids=op_id)
def test_every_op_and_dtype(op, dtype):
    arrays = [sample(dtype, seed) for seed in range(3)]
    if not defined(op, dtype):
        with pytest.raises(ValueError, match=str(dtype)):
            kernels.check_op_dtype(op, dtype)
        return
    kernels.check_op_dtype(op, dtype)
    red = kernels.reduction(op, dtype)
    acc = kernels.prepare(red, arrays[0])
    for other in arrays[1:]:
        kernels.combine(red.op, acc, kernels.prepare(red, other), acc)
    out = np.empty_like(arrays[0])
    kernels.finish(red, acc, out, len(arrays))

    exact = dtype == BOOL or dtype in INTEGERS or op in (ReduceOp.MIN, ReduceOp.MAX)
    wide = [a if exact else a.astype(np.complex128 if dtype in COMPLEX else np.float64) for a in arrays]
    if not isinstance(op, ReduceOp):
        wide = [w * op.factor for w in wide]
    expected = functools.reduce(UFUNCS.get(op, np.add), wide)  # AVG and premul are SUMs
    if op is ReduceOp.AVG:
        expected = reduce_reference(op, arrays) if exact else expected / len(arrays)
    assert out.dtype == dtype
    if exact:
        assert np.array_equal(out, expected.astype(dtype))
    else:
        rtol = {np.float16: 1e-3, ml_dtypes.bfloat16: 8e-3, np.float32: 1e-6,
                np.complex64: 1e-6}.get(dtype.type, 1e-14)
        np.testing.assert_allclose(out.astype(expected.dtype), expected, rtol=rtol)


def test_bool_follows_numpy_semantics():
    a = np.array([False, False, True, True])
    b = np.array([False, True, False, True])
    for op, expected in [(ReduceOp.SUM, a | b), (ReduceOp.PROD, a & b), (ReduceOp.MIN, a & b),
                         (ReduceOp.MAX, a | b), (ReduceOp.BXOR, a ^ b)]:
        acc = a.copy()
        kernels.combine(op, acc, b, acc)
        assert acc.dtype == BOOL and np.array_equal(acc, expected), op


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint64])
def test_integer_avg_rounds_toward_zero(dtype):
    # NCCL's integer AVG, which Lightning's counters rely on: the sum divided, rounded toward zero
    # (numpy's floor_divide would give -4 for -7 // 2).
    signed = np.dtype(dtype).kind == "i"
    left = np.array([-7, 7, -1, 1, 0, 5] if signed else [7, 3, 1, 0, 250, 5], dtype=dtype)
    right = np.array([0, 0, 0, 0, 0, 0], dtype=dtype)
    red = kernels.reduction(ReduceOp.AVG, dtype)
    work = kernels.prepare(red, left)
    kernels.combine(red.op, work, kernels.prepare(red, right), work)
    out = np.empty_like(left)
    kernels.finish(red, work, out, 2)
    assert out.tolist() == ([-3, 3, 0, 0, 0, 2] if signed else [3, 1, 0, 0, 125, 2])


def test_bool_avg_is_true_where_every_term_is():
    terms = [np.array([True, True, False, False]), np.array([True, False, True, False])]
    red = kernels.reduction(ReduceOp.AVG, np.bool_)
    work = kernels.prepare(red, terms[0])
    kernels.combine(red.op, work, kernels.prepare(red, terms[1]), work)
    out = np.empty(4, np.bool_)
    kernels.finish(red, work, out, 2)
    assert out.tolist() == [True, False, False, False]


def test_integer_sum_wraps_like_numpy():
    acc = np.array([127], dtype=np.int8)
    kernels.combine(ReduceOp.SUM, acc, np.array([1], dtype=np.int8), acc)
    assert acc[0] == -128


def test_combine_keeps_operand_order():
    # min(0.0, -0.0) depends on operand order in IEEE arithmetic; combine must not reorder.
    left, right = np.zeros(8), -np.zeros(8)
    out = np.empty(8)
    kernels.combine(ReduceOp.MIN, left, right, out)
    assert np.array_equal(np.signbit(out), np.signbit(np.minimum(left, right)))
    kernels.combine(ReduceOp.MIN, right, left, out)
    assert np.array_equal(np.signbit(out), np.signbit(np.minimum(right, left)))


@pytest.mark.parametrize("op", [ReduceOp.AVG, ReduceOp.PREMUL_SUM], ids=op_id)
def test_combine_refuses_unprepared_ops(op):
    with pytest.raises(ValueError, match="prepare"):
        kernels.combine(op, np.zeros(2), np.zeros(2), np.zeros(2))


@pytest.mark.parametrize("op, dtype, words", [
    (ReduceOp.MAX, np.complex64, "MAX is not defined for complex64"),
    (ReduceOp.MIN, np.complex128, "MIN is not defined for complex128"),
    (ReduceOp.PROD, np.complex64, "PROD is not defined for complex64"),
    (ReduceOp.BAND, np.float32, "BAND is not defined for float32; bitwise"),
    (ReduceOp.BXOR, ml_dtypes.bfloat16, "BXOR is not defined for bfloat16"),
    (ReduceOp.premul_sum(2.0), np.int64, "PREMUL_SUM is not defined for int64"),
    (ReduceOp.PREMUL_SUM, np.float32, "premul_sum\\(factor\\)"),
])
def test_check_op_dtype_messages(op, dtype, words):
    with pytest.raises(ValueError, match=words) as info:
        kernels.check_op_dtype(op, dtype, argument="reduce_op")
    assert str(info.value).startswith("reduce_op: ")


@pytest.mark.parametrize("dtype", [object, np.str_, "datetime64[s]", np.float128 if hasattr(np, "float128")
                                   else np.longdouble, ">i4"], ids=str)
def test_unsupported_dtype_is_a_type_error_listing_supported_ones(dtype):
    with pytest.raises(TypeError) as info:
        kernels.check_op_dtype(ReduceOp.SUM, dtype)
    message = str(info.value)
    assert str(np.dtype(dtype)) in message
    for name in ("bool", "int8", "uint64", "float16", "bfloat16", "float64", "complex128"):
        assert name in message


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=str)
def test_half_precision_accumulates_in_float32(dtype):
    for op in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PROD, ReduceOp.premul_sum(3.0)):
        assert kernels.accumulation_dtype(op, dtype) == np.float32
    for op in (ReduceOp.MIN, ReduceOp.MAX):
        assert kernels.accumulation_dtype(op, dtype) == np.dtype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.bool_, np.complex64], ids=str)
def test_other_dtypes_accumulate_in_themselves(dtype):
    assert kernels.accumulation_dtype(ReduceOp.SUM, dtype) == np.dtype(dtype)


def test_prepare_copies_into_a_fresh_flat_buffer():
    data = np.arange(12, dtype=np.float32).reshape(3, 4).T  # not C-contiguous
    before = data.copy()
    red = kernels.reduction(ReduceOp.MAX, data.dtype)
    work = kernels.prepare(red, data)
    assert red.op is ReduceOp.MAX
    assert work.shape == (12,) and work.flags.c_contiguous and not np.shares_memory(work, data)
    assert np.array_equal(work, data.reshape(-1))
    work[:] = -1
    assert np.array_equal(data, before)


def test_prepare_premultiplies_in_the_accumulation_dtype():
    data = np.full(4, 0.1, dtype=np.float16)
    red = kernels.reduction(ReduceOp.premul_sum(0.25), data.dtype)
    work = kernels.prepare(red, data)
    assert red.op is ReduceOp.SUM and work.dtype == np.float32
    assert np.array_equal(work, data.astype(np.float32) * np.float32(0.25))


def test_finish_divides_avg_and_writes_any_shape():
    red = kernels.reduction(ReduceOp.AVG, np.float16)
    work = kernels.prepare(red, np.full((2, 3), 6.0, dtype=np.float16))
    assert red.op is ReduceOp.SUM
    kernels.combine(red.op, work, work.copy(), work)
    out = np.empty((3, 2), dtype=np.float16)
    kernels.finish(red, work, out, 2)
    assert np.array_equal(out, np.full((3, 2), 6.0, dtype=np.float16))


def test_finish_refuses_a_wrong_sized_out():
    with pytest.raises(ValueError, match="out: expected a C-contiguous array of 4 elements"):
        kernels.finish(kernels.reduction(ReduceOp.SUM, np.float64), np.zeros(4), np.zeros(5), 1)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=str)
def test_half_precision_sum_of_1000_ranks_matches_float32_accumulation(dtype):
    """1000 ranks each contribute 0.1 in half precision, reduced one after another."""
    contribution = np.full(8, 0.1, dtype=dtype)
    red = kernels.reduction(ReduceOp.SUM, contribution.dtype)
    acc = kernels.prepare(red, contribution)
    for _ in range(999):
        kernels.combine(red.op, acc, kernels.prepare(red, contribution), acc)
    out = np.empty_like(contribution)
    kernels.finish(red, acc, out, 1000)

    exact = 1000 * float(contribution[0])
    bound = (0.5 * float(ml_dtypes.finfo(dtype).eps) * 2.0 ** np.floor(np.log2(exact))  # final rounding
             + 999 * float(np.finfo(np.float32).eps) * exact)  # 999 float32 roundings
    assert abs(float(out[0]) - exact) <= bound
    # Accumulating in the half dtype itself fails the bound by far (float16 reaches 105.2).
    naive = contribution[:1].copy()
    for _ in range(999):
        naive += contribution[:1]
    assert abs(float(naive[0]) - exact) > 10 * bound

