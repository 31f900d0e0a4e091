"""Chunked transport algorithms and wire compression, with threads as ranks on the loopback
transport: tiny chunks so every message is cut into many, against numpy; compressed sums
bit-identical on every rank and within the wire dtype's rounding of the exact sum."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tensorcomm import config
from tensorcomm.algorithms import allgather, allreduce, broadcast, reduce_scatter
from tensorcomm.algorithms.wire import spans
from tensorcomm.testing import run_threads
from tensorcomm.types import ReduceOp

from helpers import one_off_ctx

BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture(autouse=True)
def tiny_chunks(monkeypatch):
    monkeypatch.setattr(config, "TCP_CHUNK_BYTES", 12)  # 3 float32 per message


def _run(size: int, body, wire: np.dtype | None = None) -> list:
    def rank_main(transport):
        transport.wire_dtype = wire
        return body(one_off_ctx(transport, range(size), transport.rank, group_id=1, seq=0, timeout=15.0))

    return run_threads(size, rank_main, timeout=60)


def _inputs(size: int, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng([size, count])
    return [rng.uniform(-2.0, 2.0, count).astype(np.float32) for _ in range(size)]


def test_spans_cover_the_range_once():
    assert spans(3, 10, 3) == [(3, 6), (6, 9), (9, 10)]
    assert spans(4, 4, 3) == [(4, 4)]  # an empty block is still one (empty) message


ALLREDUCE = [allreduce.ring, allreduce.recursive_doubling, allreduce.halving_doubling]


@pytest.mark.parametrize("count", [0, 1, 7, 50])
def test_chunked_pair_in_place_matches_numpy(count):
    inputs = [np.arange(count, dtype=np.int64) * (r + 1) - r for r in range(2)]

    def body(ctx):
        x = inputs[ctx.rank].copy()
        allreduce.pair_in_place(ctx, x, np.add)
        return x

    for result in _run(2, body):
        assert np.array_equal(result, np.sum(inputs, axis=0))


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("count", [0, 1, 7, 50])
@pytest.mark.parametrize("algorithm", ALLREDUCE, ids=lambda f: f.__name__)
def test_chunked_allreduce_matches_numpy(algorithm, size, count):
    inputs = [np.arange(count, dtype=np.int64) * (r + 1) - r for r in range(size)]

    def body(ctx):
        buf = inputs[ctx.rank].copy()
        algorithm(ctx, buf, ReduceOp.SUM)
        return buf

    for result in _run(size, body):
        assert np.array_equal(result, np.sum(inputs, axis=0))


@pytest.mark.parametrize("size", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("count", [1, 7, 50])
@pytest.mark.parametrize("algorithm", ALLREDUCE, ids=lambda f: f.__name__)
def test_chunked_allreduce_from_a_separate_source_leaves_it_untouched(algorithm, size, count):
    """As staging runs them on terms as they are: read the caller's array, write scratch; float
    results bit-identical on every rank (each chunk combined in the buffer it arrived in keeps
    the operand order)."""
    inputs = _inputs(size, count)

    def body(ctx):
        source = inputs[ctx.rank].copy()
        buf = np.full(count, np.nan, np.float32)
        algorithm(ctx, buf, ReduceOp.PROD, source)
        assert np.array_equal(source, inputs[ctx.rank])
        return buf

    results = _run(size, body)
    assert all(result.tobytes() == results[0].tobytes() for result in results)
    np.testing.assert_allclose(results[0], np.prod(inputs, axis=0), rtol=1e-5)


@pytest.mark.parametrize("size", [2, 3, 5])
def test_chunked_reduce_scatter_allgather_and_broadcast(size):
    counts = [4 + 3 * r for r in range(size)]  # uneven blocks of several chunks
    total = sum(counts)
    inputs = [np.arange(total, dtype=np.int32) + 100 * r for r in range(size)]
    offsets = allgather.bounds(counts)

    def body(ctx):
        reduced = np.empty(counts[ctx.rank], np.int32)
        reduce_scatter.ring(ctx, inputs[ctx.rank], reduced, counts, ReduceOp.SUM)
        gathered = np.empty(total, np.int32)
        ctx.seq = 1
        allgather.ring(ctx, np.full(counts[ctx.rank], ctx.rank, np.int32), gathered, counts)
        copied = inputs[ctx.rank].copy() if ctx.rank == 1 else np.zeros(total, np.int32)
        ctx.seq = 2
        broadcast.scatter_allgather(ctx, copied, 1)
        ctx.seq = 3
        tree = inputs[ctx.rank].copy() if ctx.rank == 0 else np.zeros(total, np.int32)
        broadcast.binomial_tree(ctx, tree, 0)
        return reduced, gathered, copied, tree

    total_sum = np.sum(inputs, axis=0)
    for rank, (reduced, gathered, copied, tree) in enumerate(_run(size, body)):
        assert np.array_equal(reduced, total_sum[offsets[rank]:offsets[rank + 1]])
        assert np.array_equal(gathered, np.repeat(np.arange(size), counts))
        assert np.array_equal(copied, inputs[1])
        assert np.array_equal(tree, inputs[0])


@pytest.mark.parametrize("wire", [BF16, np.dtype(np.float16)], ids=str)
@pytest.mark.parametrize("size", [2, 3, 4, 5, 6])
@pytest.mark.parametrize("algorithm", ALLREDUCE, ids=lambda f: f.__name__)
def test_compressed_sums_are_identical_everywhere_and_close(algorithm, size, wire):
    count = 40
    inputs = _inputs(size, count)

    def body(ctx):
        buf = inputs[ctx.rank].copy()
        algorithm(ctx, buf, ReduceOp.SUM)
        return buf

    results = _run(size, body, wire)
    for result in results[1:]:
        assert result.tobytes() == results[0].tobytes()
    exact = np.sum([x.astype(np.float64) for x in inputs], axis=0)
    # Every partial is rounded to the wire dtype once per hop (at most size hops, plus the
    # final rounding): a relative error of (size + 1) units of its rounding on the magnitudes.
    unit = float(np.finfo(wire).eps) if wire == np.float16 else 2.0 ** -8
    bound = (size + 1) * unit * np.sum([np.abs(x) for x in inputs], axis=0)
    assert np.all(np.abs(results[0] - exact) <= bound)
    assert np.array_equal(results[0], results[0].astype(wire).astype(np.float32))  # rounded


def test_compression_leaves_other_ops_and_dtypes_exact():
    size = 3
    inputs = _inputs(size, 20)

    def body(ctx):
        maximum = inputs[ctx.rank].copy()
        allreduce.ring(ctx, maximum, ReduceOp.MAX)
        ctx.seq = 1
        wide = inputs[ctx.rank].astype(np.float64)
        allreduce.ring(ctx, wide, ReduceOp.SUM)
        return maximum, wide

    for maximum, wide in _run(size, body, BF16):
        assert np.array_equal(maximum, np.max(inputs, axis=0))
        exact = np.sum([x.astype(np.float64) for x in inputs], axis=0)
        np.testing.assert_allclose(wide, exact, rtol=1e-12)


def test_scratch_is_reused_between_calls_bounded_and_freed_with_its_owner(monkeypatch):
    from tensorcomm.algorithms.base import Scratch

    u8 = np.dtype(np.uint8)
    scratch, other_group = Scratch(), Scratch()
    first = scratch.take("inbox", 64, u8)
    assert np.shares_memory(first, scratch.take("inbox", 32, u8))  # reused, no new pages
    assert scratch.take("inbox", 8, np.dtype(np.float32)).dtype == np.float32
    assert not np.shares_memory(first, scratch.take("outbox", 64, u8))  # per purpose
    assert not np.shares_memory(first, other_group.take("inbox", 64, u8))  # per group
    scratch.clear()  # the group is gone: its memory goes with it
    assert not np.shares_memory(first, scratch.take("inbox", 64, u8))
    monkeypatch.setattr(config, "SCRATCH_KEEP_BYTES", 100)
    big = scratch.take("inbox", 128, u8)  # above the bound: fresh, and not kept
    assert big.size == 128 and not np.shares_memory(big, scratch.take("inbox", 128, u8))


def test_scratch_no_call_needed_whole_for_a_while_is_given_back(monkeypatch):
    from tensorcomm.algorithms import base

    clock = [1000.0]
    monkeypatch.setattr(base, "_monotonic", lambda: clock[0])
    u8 = np.dtype(np.uint8)
    scratch = base.Scratch()

    def call(nbytes: int) -> np.ndarray:  # a group's call: ``Ctx.of`` sweeps, then it takes
        clock[0] += base.SCRATCH_IDLE * 0.6
        if clock[0] >= scratch.sweep_at:
            scratch.sweep(clock[0])
        return scratch.take("inbox", nbytes, u8)

    big = scratch.take("inbox", 1 << 20, u8)
    other = scratch.take("outbox", 1 << 20, u8)
    for _ in range(4):  # one shape repeated, for longer than the idle time: it stays
        assert np.shares_memory(big, call(1 << 20))
    assert np.shares_memory(big, call(4096))  # needed only in part: its idle time runs on
    small = call(4096)  # 1.2 idle times since it was last needed whole: given back
    assert not np.shares_memory(big, small) and small.base is not None and small.base.size == 4096
    # "outbox" was not needed at all meanwhile: given back too.
    assert not np.shares_memory(other, scratch.take("outbox", 64, u8))


def test_a_call_gives_back_its_groups_idle_scratch(monkeypatch):
    from tensorcomm.algorithms import base

    clock = [1000.0]
    monkeypatch.setattr(base, "_monotonic", lambda: clock[0])
    team = base.Team(None, (0, 1), 0, 0, 10.0)  # type: ignore[arg-type]
    kept = team.scratch.take("inbox", 1 << 20, np.dtype(np.uint8))
    plan = base.Plan("all_reduce", None, "ring", lambda ctx: None)  # type: ignore[arg-type]
    base.Ctx.of(team, 0, plan)
    assert np.shares_memory(kept, team.scratch.take("inbox", 16, np.dtype(np.uint8)))
    clock[0] += base.SCRATCH_IDLE + 1
    base.Ctx.of(team, 1, plan)  # a call that takes no scratch: the sweep still runs
    assert not team.scratch._held


def test_wire_dtype_variable_is_checked():
    from tensorcomm.rendezvous.discovery import wire_dtype

    assert wire_dtype({}) is None
    assert wire_dtype({"TENSORCOMM_WIRE_DTYPE": " BFloat16 "}) == "bfloat16"
    with pytest.raises(ValueError,
                       match="TENSORCOMM_WIRE_DTYPE='fp8': expected one of 'bfloat16', 'float16'"):
        wire_dtype({"TENSORCOMM_WIRE_DTYPE": "fp8"})
