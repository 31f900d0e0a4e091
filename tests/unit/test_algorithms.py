"""Every algorithm x world sizes 1..7 x counts x ops x dtypes against numpy, with threads as ranks.

Each test runs one thread per rank over the loopback transport; a rank issues many calls in a
row (one ``seq`` each), the way the core's engine will. Every message is recorded so that the
tests also check that no two messages of a call share (source, destination, tag). The loopback
transport itself is tested at the end of the file.
"""

from __future__ import annotations

import functools
import threading
import time

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorcomm import config
from tensorcomm.algorithms import (
    allgather,
    allreduce,
    alltoall,
    barrier,
    broadcast,
    gather_scatter,
    kernels,
    reduce,
    reduce_scatter,
    scan,
)
from tensorcomm.errors import CollectiveMismatchError, CommTimeoutError, GroupAbortedError
from tensorcomm.signature import signature
from tensorcomm.testing import rank_data, reduces, run_threads
from tensorcomm.testing.reference import reduce_reference
from tensorcomm.transports.base import ANY_SOURCE, as_bytes, collective_tag
from tensorcomm.transports.loopback import LoopbackHub
from tensorcomm.types import ReduceOp

from helpers import (
    CUMULATIVE,
    PREFIX_DTYPES,
    assert_prefix,
    expected_prefixes,
    one_off_ctx,
    row_fn,
    run_algorithm,
    run_calls_on_threads,
)

BF16 = np.dtype(ml_dtypes.bfloat16)
SIZES = range(1, 8)
# The costly tests run 5 to 7 ranks in the full suite only (python -m pytest -m ""); 1 to 4 cover
# a single rank, powers of two and not.
TIERED_SIZES = [*range(1, 5), *(pytest.param(n, marks=pytest.mark.slow) for n in range(5, 8))]
DTYPES = [np.dtype(np.int32), np.dtype(np.float32), np.dtype(np.float64), BF16,
          np.dtype(np.bool_), np.dtype(np.complex128)]
OPS = [ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG, ReduceOp.BAND,
       ReduceOp.BOR, ReduceOp.BXOR, ReduceOp.premul_sum(0.5)]


def counts_for(size: int) -> list[int]:
    return sorted({0, 1, max(size - 1, 0), size + 1, 1000})


def ops_for(dtype: np.dtype) -> list:
    """Every op defined on ``dtype``; complex is checked with SUM only (and its AVG/premul forms)."""
    valid = []
    for op in OPS:
        try:
            kernels.check_op_dtype(op, dtype)
        except ValueError:
            continue
        valid.append(op)
    return valid


def data(dtype: np.dtype, rank: int, count: int, salt: int = 0) -> np.ndarray:
    rng = np.random.default_rng([rank, count, salt])
    if dtype == np.bool_:
        return rng.random(count) < 0.5
    if dtype.kind in "iu":
        return rng.integers(-9, 10, count).astype(dtype)
    values = rng.uniform(0.5, 2.0, count) * rng.choice([-1.0, 1.0], count)
    if dtype.kind == "c":
        values = values + 1j * rng.standard_normal(count)
    return values.astype(dtype)


def reference(op, arrays: list[np.ndarray]) -> np.ndarray:
    """The reduction computed by numpy alone: exactly for integers/bool/MIN/MAX, else in 64 bits."""
    dtype = arrays[0].dtype
    exact = dtype.kind in "biu" or op in (ReduceOp.MIN, ReduceOp.MAX)
    wide = arrays if exact else [a.astype(np.complex128 if dtype.kind == "c" else np.float64)
                                 for a in arrays]
    if not isinstance(op, ReduceOp):
        wide = [w * op.factor for w in wide]
    if op is ReduceOp.AVG and exact:
        return reduce_reference(op, arrays)  # rounded toward zero; bool: True where all are
    result = functools.reduce(CUMULATIVE.get(op, np.add), wide)
    return result / len(arrays) if op is ReduceOp.AVG else result


def assert_matches(result: np.ndarray, expected: np.ndarray, op, size: int) -> None:
    if result.dtype.kind in "biu" or op in (ReduceOp.MIN, ReduceOp.MAX):
        assert np.array_equal(result.astype(expected.dtype), expected)
        return
    rtol = {BF16: 1e-2, np.dtype(np.float32): 1e-5}.get(result.dtype, 1e-12)
    # Terms lie in [0.5, 2] in magnitude: a sum can cancel down to zero, so allow an absolute error
    # of rtol times the largest partial sum.
    np.testing.assert_allclose(result.astype(expected.dtype), expected, rtol=rtol, atol=rtol * 2 * size)


ALLREDUCE = [allreduce.ring, allreduce.recursive_doubling, allreduce.halving_doubling]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("size", TIERED_SIZES)
@pytest.mark.parametrize("algorithm", ALLREDUCE, ids=lambda f: f.__name__)
def test_allreduce(algorithm, size, dtype):
    cases = [(count, op) for count in counts_for(size) for op in ops_for(dtype)]

    def body(next_ctx):
        results = []
        for count, op in cases:
            ctx = next_ctx()
            mine = data(dtype, ctx.rank, count)
            before = mine.copy()
            red = kernels.reduction(op, mine.dtype)
            work = kernels.prepare(red, mine)
            algorithm(ctx, work, red.op)
            out = np.empty_like(mine)
            kernels.finish(red, work, out, size)
            assert np.array_equal(mine, before)
            results.append(out)
        return results

    per_rank = run_calls_on_threads(size, body)
    for index, (count, op) in enumerate(cases):
        outs = [results[index] for results in per_rank]
        assert all(out.tobytes() == outs[0].tobytes() for out in outs), f"ranks differ: {op} {count}"
        expected = reference(op, [data(dtype, rank, count) for rank in range(size)])
        assert_matches(outs[0], expected, op, size)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pair_in_place_matches_numpy_and_agrees_bitwise(dtype):
    """Two members, terms as they are: staging runs recursive doubling as one exchange straight
    into the caller's array (AVG and premul_sum go through a working copy instead); chunked in
    test_wire.py."""
    cases = [(count, op) for count in (0, 1, 13, 1000) for op in ops_for(dtype)
             if isinstance(op, ReduceOp) and op is not ReduceOp.AVG]

    def body(next_ctx):
        results = []
        for count, op in cases:
            ctx = next_ctx()
            x = data(dtype, ctx.rank, count)
            allreduce.pair_in_place(ctx, x, kernels.ufunc(op))
            results.append(x)
        return results

    per_rank = run_calls_on_threads(2, body)
    for index, (count, op) in enumerate(cases):
        mine, theirs = per_rank[0][index], per_rank[1][index]
        assert mine.tobytes() == theirs.tobytes(), f"ranks differ: {op} {count}"
        assert_matches(mine, reference(op, [data(dtype, rank, count) for rank in range(2)]), op, 2)


def test_pair_in_place_leaves_the_array_untouched_when_the_peer_fails():
    def body(next_ctx):
        ctx = next_ctx()
        x = data(np.dtype(np.float32), ctx.rank, 1000)
        before = x.copy()
        if ctx.rank == 1:  # gives up without sending anything
            ctx.transport.abort_group(ctx.group_id, GroupAbortedError("rank 1 gave up on purpose"))
            return True
        with pytest.raises(GroupAbortedError, match="gave up on purpose"):
            allreduce.pair_in_place(ctx, x, np.add)
        return np.array_equal(x, before)

    assert run_calls_on_threads(2, body) == [True, True]


@pytest.mark.parametrize("keep_going", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pair_in_place_row_runs_every_op_and_dtype(dtype, keep_going):
    """``select``'s ``pair_in_place`` row: terms as they are exchange straight into the array,
    the others (half precision, AVG, premul_sum) through a converted copy; both ranks agree."""
    cases = [(count, op) for count in (0, 1, 13, 1000) for op in ops_for(dtype)]
    fn = row_fn("all_reduce", "pair_in_place")

    def body(next_ctx):
        results = []
        for count, op in cases:
            ctx = next_ctx()
            object.__setattr__(ctx.team, "keep_going", keep_going)
            x = data(dtype, ctx.rank, count)
            run_algorithm(ctx, fn, x, op)
            results.append(x)
        return results

    per_rank = run_calls_on_threads(2, body)
    for index, (count, op) in enumerate(cases):
        mine, theirs = per_rank[0][index], per_rank[1][index]
        assert mine.tobytes() == theirs.tobytes(), f"ranks differ: {op} {count}"
        assert_matches(mine, reference(op, [data(dtype, rank, count) for rank in range(2)]), op, 2)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 6, 8])
@pytest.mark.parametrize("algorithm", ALLREDUCE, ids=lambda f: f.__name__)
def test_allreduce_from_a_separate_source_leaves_it_untouched(algorithm, size):
    """What staging does when the caller's array needs no conversion: read it, write scratch."""
    def body(next_ctx):
        results = []
        for count in (0, 1, 13, 1000):
            ctx = next_ctx()
            source = data(np.dtype(np.float64), ctx.rank, count)
            before = source.copy()
            buf = np.full(count, np.nan)
            algorithm(ctx, buf, ReduceOp.SUM, source)
            assert np.array_equal(source, before)
            results.append(buf)
        return results

    per_rank = run_calls_on_threads(size, body)
    for index, count in enumerate((0, 1, 13, 1000)):
        expected = reference(ReduceOp.SUM, [data(np.dtype(np.float64), rank, count) for rank in range(size)])
        for results in per_rank:
            assert results[index].tobytes() == per_rank[0][index].tobytes()
        np.testing.assert_allclose(per_rank[0][index], expected)


@settings(max_examples=40, deadline=None)
@given(size=st.integers(1, 7), count=st.integers(0, 300), seed=st.integers(0, 2**32 - 1),
       op=st.sampled_from([ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.BXOR]))
def test_ring_allreduce_property(size, count, seed, op):
    inputs = [np.random.default_rng([seed, rank]).integers(-2**40, 2**40, count) for rank in range(size)]

    def body(next_ctx):
        ctx = next_ctx()
        buf = inputs[ctx.rank].copy()
        allreduce.ring(ctx, buf, op)
        return buf

    expected = functools.reduce(CUMULATIVE[op], inputs)
    for out in run_calls_on_threads(size, body):
        assert np.array_equal(out, expected)


def test_allreduce_results_are_bit_identical_with_signed_zeros():
    """MIN over +0.0 and -0.0 depends on operand order; every rank must still agree."""
    def body(next_ctx):
        results = []
        for algorithm in ALLREDUCE:
            ctx = next_ctx()
            buf = np.zeros(64) * (-1.0 if ctx.rank % 2 else 1.0)
            algorithm(ctx, buf, ReduceOp.MIN)
            results.append(buf)
        return results

    for size in (3, 5, 6):
        per_rank = run_calls_on_threads(size, body)
        for index in range(len(ALLREDUCE)):
            assert len({results[index].tobytes() for results in per_rank}) == 1


def test_allreduce_mismatched_counts_raise_collective_mismatch():
    def body(next_ctx):
        ctx = next_ctx()
        allreduce.ring(ctx, np.zeros(10 + ctx.rank), ReduceOp.SUM)

    with pytest.raises(CollectiveMismatchError, match="bytes"):
        run_calls_on_threads(2, body)


def uneven(size: int, count: int) -> list[int]:
    """Per-rank block sizes that differ, some zero."""
    return [(count + 3 * rank) % 5 for rank in range(size)]


def counts_cases(size: int) -> list[list[int]]:
    return [[count] * size for count in counts_for(size)] + [uneven(size, 1), uneven(size, 2)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("size", TIERED_SIZES)
def test_reduce_scatter_ring(size, dtype):
    cases = [(counts, op) for counts in counts_cases(size) for op in ops_for(dtype)]

    def body(next_ctx):
        results = []
        for counts, op in cases:
            ctx = next_ctx()
            mine = data(dtype, ctx.rank, sum(counts))
            red = kernels.reduction(op, mine.dtype)
            work = kernels.prepare(red, mine)
            sent = work.copy()
            out_work = np.empty(counts[ctx.rank], dtype=work.dtype)
            reduce_scatter.ring(ctx, work, out_work, counts, red.op)
            assert np.array_equal(work, sent), "send was modified"
            out = np.empty(counts[ctx.rank], dtype=dtype)
            kernels.finish(red, out_work, out, size)
            results.append(out)
        return results

    per_rank = run_calls_on_threads(size, body)
    for index, (counts, op) in enumerate(cases):
        expected = reference(op, [data(dtype, rank, sum(counts)) for rank in range(size)])
        offsets = allgather.bounds(counts)
        for rank, results in enumerate(per_rank):
            assert_matches(results[index], expected[offsets[rank]:offsets[rank + 1]], op, size)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("size", TIERED_SIZES)
def test_reduce_binomial_tree(size, dtype):
    cases = [(count, op, root) for count in counts_for(size) for op in ops_for(dtype)
             for root in {0, size - 1, size // 2}]

    def body(next_ctx):
        results = []
        for count, op, root in cases:
            ctx = next_ctx()
            red = kernels.reduction(op, dtype)
            work = kernels.prepare(red, data(dtype, ctx.rank, count))
            sent = work.copy()
            out_work = np.empty_like(work) if ctx.rank == root else None
            reduce.binomial_tree(ctx, work, out_work, root, red.op)
            assert np.array_equal(work, sent), "send was modified"
            if ctx.rank == root:
                out = np.empty(count, dtype=dtype)
                kernels.finish(red, out_work, out, size)
                results.append(out)
        return results

    per_rank = run_calls_on_threads(size, body)
    for count, op, root in cases:  # each root's list holds its results in call order
        out = per_rank[root].pop(0)
        assert_matches(out, reference(op, [data(dtype, rank, count) for rank in range(size)]), op, size)


MOVERS = [np.dtype(np.int32), BF16, np.dtype(np.bool_), np.dtype(np.complex128)]


@pytest.mark.parametrize("dtype", MOVERS, ids=str)
@pytest.mark.parametrize("size", TIERED_SIZES)
@pytest.mark.parametrize("algorithm", [allgather.ring, allgather.bruck], ids=lambda f: f.__name__)
def test_allgather(algorithm, size, dtype):
    cases = counts_cases(size)

    def body(next_ctx):
        results = []
        for counts in cases:
            ctx = next_ctx()
            send = data(dtype, ctx.rank, counts[ctx.rank])
            sent = send.copy()
            out = np.empty(sum(counts), dtype=dtype)
            algorithm(ctx, send, out, counts)
            assert np.array_equal(send, sent)
            results.append(out)
        return results

    per_rank = run_calls_on_threads(size, body)
    for index, counts in enumerate(cases):
        expected = np.concatenate([data(dtype, rank, counts[rank]) for rank in range(size)])
        for results in per_rank:
            assert results[index].tobytes() == expected.tobytes()


@pytest.mark.parametrize("size", TIERED_SIZES)
@pytest.mark.parametrize("algorithm", [broadcast.binomial_tree, broadcast.scatter_allgather],
                         ids=lambda f: f.__name__)
def test_broadcast(algorithm, size):
    cases = [(count, root, dtype) for count in counts_for(size) for root in range(size)
             for dtype in MOVERS]

    def body(next_ctx):
        results = []
        for count, root, dtype in cases:
            ctx = next_ctx()
            buf = data(dtype, ctx.rank, count, salt=root)
            algorithm(ctx, buf, root)
            results.append(buf)
        return results

    per_rank = run_calls_on_threads(size, body)
    for index, (count, root, dtype) in enumerate(cases):
        expected = data(dtype, root, count, salt=root)
        for results in per_rank:
            assert results[index].tobytes() == expected.tobytes()


@pytest.mark.parametrize("size", SIZES)
def test_gather_and_scatter(size):
    cases = [(counts, root) for counts in counts_cases(size) for root in range(size)]
    dtype = np.dtype(np.float64)

    def body(next_ctx):
        results = []
        for counts, root in cases:
            ctx = next_ctx()
            send = data(dtype, ctx.rank, counts[ctx.rank])
            gathered = np.empty(sum(counts)) if ctx.rank == root else None
            gather_scatter.gather(ctx, send, gathered, counts, root)
            whole = data(dtype, root, sum(counts), salt=1) if ctx.rank == root else None
            block = np.empty(counts[ctx.rank])
            gather_scatter.scatter(next_ctx(), whole, block, counts, root)
            results.append((gathered, block))
        return results

    per_rank = run_calls_on_threads(size, body)
    for index, (counts, root) in enumerate(cases):
        offsets = allgather.bounds(counts)
        expected = np.concatenate([data(dtype, rank, counts[rank]) for rank in range(size)])
        whole = data(dtype, root, sum(counts), salt=1)
        for rank, results in enumerate(per_rank):
            gathered, block = results[index]
            if rank == root:
                assert np.array_equal(gathered, expected)
            else:
                assert gathered is None
            assert np.array_equal(block, whole[offsets[rank]:offsets[rank + 1]])


@pytest.mark.parametrize("size", SIZES)
def test_alltoall_pairwise_exchange(size):
    def matrix(count: int) -> list[list[int]]:
        """matrix[i][j]: elements rank i sends to rank j."""
        return [[(count + i + 2 * j) % 4 if count > 1 else count for j in range(size)]
                for i in range(size)]

    cases = [matrix(count) for count in counts_for(size)]
    dtype = np.dtype(np.int32)

    def body(next_ctx):
        results = []
        for sizes in cases:
            ctx = next_ctx()
            send_counts = sizes[ctx.rank]
            recv_counts = [sizes[src][ctx.rank] for src in range(size)]
            send = data(dtype, ctx.rank, sum(send_counts))
            sent = send.copy()
            out = np.empty(sum(recv_counts), dtype=dtype)
            alltoall.pairwise_exchange(ctx, send, send_counts, out, recv_counts)
            assert np.array_equal(send, sent)
            results.append(out)
        return results

    per_rank = run_calls_on_threads(size, body)
    for index, sizes in enumerate(cases):
        blocks = [np.split(data(dtype, src, sum(sizes[src])), np.cumsum(sizes[src])[:-1])
                  for src in range(size)]
        for rank, results in enumerate(per_rank):
            expected = np.concatenate([blocks[src][rank] for src in range(size)])
            assert np.array_equal(results[index], expected)


@pytest.mark.parametrize("size", SIZES)
def test_barrier_dissemination(size):
    entered, left = [0.0] * size, [0.0] * size

    def body(next_ctx):
        ctx = next_ctx()
        time.sleep(0.02 * ((ctx.rank * 3) % size))  # ranks arrive at different times
        entered[ctx.rank] = time.monotonic()
        barrier.dissemination(ctx)
        left[ctx.rank] = time.monotonic()

    run_calls_on_threads(size, body)
    assert max(entered) <= min(left)


# --- the loopback transport the tests above stand on ------------------------------------------

# -- scan, exscan (algorithms/scan.py) -----------------------------------------------------------

@pytest.mark.parametrize("inclusive", [True, False], ids=["scan", "exscan"])
@pytest.mark.parametrize("size", TIERED_SIZES)
def test_scan_recursive_doubling_matches_numpy_cumulative_ops(size, inclusive):
    collective = "scan" if inclusive else "exscan"
    fn = row_fn(collective, "recursive_doubling")
    cases = [(op, dtype, count) for op in OPS for dtype in PREFIX_DTYPES if reduces(op, dtype)
             for count in (0, 1, 37)]

    def body(next_ctx):
        results = []
        for op, dtype, count in cases:
            ctx = next_ctx()
            x = rank_data(ctx.rank, count, dtype, op=op)
            run_algorithm(ctx, fn, x, op)
            results.append(x)
        return results

    per_rank = run_calls_on_threads(size, body)
    for index, (op, dtype, count) in enumerate(cases):
        inputs = [rank_data(r, count, dtype, op=op) for r in range(size)]
        for r, expected in enumerate(expected_prefixes(op, inputs, inclusive)):
            assert_prefix(per_rank[r][index], expected, inputs[0], op,
                          f"{collective} {op} {dtype} x{count} rank {r}")


@pytest.mark.parametrize("size", [2, 3, 5])
def test_scan_recursive_doubling_in_chunks(size, monkeypatch):
    """Blocks travel in several messages of one step (the transport keeps them in order), each
    combined as it arrives."""
    monkeypatch.setattr(config, "TCP_CHUNK_BYTES", 40)  # 5 float64 per message
    count = 37

    def rank_main(transport):  # not run_calls_on_threads: the messages of one step share a tag
        results = []
        for seq, collective in enumerate(("scan", "exscan")):
            ctx = one_off_ctx(transport, range(size), transport.rank, group_id=1, seq=seq, timeout=15.0)
            x = rank_data(transport.rank, count, np.float64)
            run_algorithm(ctx, row_fn(collective, "recursive_doubling"), x, ReduceOp.SUM)
            results.append(x)
        return results

    per_rank = run_threads(size, rank_main, timeout=60)
    running = np.cumsum([rank_data(r, count, np.float64) for r in range(size)], axis=0)
    for r in range(size):
        np.testing.assert_array_equal(per_rank[r][0], running[r])
        exclusive = running[r - 1] if r else rank_data(0, count, np.float64)
        np.testing.assert_array_equal(per_rank[r][1], exclusive)


def test_scan_recursive_doubling_keeps_lower_ranks_on_the_left():
    """Signed zeros tie under MIN/MAX, and numpy returns one operand or the other: the result is
    bit for bit numpy's left-to-right accumulation at every rank."""
    size = 6
    values = [np.array([0.0, -0.0, 0.0], np.float64) * (-1) ** r for r in range(size)]
    fn = row_fn("scan", "recursive_doubling")

    def body(next_ctx):
        out = []
        for op in (ReduceOp.MIN, ReduceOp.MAX):
            ctx = next_ctx()
            x = values[ctx.rank].copy()
            run_algorithm(ctx, fn, x, op)
            out.append(x)
        return out

    per_rank = run_calls_on_threads(size, body)
    for index, ufunc in enumerate((np.minimum, np.maximum)):
        expected = ufunc.accumulate(np.stack(values), axis=0)
        for r in range(size):
            assert per_rank[r][index].tobytes() == expected[r].tobytes()


def test_scan_terms():
    assert [scan.terms(r, True) for r in range(3)] == [1, 2, 3]
    assert [scan.terms(r, False) for r in range(3)] == [0, 1, 2]


# -- the loopback transport ------------------------------------------------------------------------


def test_loopback_matches_fifo_per_source_and_tag():
    hub = LoopbackHub(3)
    a, b, c = (hub.transport(rank) for rank in range(3))
    for value in (1, 2):
        a.isend(2, as_bytes(np.array([value], np.int64)), tag=7)
    b.isend(2, as_bytes(np.array([10], np.int64)), tag=7)
    a.isend(2, as_bytes(np.array([99], np.int64)), tag=8)
    got = [np.zeros(1, np.int64) for _ in range(4)]
    assert c.irecv(0, as_bytes(got[0]), tag=8).wait(1) == 0
    assert c.irecv(1, as_bytes(got[1]), tag=7).wait(1) == 1
    assert c.irecv(0, as_bytes(got[2]), tag=7).wait(1) == 0
    assert c.irecv(0, as_bytes(got[3]), tag=7).wait(1) == 0
    assert [int(g[0]) for g in got] == [99, 10, 1, 2]


def test_loopback_any_source_and_posted_before_send():
    hub = LoopbackHub(3)
    got = np.zeros(1, np.int64)
    request = hub.transport(0).irecv(ANY_SOURCE, as_bytes(got), tag=5)
    assert not request.done()
    hub.transport(2).isend(0, as_bytes(np.array([42], np.int64)), tag=5)
    assert request.wait(1) == 2 and got[0] == 42


def test_loopback_size_mismatch_timeout_abort_and_close():
    hub = LoopbackHub(2)
    sender, receiver = hub.transport(0), hub.transport(1)
    sender.isend(1, as_bytes(np.zeros(3, np.uint8)), tag=1)
    with pytest.raises(CollectiveMismatchError, match="3 bytes"):
        receiver.irecv(0, as_bytes(np.zeros(4, np.uint8)), tag=1).wait(1)
    with pytest.raises(CommTimeoutError):
        receiver.irecv(0, as_bytes(np.zeros(1, np.uint8)), tag=2).wait(0.01)
    pending = receiver.irecv(0, as_bytes(np.zeros(1, np.uint8)), tag=3)
    receiver.abort(GroupAbortedError("stop"))
    with pytest.raises(GroupAbortedError, match="stop"):
        pending.wait(1)
    with pytest.raises(GroupAbortedError, match="stop"):
        receiver.isend(0, as_bytes(np.zeros(1, np.uint8)), tag=4).wait(1)
    sender.close()
    sender.close()
    with pytest.raises(GroupAbortedError):
        sender.irecv(1, as_bytes(np.zeros(1, np.uint8)), tag=5).wait(1)


def test_run_threads_reraises_the_first_failure_and_unblocks_the_others():
    def body(transport):
        if transport.rank == 1:
            raise KeyError("rank 1 broke")
        transport.recv(1, as_bytes(np.zeros(1, np.uint8)), tag=0, timeout=10)  # would wait forever

    start = time.monotonic()
    with pytest.raises(KeyError, match="rank 1 broke"):
        run_threads(3, body)
    assert time.monotonic() - start < 5


def test_run_threads_times_out_on_a_hung_rank():
    release = threading.Event()
    with pytest.raises(CommTimeoutError, match=r"ranks \[0\]"):
        run_threads(2, lambda transport: release.wait(5) if transport.rank == 0 else None, timeout=0.2)
    release.set()


def test_loopback_refuses_a_message_from_a_different_call():
    hub = LoopbackHub(2)
    theirs = signature("all_reduce", np.dtype(np.float32), 4, ReduceOp.SUM)
    mine = signature("all_reduce", np.dtype(np.float32), 4, ReduceOp.MAX)
    hub.transport(0).isend(1, as_bytes(np.zeros(4, np.float32)), tag=1, signature=theirs)
    with pytest.raises(CollectiveMismatchError, match=r"rank 0 called all_reduce.*op=sum.*op=max"):
        hub.transport(1).irecv(0, as_bytes(np.zeros(4, np.float32)), tag=1, signature=mine).wait(1)


def test_loopback_abort_group_fails_pending_and_later_receives_of_that_group_only():
    hub = LoopbackHub(2)
    group_1, group_2 = collective_tag(1, 0, 0), collective_tag(2, 0, 0)
    pending = hub.transport(1).irecv(0, as_bytes(np.zeros(1, np.uint8)), tag=group_1)
    other = hub.transport(1).irecv(0, as_bytes(np.zeros(1, np.uint8)), tag=group_2)
    hub.transport(0).abort_group(1, GroupAbortedError("group 1 aborted"))
    with pytest.raises(GroupAbortedError, match="group 1"):
        pending.wait(1)
    with pytest.raises(GroupAbortedError, match="group 1"):
        hub.transport(0).irecv(1, as_bytes(np.zeros(1, np.uint8)), tag=group_1).wait(1)
    assert not other.done()
