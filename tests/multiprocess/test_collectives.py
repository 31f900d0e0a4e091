"""Every collective x op x dtype x world size 1-5 on real rank processes, against numpy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.testing import rank_data, reduce_reference, reduces, run_ranks

from helpers import BODY_OF, COLLECTIVES, assert_prefix, assert_reduced, expected_prefixes, reduction_cases

pytestmark = pytest.mark.multiprocess

WORLD_SIZES = [1, 2, 3, 4, 5]
DTYPES = [np.bool_, np.int8, np.int32, np.int64, np.uint8, np.uint64, np.float16,
          ml_dtypes.bfloat16, np.float32, np.float64, np.complex64, np.complex128]
OPS = [tc.ReduceOp.SUM, tc.ReduceOp.PROD, tc.ReduceOp.MIN, tc.ReduceOp.MAX, tc.ReduceOp.AVG,
       tc.ReduceOp.BAND, tc.ReduceOp.BOR, tc.ReduceOp.BXOR, tc.premul_sum(0.5)]
COUNTS = [1, 13, 40_000]  # the last one crosses into the bandwidth (ring) algorithms



def body_all_reduce() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    for op, dtype, count in reduction_cases(OPS, DTYPES, COUNTS):
        x = rank_data(rank, count, dtype, op=op)
        expected = reduce_reference(op, [rank_data(r, count, dtype, op=op) for r in range(size)])
        tc.all_reduce(x, op=op)
        assert_reduced(x, expected, op, f"all_reduce {op} {np.dtype(dtype)} x{count}")


def body_reduce() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    for op in (tc.ReduceOp.SUM, tc.ReduceOp.MAX, tc.ReduceOp.AVG, tc.ReduceOp.BXOR):
        for dtype in (np.int32, np.float32, ml_dtypes.bfloat16, np.float64):
            if not reduces(op, dtype):
                continue
            for count in COUNTS:
                for dst in range(size):
                    x = rank_data(rank, count, dtype, op=op)
                    before = x.copy()
                    tc.reduce(x, dst=dst, op=op)
                    if rank == dst:
                        expected = reduce_reference(op, [rank_data(r, count, dtype, op=op)
                                                         for r in range(size)])
                        assert_reduced(x, expected, op, f"reduce {op} to {dst}")
                    else:
                        np.testing.assert_array_equal(x, before)


def body_broadcast() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    for dtype in DTYPES:
        for count in COUNTS:
            for src in range(size):
                x = rank_data(rank, (count, 2), dtype, salt=src)
                tc.broadcast(x, src=src)
                np.testing.assert_array_equal(x, rank_data(src, (count, 2), dtype, salt=src))


def body_all_gather() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    for dtype in (np.bool_, np.int8, np.float16, ml_dtypes.bfloat16, np.float64, np.complex64):
        for count in COUNTS:
            x = rank_data(rank, (count,), dtype)
            outs = [np.zeros(count, dtype) for _ in range(size)]
            tc.all_gather(outs, x)
            for r in range(size):
                np.testing.assert_array_equal(outs[r], rank_data(r, (count,), dtype))
            joined = np.zeros((size * count,), dtype)
            tc.all_gather_into_tensor(joined, x)
            np.testing.assert_array_equal(joined, np.concatenate(outs))
    # uneven: rank r contributes r + 1 rows
    x = np.full((rank + 1, 3), rank, np.int64)
    outs = [np.empty((r + 1, 3), np.int64) for r in range(size)]
    tc.all_gather(outs, x)
    for r in range(size):
        assert (outs[r] == r).all()


def body_gather_scatter() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    for count in COUNTS:
        for root in range(size):
            x = rank_data(rank, (count,), np.float32)
            untouched = [np.full(count, -1, np.float32) for _ in range(size)]
            tc.gather(x, untouched, dst=root)  # non-roots pass a list too: left untouched
            for r in range(size):
                expected = (rank_data(r, (count,), np.float32) if rank == root
                            else np.full(count, -1, np.float32))
                np.testing.assert_array_equal(untouched[r], expected)
            out = np.zeros(count, np.int32)
            pieces = ([rank_data(r, (count,), np.int32, salt=root) for r in range(size)] if rank == root
                      else None)
            tc.scatter(out, pieces, src=root)
            np.testing.assert_array_equal(out, rank_data(rank, (count,), np.int32, salt=root))


def body_reduce_scatter() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    for op in (tc.ReduceOp.SUM, tc.ReduceOp.MIN, tc.ReduceOp.AVG, tc.ReduceOp.BOR):
        for dtype in (np.int64, np.float32, np.float16):
            if not reduces(op, dtype):
                continue
            for count in COUNTS:
                inputs = [rank_data(rank, count, dtype, salt=i, op=op) for i in range(size)]
                out = np.zeros(count, dtype)
                tc.reduce_scatter(out, inputs, op=op)
                expected = reduce_reference(op, [rank_data(r, count, dtype, salt=rank, op=op)
                                                 for r in range(size)])
                assert_reduced(out, expected, op, f"reduce_scatter {op} {np.dtype(dtype)}")
                whole = np.concatenate(inputs)
                out2 = np.zeros(count, dtype)
                tc.reduce_scatter_tensor(out2, whole, op=op)
                assert_reduced(out2, expected, op, "reduce_scatter_tensor")


def body_all_to_all() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    for count in COUNTS:
        inputs = [np.full(count, 100 * rank + j, np.int32) for j in range(size)]
        outputs = [np.zeros(count, np.int32) for _ in range(size)]
        tc.all_to_all(outputs, inputs)
        for j in range(size):
            assert (outputs[j] == 100 * j + rank).all()
        single_in = np.concatenate(inputs).reshape(size, count)
        single_out = np.zeros_like(single_in)
        tc.all_to_all_single(single_out, single_in)
        np.testing.assert_array_equal(single_out, np.stack(outputs))
    # uneven splits: rank r sends j + 1 rows of width 2 to rank j
    send_rows = [j + 1 for j in range(size)]
    recv_rows = [rank + 1] * size
    x = np.concatenate([np.full((j + 1, 2), 10 * rank + j, np.float64) for j in range(size)])
    y = np.zeros((sum(recv_rows), 2), np.float64)
    tc.all_to_all_single(y, x, output_split_sizes=recv_rows, input_split_sizes=send_rows)
    expected = np.concatenate([np.full((rank + 1, 2), 10 * r + rank, np.float64) for r in range(size)])
    np.testing.assert_array_equal(y, expected)


def body_barrier_and_p2p() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    tc.barrier()
    if size == 1:
        return
    right, left = (rank + 1) % size, (rank - 1) % size
    out = np.arange(5, dtype=np.float64) + rank
    got = np.zeros(5, np.float64)
    sent = tc.isend(out, right, tag=7)
    received = tc.irecv(got, left, tag=7)
    sent.wait()
    received.wait()
    assert received.result() == left
    np.testing.assert_array_equal(got, np.arange(5) + left)
    if rank == 0:
        sources = set()
        for _ in range(size - 1):
            buf = np.zeros(1, np.int64)
            source = tc.recv(buf, tag=3)
            assert buf[0] == 1000 + source
            sources.add(source)
        assert sources == set(range(1, size))
    else:
        tc.send(np.array([1000 + rank], np.int64), 0, tag=3)
    tc.barrier()


def body_async() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    xs = [np.full(1000, rank + i, np.float32) for i in range(5)]
    works = [tc.all_reduce(x, async_op=True) for x in xs]
    y = np.full(10, rank, np.int64)
    tc.all_reduce(y, op="max")  # a blocking call behind pending async ones keeps issue order
    assert (y == size - 1).all()
    for i, (x, work) in enumerate(zip(xs, works, strict=True)):
        assert work.wait(timeout=30) is True
        assert work.is_completed() and work.exception() is None
        assert (x == sum(r + i for r in range(size))).all()
    w = tc.barrier(async_op=True)
    w.wait()


def body_groups() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    odd = tc.new_group([r for r in range(size) if r % 2 == 1])
    even = tc.create_group("even", [r for r in range(size) if r % 2 == 0])
    rest = tc.new_group(list(range(1, size)))  # excludes rank 0
    mine = odd if rank % 2 else even
    assert mine.is_member and tc.get_world_size(mine) == mine.size
    assert mine.global_rank(mine.rank) == rank
    # two groups in flight at once: async on one, blocking on the other
    x = np.full(100, rank, np.int64)
    w = tc.all_reduce(x, group=mine, async_op=True)
    if rank != 0:
        z = np.full(3, rank, np.int64)
        tc.all_reduce(z, group=rest)
        assert (z == sum(range(1, size))).all()
        assert tc.get_rank(rest) == rank - 1
    else:
        with pytest.raises(ValueError, match="not a member"):
            tc.all_reduce(np.zeros(3), group=rest)
    w.wait()
    assert (x == sum(r for r in range(size) if r % 2 == rank % 2)).all()
    y = np.full(4, rank, np.float32)
    tc.broadcast(y, src=mine.ranks[-1], group="even" if rank % 2 == 0 else mine)
    assert (y == mine.ranks[-1]).all()


def body_scan() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    cases = [(op, dtype, count) for op in OPS for dtype in DTYPES if reduces(op, dtype)
             for count in (1, 13)]
    # more than one shared-memory slot (1 MiB) in the accumulation dtype: the multi-round path
    cases += [(tc.ReduceOp.SUM, np.float32, 300_000), (tc.ReduceOp.AVG, np.float16, 300_000),
              (tc.ReduceOp.MAX, np.int64, 300_000)]
    for op, dtype, count in cases:
        inputs = [rank_data(r, count, dtype, op=op) for r in range(size)]
        inclusive, exclusive = expected_prefixes(op, inputs, True), expected_prefixes(op, inputs, False)
        x = inputs[rank].copy()
        tc.scan(x, op=op)
        assert tc.WORLD.last_call.collective == "scan"
        assert_prefix(x, inclusive[rank], inputs[0], op, f"scan {op} {np.dtype(dtype)} x{count}")
        y = inputs[rank].copy()
        work = tc.exscan(y, op=op, async_op=True)
        work.wait(timeout=60)
        assert work.algorithm == ("shm_prefix" if tc.WORLD.transport_kind is tc.TransportKind.SHM
                                  else "recursive_doubling"), work.algorithm
        assert_prefix(y, exclusive[rank], inputs[0], op, f"exscan {op} {np.dtype(dtype)} x{count}")


def body_scan_async_groups_and_objects() -> None:
    from tensorcomm.ops import Exscan, Scan

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


# The body of each collective (``helpers.BODY_OF``, which tests/mpi/test_mpi_backend.py runs too),
# then the bodies that mix them.
BODIES = [*(globals()[name] for name in dict.fromkeys(BODY_OF.values())), body_scan_async_groups_and_objects,
          body_async]


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_a_body_runs_every_collective(collective):
    """A collective of ``signature.COLLECTIVES`` needs a body here, named in ``helpers.BODY_OF``."""
    assert collective in BODY_OF, f"no body runs {collective}: add one and name it in helpers.BODY_OF"

# Ranks of one host use shared memory unless TENSORCOMM_TRANSPORT=tcp: run everything both ways.
TRANSPORTS = {"shm": {}, "tcp": {"TENSORCOMM_TRANSPORT": "tcp"}}


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("body", BODIES, ids=lambda b: b.__name__.removeprefix("body_"))
def test_collective(body, world_size, transport):
    run_ranks(body, world_size, timeout=120, env=TRANSPORTS[transport])


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("world_size", [2, 3, 5])
def test_groups(world_size, transport):
    run_ranks(body_groups, world_size, timeout=60, env=TRANSPORTS[transport])


def body_overflow() -> list[str]:
    """A float sum that overflows is inf on every rank, with no warning from tensorcomm's code."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        for count in (4, 400_000):  # one slot; pipelined
            x = np.full(count, 3e38, np.float32)
            tc.all_reduce(x)
            assert np.isinf(x).all()
        np.add(np.float32(3e38), np.float32(3e38))  # the user's own overflow still warns
    return [f"{w.filename}: {w.message}" for w in caught]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_float_overflow_gives_inf_and_no_warning_from_tensorcomm(transport):
    for messages in run_ranks(body_overflow, 2, timeout=60, env=TRANSPORTS[transport]):
        assert len(messages) == 1 and "test_collectives.py" in messages[0], messages
