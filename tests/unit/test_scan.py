"""scan and exscan (``algorithms/scan.py``) against numpy's cumulative ops, with threads as ranks.

The transport algorithm runs over the loopback transport at 1 to 7 ranks (every message recorded:
no two of a call share a tag); the shared-memory one on a tiny-slot domain, so arrays of a few
hundred elements take its multi-round path under the journal.
"""

from __future__ import annotations

import time

import ml_dtypes
import numpy as np
import one_off  # same directory
import pytest
from test_algorithms import TIERED_SIZES, run_ranks  # same directory
from test_shm_algorithms import SLOT, Group  # same directory

from tensorcomm import config
from tensorcomm.algorithms import kernels, scan, select
from tensorcomm.algorithms.base import Ctx
from tensorcomm.errors import GroupAbortedError
from tensorcomm.signature import signature
from tensorcomm.testing import rank_data, reduces
from tensorcomm.transports.loopback import run_threads
from tensorcomm.transports.shm import slots
from tensorcomm.types import PremulSum, ReduceOp

OPS = [ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG, ReduceOp.BAND,
       ReduceOp.BOR, ReduceOp.BXOR, ReduceOp.premul_sum(0.5)]
DTYPES = [np.bool_, np.int32, np.uint8, np.float16, ml_dtypes.bfloat16, np.float32, np.float64,
          np.complex64]
BF16 = np.dtype(ml_dtypes.bfloat16)
CUMULATIVE = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply, ReduceOp.MIN: np.minimum,
              ReduceOp.MAX: np.maximum, ReduceOp.BAND: np.bitwise_and, ReduceOp.BOR: np.bitwise_or,
              ReduceOp.BXOR: np.bitwise_xor}


def algorithm(inclusive: bool, name: str):
    """The row's function of ``select.ROWS`` (``one_off.run`` prepares its plan as the core does)."""
    return next(row.fn for row in select.ROWS
                if row.collective == ("scan" if inclusive else "exscan") and row.name == name)


def expected_prefixes(op, inputs: list[np.ndarray], inclusive: bool) -> list[np.ndarray | None]:
    """What each rank should hold: numpy's cumulative op over the ranks (axis 0), computed in the
    accumulation dtype as tensorcomm's kernels do, rounded once; None for exscan's rank 0."""
    dtype = inputs[0].dtype
    acc = kernels.accumulation_dtype(op, dtype)
    stack = np.stack([a.astype(acc) for a in inputs])
    if isinstance(op, PremulSum):
        stack = stack * np.asarray(op.factor, acc)
    if op is ReduceOp.AVG or isinstance(op, PremulSum):
        running = np.cumsum(stack, axis=0, dtype=acc)
        if op is ReduceOp.AVG:
            running = running / np.arange(1, len(inputs) + 1, dtype=acc.type(0).real.dtype)[:, None]
    else:
        running = CUMULATIVE[op].accumulate(stack, axis=0, dtype=acc)
    prefixes = [row.astype(dtype) for row in running]
    return prefixes if inclusive else [None, *prefixes[:-1]]


def assert_prefix(got: np.ndarray, expected: np.ndarray, op, what: str) -> None:
    if got.dtype.kind in "biu" or op in (ReduceOp.MIN, ReduceOp.MAX):
        np.testing.assert_array_equal(got, expected, err_msg=what)
        return
    tolerance = 1e-2 if got.dtype in (np.float16, BF16) else 1e-5
    np.testing.assert_allclose(got.astype(np.complex128), expected.astype(np.complex128),
                               rtol=tolerance, err_msg=what)


@pytest.mark.parametrize("inclusive", [True, False], ids=["scan", "exscan"])
@pytest.mark.parametrize("size", TIERED_SIZES)
def test_recursive_doubling_matches_numpy_cumulative_ops(size, inclusive):
    fn = algorithm(inclusive, "recursive_doubling")
    cases = [(op, np.dtype(dtype), count) for op in OPS for dtype in DTYPES if reduces(op, dtype)
             for count in (0, 1, 37)]

    def body(next_ctx):
        results = []
        for op, dtype, count in cases:
            ctx = next_ctx()
            x = rank_data(ctx.rank, count, dtype, op=op)
            one_off.run(ctx, fn, x, op)
            results.append(x)
        return results

    per_rank = run_ranks(size, body)
    for index, (op, dtype, count) in enumerate(cases):
        inputs = [rank_data(r, count, dtype, op=op) for r in range(size)]
        for r, expected in enumerate(expected_prefixes(op, inputs, inclusive)):
            got = per_rank[r][index]
            what = f"{'scan' if inclusive else 'exscan'} {op} {dtype} x{count} rank {r}"
            if expected is None:
                np.testing.assert_array_equal(got, inputs[0], err_msg=what + " (left as it was)")
            else:
                assert_prefix(got, expected, op, what)


@pytest.mark.parametrize("size", [2, 3, 5])
def test_recursive_doubling_in_chunks(size, monkeypatch):
    """Blocks travel in several messages of one step (the transport keeps them in order), each
    combined as it arrives."""
    monkeypatch.setattr(config, "TCP_CHUNK_BYTES", 40)  # 5 float64 per message
    count = 37

    def rank_main(transport):
        results = []
        for seq, inclusive in enumerate((True, False)):
            ctx = one_off.one_off_ctx(transport, range(size), transport.rank, group_id=1, seq=seq,
                                      timeout=15.0)
            x = rank_data(transport.rank, count, np.float64)
            one_off.run(ctx, algorithm(inclusive, "recursive_doubling"), x, ReduceOp.SUM)
            results.append(x)
        return results

    per_rank = run_threads(size, rank_main, timeout=60)
    running = np.cumsum([rank_data(r, count, np.float64) for r in range(size)], axis=0)
    for r in range(size):
        np.testing.assert_array_equal(per_rank[r][0], running[r])
        exclusive = running[r - 1] if r else rank_data(0, count, np.float64)
        np.testing.assert_array_equal(per_rank[r][1], exclusive)


def test_recursive_doubling_keeps_lower_ranks_on_the_left():
    """Signed zeros tie under MIN/MAX, and numpy returns one operand or the other: the result is
    bit for bit numpy's left-to-right accumulation at every rank."""
    size = 6
    values = [np.array([0.0, -0.0, 0.0], np.float64) * (-1) ** r for r in range(size)]
    fn = algorithm(True, "recursive_doubling")

    def body(next_ctx):
        out = []
        for op in (ReduceOp.MIN, ReduceOp.MAX):
            ctx = next_ctx()
            x = values[ctx.rank].copy()
            one_off.run(ctx, fn, x, op)
            out.append(x)
        return out

    per_rank = run_ranks(size, body)
    for index, ufunc in enumerate((np.minimum, np.maximum)):
        expected = ufunc.accumulate(np.stack(values), axis=0)
        for r in range(size):
            assert per_rank[r][index].tobytes() == expected[r].tobytes()


@pytest.mark.skipif(not slots.SUPPORTED, reason="shared memory needs x86-64")
@pytest.mark.parametrize("inclusive", [True, False], ids=["scan", "exscan"])
@pytest.mark.parametrize("size", [1, 2, 3, pytest.param(5, marks=pytest.mark.slow)])
def test_shm_prefix_matches_numpy_cumulative_ops(size, inclusive):
    group = Group(size)
    fn = algorithm(inclusive, "shm_prefix")
    try:
        for op in OPS:
            for dtype in map(np.dtype, DTYPES):
                if not reduces(op, dtype):
                    continue
                # within one slot, and several slots' worth (rounds under the journal)
                for count in (0, 7, 5 * SLOT // kernels.accumulation_dtype(op, dtype).itemsize + 3):
                    inputs = [rank_data(r, count, dtype, op=op) for r in range(size)]
                    arrays = [a.copy() for a in inputs]
                    group.call(lambda ctx, arrays=arrays, op=op: one_off.run(ctx, fn, arrays[ctx.rank], op),
                               signature("scan" if inclusive else "exscan", dtype, count, op))
                    for r, expected in enumerate(expected_prefixes(op, inputs, inclusive)):
                        what = f"{op} {dtype} x{count} rank {r}"
                        if expected is None:
                            np.testing.assert_array_equal(arrays[r], inputs[0], err_msg=what)
                        else:
                            assert_prefix(arrays[r], expected, op, what)
    finally:
        group.close()


@pytest.mark.skipif(not slots.SUPPORTED, reason="shared memory needs x86-64")
def test_a_failed_multi_round_shm_scan_leaves_the_array_untouched():
    group = Group(2, keep_going=True)
    count = 4 * SLOT // 4  # four rounds of float32
    original = rank_data(1, count, np.float32)
    array = original.copy()

    def body(ctx: Ctx) -> None:
        d = ctx.team.shm
        if ctx.rank == 0:  # take part in two rounds with ones, then give up
            d.inbox[0][d.next_round()].view(np.float32)[...] = 1
            d.start(ctx)
            d.inbox[0][d.next_round()].view(np.float32)[...] = 1
            d.post()
            d.wait(d.peers, d.posts, ctx)
            time.sleep(0.3)
            d.abort(GroupAbortedError("peer gave up"))
            raise GroupAbortedError("gave up on purpose")
        one_off.run(ctx, algorithm(True, "shm_prefix"), array, ReduceOp.SUM)

    try:
        with pytest.raises(GroupAbortedError):
            group.call(body, signature("scan", np.dtype(np.float32), count, ReduceOp.SUM))
        np.testing.assert_array_equal(array, original)
    finally:
        group.close()


def test_terms():
    assert [scan.terms(r, True) for r in range(3)] == [1, 2, 3]
    assert [scan.terms(r, False) for r in range(3)] == [0, 1, 2]


# -- through the core and the frontends, on a world of one in this process --------------------


@pytest.fixture
def world():
    import tensorcomm as tc
    from tensorcomm.rendezvous.store import HashStore

    tc.init(store=HashStore(), rank=0, world_size=1, timeout=30)
    try:
        yield tc
    finally:
        tc.destroy()


def test_a_world_of_one_scans_splits_and_enumerates(world):
    tc = world
    from tensorcomm.ops import Exscan, Scan

    x = np.arange(6, dtype=np.float16).reshape(2, 3)
    tc.scan(x, op="avg")
    np.testing.assert_array_equal(x, np.arange(6).reshape(2, 3))
    y = np.full(3, 5, np.int64)
    assert tc.exscan(y, op="prod", async_op=True).wait(timeout=10) is True
    assert (y == 5).all()  # rank 0's exclusive prefix is empty: left as it was
    assert (Scan("max")(np.ones(2)) == 1).all() and Exscan("sum")(np.ones(2)) is None
    alone = tc.WORLD.split(3, key=-1)
    assert alone is not None and alone.ranks == (0,)
    z = np.ones(2, np.float32)
    tc.scan(z, group=alone)
    assert tc.WORLD.split(None) is None and tc.WORLD.split(-1) is None
    mine, subgroups = tc.new_subgroups_by_enumeration([[0]])
    assert mine is subgroups[0] and mine.ranks == (0,)


@pytest.mark.parametrize(("call", "error", "words"), [
    (lambda tc: tc.scan([1, 2]), TypeError, "scan: tensor"),
    (lambda tc: tc.exscan(np.ones(2), op="bogus"), ValueError, "exscan: op"),
    (lambda tc: tc.scan(np.ones(2), op="bxor"), ValueError, "scan: op"),
    (lambda tc: tc.scan(np.ones(2, np.int8), op="avg"), ValueError, "scan: op"),
    (lambda tc: tc.scan(np.ones(2), async_op=1), TypeError, "scan: async_op"),
    (lambda tc: tc.exscan(np.ones(2), group=2.0), TypeError, "exscan: group"),
    (lambda tc: tc.WORLD.split("red"), TypeError, "split: color"),
    (lambda tc: tc.WORLD.split(False), TypeError, "split: color"),
    (lambda tc: tc.WORLD.split(0, key="1"), TypeError, "split: key"),
    (lambda tc: tc.WORLD.split(-(1 << 64)), ValueError, "split: color"),
    (lambda tc: tc.new_subgroups_by_enumeration(5), TypeError, "ranks_per_subgroup_list"),
    (lambda tc: tc.new_subgroups_by_enumeration([[0], [0]]), ValueError, "rank 0 is in"),
    (lambda tc: tc.new_subgroups_by_enumeration([[]]), ValueError, "must not be empty"),
])
def test_bad_arguments_name_themselves(world, call, error, words):
    with pytest.raises(error, match=words):
        call(world)
