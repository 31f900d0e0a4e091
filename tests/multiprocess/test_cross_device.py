"""tf.distribute-style strategies (tensorcomm.cross_device) on 1-5 real ranks, against numpy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm import cross_device as cd
from tensorcomm.testing import rank_data, run_ranks

pytestmark = pytest.mark.multiprocess

SHAPES = [(3, 3, 4, 8), (8,), (), (5, 7), (0, 2), (64,), (1,)]
DTYPES = [np.float32, np.float16, np.float32, ml_dtypes.bfloat16, np.float64, np.float32, np.complex64]


def _strategies():
    return [cd.ReductionToOneDevice(), cd.ReductionToOneDevice(reduce_to_rank=tc.get_world_size() - 1),
            cd.AllReduceCrossDeviceOps(num_packs=0), cd.AllReduceCrossDeviceOps(num_packs=1),
            cd.AllReduceCrossDeviceOps(num_packs=3), cd.CollectiveAllReduce(bytes_per_pack=0),
            cd.CollectiveAllReduce(bytes_per_pack=100), cd.AllReduceCrossDeviceOps(group="world")]


def _replicas(rank: int) -> int:
    return rank % 3 + 1  # processes hold different numbers of local replicas


def _value(rank: int, i: int, replica: int) -> np.ndarray:
    return rank_data(rank, SHAPES[i], DTYPES[i], salt=10 * i + replica)


def _local(rank: int, i: int):
    """Value i of ``rank``: a single array on even ranks, a list of replicas on odd ones."""
    replicas = [_value(rank, i, k) for k in range(_replicas(rank))]
    return replicas if rank % 2 else replicas[0]


def _expected(size: int, i: int, mean: bool) -> np.ndarray:
    parts = [_value(r, i, k).astype(np.complex128 if DTYPES[i] == np.complex64 else np.float64)
             for r in range(size) for k in range(_replicas(r) if r % 2 else 1)]
    total = np.add.reduce(parts) if parts[0].shape else sum(parts)
    return total / len(parts) if mean else total


def _close(got, expected, i: int, what: str) -> None:
    assert got.shape == SHAPES[i] and got.dtype == np.dtype(DTYPES[i]), what
    tolerance = 2e-2 if DTYPES[i] in (np.float16, ml_dtypes.bfloat16) else 1e-6
    np.testing.assert_allclose(got.astype(np.complex128), expected, rtol=tolerance, atol=tolerance,
                               err_msg=what)


def body_strategies() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    everyone = list(range(size))
    for strategy in _strategies():
        for op, mean in ((cd.ReduceOp.SUM, False), ("mean", True), ("SUM", False), (tc.ReduceOp.AVG, True)):
            what = f"{strategy!r} {op}"
            values = [_local(rank, i) for i in range(len(SHAPES))]
            results = strategy.batch_reduce(op, [(v, None) for v in values])
            for i, got in enumerate(results):
                _close(got, _expected(size, i, mean), i, f"{what} batch value {i}")
            # destinations: every rank spelled out, one rank, some ranks, mixed in one batch
            last, some = size - 1, everyone[::2]
            pairs = [(values[0], everyone), (values[1], last), (values[3], some), (values[4], "all")]
            results = strategy.batch_reduce(op, pairs)
            for (i, dests), got in zip([(0, everyone), (1, [last]), (3, some), (4, everyone)], results,
                                       strict=True):
                if rank in dests:
                    _close(got, _expected(size, i, mean), i, f"{what} to {dests}")
                else:
                    assert got is None, f"{what}: rank {rank} is not in {dests}"
            single = strategy.reduce(op, values[5], destinations=0)
            if rank == 0:
                _close(single, _expected(size, 5, mean), 5, f"{what} reduce to 0")
            else:
                assert single is None
        assert strategy.batch_reduce("sum", []) == []
        for src in range(size):
            x = rank_data(rank, (4, 2), np.float32, salt=src)
            before = x.copy()
            got = strategy.broadcast(x, src=src)
            np.testing.assert_array_equal(got, rank_data(src, (4, 2), np.float32, salt=src))
            np.testing.assert_array_equal(x, before)
            only = strategy.broadcast(x, destinations=[src], src=src)
            assert (only is not None) == (rank == src)
    # integers and SUM; the input arrays are never modified
    ints = [np.full(3, rank, np.int64), np.full((2, 2), rank, np.int32)]
    kept = [a.copy() for a in ints]
    out = cd.AllReduceCrossDeviceOps(2).batch_reduce("sum", [(a, None) for a in ints])
    assert (out[0] == sum(range(size))).all() and out[1].dtype == np.int32
    for a, b in zip(ints, kept, strict=True):
        np.testing.assert_array_equal(a, b)


def body_errors() -> None:
    size = tc.get_world_size()
    strategy = cd.AllReduceCrossDeviceOps()
    x = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="num_packs must be a non-negative integer, got -1"):
        cd.AllReduceCrossDeviceOps(num_packs=-1)
    with pytest.raises(ValueError, match="bytes_per_pack must be a non-negative integer"):
        cd.CollectiveAllReduce(bytes_per_pack=-5)
    with pytest.raises(TypeError, match="num_packs must be an int"):
        cd.AllReduceCrossDeviceOps(num_packs=1.0)
    with pytest.raises(TypeError, match="group must be"):
        cd.ReductionToOneDevice(group=3)
    with pytest.raises(TypeError, match="reduce_to_rank must be an int"):
        cd.ReductionToOneDevice(reduce_to_rank="0")
    with pytest.raises(ValueError, match="expected 'sum' or 'mean', got 'max'"):
        strategy.reduce("max", x)
    with pytest.raises(ValueError, match="support SUM and MEAN"):
        strategy.reduce(tc.ReduceOp.MAX, x)
    with pytest.raises(TypeError, match="reduce_op: expected"):
        strategy.reduce(1, x)
    with pytest.raises(ValueError, match="reduce_op: MEAN is not defined for int64"):
        strategy.reduce("mean", np.ones(3, np.int64))
    with pytest.raises(ValueError, match="value_destination_pairs must be a list"):
        strategy.batch_reduce("sum", [x])
    with pytest.raises(ValueError, match="value_destination_pairs must be a list"):
        strategy.batch_reduce("sum", x)
    with pytest.raises(ValueError, match="at least one replica"):
        strategy.reduce("sum", [])
    with pytest.raises(ValueError, match="shapes must match"):
        strategy.reduce("sum", [x, np.ones(4, np.float32)])
    with pytest.raises(TypeError, match="expected an array"):
        strategy.reduce("sum", [1.0])
    with pytest.raises(ValueError, match="destinations=99 is out of range"):
        strategy.reduce("sum", x, destinations=99)
    with pytest.raises(ValueError, match="must not repeat"):
        strategy.reduce("sum", x, destinations=[0, 0])
    with pytest.raises(ValueError, match="the only destinations string is 'all'"):
        strategy.reduce("sum", x, destinations="/gpu:0")
    with pytest.raises(TypeError, match="src must be an int"):
        strategy.broadcast(x, src=None)
    assert (strategy.reduce("sum", x) == size).all()


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_strategies(world_size):
    run_ranks(body_strategies, world_size, timeout=90)


def test_errors():
    run_ranks(body_errors, 2, timeout=60)
