"""Bad arguments raise TypeError/ValueError at once, on the calling rank, naming the argument."""

from __future__ import annotations

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.testing import RanksFailed, run_ranks

pytestmark = pytest.mark.multiprocess


def _raises(exc, match, fn, *args, **kwargs) -> None:
    with pytest.raises(exc, match=match):
        fn(*args, **kwargs)


def body_bad_arguments() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    x = np.ones(4, np.float32)
    _raises(TypeError, "tensor: expected an array", tc.all_reduce, [1.0, 2.0])
    _raises(TypeError, "op: expected a tensorcomm.ReduceOp", tc.all_reduce, x, op=3)
    _raises(ValueError, "op: unknown reduction 'mean'", tc.all_reduce, x, op="mean")
    _raises(ValueError, "not defined for complex", tc.all_reduce, np.ones(2, np.complex64), op="max")
    _raises(ValueError, "BAND is not defined for float32", tc.all_reduce, x, op=tc.ReduceOp.BAND)
    _raises(TypeError, "async_op must be a bool", tc.all_reduce, x, async_op=1)
    _raises(TypeError, "group must be", tc.all_reduce, x, group=3.5)
    _raises(ValueError, "no group is named 'nope'", tc.all_reduce, x, group="nope")
    _raises(TypeError, "dtype object is not supported", tc.all_reduce, np.array([None, 1]))
    readonly = np.ones(3)
    readonly.flags.writeable = False
    _raises(ValueError, "read-only", tc.all_reduce, readonly)
    _raises(TypeError, "dst must be an int", tc.reduce, x, dst="0")
    _raises(TypeError, "dst must be an int", tc.reduce, x, dst=True)
    _raises(ValueError, "dst=99 is out of range", tc.reduce, x, dst=99)
    _raises(ValueError, "src=-1 is out of range", tc.broadcast, x, src=-1)
    _raises(tc.ArgumentMismatchError, f"must hold {size} arrays", tc.all_gather, [x] * (size + 2), x)
    _raises(TypeError, "tensor_list must be a list", tc.all_gather, x, x)
    _raises(TypeError, "gather_list must hold", tc.gather, x, [x] * (size + 1), dst=rank)
    bad = [np.ones(4, np.float32) for _ in range(size)]
    bad[-1] = np.ones(5, np.float32)
    _raises(TypeError, r"gather_list\[\d\] is float32\[5\] but the tensor is float32\[4\]: shapes",
            tc.gather, x, bad, dst=rank)
    wrong = [np.ones(4, np.float64) for _ in range(size)]
    _raises(ValueError, "dtypes must match", tc.gather, x, wrong, dst=rank)
    _raises(ValueError, "gather_list is required", tc.gather, x, None, dst=rank)
    _raises(ValueError, "must hold group size", tc.all_gather_into_tensor, np.ones(3), np.ones(2))
    _raises(ValueError, "tag must be in", tc.isend, x, 0, tag=-1)
    outs = [np.ones(4, np.float32) for _ in range(size)]
    outs[-1] = np.ones(4, np.float64)
    _raises(ValueError, rf"output_tensor_list\[{size - 1}\] is float64\[4\]", tc.all_to_all,
            outs, [x] * size)
    _raises(ValueError, "ranks must be unique", tc.new_group, [0, 0])
    _raises(TypeError, r"ranks\[0\] must be an int", tc.new_group, ["a"])
    _raises(ValueError, "input_split_sizes must be non-negative and sum", tc.all_to_all_single,
            np.ones((size, 2)), np.ones((size, 2)), None, [size + 1] + [0] * (size - 1))
    # every rank still works together afterwards: nothing was half-issued
    tc.all_reduce(x)
    assert (x == size).all()


def body_bool_logical() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    flags = np.array([rank == 0, True, False])
    tc.all_reduce(flags)  # SUM on bool is logical or
    np.testing.assert_array_equal(flags, [True, True, False])
    flags = np.array([rank == 0, True, False])
    tc.all_reduce(flags, op=tc.ReduceOp.MIN)  # and
    np.testing.assert_array_equal(flags, [size == 1, True, False])


def body_uninitialized() -> None:
    _raises(RuntimeError, "not initialized", tc.all_reduce, np.ones(2))
    assert not tc.is_initialized()


# Ranks of one host use shared memory unless TENSORCOMM_TRANSPORT=tcp: run both ways.
TRANSPORTS = {"shm": {}, "tcp": {"TENSORCOMM_TRANSPORT": "tcp"}}


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("world_size", [1, 3])
def test_bad_arguments(world_size, transport):
    run_ranks(body_bad_arguments, world_size, timeout=60, env=TRANSPORTS[transport])


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_bool_is_logical(transport):
    run_ranks(body_bool_logical, 2, timeout=60, env=TRANSPORTS[transport])


def test_calls_before_init_say_so():
    run_ranks(body_uninitialized, 1, timeout=30, init=False)


def test_failed_rank_output_is_reported():
    with pytest.raises(RanksFailed, match="boom from rank"):
        run_ranks(body_fails_on_rank_one, 2, timeout=30)


def body_fails_on_rank_one() -> None:
    if tc.get_rank() == 1:
        raise RuntimeError("boom from rank 1")
