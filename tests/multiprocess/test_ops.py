"""MindSpore-style operator objects (tensorcomm.ops) on 1-5 real ranks and the 8-rank seed, vs numpy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.ops import (
    AllGather,
    AllReduce,
    AlltoAll,
    AlltoAllV,
    Broadcast,
    NeighborExchange,
    ReduceScatter,
)
from tensorcomm.testing import rank_data, reduce_reference, run_ranks

pytestmark = pytest.mark.multiprocess


def _raises(exc, match, fn, *args, **kwargs) -> None:
    with pytest.raises(exc, match=match):
        fn(*args, **kwargs)


def _check_new(result, source, before) -> None:
    """The operator returned a new array and left its input as it was."""
    assert result is not source
    np.testing.assert_array_equal(source, before)


def body_reductions() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    odd_even = tc.new_group([r for r in range(size) if r % 2 == rank % 2])
    for op in ("sum", tc.ReduceOp.PROD, "max", tc.ReduceOp.MIN):
        for dtype in (np.int32, np.float16, ml_dtypes.bfloat16, np.float64):
            for shape in ((), (7,), (size * 2, 3)):
                parsed = tc.ReduceOp.parse(op)
                everyone = [rank_data(r, shape, dtype, op=parsed) for r in range(size)]
                x, before = everyone[rank].copy(), everyone[rank].copy()
                for group in ("world", tc.WORLD):
                    y = AllReduce(op, group)(x)
                    _check_new(y, x, before)
                    np.testing.assert_array_equal(y, reduce_reference(parsed, everyone))
                    assert y.shape == x.shape and y.dtype == x.dtype
                if shape and shape[0] % size == 0 and parsed in (tc.ReduceOp.SUM, tc.ReduceOp.MAX):
                    z = ReduceScatter(op)(x)
                    _check_new(z, x, before)
                    full = reduce_reference(parsed, everyone)
                    np.testing.assert_array_equal(z, np.split(full, size)[rank])
    mine = AllReduce(group=odd_even)(np.full(3, rank, np.int64))
    assert (mine == sum(r for r in range(size) if r % 2 == rank % 2)).all()


def body_gather_broadcast() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    for shape in ((2, 3), (1,), (0, 4)):
        x = rank_data(rank, shape, np.int64)
        before = x.copy()
        y = AllGather()(x)
        _check_new(y, x, before)
        np.testing.assert_array_equal(y, np.concatenate([rank_data(r, shape, np.int64) for r in range(size)]))
    for root in range(size):
        a, b = rank_data(rank, (3, 2), np.float32, salt=root), rank_data(rank, 5, np.uint8, salt=root)
        out = Broadcast(root)((a, b))
        assert isinstance(out, tuple) and len(out) == 2
        np.testing.assert_array_equal(out[0], rank_data(root, (3, 2), np.float32, salt=root))
        np.testing.assert_array_equal(out[1], rank_data(root, 5, np.uint8, salt=root))
        np.testing.assert_array_equal(a, rank_data(rank, (3, 2), np.float32, salt=root))
        assert out[0] is not a
    assert Broadcast(0)(()) == ()


def _alltoall_reference(everyone, size, rank, split, concat) -> np.ndarray:
    return np.concatenate([np.split(x, size, axis=split)[rank] for x in everyone], axis=concat)


def body_alltoall() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    cases = [((size * 2, 3), 0, 1), ((size * 2, 3), 0, 0), ((4, size, 2), -2, -1),
             ((2, 3, size * 3), 2, 0), ((1, 1, size, 1), -2, -1), ((size, 0), 0, 1)]
    for shape, split, concat in cases:
        for dtype in (np.float32, np.int8, np.complex64):
            everyone = [rank_data(r, shape, dtype, salt=7) for r in range(size)]
            x, before = everyone[rank].copy(), everyone[rank].copy()
            y = AlltoAll(size, split, concat)(x)
            _check_new(y, x, before)
            np.testing.assert_array_equal(y, _alltoall_reference(everyone, size, rank, split, concat))
    # AlltoAllV: rank r sends j + 1 units of block_size 2 to rank j
    for block in (1, 2):
        x = np.concatenate([np.full((j + 1) * block, 10 * rank + j, np.float64) for j in range(size)])
        expected = np.concatenate([np.full((rank + 1) * block, 10 * r + rank, np.float64)
                                   for r in range(size)])
        send = [j + 1 for j in range(size)]
        op = AlltoAllV(block_size=block)
        np.testing.assert_array_equal(op(x, send, [rank + 1] * size), expected)
        np.testing.assert_array_equal(op(x, send), expected)
    # NeighborExchange on a ring: send to the right, receive from the left (size 1: to oneself)
    right, left = (rank + 1) % size, (rank - 1) % size
    shapes = [[2, rank + 1]] if size > 1 else [[2, 1]]
    exchange = NeighborExchange([right], [left], [[2, left + 1]], shapes, np.float32)
    (got,) = exchange((np.full(shapes[0], rank, np.float32),))
    np.testing.assert_array_equal(got, np.full((2, left + 1), left, np.float32))
    nothing = NeighborExchange([], [], [], [], np.float32)(())
    assert nothing == ()


def body_errors() -> None:
    size = tc.get_world_size()
    x = np.ones((size * 2, 4), np.float32)
    _raises(TypeError, "AllReduce: input_x dtype bool", AllReduce(), np.ones(3, np.bool_))
    _raises(TypeError, "AllReduce: group must be a group name", AllReduce, "sum", 3)
    _raises(TypeError, "group must be a group name", AllReduce, "sum", None)
    _raises(TypeError, "AllGather: group must be", AllGather, group=1.5)
    _raises(TypeError, "op: expected a tensorcomm.ReduceOp", AllReduce, 3)
    _raises(ValueError, "op: unknown reduction 'mean'", AllReduce, "mean")
    _raises(TypeError, "input_x: expected an array", AllReduce(), [1.0])
    _raises(ValueError, "no group is named 'nope'", AllReduce(group="nope"), x)
    _raises(ValueError, "BAND is not defined for float32", AllReduce(tc.ReduceOp.BAND), x)
    _raises(ValueError, rf"split_count \({size + 1}\) must equal the group size \({size}\)",
            AlltoAll(size + 1, 0, 1), x)
    _raises(ValueError, "split_dim=2 is out of range for a 2-d input", AlltoAll(size, 2, 0), x)
    _raises(ValueError, "concat_dim=-3 is out of range", AlltoAll(size, 0, -3), x)
    if 5 % size:
        _raises(ValueError, r"input_x.shape\[1\] \(5\) is not divisible by split_count",
                AlltoAll(size, 1, 0), np.ones((2, 5)))
    _raises(TypeError, "split_count must be an int", AlltoAll, "2", 0, 1)
    _raises(TypeError, "split_dim must be an int", AlltoAll, 2, 0.0, 1)
    _raises(ValueError, "split_count must be positive", AlltoAll, 0, 0, 1)
    _raises(TypeError, "AlltoAll: group must be", AlltoAll, 2, 0, 1, group=[0, 1])
    _raises(TypeError, "root_rank must be an int", Broadcast, "0")
    _raises(ValueError, "root_rank=99 is out of range", Broadcast(99), (x,))
    _raises(TypeError, "input_x must be a tuple of arrays", Broadcast(0), x)
    _raises(ValueError, "0-d array", AllGather(), np.ones((), np.float32))
    if size > 1:
        _raises(ValueError, "is not divisible by the group size", ReduceScatter(), np.ones((size + 1, 2)))
    _raises(ValueError, "must be 1-D", AlltoAllV(), x, [0] * size)
    _raises(ValueError, "block_size must be positive", AlltoAllV, block_size=0)
    _raises(ValueError, "send_numel_list must be non-negative and sum", AlltoAllV(), np.ones(3),
            [4] + [0] * (size - 1))
    _raises(ValueError, "recv_numel_list must hold", AlltoAllV(), np.ones(size), [1] * size,
            [1] * (size + 1))
    _raises(ValueError, "send_rank_ids must not repeat", NeighborExchange, [0, 0], [], [], [[1], [1]],
            np.float32)
    _raises(ValueError, "send_shapes must hold 1 shapes", NeighborExchange, [0], [], [], [], np.float32)
    _raises(TypeError, "recv_type must be a dtype", NeighborExchange, [], [], [], [], "no-such-type")
    ne = NeighborExchange([0], [], [], [[2]], np.float32)
    _raises(TypeError, "every tensor must be recv_type", ne, (np.ones(2, np.float64),))
    _raises(ValueError, r"send_shapes\[0\] is \[2\]", ne, (np.ones(3, np.float32),))
    _raises(ValueError, "send_rank_ids=99 is out of range", NeighborExchange([99], [], [], [[2]], np.float32),
            (np.ones(2, np.float32),))
    # nothing was half-issued: the ranks still agree
    assert (AllReduce()(np.ones(2)) == size).all()


def body_seed_alltoall() -> list:
    """Seed 002, as written modulo imports (8 ranks)."""
    rank_id = tc.get_rank()
    alltoall = AlltoAll(split_count=8, split_dim=-2, concat_dim=-1)
    input_x = np.ones([1, 1, 8, 1]).astype(np.float32) * rank_id
    return alltoall(input_x).tolist()


def body_seed_allreduce() -> list:
    """Seed 000 (2 ranks)."""
    return AllReduce(tc.ReduceOp.SUM)(np.ones([2, 8]).astype(np.float32)).tolist()


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_operators(world_size):
    run_ranks(body_reductions, world_size, timeout=60)
    run_ranks(body_gather_broadcast, world_size, timeout=60)
    run_ranks(body_alltoall, world_size, timeout=60)


@pytest.mark.parametrize("world_size", [1, 3])
def test_errors(world_size):
    run_ranks(body_errors, world_size, timeout=60)


def test_seed_alltoall_8_ranks():
    for out in run_ranks(body_seed_alltoall, 8, timeout=60):
        assert out == [[[[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]]]]


def test_seed_allreduce_2_ranks():
    for out in run_ranks(body_seed_allreduce, 2, timeout=60):
        assert out == [[2.0] * 8] * 2
