"""scan, exscan and Group.split on real ranks, shared memory and TCP, against numpy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.algorithms import kernels
from tensorcomm.ops import Exscan, Scan
from tensorcomm.testing import rank_data, reduces, run_ranks

pytestmark = pytest.mark.multiprocess

TRANSPORTS = {"shm": {}, "tcp": {"TENSORCOMM_TRANSPORT": "tcp"}}
DTYPES = [np.bool_, np.int8, np.int64, np.uint8, np.float16, ml_dtypes.bfloat16, np.float32,
          np.float64, np.complex64]
OPS = [tc.ReduceOp.SUM, tc.ReduceOp.PROD, tc.ReduceOp.MIN, tc.ReduceOp.MAX, tc.ReduceOp.AVG,
       tc.ReduceOp.BAND, tc.ReduceOp.BOR, tc.ReduceOp.BXOR, tc.premul_sum(0.5)]
CUMULATIVE = {tc.ReduceOp.SUM: np.add, tc.ReduceOp.PROD: np.multiply, tc.ReduceOp.MIN: np.minimum,
              tc.ReduceOp.MAX: np.maximum, tc.ReduceOp.BAND: np.bitwise_and,
              tc.ReduceOp.BOR: np.bitwise_or, tc.ReduceOp.BXOR: np.bitwise_xor}
# More than one shared-memory slot (1 MiB) in the accumulation dtype: the multi-round path.
LARGE = 300_000



def _prefix(op, inputs: list[np.ndarray], upto: int) -> np.ndarray:
    """numpy's cumulative op over ranks ``0..upto`` (axis 0), in the accumulation dtype all_reduce
    uses (half-precision sums in float32), rounded once."""
    dtype = inputs[0].dtype
    acc = kernels.accumulation_dtype(op, dtype)
    stack = np.stack([a.astype(acc) for a in inputs[:upto + 1]])
    if isinstance(op, tc.PremulSum):
        return np.cumsum(stack * np.asarray(op.factor, acc), axis=0, dtype=acc)[-1].astype(dtype)
    if op is tc.ReduceOp.AVG:
        return (np.cumsum(stack, axis=0, dtype=acc)[-1] / (upto + 1)).astype(dtype)
    return CUMULATIVE[op].accumulate(stack, axis=0, dtype=acc)[-1].astype(dtype)


def _check(got: np.ndarray, expected: np.ndarray, op, what: str) -> None:
    if got.dtype.kind in "biu" or op in (tc.ReduceOp.MIN, tc.ReduceOp.MAX):
        np.testing.assert_array_equal(got, expected, err_msg=what)
    else:
        tolerance = 1e-2 if got.dtype in (np.float16, ml_dtypes.bfloat16) else 1e-6
        np.testing.assert_allclose(got.astype(np.complex128), expected.astype(np.complex128),
                                   rtol=tolerance, err_msg=what)


def body_scan_every_op_and_dtype() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    cases = [(op, dtype, count) for op in OPS for dtype in DTYPES if reduces(op, dtype)
             for count in (1, 13)]
    cases += [(tc.ReduceOp.SUM, np.float32, LARGE), (tc.ReduceOp.AVG, np.float16, LARGE),
              (tc.ReduceOp.MAX, np.int64, LARGE)]
    for op, dtype, count in cases:
        inputs = [rank_data(r, count, dtype, op=op) for r in range(size)]
        x = inputs[rank].copy()
        tc.scan(x, op=op)
        assert tc.WORLD.last_call.collective == "scan"
        _check(x, _prefix(op, inputs, rank), op, f"scan {op} {np.dtype(dtype)} x{count}")
        y = inputs[rank].copy()
        work = tc.exscan(y, op=op, async_op=True)
        work.wait(timeout=60)
        assert work.algorithm == ("shm_prefix" if tc.WORLD.transport_kind is tc.TransportKind.SHM
                                  else "recursive_doubling"), work.algorithm
        what = f"exscan {op} {np.dtype(dtype)} x{count}"
        if rank == 0:
            np.testing.assert_array_equal(y, inputs[0], err_msg=what + " (rank 0 left as it was)")
        else:
            _check(y, _prefix(op, inputs, rank - 1), op, what)


def body_scan_async_groups_and_objects() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    xs = [np.full((2, 3), rank + i, np.float64) for i in range(3)]
    works = [tc.scan(x, async_op=True) for x in xs]
    late = np.full(4, rank + 1, np.int32)
    exscan_work = tc.exscan(late, op="prod", async_op=True)
    for i, (x, work) in enumerate(zip(xs, works, strict=True)):
        assert work.wait(timeout=30) is True
        assert (x == sum(r + i for r in range(rank + 1))).all()
    exscan_work.wait(timeout=30)
    assert (late == (np.prod(np.arange(1, rank + 1)) if rank else 1)).all()
    # a non-contiguous tensor is written back; the input of an operator object is not touched
    wide = np.arange(12, dtype=np.float32).reshape(3, 4) + rank
    view = wide[:, ::2]
    tc.scan(view, op="max")
    assert (view == np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2] + rank).all()
    source = np.full(3, rank + 1.0)
    assert (Scan("sum")(source) == sum(range(1, rank + 2))).all() and (source == rank + 1).all()
    before = Exscan("min")(source)
    assert before is None if rank == 0 else (before == 1.0).all()
    # on a subgroup made by split, in reverse order: group rank 0 is the highest global rank
    reverse = tc.WORLD.split(0, key=-rank)
    assert reverse is not None and reverse.rank == size - 1 - rank
    z = np.full(2, rank, np.int64)
    tc.scan(z, group=reverse)
    assert (z == sum(range(rank, size))).all()
    reverse.destroy()


def body_split() -> list:
    rank, size = tc.get_rank(), tc.get_world_size()
    world = tc.WORLD
    # parity colors, reversed keys; the last rank passes None and gets no group
    color = None if rank == size - 1 else rank % 2
    mine = world.split(color, key=-rank)
    if color is None:
        assert mine is None
    else:
        expected = sorted((r for r in range(size - 1) if r % 2 == color), reverse=True)
        assert mine.ranks == tuple(expected), (mine.ranks, expected)
        assert mine.rank == expected.index(rank)
        x = np.full(3, rank, np.int64)
        tc.all_reduce(x, group=mine)
        assert (x == sum(expected)).all()
    # negative color: no group; equal keys keep the parent's order
    other = world.split(-5 if rank == 0 else 7)
    assert (other is None) == (rank == 0)
    if other is not None:
        assert other.ranks == tuple(range(1, size))
        # split a split group: every member alone
        alone = other.split(rank, key=0)
        assert alone is not None and alone.ranks == (rank,)
    # torch's enumeration: the last rank is in no list
    lists = [list(range(0, size - 1, 2)), list(range(1, size - 1, 2))]
    lists = [ranks for ranks in lists if ranks]
    current, subgroups = tc.new_subgroups_by_enumeration(lists)
    assert [list(g.ranks) for g in subgroups] == lists
    if rank == size - 1:
        assert current is None
    else:
        assert current is not None and rank in current.ranks and current.is_member
        y = np.ones(1, np.float32)
        tc.all_reduce(y, group=current)
        assert y[0] == current.size
    return [None if mine is None else list(mine.ranks), current is None]


def body_split_name() -> str:
    if tc.get_rank() == 0:
        tc.new_group([0])  # only its member makes it: rank 0 has made one group more than the others
    return tc.WORLD.split(0).name


def test_a_split_group_has_one_name_on_every_member():
    names = run_ranks(body_split_name, 3, timeout=60)
    assert len(set(names)) == 1, names


def body_bad_input() -> None:
    x = np.ones(4, np.float32)
    group = tc.WORLD
    for call, error, words in [
        (lambda: tc.scan("not an array"), TypeError, "scan: tensor"),
        (lambda: tc.exscan(x, op="bogus"), ValueError, "exscan: op"),
        (lambda: tc.scan(x, op="band"), ValueError, "scan: op"),
        (lambda: tc.exscan(np.ones(3, np.int32), op="avg"), ValueError, "exscan: op"),
        (lambda: tc.scan(x, async_op="yes"), TypeError, "async_op"),
        (lambda: tc.scan(x, group=3), TypeError, "scan: group"),
        (lambda: group.split("red"), TypeError, "split: color"),
        (lambda: group.split(True), TypeError, "split: color"),
        (lambda: group.split(0, key=1.5), TypeError, "split: key"),
        (lambda: group.split(0, key=None), TypeError, "split: key"),
        (lambda: group.split(1 << 70), ValueError, "split: color"),
        (lambda: Scan(op=3.0), TypeError, "Scan: op"),
        (lambda: Exscan(group=7), TypeError, "Exscan: group"),
        (lambda: tc.new_subgroups_by_enumeration("01"), TypeError, "ranks_per_subgroup_list"),
        (lambda: tc.new_subgroups_by_enumeration([]), ValueError, "ranks_per_subgroup_list"),
        (lambda: tc.new_subgroups_by_enumeration([[0], None]), TypeError, "ranks_per_subgroup_list[1]"),
        (lambda: tc.new_subgroups_by_enumeration([[0, 1], [1]]), ValueError, "rank 1 is in"),
        (lambda: tc.new_subgroups_by_enumeration([[0, 99]]), ValueError, "out of range"),
    ]:
        with pytest.raises(error, match=words.replace("[", r"\[").replace("]", r"\]")):
            call()
    frozen = np.ones(3, np.float32)
    frozen.setflags(write=False)
    with pytest.raises(ValueError, match="scan: tensor"):
        tc.scan(frozen)
    # nothing above reached the peers: the group still works
    y = np.ones(2, np.float32)
    tc.scan(y)
    assert (y == tc.get_rank() + 1).all()


def _mismatched(kind: str, odd: bool) -> None:
    x = np.ones(4, np.float32)
    if kind == "scan_exscan":
        (tc.exscan if odd else tc.scan)(x)
    elif kind == "op":
        tc.scan(x, op="max" if odd else "sum")
    elif kind == "scan_all_reduce":
        (tc.all_reduce if odd else tc.scan)(x)
    elif kind == "split_all_gather":
        if odd:
            tc.all_gather_into_tensor(np.zeros(2 * tc.get_world_size(), np.int64), np.zeros(2, np.int64))
        else:
            tc.WORLD.split(0)
    else:
        raise AssertionError(kind)


def body_mismatch(kind: str) -> str:
    try:
        _mismatched(kind, odd=tc.get_rank() % 2 == 1)
        tc.barrier()
    except tc.CollectiveMismatchError as exc:
        return str(exc)
    raise AssertionError(f"rank {tc.get_rank()}: no CollectiveMismatchError for {kind}")


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("body", [body_scan_every_op_and_dtype, body_scan_async_groups_and_objects,
                                  body_split, body_bad_input],
                         ids=lambda b: b.__name__.removeprefix("body_"))
def test_split_and_scan(body, world_size, transport):
    run_ranks(body, world_size, timeout=180, env=TRANSPORTS[transport])


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("kind", ["scan_exscan", "op", "scan_all_reduce", "split_all_gather"])
def test_mismatched_calls_fail_on_every_rank(kind, world_size, transport):
    messages = run_ranks(body_mismatch, world_size, kind, timeout=90, env=TRANSPORTS[transport])
    assert len(messages) == world_size
    if kind == "split_all_gather":
        assert any("split(int64" in m for m in messages), messages
