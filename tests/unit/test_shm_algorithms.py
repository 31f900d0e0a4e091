"""The same-host algorithms against numpy, with threads as ranks and tiny slots.

Slots of a few hundred bytes make every algorithm take its multi-round / pipelined paths with small
arrays: all-reduce staged in the OUT region and streamed through it under the journal, streams that
span many rounds, uneven contributions. A failing peer must leave in-place arrays untouched where
the group keeps them untouched or complete (``keep_going``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from one_off import one_off_ctx, run  # same directory

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
from tensorcomm.signature import UNCHECKED, Signature, signature
from tensorcomm.testing import rank_data, reduce_reference, reduces
from tensorcomm.transports.shm import slots
from tensorcomm.types import PremulSum, ReduceOp

from test_shm_domain import close_all, open_domains, run_threads  # same directory

pytestmark = pytest.mark.skipif(not slots.SUPPORTED, reason="shared memory needs x86-64")

SLOT = 256  # bytes: 64 float32 per slot
OUT = 512


@pytest.fixture(autouse=True)
def _fast_thread_switches():
    import sys

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(interval)


BARRIER = signature("barrier")  # Group.call's default: a call that moves no data


class Group:
    """``size`` thread-ranks sharing one tiny-slot domain; ``call`` runs one collective on all.

    As in the core, a call's signature must describe it (algorithms key caches on it).
    """

    def __init__(self, size: int, slot: int = SLOT, out: int = OUT, keep_going: bool = False) -> None:
        self.size = size
        self.keep_going = keep_going
        self.domains = open_domains(size, slot, out)
        self.seq = 0

    def call(self, fn: Callable[[Ctx], Any], sig: Signature = BARRIER) -> list[Any]:
        seq = self.seq
        self.seq += 1

        def body(rank: int) -> Any:
            d = self.domains[rank]
            ctx = one_off_ctx(None, range(self.size), rank, group_id=0, seq=seq, timeout=30, name="test",
                              signature=sig, group_name="test", shm=d, keep_going=self.keep_going)
            try:
                return fn(ctx)
            except BaseException as exc:
                d.fail(exc, ctx)  # as Group._run does
                raise

        return run_threads(self.size, body)

    def close(self) -> None:
        close_all(self.domains)


SIZES = [1, 2, 3, pytest.param(5, marks=pytest.mark.slow)]  # 5 ranks: the full suite only


@pytest.fixture(params=SIZES, ids=lambda n: f"{n}ranks")
def group(request):
    g = Group(request.param)
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
                           run(ctx, algorithm, arrays[ctx.rank], op),
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
                       run(ctx, algorithm, arrays[ctx.rank], root, ReduceOp.SUM),
                       signature("reduce", np.dtype(np.float32), count, ReduceOp.SUM, root))
            for r in range(n):
                np.testing.assert_array_equal(arrays[r], expected if r == root else inputs[r])


@pytest.mark.parametrize("count", [0, 5, 100, 1000])
def test_broadcast_and_scatter(group, count):
    n = group.size
    for root in range(n):
        arrays = [rank_data(r, count, np.int32, salt=root) for r in range(n)]
        group.call(lambda ctx, arrays=arrays, root=root:
                   run(ctx, shm_broadcast.broadcast, arrays[ctx.rank], root),
                   signature("broadcast", np.dtype(np.int32), count, root=root))
        for r in range(n):
            np.testing.assert_array_equal(arrays[r], rank_data(root, count, np.int32, salt=root))
        pieces = [rank_data(i, count, np.float64, salt=7) for i in range(n)]
        send = np.concatenate(pieces)
        outs = [np.zeros(count, np.float64) for _ in range(n)]
        group.call(lambda ctx, send=send, outs=outs, root=root:
                   run(ctx, shm_broadcast.scatter, send if ctx.rank == root else None, outs[ctx.rank],
                       [count] * n, root),
                   signature("scatter", np.dtype(np.float64), count * n, root=root))
        for r in range(n):
            np.testing.assert_array_equal(outs[r], pieces[r])


@pytest.mark.parametrize("size", [2, 3])
def test_runs_of_broadcasts_through_the_out_region_alternate_its_halves(size):
    """Broadcasts between a slot and half the OUT region, back to back, from changing roots:
    each uses the half its predecessor did not, its root copying before the first wait; a call
    of another size or collective in between restarts the run."""
    g = Group(size, out=4096)  # halves of 2048 bytes
    counts = [100, 300, 500, 500, 900, 200, 60, 150, 150, None, 150, 512, 100]  # None: an all_reduce
    try:
        for i, count in enumerate(counts):
            if count is None:
                arrays = [np.ones(3, np.float32) for _ in range(size)]
                g.call(lambda ctx, arrays=arrays: run(ctx, shm_allreduce.direct, arrays[ctx.rank],
                                                      ReduceOp.SUM),
                       signature("all_reduce", np.dtype(np.float32), 3, ReduceOp.SUM))
                continue
            root = i % size
            arrays = [rank_data(r, count, np.int32, salt=i) for r in range(size)]
            g.call(lambda ctx, arrays=arrays, root=root:
                   run(ctx, shm_broadcast.broadcast, arrays[ctx.rank], root),
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
            ctx = one_off_ctx(None, range(2), rank, group_id=0, seq=k, timeout=30, name="test",
                              signature=sig, group_name="test", shm=d)
            if rank == 0:
                run(ctx, shm_broadcast.broadcast, data[k].copy(), 0)
            elif k != 1:
                x = np.zeros(count, np.int32)
                run(ctx, shm_broadcast.broadcast, x, 0)
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
        got = run_threads(2, body)[1]
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
    group.call(lambda ctx: run(ctx, shm_allgather.all_gather, sends[ctx.rank], outputs[ctx.rank], sizes),
               signature("all_gather", np.dtype(np.float16), sum(sizes)))
    for r in range(n):
        for q, block in enumerate(_split(outputs[r], sizes)):
            np.testing.assert_array_equal(block, sends[q])
    for root in range(n):
        outs = [np.full(sum(sizes), -1, np.float16) for _ in range(n)]
        group.call(lambda ctx, outs=outs, root=root:
                   run(ctx, shm_allgather.gather, sends[ctx.rank],
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
                   run(ctx, shm_reduce_scatter.reduce_scatter, sends[ctx.rank], outs[ctx.rank], counts, op),
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
    group.call(lambda ctx: run(ctx, shm_alltoall.all_to_all, np.concatenate(inputs[ctx.rank]),
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
    group.call(lambda ctx: run(ctx, shm_alltoall.all_to_all, sends[ctx.rank], [count] * n, outs[ctx.rank],
                                                   [count] * n),
               signature("all_to_all", np.dtype(np.float32), UNCHECKED))
    for r in range(n):
        expected = np.concatenate([sends[q].reshape(n, count)[r] for q in range(n)])
        np.testing.assert_array_equal(outs[r], expected)


def test_all_to_all_one_slot_fast_path_follows_a_peer_that_needs_more_rounds():
    g = Group(3)
    k = 4
    send_counts = [[k, k, 100], [k, k, k], [k, k, k]]  # rank 0's stream spans several slots
    recv_counts = [[send_counts[q][r] for q in range(3)] for r in range(3)]
    sends = [np.arange(sum(c), dtype=np.int32) + 1000 * r for r, c in enumerate(send_counts)]
    outs = [np.zeros(sum(c), np.int32) for c in recv_counts]
    g.call(lambda ctx: run(ctx, shm_alltoall.all_to_all, sends[ctx.rank], send_counts[ctx.rank],
                           outs[ctx.rank], recv_counts[ctx.rank]),
           signature("all_to_all", np.dtype(np.int32), UNCHECKED))
    for r in range(3):
        expected = [_split(sends[q], send_counts[q])[r] for q in range(3)]
        np.testing.assert_array_equal(outs[r], np.concatenate(expected))
    g.close()


@pytest.mark.parametrize("count", [2, 100])  # one slot; rounds
def test_all_gather_size_disagreement_is_a_mismatch(count):
    g = Group(2)
    counts = [[count, count + 1], [count, count]]  # rank 0 expects one element more from rank 1
    with pytest.raises(Exception, match=f"rank 1 called test with {count} elements, while rank 0 called "
                                        f"it expecting {count + 1} from rank 1"):
        g.call(lambda ctx: run(ctx, shm_allgather.all_gather, np.zeros(count, np.int64),
                               np.zeros(sum(counts[ctx.rank]), np.int64), counts[ctx.rank]))
    g.close()


def test_all_to_all_size_disagreement_is_a_mismatch():
    g = Group(2)
    recv_counts = [[3, 5], [3, 3]]
    with pytest.raises(Exception,
                       match="rank 1 called test sending 3 elements to rank 0, which called it expecting 5"):
        g.call(lambda ctx: run(ctx, shm_alltoall.all_to_all, np.zeros(6, np.int64), [3, 3],
                                                   np.zeros(sum(recv_counts[ctx.rank]), np.int64),
                                                   recv_counts[ctx.rank]))
    g.close()


def test_barrier_and_many_calls_in_a_row_alternate_slots(group):
    n = group.size
    for i in range(30):
        group.call(shm_barrier.barrier)
        arrays = [np.full(3, r + i, np.float32) for r in range(n)]
        group.call(lambda ctx, arrays=arrays: run(ctx, shm_allreduce.direct, arrays[ctx.rank], ReduceOp.SUM),
                   signature("all_reduce", np.dtype(np.float32), 3, ReduceOp.SUM))
        assert (arrays[0] == sum(range(n)) + n * i).all()


def test_two_members_reduce_through_the_out_regions_over_many_chunks():
    """Two members with raw terms and an array that fits the OUT region (``_through_out``):
    several chunks, a short last one, every op, all_reduce and reduce onto each root."""
    g = Group(2, out=4096)
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
                       run(ctx, shm_allreduce.pipelined, arrays[ctx.rank], op), sig)
                for r in range(2):
                    _close(arrays[r], expected, op)
                    assert arrays[r].tobytes() == arrays[0].tobytes(), "ranks disagree bitwise"
                for root in (0, 1):
                    arrays = [a.copy() for a in inputs]
                    g.call(lambda ctx, arrays=arrays, op=op, root=root:
                           run(ctx, shm_allreduce.reduce_pipelined, arrays[ctx.rank], root, op),
                           signature("reduce", np.dtype(dtype), count, op, root))
                    _close(arrays[root], expected, op)
                    np.testing.assert_array_equal(arrays[1 - root], inputs[1 - root])
    finally:
        g.close()


def test_an_array_just_over_the_chunk_size_takes_one_chunk_through_the_out_regions():
    """65 float32 with 256-byte slots (a 1 MiB + 3 KB bucket at 1 MiB slots): one chunk, not a
    full one and a tail of one element; 200 of them: three."""
    g = Group(2, out=4096)
    plans = []

    def body(ctx: Ctx, x: np.ndarray) -> None:
        run(ctx, shm_allreduce.pipelined, x, ReduceOp.SUM)
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


# staged in OUT; through the OUT regions, a failure after a chunk was copied in; streamed
@pytest.mark.parametrize("count, chunks_done", [(100, 1), (100, 2), (2000, 3)])
def test_a_failed_all_reduce_leaves_the_array_untouched(count, chunks_done):
    g = Group(2, keep_going=True)
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
        run(ctx, shm_allreduce.pipelined, array, ReduceOp.SUM)

    with pytest.raises(GroupAbortedError):
        g.call(body, signature("all_reduce", np.dtype(np.float32), count, ReduceOp.SUM))
    np.testing.assert_array_equal(array, original)
    g.close()


def test_a_failed_broadcast_leaves_the_receivers_untouched():
    g = Group(2, keep_going=True)
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
        run(ctx, shm_broadcast.broadcast, receiver, 0)

    with pytest.raises(GroupAbortedError):
        g.call(body, signature("broadcast", np.dtype(np.float64), 1000, root=0))
    np.testing.assert_array_equal(receiver, before)
    g.close()
