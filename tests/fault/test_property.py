"""Random shapes, dtypes, ops and argument types thrown at the public API on two real ranks:
only a correct result or a TypeError/ValueError with a message is acceptable.

Both ranks run the same derandomised hypothesis search, so they make the same calls in the same
order; a call that one rank rejects is rejected by the other too (validation is local and
deterministic), which keeps the group in step.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorcomm as tc
from tensorcomm.testing import rank_data, reduce_reference, run_ranks

pytestmark = pytest.mark.fault

DTYPES = [np.bool_, np.int8, np.uint16, np.int32, np.int64, np.uint64, np.float16,
          ml_dtypes.bfloat16, np.float32, np.float64, np.complex64, np.complex128, object, np.str_]
OPS = ["sum", "prod", "min", "max", "avg", "band", "bor", "bxor", "mean", 7, None,
       tc.ReduceOp.SUM, tc.ReduceOp.AVG, tc.ReduceOp.BXOR]
COLLECTIVES = ["all_reduce", "broadcast", "reduce", "all_gather_into_tensor", "reduce_scatter_tensor"]
WEIRD = [None, 3, "x", [1, 2], (1.5,), 2.5, True]


def _inputs(rank: int, shape: tuple, dtype, op):
    if dtype in (object, np.str_):
        return np.zeros(shape, dtype)
    safe = op if isinstance(op, tc.ReduceOp) else None
    return rank_data(rank, shape, dtype, op=safe or tc.ReduceOp.SUM)


def _run_one(name: str, shape: tuple, dtype, op, root, weird) -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    x = weird if weird is not None else _inputs(rank, shape, dtype, op)
    everyone = [_inputs(r, shape, dtype, op) for r in range(size)] if weird is None else None
    try:
        if name == "all_reduce":
            tc.all_reduce(x, op=op)
            parsed = tc.ReduceOp.parse(op)
            expected = reduce_reference(parsed, everyone)
            if parsed is tc.ReduceOp.AVG:
                np.testing.assert_allclose(x.astype(np.float64), expected.astype(np.float64), rtol=1e-2)
            else:
                np.testing.assert_array_equal(x, expected)
        elif name == "broadcast":
            tc.broadcast(x, src=root)
            np.testing.assert_array_equal(x, everyone[root])
        elif name == "reduce":
            tc.reduce(x, dst=root, op=op)
            if rank == root and tc.ReduceOp.parse(op) is not tc.ReduceOp.AVG:
                np.testing.assert_array_equal(x, reduce_reference(tc.ReduceOp.parse(op), everyone))
        elif name == "all_gather_into_tensor":
            out = np.zeros(size * x.size, x.dtype) if weird is None else np.zeros(2, np.float32)
            tc.all_gather_into_tensor(out, x)
            np.testing.assert_array_equal(out.reshape(-1), np.concatenate([e.reshape(-1) for e in everyone]))
        elif name == "reduce_scatter_tensor":
            out = np.zeros(x.size // size, x.dtype) if weird is None else np.zeros(2, np.float32)
            tc.reduce_scatter_tensor(out, x, op=op)
            expected = reduce_reference(tc.ReduceOp.parse(op), everyone).reshape(-1)
            block = expected[rank * out.size:(rank + 1) * out.size]
            if tc.ReduceOp.parse(op) is tc.ReduceOp.AVG:
                np.testing.assert_allclose(out.astype(np.float64), block.astype(np.float64), rtol=1e-2)
            else:
                np.testing.assert_array_equal(out, block)
    except (TypeError, ValueError) as exc:
        assert str(exc), f"{type(exc).__name__} without a message"
        assert not isinstance(exc, AssertionError)


def body_property() -> int:
    calls = []

    @settings(max_examples=150, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(name=st.sampled_from(COLLECTIVES),
           shape=st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple),
           dtype=st.sampled_from(DTYPES), op=st.sampled_from(OPS),
           root=st.sampled_from([0, 1, -1, 2, "0", 1.0]),
           weird=st.one_of(st.none(), st.none(), st.none(), st.sampled_from(WEIRD)))
    def check(name, shape, dtype, op, root, weird):
        calls.append(name)
        _run_one(name, shape, dtype, op, root, weird)

    check()
    tc.barrier()  # both ranks are still in step after every example
    return len(calls)


def test_public_api_returns_a_right_answer_or_a_clear_error():
    counts = run_ranks(body_property, 2, timeout=300)
    assert counts[0] == counts[1] >= 100
