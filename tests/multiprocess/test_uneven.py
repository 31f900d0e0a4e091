"""Uneven ("v") collectives on 1-5 real ranks: sizes unknown to receivers, checked against numpy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.testing import rank_data, run_ranks

pytestmark = pytest.mark.multiprocess


def _rows(rank: int) -> int:
    return (3 * rank + 1) % 4  # 1, 0, 3, 2, 1: includes empty contributions


def body_uneven() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    for dtype in (np.int64, np.float16, ml_dtypes.bfloat16, np.complex128):
        for trailing in ((), (3,), (2, 0)):
            everyone = [rank_data(r, (_rows(r), *trailing), dtype) for r in range(size)]
            x, before = everyone[rank].copy(), everyone[rank].copy()
            joined = np.concatenate(everyone)
            sizes = [_rows(r) for r in range(size)]

            gathered, got_sizes = tc.all_gather_v(x)
            np.testing.assert_array_equal(gathered, joined)
            assert got_sizes == sizes and gathered.dtype == x.dtype
            np.testing.assert_array_equal(x, before)

            for root in range(size):
                result = tc.gather_v(x, dst=root)
                if rank == root:
                    np.testing.assert_array_equal(result[0], joined)
                    assert result[1] == sizes
                else:
                    assert result is None
                splits = [_rows(r + root) for r in range(size)]
                source = rank_data(root, (sum(splits), *trailing), dtype, salt=5)
                piece = tc.scatter_v(source if rank == root else None, splits if rank == root else None,
                                     src=root)
                start = sum(splits[:rank])
                np.testing.assert_array_equal(piece, source[start:start + splits[rank]])
                assert piece.dtype == source.dtype

            # all_to_all_v: rank r sends (r + j) % 3 rows to rank j; receivers do not know the sizes
            send = [(rank + j) % 3 for j in range(size)]
            data = rank_data(rank, (sum(send), *trailing), dtype, salt=9)
            received, splits = tc.all_to_all_v(data, send)
            assert splits == [(r + rank) % 3 for r in range(size)]
            expected = []
            for r in range(size):
                theirs = [(r + j) % 3 for j in range(size)]
                their_data = rank_data(r, (sum(theirs), *trailing), dtype, salt=9)
                expected.append(their_data[sum(theirs[:rank]):sum(theirs[:rank + 1])])
            np.testing.assert_array_equal(received, np.concatenate(expected))
    # equal splits by default
    even = np.arange(size * 2, dtype=np.int32).reshape(size * 2, 1) + 100 * rank
    received, splits = tc.all_to_all_v(even)
    assert splits == [2] * size
    np.testing.assert_array_equal(received[:, 0], np.concatenate(
        [np.arange(2 * rank, 2 * rank + 2) + 100 * r for r in range(size)]))


def body_reduce_scatter_v() -> None:
    """MPI's Reduce_scatter with recvcounts, as reduce_scatter_v and as reduce_scatter's blocks."""
    rank, size = tc.get_rank(), tc.get_world_size()
    for dtype in (np.int64, np.float32, ml_dtypes.bfloat16):
        for trailing in ((), (3,)):
            splits = [_rows(r) for r in range(size)]  # includes members that get nothing
            everyone = [rank_data(r, (sum(splits), *trailing), dtype, salt=3) for r in range(size)]
            wide = np.float32 if dtype == ml_dtypes.bfloat16 else dtype
            total = np.add.reduce([e.astype(wide) for e in everyone]).astype(dtype)
            start = sum(splits[:rank])
            mine = total[start:start + splits[rank]]
            x = everyone[rank].copy()
            got = tc.reduce_scatter_v(x, splits)
            assert got.dtype == x.dtype and got.shape == mine.shape
            np.testing.assert_array_equal(got, mine)
            np.testing.assert_array_equal(x, everyone[rank])  # the input is untouched
            blocks = np.split(x, np.cumsum(splits)[:-1])
            out = np.empty_like(mine)
            tc.reduce_scatter(out, blocks)
            np.testing.assert_array_equal(out, mine)
            out = np.empty_like(mine)
            tc.reduce_scatter(out, blocks, async_op=True).wait()
            np.testing.assert_array_equal(out, mine)
    maxed = tc.reduce_scatter_v(np.arange(size * 2.0) * (rank + 1), None, op=tc.ReduceOp.MAX)
    np.testing.assert_array_equal(maxed, np.arange(2.0 * rank, 2.0 * rank + 2) * size)


def body_errors() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    with pytest.raises(ValueError, match="at least one dimension"):
        tc.all_gather_v(np.ones(()))
    with pytest.raises(ValueError, match="splits must be non-negative and sum"):
        tc.all_to_all_v(np.ones(3), [4] + [0] * (size - 1))
    with pytest.raises(TypeError, match="splits must be a list"):
        tc.all_to_all_v(np.ones(3), 3)
    with pytest.raises(ValueError, match="dst=99 is out of range"):
        tc.gather_v(np.ones(3), dst=99)
    with pytest.raises(TypeError, match="tensor: expected an array"):
        tc.scatter_v([1, 2], [2] + [0] * (size - 1), src=rank)
    # a dtype / trailing-shape mismatch is detected on every rank, not garbled
    with pytest.raises(tc.CollectiveMismatchError, match=r"group ranks \[1\] differ from group rank 0"):
        tc.all_gather_v(np.ones((2, 3 if rank == 1 else 4), np.float32))
    with pytest.raises(tc.CollectiveMismatchError, match="disagree on the dtype"):
        tc.all_to_all_v(np.ones(size, np.float64 if rank == 1 else np.float32))
    # members that split a reduce_scatter differently all get an error
    theirs = [1, 2, 3] if rank == 0 else [2, 1, 3]
    with pytest.raises(tc.CollectiveMismatchError, match="disagree on the dtype or the block sizes"):
        tc.reduce_scatter_v(np.ones(6), theirs)
    with pytest.raises(tc.CollectiveMismatchError, match="disagree on the dtype or the block sizes"):
        tc.reduce_scatter(np.empty(theirs[rank]), np.split(np.ones(6), np.cumsum(theirs)[:-1]))
    with pytest.raises(ValueError, match="BAND is not defined"):
        tc.reduce_scatter_v(np.ones(6), [1, 2, 3], op=tc.ReduceOp.BAND)
    with pytest.raises(tc.ArgumentMismatchError, match=rf"input_list\[{rank}\] .* must hold as many"):
        tc.reduce_scatter(np.empty(5), [np.ones(1), np.ones(2), np.ones(3)])
    _, sizes = tc.all_gather_v(np.ones(1))
    assert sizes == [1] * size


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_uneven(world_size):
    run_ranks(body_uneven, world_size, timeout=60)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_reduce_scatter_v(world_size):
    run_ranks(body_reduce_scatter_v, world_size, timeout=60)


def test_errors():
    run_ranks(body_errors, 3, timeout=60)
