"""The same-host algorithms against numpy, with threads as ranks and tiny slots.

Slots of a few hundred bytes make every algorithm take its multi-round / pipelined paths with small
arrays: all-reduce staged in the OUT region and streamed through it under the journal, streams that
span many rounds, uneven contributions. A failing peer must leave in-place arrays untouched where
the group keeps them untouched or complete (``keep_going``).
"""

from __future__ import annotations

import time

import ml_dtypes
import numpy as np
import pytest

from tensorcomm.algorithms import (
    kernels,
    shm_allgather,
    shm_allreduce,
    shm_alltoall,
    shm_barrier,
    shm_broadcast,
    shm_reduce_scatter,
)
from tensorcomm.algorithms.base import Ctx
from tensorcomm.errors import GroupAbortedError
from tensorcomm.signature import UNCHECKED, signature
from tensorcomm.testing import rank_data, reduce_reference, reduces
from tensorcomm.transports.shm import slots
from tensorcomm.types import PremulSum, ReduceOp

from helpers import (
    PREFIX_DTYPES,
    TINY_SLOT,
    ShmGroup,
    assert_prefix,
    close_all,
    ctx_for,
    expected_prefixes,
    fast_thread_switches,
    open_domains,
    row_fn,
    run_algorithm,
    run_each_rank,
)

pytestmark = pytest.mark.skipif(not slots.SUPPORTED, reason="shared memory needs x86-64")

SLOT = TINY_SLOT


@pytest.fixture(autouse=True)
def _fast_thread_switches():
    with fast_thread_switches():
        yield


SIZES = [1, 2, 3, pytest.param(5, marks=pytest.mark.slow)]  # 5 ranks: the full suite only


@pytest.fixture(params=SIZES, ids=lambda n: f"{n}ranks")
def group(request):
    g = ShmGroup(request.param)
    yield g
    g.close()


OPS = [ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.AVG, ReduceOp.PROD, ReduceOp.BXOR,
       ReduceOp.premul_sum(0.5)]
DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16, np.int64, np.bool_, np.complex64]



def _close(got: np.ndarray, expected: np.ndarray, op) -> None:
    if op is ReduceOp.AVG or isinstance(op, PremulSum):
        tolerance = 1e-2 if got.dtype in (np.float16, ml_dtypes.bfloat16) else 1e-6
        np.testing.assert_allclose(got.astype(np.complex128), expected.astype(np.complex128), rtol=tolerance)
    else:
        np.testing.assert_array_equal(got, expected)


def _split(flat: np.ndarray, counts) -> list[np.ndarray]:
    return np.split(flat, np.cumsum(counts)[:-1])


# counts: empty, inside one slot, a few chunks staged in OUT, many chunks streamed under a journal
COUNTS = [0, 7, 150, 2000]


@pytest.mark.parametrize("count", COUNTS)
def test_all_reduce_direct_and_pipelined_match_numpy_and_agree_bitwise(group, count):
    n = group.size
    for op in OPS:
        for dtype in DTYPES:
            if not reduces(op, dtype):
                continue
            inputs = [rank_data(r, count, dtype, op=op) for r in range(n)]
            expected = reduce_reference(op, inputs)
            for algorithm in (shm_allreduce.direct, shm_allreduce.split, shm_allreduce.pipelined):
                itemsize = kernels.accumulation_dtype(op, dtype).itemsize
                if algorithm is not shm_allreduce.pipelined and count * itemsize > SLOT:
                    continue
                arrays = [a.copy() for a in inputs]
                group.call(lambda ctx, algorithm=algorithm, arrays=arrays, op=op:
                           run_algorithm(ctx, algorithm, arrays[ctx.rank], op),
                           signature("all_reduce", np.dtype(dtype), count, op))
                for r in range(n):
                    _close(arrays[r], expected, op)
                    assert arrays[r].tobytes() == arrays[0].tobytes(), "ranks disagree bitwise"


@pytest.mark.parametrize("count", [7, 150, 2000])
def test_reduce_writes_the_root_only(group, count):
    n = group.size
    inputs = [rank_data(r, count, np.float32) for r in range(n)]
    expected = reduce_reference(ReduceOp.SUM, inputs)
    for root in range(n):
        for algorithm in (shm_allreduce.reduce_direct, shm_allreduce.reduce_split,
                          shm_allreduce.reduce_pipelined):
            if algorithm is not shm_allreduce.reduce_pipelined and count * 4 > SLOT:
                continue
            arrays = [a.copy() for a in inputs]
            group.call(lambda ctx, algorithm=algorithm, arrays=arrays, root=root:
                       run_algorithm(ctx, algorithm, arrays[ctx.rank], root, ReduceOp.SUM),
                       signature("reduce", np.dtype(np.float32), count, ReduceOp.SUM, root))
            for r in range(n):
                np.testing.assert_array_equal(arrays[r], expected if r == root else inputs[r])


@pytest.mark.parametrize("count", [0, 5, 100, 1000])
def test_broadcast_and_scatter(group, count):
    n = group.size
    for root in range(n):
        arrays = [rank_data(r, count, np.int32, salt=root) for r in range(n)]
        group.call(lambda ctx, arrays=arrays, root=root:
                   run_algorithm(ctx, shm_broadcast.broadcast, arrays[ctx.rank], root),
                   signature("broadcast", np.dtype(np.int32), count, root=root))
        for r in range(n):
            np.testing.assert_array_equal(arrays[r], rank_data(root, count, np.int32, salt=root))
        pieces = [rank_data(i, count, np.float64, salt=7) for i in range(n)]
        send = np.concatenate(pieces)
        outs = [np.zeros(count, np.float64) for _ in range(n)]
        group.call(lambda ctx, send=send, outs=outs, root=root:
                   run_algorithm(ctx, shm_broadcast.scatter, send if ctx.rank == root else None,
                                 outs[ctx.rank], [count] * n, root),
                   signature("scatter", np.dtype(np.float64), count * n, root=root))
        for r in range(n):
            np.testing.assert_array_equal(outs[r], pieces[r])


@pytest.mark.parametrize("size", [2, 3])
def test_runs_of_broadcasts_through_the_out_region_alternate_its_halves(size):
    """Broadcasts between a slot and half the OUT region, back to back, from changing roots:
    each uses the half its predecessor did not, its root copying before the first wait; a call
    of another size or collective in between restarts the run."""
    g = ShmGroup(size, out=4096)  # halves of 2048 bytes
    counts = [100, 300, 500, 500, 900, 200, 60, 150, 150, None, 150, 512, 100]  # None: an all_reduce
    try:
        for i, count in enumerate(counts):
            if count is None:
                arrays = [np.ones(3, np.float32) for _ in range(size)]
                g.call(lambda ctx, arrays=arrays: run_algorithm(ctx, shm_allreduce.direct, arrays[ctx.rank],
                                                                ReduceOp.SUM),
                       signature("all_reduce", np.dtype(np.float32), 3, ReduceOp.SUM))
                continue
            root = i % size
            arrays = [rank_data(r, count, np.int32, salt=i) for r in range(size)]
            g.call(lambda ctx, arrays=arrays, root=root:
                   run_algorithm(ctx, shm_broadcast.broadcast, arrays[ctx.rank], root),
                   signature("broadcast", np.dtype(np.int32), count, root=root))
            for r in range(size):
                np.testing.assert_array_equal(arrays[r], rank_data(root, count, np.int32, salt=i))
    finally:
        g.close()


def test_a_root_running_ahead_leaves_the_previous_broadcast_to_a_slow_receiver():
    """The root of the second of three broadcasts returns before its receiver has copied; the
    root's third call copies its array into the other half of its OUT region meanwhile."""
    domains = open_domains(2, SLOT, 4096)  # OUT halves of 2048 bytes
    count = 300  # 1200 bytes: between a slot and half the OUT region
    data = [np.full(count, k + 1, np.int32) for k in range(3)]
    sig = signature("broadcast", np.dtype(np.int32), count, root=0)

    def body(rank: int) -> list[np.ndarray]:
        d = domains[rank]
        got = []
        for k in range(3):
            ctx = ctx_for(d, k, sig, timeout=30)
            if rank == 0:
                run_algorithm(ctx, shm_broadcast.broadcast, data[k].copy(), 0)
            elif k != 1:
                x = np.zeros(count, np.int32)
                run_algorithm(ctx, shm_broadcast.broadcast, x, 0)
                got.append(x)
            else:  # call 1 by hand, as ``staged`` runs it, with a pause before the copy
                d.next_round()
                d.start(ctx)
                d.post()
                d.wait((0,), d.posts, ctx)
                time.sleep(0.3)  # the root has returned and copies call 2's array now
                got.append(d.outbox[0][2048:][:count * 4].view(np.int32).copy())  # half 1
                d.last_broadcast = (d.posts, 1)  # as ``staged`` records it
        return got

    try:
        got = run_each_rank(2, body)[1]
    finally:
        close_all(domains)
    for k in range(3):
        np.testing.assert_array_equal(got[k], data[k])


@pytest.mark.parametrize("count", [0, 5, 100, 1000])
def test_all_gather_and_gather_including_uneven(group, count):
    n = group.size
    sizes = [count + 3 * r for r in range(n)]  # uneven: the "v" variant
    sends = [rank_data(r, sizes[r], np.float16) for r in range(n)]
    outputs = [np.zeros(sum(sizes), np.float16) for _ in range(n)]
    group.call(lambda ctx: run_algorithm(ctx, shm_allgather.all_gather, sends[ctx.rank], outputs[ctx.rank],
                                         sizes),
               signature("all_gather", np.dtype(np.float16), sum(sizes)))
    for r in range(n):
        for q, block in enumerate(_split(outputs[r], sizes)):
            np.testing.assert_array_equal(block, sends[q])
    for root in range(n):
        outs = [np.full(sum(sizes), -1, np.float16) for _ in range(n)]
        group.call(lambda ctx, outs=outs, root=root:
                   run_algorithm(ctx, shm_allgather.gather, sends[ctx.rank],
                                 outs[ctx.rank] if ctx.rank == root else None, sizes, root),
                   signature("gather", np.dtype(np.float16), sum(sizes), root=root))
        for q, block in enumerate(_split(outs[root], sizes)):
            np.testing.assert_array_equal(block, sends[q])
        for r in range(n):
            if r != root:
                assert (outs[r] == -1).all()


@pytest.mark.parametrize("count", [0, 5, 100, 1000])
def test_reduce_scatter(group, count):
    n = group.size
    for op, dtype in [(ReduceOp.SUM, np.float32), (ReduceOp.AVG, np.float16), (ReduceOp.MAX, np.int64),
                      (ReduceOp.premul_sum(2.0), np.float64)]:
        blocks = [[rank_data(r, count + i, dtype, salt=i, op=op) for i in range(n)] for r in range(n)]
        sends = [np.concatenate(b) for b in blocks]
        counts = [count + i for i in range(n)]
        outs = [np.zeros(count + r, dtype) for r in range(n)]
        group.call(lambda ctx, sends=sends, outs=outs, counts=counts, op=op:
                   run_algorithm(ctx, shm_reduce_scatter.reduce_scatter, sends[ctx.rank], outs[ctx.rank],
                                 counts, op),
                   signature("reduce_scatter", np.dtype(dtype), sum(count + i for i in range(n)), op))
        for r in range(n):
            _close(outs[r], reduce_reference(op, [blocks[q][r] for q in range(n)]), op)


@pytest.mark.parametrize("count", [0, 5, 100, 1000])
def test_all_to_all_with_per_pair_sizes(group, count):
    n = group.size
    # rank r sends count + r + 2j elements to rank j
    inputs = [[np.full(count + r + 2 * j, 100 * r + j, np.int64) for j in range(n)] for r in range(n)]
    send_counts = [[count + r + 2 * j for j in range(n)] for r in range(n)]
    recv_counts = [[count + q + 2 * r for q in range(n)] for r in range(n)]
    outputs = [np.zeros(sum(c), np.int64) for c in recv_counts]
    group.call(lambda ctx: run_algorithm(ctx, shm_alltoall.all_to_all, np.concatenate(inputs[ctx.rank]),
                                         send_counts[ctx.rank], outputs[ctx.rank],
                                                   recv_counts[ctx.rank]),
               signature("all_to_all", np.dtype(np.int64), UNCHECKED))
    for r in range(n):
        for q, block in enumerate(_split(outputs[r], recv_counts[r])):
            np.testing.assert_array_equal(block, inputs[q][r])


@pytest.mark.parametrize("count", [1, 40])  # blocks of one size: one numpy call per member
def test_all_to_all_with_equal_blocks(group, count):
    n = group.size
    sends = [np.arange(n * count, dtype=np.float32) + 1000 * r for r in range(n)]
    outs = [np.zeros(n * count, np.float32) for _ in range(n)]
    group.call(lambda ctx: run_algorithm(ctx, shm_alltoall.all_to_all, sends[ctx.rank], [count] * n,
                                         outs[ctx.rank], [count] * n),
               signature("all_to_all", np.dtype(np.float32), UNCHECKED))
    for r in range(n):
        expected = np.concatenate([sends[q].reshape(n, count)[r] for q in range(n)])
        np.testing.assert_array_equal(outs[r], expected)


def test_all_to_all_one_slot_fast_path_follows_a_peer_that_needs_more_rounds():
    g = ShmGroup(3)
    k = 4
    send_counts = [[k, k, 100], [k, k, k], [k, k, k]]  # rank 0's stream spans several slots
    recv_counts = [[send_counts[q][r] for q in range(3)] for r in range(3)]
    sends = [np.arange(sum(c), dtype=np.int32) + 1000 * r for r, c in enumerate(send_counts)]
    outs = [np.zeros(sum(c), np.int32) for c in recv_counts]
    g.call(lambda ctx: run_algorithm(ctx, shm_alltoall.all_to_all, sends[ctx.rank], send_counts[ctx.rank],
                                     outs[ctx.rank], recv_counts[ctx.rank]),
           signature("all_to_all", np.dtype(np.int32), UNCHECKED))
    for r in range(3):
        expected = [_split(sends[q], send_counts[q])[r] for q in range(3)]
        np.testing.assert_array_equal(outs[r], np.concatenate(expected))
    g.close()


@pytest.mark.parametrize("count", [2, 100])  # one slot; rounds
def test_all_gather_size_disagreement_is_a_mismatch(count):
    g = ShmGroup(2)
    counts = [[count, count + 1], [count, count]]  # rank 0 expects one element more from rank 1
    with pytest.raises(Exception, match=f"rank 1 called test with {count} elements, while rank 0 called "
                                        f"it expecting {count + 1} from rank 1"):
        g.call(lambda ctx: run_algorithm(ctx, shm_allgather.all_gather, np.zeros(count, np.int64),
                                         np.zeros(sum(counts[ctx.rank]), np.int64), counts[ctx.rank]))
    g.close()


def test_all_to_all_size_disagreement_is_a_mismatch():
    g = ShmGroup(2)
    recv_counts = [[3, 5], [3, 3]]
    with pytest.raises(Exception,
                       match="rank 1 called test sending 3 elements to rank 0, which called it expecting 5"):
        g.call(lambda ctx: run_algorithm(ctx, shm_alltoall.all_to_all, np.zeros(6, np.int64), [3, 3],
                                         np.zeros(sum(recv_counts[ctx.rank]), np.int64),
                                         recv_counts[ctx.rank]))
    g.close()


def test_barrier_and_many_calls_in_a_row_alternate_slots(group):
    n = group.size
    for i in range(30):
        group.call(shm_barrier.barrier)
        arrays = [np.full(3, r + i, np.float32) for r in range(n)]
        group.call(lambda ctx, arrays=arrays: run_algorithm(ctx, shm_allreduce.direct, arrays[ctx.rank],
                                                            ReduceOp.SUM),
                   signature("all_reduce", np.dtype(np.float32), 3, ReduceOp.SUM))
        assert (arrays[0] == sum(range(n)) + n * i).all()


def test_two_members_reduce_through_the_out_regions_over_many_chunks():
    """Two members with raw terms and an array that fits the OUT region (``_through_out``):
    several chunks, a short last one, every op, all_reduce and reduce onto each root."""
    g = ShmGroup(2, out=4096)
    count = 700  # 11 chunks of 64 float32, the last of 60; 2800 bytes <= OUT
    try:
        for op in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MAX, ReduceOp.PROD):
            for dtype in (np.float32, np.int64):
                if not reduces(op, dtype):
                    continue
                inputs = [rank_data(r, count, dtype, op=op) for r in range(2)]
                expected = reduce_reference(op, inputs)
                sig = signature("all_reduce", np.dtype(dtype), count, op)
                arrays = [a.copy() for a in inputs]
                g.call(lambda ctx, arrays=arrays, op=op:
                       run_algorithm(ctx, shm_allreduce.pipelined, arrays[ctx.rank], op), sig)
                for r in range(2):
                    _close(arrays[r], expected, op)
                    assert arrays[r].tobytes() == arrays[0].tobytes(), "ranks disagree bitwise"
                for root in (0, 1):
                    arrays = [a.copy() for a in inputs]
                    g.call(lambda ctx, arrays=arrays, op=op, root=root:
                           run_algorithm(ctx, shm_allreduce.reduce_pipelined, arrays[ctx.rank], root, op),
                           signature("reduce", np.dtype(dtype), count, op, root))
                    _close(arrays[root], expected, op)
                    np.testing.assert_array_equal(arrays[1 - root], inputs[1 - root])
    finally:
        g.close()


def test_an_array_just_over_the_chunk_size_takes_one_chunk_through_the_out_regions():
    """65 float32 with 256-byte slots (a 1 MiB + 3 KB bucket at 1 MiB slots): one chunk, not a
    full one and a tail of one element; 200 of them: three."""
    g = ShmGroup(2, out=4096)
    plans = []

    def body(ctx: Ctx, x: np.ndarray) -> None:
        run_algorithm(ctx, shm_allreduce.pipelined, x, ReduceOp.SUM)
        plans.append(ctx.plan.state)

    try:
        for count, chunks in ((65, 1), (200, 3)):
            arrays = [np.full(count, r + 1, np.float32) for r in range(2)]
            g.call(lambda ctx, arrays=arrays: body(ctx, arrays[ctx.rank]),
                   signature("all_reduce", np.dtype(np.float32), count, ReduceOp.SUM))
            assert [(p.in_out, p.chunks) for p in plans[-2:]] == [(True, chunks)] * 2
            for x in arrays:
                np.testing.assert_array_equal(x, np.full(count, 3, np.float32))
    finally:
        g.close()


@pytest.mark.parametrize("keep_going", [False, True])
def test_two_members_reduce_arrays_larger_than_the_out_region_through_its_ring(keep_going):
    """Where a failed call may leave arrays partly written, the OUT regions are rings of
    ``RING`` chunks: an array eight times their size still goes through them, each chunk's
    place reused many times; where failed calls keep arrays, the array goes through the slots."""
    g = ShmGroup(2, out=2048, keep_going=keep_going)  # 3 chunks of 96 float32 fit, 2000 do not
    count = 2000
    plans = []

    def body(ctx: Ctx, x: np.ndarray, root: int | None) -> None:
        if root is None:
            run_algorithm(ctx, shm_allreduce.pipelined, x, ReduceOp.SUM)
        else:
            run_algorithm(ctx, shm_allreduce.reduce_pipelined, x, root, ReduceOp.SUM)
        plans.append(ctx.plan.state)

    try:
        inputs = [rank_data(r, count, np.float32) for r in range(2)]
        expected = reduce_reference(ReduceOp.SUM, inputs)
        for root in (None, 0, 1):
            arrays = [a.copy() for a in inputs]
            sig = signature("all_reduce", np.dtype(np.float32), count, ReduceOp.SUM) if root is None \
                else signature("reduce", np.dtype(np.float32), count, ReduceOp.SUM, root)
            g.call(lambda ctx, arrays=arrays, root=root: body(ctx, arrays[ctx.rank], root), sig)
            for r in range(2):
                if root is None or r == root:
                    _close(arrays[r], expected, ReduceOp.SUM)
                else:
                    np.testing.assert_array_equal(arrays[r], inputs[r])
            assert [(p.in_out, p.ring) for p in plans[-2:]] == [(not keep_going, not keep_going)] * 2
            assert plans[-1].chunks > 3 * shm_allreduce.RING
    finally:
        g.close()


# staged in OUT; through the OUT regions, a failure after a chunk was copied in; streamed
@pytest.mark.parametrize("count, chunks_done", [(100, 1), (100, 2), (2000, 3)])
def test_a_failed_all_reduce_leaves_the_array_untouched(count, chunks_done):
    g = ShmGroup(2, keep_going=True)
    original = rank_data(0, count, np.float32)
    array = original.copy()

    def body(ctx: Ctx) -> None:
        d = ctx.team.shm
        if ctx.rank == 1:
            # Play the protocol's posts for the first chunks (A0 B0 A1 ...), then give up: by
            # then rank 0 has copied some chunks out when they are streamed.
            d.next_round()
            d.start(ctx)
            for _ in range(2 * chunks_done - 1):
                d.post()
            time.sleep(0.3)
            d.abort(GroupAbortedError("peer gave up"))
            raise GroupAbortedError("gave up on purpose")
        run_algorithm(ctx, shm_allreduce.pipelined, array, ReduceOp.SUM)

    with pytest.raises(GroupAbortedError):
        g.call(body, signature("all_reduce", np.dtype(np.float32), count, ReduceOp.SUM))
    np.testing.assert_array_equal(array, original)
    g.close()


def test_a_failed_broadcast_leaves_the_receivers_untouched():
    g = ShmGroup(2, keep_going=True)
    receiver = np.arange(1000, dtype=np.float64)
    before = receiver.copy()

    def body(ctx: Ctx) -> None:
        d = ctx.team.shm
        if ctx.rank == 0:  # the root: publish three rounds, then abort
            source = np.full(1000, 7.0)
            raw = source.view(np.uint8)
            d.inbox[0][d.next_round()][:SLOT] = raw[:SLOT]
            d.start(ctx, raw.size)
            for t in range(1, 3):
                d.inbox[0][d.next_round()][:SLOT] = raw[t * SLOT:(t + 1) * SLOT]
                d.post()
                d.wait(d.peers, d.posts, ctx)
            d.abort(GroupAbortedError("root gave up"))
            raise GroupAbortedError("gave up on purpose")
        run_algorithm(ctx, shm_broadcast.broadcast, receiver, 0)

    with pytest.raises(GroupAbortedError):
        g.call(body, signature("broadcast", np.dtype(np.float64), 1000, root=0))
    np.testing.assert_array_equal(receiver, before)
    g.close()


# -- scan, exscan: shm_prefix ----------------------------------------------------------------------

@pytest.mark.parametrize("inclusive", [True, False], ids=["scan", "exscan"])
@pytest.mark.parametrize("size", [1, 2, 3, pytest.param(5, marks=pytest.mark.slow)])
def test_shm_prefix_matches_numpy_cumulative_ops(size, inclusive):
    collective = "scan" if inclusive else "exscan"
    group = ShmGroup(size)
    fn = row_fn(collective, "shm_prefix")
    try:
        for op in [*OPS, ReduceOp.BAND, ReduceOp.BOR]:
            for dtype in PREFIX_DTYPES:
                if not reduces(op, dtype):
                    continue
                # within one slot, and several slots' worth (rounds under the journal)
                for count in (0, 7, 5 * SLOT // kernels.accumulation_dtype(op, dtype).itemsize + 3):
                    inputs = [rank_data(r, count, dtype, op=op) for r in range(size)]
                    arrays = [a.copy() for a in inputs]
                    group.call(lambda ctx, arrays=arrays, op=op: run_algorithm(ctx, fn, arrays[ctx.rank], op),
                               signature(collective, dtype, count, op))
                    for r, expected in enumerate(expected_prefixes(op, inputs, inclusive)):
                        assert_prefix(arrays[r], expected, inputs[0], op, f"{op} {dtype} x{count} rank {r}")
    finally:
        group.close()


def test_a_failed_multi_round_shm_scan_leaves_the_array_untouched():
    group = ShmGroup(2, keep_going=True)
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
        run_algorithm(ctx, row_fn("scan", "shm_prefix"), array, ReduceOp.SUM)

    try:
        with pytest.raises(GroupAbortedError):
            group.call(body, signature("scan", np.dtype(np.float32), count, ReduceOp.SUM))
        np.testing.assert_array_equal(array, original)
    finally:
        group.close()


@pytest.mark.parametrize("dtype", [np.uint8, np.float16, np.float32, np.complex128])
@pytest.mark.parametrize("count", [0, 1, 63, 64, 65, 1000])
def test_copies_in_pieces_keep_every_element(monkeypatch, dtype, count):
    """``shm_common.copy`` splits large copies (below glibc's non-temporal threshold): with tiny
    pieces, arrays of any length come out whole, the last piece short."""
    from tensorcomm.algorithms import shm_common

    monkeypatch.setattr(shm_common, "PIECE_BYTES", 64)
    src = np.arange(count).astype(dtype)
    dst = np.zeros(count, dtype)
    pieces = []
    original = np.ndarray.__setitem__

    class Recorder(np.ndarray):
        def __setitem__(self, key, value):  # each piece the copy makes
            pieces.append(np.asarray(value).nbytes)
            original(self, key, value)

    shm_common.copy(dst.view(Recorder), src)
    np.testing.assert_array_equal(dst, src)
    assert sum(pieces) == src.nbytes and all(size <= max(64, src.itemsize) for size in pieces)
    assert len(pieces) == (-(-src.nbytes // 64) if src.nbytes > 64 else 1)


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.complex128, ml_dtypes.bfloat16, np.bool_])
def test_bound_copy_copies_what_np_copyto_copies(dtype: type) -> None:
    from tensorcomm.algorithms import shm_common

    rng = np.random.default_rng(1)
    src = rng.integers(0, 2, 37).astype(dtype)
    dst = np.zeros(37, dtype)
    copy = shm_common.bound_copy(dst, src)
    assert isinstance(copy.func, type(memoryview(b"").__setitem__))  # the small same-dtype way
    src[:] = rng.integers(0, 2, 37).astype(dtype)  # bound to the arrays: their values at the run
    copy()
    assert dst.tobytes() == src.tobytes()


def test_bound_copy_takes_numpy_for_other_arrays_and_pieces_for_large_ones(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorcomm.algorithms import shm_common

    src = np.arange(64, dtype=np.float32)
    for dst, given in [(np.zeros(64, np.float64), src), (np.zeros(32, np.float32), src[::2])]:
        copy = shm_common.bound_copy(dst, given)  # another dtype; a strided source
        assert copy.func is np.copyto
        copy()
        np.testing.assert_array_equal(dst, given)
    monkeypatch.setattr(shm_common, "PIECE_BYTES", 64)
    dst = np.zeros(64, np.float32)
    copy = shm_common.bound_copy(dst, src)
    assert copy.func is shm_common.copy
    copy()
    np.testing.assert_array_equal(dst, src)
