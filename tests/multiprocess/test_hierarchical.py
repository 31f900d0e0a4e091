"""Groups that span "hosts" (host identities given per rank): hierarchical collectives against
numpy, bit-identical on every rank, for host-major and interleaved layouts, all ops that matter,
the small and large variants; uneven hosts run flat."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.testing import rank_data, reduce_reference, run_ranks

pytestmark = pytest.mark.multiprocess

LAYOUTS = {"AABB": "AABB", "ABAB": "ABAB", "AAABBB": "AAABBB", "AABBCC": "AABBCC"}


def _init(layout: str) -> None:
    os.environ["TENSORCOMM_HOST_ID"] = "host-" + layout[int(os.environ["RANK"])]
    tc.init(timeout=60)


def body_collectives(layout: str, count: int) -> dict:
    _init(layout)
    n, r = tc.get_world_size(), tc.get_rank()
    digests = {}
    for op, dtype in [(tc.ReduceOp.SUM, np.float32), (tc.ReduceOp.AVG, ml_dtypes.bfloat16),
                      (tc.ReduceOp.MAX, np.int64), (tc.premul_sum(0.5), np.float64)]:
        inputs = [rank_data(q, count, dtype, op=op) for q in range(n)]
        x = inputs[r].copy()
        tc.all_reduce(x, op=op)
        expected = reduce_reference(op, inputs)
        if op is tc.ReduceOp.AVG or isinstance(op, tc.PremulSum):
            np.testing.assert_allclose(x.astype(np.float64), expected.astype(np.float64), rtol=1e-2)
        else:
            np.testing.assert_array_equal(x, expected)
        digests[f"all_reduce {op}"] = x.tobytes()
    for root in range(n):
        x = rank_data(r, count, np.float32, salt=root)
        tc.broadcast(x, src=root)
        np.testing.assert_array_equal(x, rank_data(root, count, np.float32, salt=root))
    mine = rank_data(r, count, np.int32)
    out = np.empty(count * n, np.int32)
    tc.all_gather_into_tensor(out, mine)
    np.testing.assert_array_equal(out, np.concatenate([rank_data(q, count, np.int32) for q in range(n)]))
    parts = [np.empty(count + q, np.float32) for q in range(n)]  # uneven: the list variant
    tc.all_gather(parts, rank_data(r, count + r, np.float32))
    for q in range(n):
        np.testing.assert_array_equal(parts[q], rank_data(q, count + q, np.float32))
    source = rank_data(r, count * n, np.float32)
    block = np.empty(count, np.float32)
    tc.reduce_scatter_tensor(block, source)
    total = reduce_reference(tc.ReduceOp.SUM, [rank_data(q, count * n, np.float32) for q in range(n)])
    np.testing.assert_array_equal(block, total[r * count:(r + 1) * count])
    digests["reduce_scatter"] = block.tobytes()
    tc.barrier()
    chosen = {plan.algorithm for plan in tc.WORLD._target()._plans.values()}
    tc.destroy()
    return {"digests": digests, "algorithms": chosen}


@pytest.mark.parametrize("count", [5, 40_000])  # the small variants; the large ones (160 KB)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_hierarchical_collectives_match_numpy_and_agree_bitwise(layout, count):
    results = run_ranks(body_collectives, len(layout), layout, count, init=False, timeout=120)
    for result in results:
        assert result["algorithms"] == {"hierarchical"}, result["algorithms"]
        for key in ("all_reduce ReduceOp.SUM", "all_reduce ReduceOp.AVG"):
            assert result["digests"][key] == results[0]["digests"][key], key


def body_flat(layout: str) -> set:
    _init(layout)
    x = np.ones(8, np.float32)
    tc.all_reduce(x)
    assert x[0] == tc.get_world_size()
    chosen = {plan.algorithm for plan in tc.WORLD._target()._plans.values()}
    tc.destroy()
    return chosen


@pytest.mark.parametrize("layout, env, algorithm", [
    ("AAB", {}, "recursive_doubling"),  # hosts of different sizes: flat
    ("AABB", {"TENSORCOMM_HIERARCHY": "off"}, "recursive_doubling"),
    ("AABB", {"TENSORCOMM_ALGORITHMS": "all_reduce=ring"}, "ring"),
])
def test_flat_where_hierarchy_does_not_apply_or_is_turned_off(layout, env, algorithm):
    for chosen in run_ranks(body_flat, len(layout), layout, init=False, timeout=60, env=env):
        assert chosen == {algorithm}


def body_subgroup_and_failure(layout: str) -> str:
    _init(layout)
    r = tc.get_rank()
    pair = tc.new_group([0, 1, 2, 3])  # a hierarchical subgroup of the world
    x = np.full(3, r, np.float32)
    tc.all_reduce(x, group=pair)
    assert x[0] == 6
    tc.all_reduce(np.ones(4, np.float32))  # the world's plan for this shape exists now
    tc.barrier()
    if r == 3:  # a local failure inside a hierarchical call ends it on every member
        def out_of_memory(*args):
            raise MemoryError("injected")
        for plan in tc.WORLD._target()._plans.values():
            plan.run = out_of_memory
    try:
        tc.all_reduce(np.ones(4, np.float32))
        tc.barrier()
    except BaseException as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def test_a_failure_inside_a_hierarchical_call_reaches_every_rank():
    messages = run_ranks(body_subgroup_and_failure, 4, "AABB", init=False, timeout=90)
    assert messages[3].startswith("MemoryError"), messages
    for message in messages[:3]:
        assert "rank 3" in message, messages
