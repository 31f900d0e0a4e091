"""The local half of sparse_all_reduce: coalescing entries, and the density rule, against numpy."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorcomm.frontends import sparse


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(0, 200), st.integers(0, 3), st.integers(0, 2**31))
def test_coalesce_sums_repeats_in_order(rows: int, nnz: int, width: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    # Few distinct rows make long runs of repeats (past the level-by-level limit, too).
    positions = rng.integers(0, rows, nnz).astype(np.int64)
    values = rng.standard_normal((nnz, width)).astype(np.float32)
    got_positions, got_values = sparse._coalesce(positions, values)
    want_positions = np.unique(positions)
    np.testing.assert_array_equal(got_positions, want_positions)
    # Each row's sum, added left to right in input order.
    want = np.zeros((want_positions.size, width), np.float32)
    for p, v in zip(positions, values, strict=True):
        slot = np.searchsorted(want_positions, p)
        want[slot] = want[slot] + v
    longest = np.bincount(positions).max() if nnz else 0
    if longest <= sparse._REPEATS_BY_ROUNDS:  # added left to right: the same bits
        np.testing.assert_array_equal(got_values, want)
    else:  # numpy's reduceat: its own order
        np.testing.assert_allclose(got_values, want, rtol=1e-5, atol=1e-5)


def test_coalesce_half_precision_accumulates_in_float32() -> None:
    positions = np.zeros(3000, np.int64)
    values = np.full((3000, 1), 1.0, np.float16)  # float16 alone stalls at 2048
    _, summed = sparse._coalesce(positions, values)
    assert summed.dtype == np.float16 and float(summed[0, 0]) == 3000.0


def test_choose_is_the_documented_rule() -> None:
    # 2 ranks x 30 % of a 100,000 x 32 float32 table: 0.64 of the dense bytes.
    counts, shape = [30_000, 30_000], (100_000, 32)
    assert sparse.choose(counts, shape, 1, 4, sparse.TransportKind.SHM) == "dense"
    assert sparse.choose(counts, shape, 1, 4, sparse.TransportKind.TCP) == "gather"
    assert sparse.choose([20_000, 20_000], shape, 1, 4, sparse.TransportKind.SHM) == "gather"
