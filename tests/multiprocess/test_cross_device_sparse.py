"""IndexedSlices in tensorcomm.cross_device's reduce/batch_reduce, on 2 and 3 ranks, against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm import cross_device as cd
from tensorcomm.testing import run_ranks

pytestmark = pytest.mark.multiprocess

TRANSPORTS = {"shm": {}, "tcp": {"TENSORCOMM_TRANSPORT": "tcp"}}
SHAPE = (9, 2)


def _replicas(rank: int) -> list[cd.IndexedSlices]:
    """``rank``'s local replicas (rank % 2 + 1 of them), rows repeated and overlapping."""
    out = []
    for k in range(rank % 2 + 1):
        rows = np.array([(rank + 3 * k + j) % SHAPE[0] for j in range(3)] + [rank])
        out.append(cd.IndexedSlices(np.full((4, 2), 10.0 * rank + k, np.float32), rows, SHAPE))
    return out


def _expected(size: int, mean: bool) -> tuple[np.ndarray, np.ndarray]:
    dense, present = np.zeros(SHAPE), np.zeros(SHAPE[0], bool)
    for r in range(size):
        for s in _replicas(r):
            np.add.at(dense, s.indices, s.values)
            present[s.indices] = True
    rows = np.flatnonzero(present)
    total = sum(len(_replicas(r)) for r in range(size))
    return rows, dense[rows] / (total if mean else 1)


def body_indexed_slices() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    strategies = [cd.ReductionToOneDevice(), cd.AllReduceCrossDeviceOps(num_packs=1),
                  cd.CollectiveAllReduce(bytes_per_pack=0)]
    for strategy in strategies:
        for op in ("sum", "mean"):
            rows, values = _expected(size, op == "mean")
            mine = _replicas(rank)
            dense = np.full(3, rank + 1.0)
            got = strategy.batch_reduce(op, [(mine, None), (dense, None), (mine[0], size - 1)])
            assert isinstance(got[0], cd.IndexedSlices) and tuple(got[0].dense_shape) == SHAPE
            np.testing.assert_array_equal(got[0].indices, rows)
            np.testing.assert_allclose(got[0].values, values, rtol=1e-6)
            assert got[0].values.dtype == np.float32
            np.testing.assert_allclose(got[1], np.full(3, sum(range(1, size + 1)) /
                                                       (size if op == "mean" else 1)))
            assert (got[2] is None) == (rank != size - 1)
            one = strategy.reduce(op, mine[0])
            want = sum(np.bincount(_replicas(r)[0].indices, minlength=SHAPE[0]) > 0 for r in range(size))
            np.testing.assert_array_equal(one.indices, np.flatnonzero(want))
    with pytest.raises(ValueError, match="reduce_op: MEAN is not defined for int64"):
        strategies[0].reduce("mean", cd.IndexedSlices(np.ones((1, 2), np.int64), np.array([0]), SHAPE))


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("world_size", [2, 3])
def test_indexed_slices_in_batch_reduce(world_size: int, transport: str) -> None:
    run_ranks(body_indexed_slices, world_size, timeout=120, env=TRANSPORTS[transport])
