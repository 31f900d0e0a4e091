"""Bad arguments raise at once on every rank of a world of several, naming the argument and the
group's size, and leave the ranks able to go on together. Each argument check on its own runs in
the test process: tests/unit/test_validation.py.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.testing import RanksFailed, run_ranks

pytestmark = pytest.mark.multiprocess


def _failure(exc: type[Exception], match: str, fn: Callable[..., object], *args: object,
             **kwargs: object) -> str | None:
    """None if ``fn(*args, **kwargs)`` raises ``exc`` matching ``match``, else what happened."""
    try:
        with pytest.raises(exc, match=match):
            fn(*args, **kwargs)
    except BaseException as failed:  # noqa: BLE001 - reported with every other case
        return f"{getattr(fn, '__name__', fn)}: {failed}"
    return None


def body_bad_arguments() -> list[str]:
    """Every case whose check depends on the group's size; returns the cases that went wrong."""
    rank, size = tc.get_rank(), tc.get_world_size()
    x = np.ones(4, np.float32)
    shapes = [np.ones(4, np.float32) for _ in range(size)]
    shapes[-1] = np.ones(5, np.float32)
    outs = [np.ones(4, np.float32) for _ in range(size)]
    outs[-1] = np.ones(4, np.float64)
    failures = [
        _failure(ValueError, "dst=99 is out of range", tc.reduce, x, dst=99),
        _failure(tc.ArgumentMismatchError, f"must hold {size} arrays", tc.all_gather,
                 [x] * (size + 2), x),
        _failure(TypeError, "gather_list must hold", tc.gather, x, [x] * (size + 1), dst=rank),
        _failure(TypeError, rf"gather_list\[{size - 1}\] is float32\[5\] but the tensor is "
                 r"float32\[4\]: shapes", tc.gather, x, shapes, dst=rank),
        _failure(ValueError, rf"output_tensor_list\[{size - 1}\] is float64\[4\]", tc.all_to_all,
                 outs, [x] * size),
        _failure(ValueError, "input_split_sizes must be non-negative and sum", tc.all_to_all_single,
                 np.ones((size, 2)), np.ones((size, 2)), None, [size + 1] + [0] * (size - 1)),
        _failure(ValueError, "out of range", tc.new_subgroups_by_enumeration, [[0, size]]),
    ]
    # every rank still works together afterwards: nothing was half-issued
    tc.all_reduce(x)
    assert (x == size).all()
    return [failure for failure in failures if failure is not None]


def body_bool_logical() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    flags = np.array([rank == 0, True, False])
    tc.all_reduce(flags)  # SUM on bool is logical or
    np.testing.assert_array_equal(flags, [True, True, False])
    flags = np.array([rank == 0, True, False])
    tc.all_reduce(flags, op=tc.ReduceOp.MIN)  # and
    np.testing.assert_array_equal(flags, [size == 1, True, False])


# Ranks of one host use shared memory unless TENSORCOMM_TRANSPORT=tcp: run both ways.
TRANSPORTS = {"shm": {}, "tcp": {"TENSORCOMM_TRANSPORT": "tcp"}}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_bad_arguments(transport):
    failures = run_ranks(body_bad_arguments, 3, timeout=60, env=TRANSPORTS[transport])
    assert failures == [[], [], []], failures


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_bool_is_logical(transport):
    run_ranks(body_bool_logical, 2, timeout=60, env=TRANSPORTS[transport])


def test_failed_rank_output_is_reported():
    with pytest.raises(RanksFailed, match="boom from rank"):
        run_ranks(body_fails_on_rank_one, 2, timeout=30)


def body_fails_on_rank_one() -> None:
    if tc.get_rank() == 1:
        raise RuntimeError("boom from rank 1")
