"""Sparse all-reduce on 2 and 3 real ranks, shared memory and TCP, checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.frontends import sparse
from tensorcomm.testing import run_ranks

pytestmark = pytest.mark.multiprocess

TRANSPORTS = {"shm": {}, "tcp": {"TENSORCOMM_TRANSPORT": "tcp"}}


def _entries(rank: int, case: int, shape: tuple[int, ...], sparse_dim: int,
             dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s entries: a count of its own (rank 1 of case 0 gives none), repeats included."""
    rng = np.random.default_rng(1000 * case + rank)
    nnz = 0 if (rank, case) == (1, 0) else int(rng.integers(1, 12))
    idx = np.stack([rng.integers(0, shape[d], nnz) for d in range(sparse_dim)])
    vals = rng.integers(-20, 20, (nnz, *shape[sparse_dim:])).astype(dtype)
    return idx, vals


def _expected(size: int, case: int, shape: tuple[int, ...], sparse_dim: int, dtype: np.dtype,
              avg: bool) -> tuple[np.ndarray, np.ndarray]:
    """numpy's answer: the union of every rank's indices, sorted, each with its values summed."""
    dense = np.zeros(shape, np.float64)
    present = np.zeros(shape[:sparse_dim], bool)
    for r in range(size):
        idx, vals = _entries(r, case, shape, sparse_dim, dtype)
        np.add.at(dense, tuple(idx), vals.astype(np.float64))
        present[tuple(idx)] = True
    where = np.stack(np.nonzero(present))  # row-major order: sorted
    values = dense[tuple(where)]
    return where, (values / size if avg else values).astype(dtype)


CASES = [  # (dense_shape, sparse_dim, dtype)
    ((10,), 1, np.float32), ((7, 3), 1, np.float64), ((5, 4), 2, np.int64),
    ((4, 3, 2), 2, np.float32), ((6, 2), 1, np.float16), ((9, 5), 1, np.complex64),
]


def body_sparse_all_reduce() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    for case, (shape, sdim, dtype) in enumerate(CASES):
        ops = ["sum"] if np.dtype(dtype).kind == "i" else ["sum", "avg"]
        for op in ops:
            want_idx, want_vals = _expected(size, case, shape, sdim, dtype, op == "avg")
            for algorithm in sparse.ALGORITHMS:
                idx, vals = _entries(rank, case, shape, sdim, dtype)
                before = vals.copy()
                flat = sdim == 1 and case % 2 == 0  # (nnz,) indices, as TF's IndexedSlices
                got_idx, got_vals = tc.sparse_all_reduce(idx[0] if flat else idx, vals, shape,
                                                         op=op, algorithm=algorithm)
                np.testing.assert_array_equal(vals, before)  # inputs untouched
                np.testing.assert_array_equal(got_idx, want_idx[0] if flat else want_idx)
                assert got_idx.dtype == np.int64 and got_vals.dtype == dtype
                tol = 1e-2 if dtype == np.float16 else 1e-6
                np.testing.assert_allclose(got_vals, want_vals, rtol=tol, atol=tol)
    # Every member empty: an empty result, whatever the algorithm.
    for algorithm in sparse.ALGORITHMS:
        got_idx, got_vals = tc.sparse_all_reduce(np.empty((1, 0), np.int32), np.empty((0, 3)), (4, 3),
                                                 algorithm=algorithm)
        assert got_idx.shape == (1, 0) and got_vals.shape == (0, 3)
    # Entries that cancel stay in the result (both algorithms), with value 0.
    for algorithm in ("gather", "dense"):
        got_idx, got_vals = tc.sparse_all_reduce(np.array([2]), np.array([1.0 if rank % 2 else -1.0]
                                                 if size % 2 == 0 else [0.0]), (4,), algorithm=algorithm)
        np.testing.assert_array_equal(got_idx, [2])
        np.testing.assert_array_equal(got_vals, [0.0])


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("world_size", [2, 3])
def test_sparse_all_reduce_matches_numpy(world_size: int, transport: str) -> None:
    run_ranks(body_sparse_all_reduce, world_size, timeout=120, env=TRANSPORTS[transport])


def _bad_call(case: str, rank: int) -> tuple[object, object, object, dict]:
    """(indices, values, dense_shape, keywords): rank 1 gets ``case``'s bad argument, the others
    good ones."""
    idx, vals, shape = np.array([[0, 2]]), np.ones((2, 3), np.float32), (4, 3)
    if rank != 1:
        return idx, vals, shape, {}
    if case in ("op_mismatch", "algorithm_mismatch"):
        return idx, vals, shape, {"op": "avg"} if case == "op_mismatch" else {"algorithm": "dense"}
    return *{
        "lengths": (idx, np.ones((3, 3), np.float32), shape),
        "index_dtype": (idx.astype(np.float32), vals, shape),
        "value_dtype": (idx, vals.astype(object), shape),
        "out_of_range": (np.array([[0, 4]]), vals, shape),
        "negative": (np.array([[-1, 2]]), vals, shape),
        "sparse_dim": (np.zeros((3, 2), np.int64), vals, shape),
        "shape_mismatch": (idx, vals.reshape(2, 3), (5, 3)),
    }[case], {}


_LOCAL = {"lengths": (ValueError, "values must have shape"),
          "index_dtype": (TypeError, "integer dtype"),
          "value_dtype": (TypeError, "dtype object"),
          "out_of_range": (ValueError, r"must lie in \[0, 4\)"),
          "negative": (ValueError, r"must lie in \[0, 4\)"),
          "sparse_dim": (ValueError, "3 sparse dimensions"),
          "shape_mismatch": (tc.CollectiveMismatchError, "disagree"),
          "op_mismatch": (tc.CollectiveMismatchError, "disagree"),
          "algorithm_mismatch": (tc.CollectiveMismatchError, "disagree")}


def body_bad_input(case: str) -> None:
    rank = tc.get_rank()
    idx, vals, shape, keywords = _bad_call(case, rank)
    error, text = _LOCAL[case] if rank == 1 or case.endswith("mismatch") else \
        (ValueError, r"group ranks \[1\] passed invalid arguments")
    with pytest.raises(error, match=text):
        tc.sparse_all_reduce(idx, vals, shape, **keywords)
    # The group is still usable afterwards.
    got_idx, got_vals = tc.sparse_all_reduce(np.array([rank]), np.ones(1), (8,))
    np.testing.assert_array_equal(got_idx, np.arange(tc.get_world_size()))
    np.testing.assert_array_equal(got_vals, np.ones(tc.get_world_size()))


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("case", list(_LOCAL))
def test_bad_input_raises_on_every_rank(case: str, transport: str) -> None:
    run_ranks(body_bad_input, 3, case, timeout=60, env=TRANSPORTS[transport])


def test_choose_by_density() -> None:
    # A 1M x 64 float32 table: 1 % of the rows from each of 2 ranks gathers, half of them densifies.
    assert sparse.choose([10_000, 10_000], (1_000_000, 64), 1, 4) == "gather"
    assert sparse.choose([500_000, 500_000], (1_000_000, 64), 1, 4) == "dense"
    # Over TCP gathering stays ahead longer: 40 % of the rows from each of 2 ranks still gathers.
    assert sparse.choose([400_000] * 2, (1_000_000, 64), 1, 4, tc.TransportKind.SHM) == "dense"
    assert sparse.choose([400_000] * 2, (1_000_000, 64), 1, 4, tc.TransportKind.TCP) == "gather"
