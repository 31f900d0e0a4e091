"""The direct-read algorithms (``shm_cma``: members read each other's arrays with cross-memory
attach) on real rank processes, against numpy: 2, 3 and 4 ranks, odd sizes, every dtype, uneven
blocks, strided and read-only inputs, in both modes of a failed call's arrays.

The rows are forced (``TENSORCOMM_ALGORITHMS``) so that small arrays take them too; a test that
the built-in selection takes them for large arrays, and a mismatch test, close the file.
"""

from __future__ import annotations

import os
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.algorithms import select
from tensorcomm.testing import rank_data, reduce_reference, run_ranks
from tensorcomm.transports.shm import cma, slots

from helpers import assert_reduced, reduction_cases

pytestmark = [pytest.mark.multiprocess,
              pytest.mark.skipif(not (slots.SUPPORTED and cma.available()), reason="needs x86-64 Linux")]

FORCED = {"TENSORCOMM_ALGORITHMS": "all_reduce=shm_cma,reduce_scatter=shm_cma,all_gather=shm_cma,"
                                   "broadcast=shm_cma,all_to_all=shm_cma"}
# where failed calls keep in-place arrays (keep_going), all_reduce has no direct-read row
MODES = {"keep_going": {"TENSORCOMM_KEEP_GOING": "1", "TENSORCOMM_ALGORITHMS": FORCED[
    "TENSORCOMM_ALGORITHMS"].replace("all_reduce=shm_cma,", "")}, "default": FORCED}
DTYPES = [np.bool_, np.int8, np.uint16, np.int32, np.int64, np.float16, ml_dtypes.bfloat16,
          np.float32, np.float64, np.complex64, np.complex128]
OPS = [tc.ReduceOp.SUM, tc.ReduceOp.PROD, tc.ReduceOp.MAX, tc.ReduceOp.AVG, tc.ReduceOp.BXOR,
       tc.premul_sum(0.5)]
COUNTS = [1, 7, 1000, 200_003]  # the last one in several chunks of the reductions (CHUNK_BYTES)


def _ran_cma(what: str, in_place: bool = False) -> None:
    """The call ran the direct reads (an in-place one: unless failed calls keep arrays)."""
    ran = tc.WORLD.last_call
    keeps = in_place and os.environ.get("TENSORCOMM_KEEP_GOING") == "1"
    assert ran is not None and (ran.algorithm == "shm_cma") != keeps, (what, ran)


def body_reductions() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    for op, dtype, count in reduction_cases(OPS, DTYPES, COUNTS):
        what = f"{op} {np.dtype(dtype)} x{count}"
        inputs = [rank_data(r, count * size, dtype, op=op) for r in range(size)]
        expected = reduce_reference(op, inputs)
        x = inputs[rank].copy()
        tc.all_reduce(x, op=op)
        _ran_cma(what, in_place=True)
        assert_reduced(x, expected, op, f"all_reduce {what}")
        out = np.zeros(count, dtype)
        tc.reduce_scatter_tensor(out, inputs[rank], op=op)
        _ran_cma(what)
        assert_reduced(out, expected[rank * count:(rank + 1) * count], op, f"reduce_scatter {what}")


def body_movement() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    for dtype in DTYPES:
        for count in COUNTS:
            what = f"{np.dtype(dtype)} x{count}"
            for src in range(size):
                x = rank_data(rank, count, dtype, salt=src)
                tc.broadcast(x, src=src)
                _ran_cma(what)
                np.testing.assert_array_equal(x, rank_data(src, count, dtype, salt=src), err_msg=what)
            mine = rank_data(rank, count, dtype)
            gathered = np.zeros(count * size, dtype)
            tc.all_gather_into_tensor(gathered, mine)
            _ran_cma(what)
            np.testing.assert_array_equal(
                gathered, np.concatenate([rank_data(r, count, dtype) for r in range(size)]), err_msg=what)
            send = rank_data(rank, count * size, dtype, salt=7)
            got = np.zeros(count * size, dtype)
            tc.all_to_all_single(got, send)
            _ran_cma(what)
            mine = slice(rank * count, (rank + 1) * count)
            expected = np.concatenate([rank_data(r, count * size, dtype, salt=7)[mine] for r in range(size)])
            np.testing.assert_array_equal(got, expected, err_msg=what)


def body_uneven_strided_read_only() -> None:
    """Blocks of different sizes per member; inputs that are strided views or read-only."""
    rank, size = tc.get_rank(), tc.get_world_size()
    counts = [3 + 1001 * q for q in range(size)]  # what member q sends (all_gather)
    mine = rank_data(rank, counts[rank], np.float32)
    mine.flags.writeable = False
    outs = [np.zeros(c, np.float32) for c in counts]
    tc.all_gather(outs, mine)
    _ran_cma("all_gather v")
    for q in range(size):
        np.testing.assert_array_equal(outs[q], rank_data(q, counts[q], np.float32))
    # all_to_all_single with split sizes: member i sends (i + j + 1) * 37 elements to member j
    send_rows = [(rank + j + 1) * 37 for j in range(size)]
    recv_rows = [(i + rank + 1) * 37 for i in range(size)]
    send = rank_data(rank, (sum(send_rows), 3), np.int64)[:, ::2]  # strided: every other column
    got = np.zeros((sum(recv_rows), 2), np.int64)
    tc.all_to_all_single(got, send, output_split_sizes=recv_rows, input_split_sizes=send_rows)
    _ran_cma("all_to_all v")
    pieces = []
    for i in range(size):
        theirs = rank_data(i, (sum((i + j + 1) * 37 for j in range(size)), 3), np.int64)[:, ::2]
        start = sum((i + j + 1) * 37 for j in range(rank))
        pieces.append(theirs[start:start + recv_rows[i]])
    np.testing.assert_array_equal(got, np.concatenate(pieces))
    # a strided, read-only all_reduce input is not allowed (in place); a strided broadcast is
    x = rank_data(rank, (500, 4), np.float64)
    view = x[:, 1]
    tc.broadcast(view, src=size - 1)
    _ran_cma("broadcast of a strided view")
    np.testing.assert_array_equal(view, rank_data(size - 1, (500, 4), np.float64)[:, 1])
    # every member's reduce_scatter input read-only
    send = rank_data(rank, 999 * size, np.float32)
    send.flags.writeable = False
    out = np.zeros(999, np.float32)
    tc.reduce_scatter_tensor(out, send)
    _ran_cma("reduce_scatter of a read-only input")
    expected = reduce_reference(tc.ReduceOp.SUM, [rank_data(r, 999 * size, np.float32) for r in range(size)])
    np.testing.assert_array_equal(out, expected[rank * 999:(rank + 1) * 999])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_reductions_match_numpy(world_size, mode):
    run_ranks(body_reductions, world_size, timeout=300, env=MODES[mode])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_data_movement_matches_numpy(world_size, mode):
    run_ranks(body_movement, world_size, timeout=300, env=MODES[mode])


@pytest.mark.parametrize("world_size", [2, 3])
def test_uneven_blocks_strided_and_read_only_inputs(world_size):
    run_ranks(body_uneven_strided_read_only, world_size, timeout=120, env=FORCED)


def body_selected_for_large_arrays() -> dict[str, str]:
    size = tc.get_world_size()
    x = np.ones(max(select.CMA_BYTES.values()), np.uint8)  # at every built-in crossover
    ran = {}
    tc.all_reduce(x.view(np.float32))
    ran["all_reduce"] = tc.WORLD.last_call.algorithm
    tc.broadcast(x, src=0)
    ran["broadcast"] = tc.WORLD.last_call.algorithm
    out = np.empty(x.size * size, np.uint8)
    tc.all_gather_into_tensor(out, x)
    ran["all_gather"] = tc.WORLD.last_call.algorithm
    return ran


def test_large_arrays_are_read_directly_unless_switched_off():
    for ran in run_ranks(body_selected_for_large_arrays, 2, timeout=120):
        assert set(ran.values()) == {"shm_cma"}, ran
    for ran in run_ranks(body_selected_for_large_arrays, 2, timeout=120, env={"TENSORCOMM_CMA": "off"}):
        assert "shm_cma" not in ran.values(), ran


def body_mismatched_sizes() -> str:
    """Both ranks gather 201 elements (the signatures agree), but split differently."""
    rank = tc.get_rank()
    counts = [100, 101] if rank == 0 else [99, 102]
    outs = [np.zeros(c, np.float32) for c in counts]
    try:
        tc.all_gather(outs, np.ones(counts[rank], np.float32))
    except tc.CollectiveMismatchError as exc:
        return str(exc)
    return "no error"


def test_a_size_mismatch_fails_on_every_rank():
    results = run_ranks(body_mismatched_sizes, 2, timeout=60, env=FORCED)
    assert "with 101 elements" in results[1] or "with 102 elements" in results[0], results
    for text in results:
        assert "all_gather" in text and "expecting" in text, results


def body_switched_off_on_one_rank() -> tuple[list[str], str]:
    """Rank 1 runs with TENSORCOMM_CMA=off: no member reads directly, and each says why once."""
    import logging

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger("tensorcomm.shm").addHandler(Keep(logging.INFO))
    logging.getLogger("tensorcomm.shm").setLevel(logging.INFO)
    if os.environ["RANK"] == "1":
        os.environ["TENSORCOMM_CMA"] = "off"
    tc.init()
    try:
        x = np.ones(16 << 20, np.uint8)
        tc.broadcast(x, src=0)
        return [r for r in records if "directly" in r], tc.WORLD.last_call.algorithm
    finally:
        tc.destroy()


def test_switched_off_on_one_rank_every_rank_keeps_the_slots_and_says_why():
    said_0, said_1 = run_ranks(body_switched_off_on_one_rank, 2, timeout=60, init=False)
    assert said_0[1] == said_1[1] == "shm_rounds"
    assert len(said_0[0]) == 1 and "rank 1 does not allow it" in said_0[0][0], said_0
    assert len(said_1[0]) == 1 and "TENSORCOMM_CMA=off on this rank" in said_1[0][0], said_1


def _mixed_blocks(rank: int, size: int, big: int) -> tuple[list[int], list[int]]:
    """Send and receive counts of a call where rank 1 sends the last rank a block of ``big``
    elements and every other block has 4 (the last rank's stream needs more than one slot's
    round at ``big = 1 << 19``)."""
    sends = [4] * size
    gets = [4] * size
    if rank == 1:
        sends[size - 1] = big
    if rank == size - 1:
        gets[1] = big
    return sends, gets


def body_designs_that_differ(reader: int, mismatch: bool) -> list[Any]:
    """Rank ``reader`` runs all_to_all reading directly (forced), the others through the slots
    (one round, bound as a persistent request, or round by round): every form of the call meets
    the direct reads, and later calls still meet. ``mismatch``: rank 0 expects a block from rank 1
    of another size, which every rank must report."""
    rank = int(os.environ["RANK"])
    if rank == reader:
        os.environ["TENSORCOMM_ALGORITHMS"] = "all_to_all=shm_cma"
    tc.init()
    try:
        size = tc.get_world_size()
        sends, gets = _mixed_blocks(rank, size, 1 << 19)
        if mismatch and rank == 0:
            gets[1] += 1
        x = np.concatenate([np.full(n, 100 * rank + j, np.float32) for j, n in enumerate(sends)])
        out = np.zeros(sum(gets), np.float32)
        expected = np.concatenate([np.full(n, 100 * q + rank, np.float32) for q, n in enumerate(gets)])
        if mismatch:
            try:
                tc.all_to_all_single(out, x, gets, sends)
            except tc.CollectiveMismatchError as exc:
                return [str(exc)]
            return ["no error"]
        found: list[Any] = [tc.WORLD._target()._member_team().shm.cma]
        request = tc.all_to_all_single_init(out, x, gets, sends)
        found.append(request._bound.one is not None)  # bound as one round of the slots
        for run in range(9):
            out[...] = -1
            if run < 3:
                tc.all_to_all_single(out, x, gets, sends)
                found.append(tc.WORLD.last_call.algorithm)
            elif run < 6:
                request.start()
                request.wait()
            else:
                request()
            found.append(bool(np.array_equal(out, expected)))
        y = np.full(3, rank + 1.0, np.float32)
        tc.all_reduce(y)
        found.append(y.tolist() == [size * (size + 1) / 2] * 3)
        return found
    finally:
        tc.destroy()


@pytest.mark.parametrize("reader", [0, 1, 2])
def test_members_that_pick_different_designs_for_one_all_to_all_meet(reader):
    """``select`` picks each member's all_to_all design by the member's own size, which members
    may not share: a call that starts with some members reading directly and others through the
    slots goes on reading directly on all (it raised a size mismatch before)."""
    results = run_ranks(body_designs_that_differ, 3, reader, False, timeout=120, init=False)
    for rank, found in enumerate(results):
        if not found[0]:
            pytest.skip("the group does not read directly")
        design = "shm_cma" if rank == reader else "shm_rounds"
        assert found[1] == (rank == 0 != reader), (rank, found)  # rank 0's block sizes are one
        assert found[2:] == [design, True] * 3 + [True] * 7, (rank, found)


def test_a_size_mismatch_between_designs_fails_on_every_rank():
    results = run_ranks(body_designs_that_differ, 2, 0, True, timeout=120, init=False)
    for text in results:
        assert "all_to_all" in text[0] and "expecting" in text[0], results


def body_sizes_on_both_sides_of_the_crossover() -> list[Any]:
    """Two members whose all_to_all inputs lie on either side of the built-in crossover
    (``select.CMA_BYTES``): rank 0 sends two blocks of more than half of it, rank 1 one such
    block and a small one."""
    rank, half = tc.get_rank(), select.CMA_BYTES["all_to_all"] // 8 + 16  # float32 elements
    sends = [half, half] if rank == 0 else [half, 16]
    gets = [half, half] if rank == 0 else [half, 16]
    x = np.concatenate([np.full(n, 10 * rank + j, np.float32) for j, n in enumerate(sends)])
    out = np.zeros(sum(gets), np.float32)
    expected = np.concatenate([np.full(n, 10 * q + rank, np.float32) for q, n in enumerate(gets)])
    found: list[Any] = []
    for _ in range(2):
        out[...] = -1
        tc.all_to_all_single(out, x, gets, sends)
        found += [tc.WORLD.last_call.algorithm, bool(np.array_equal(out, expected))]
    return found


def test_all_to_all_sizes_on_both_sides_of_the_crossover_meet():
    zero, one = run_ranks(body_sizes_on_both_sides_of_the_crossover, 2, timeout=120)
    if zero[0] != "shm_cma":
        pytest.skip("the group does not read directly")
    assert zero == ["shm_cma", True] * 2 and one == ["shm_rounds", True] * 2, (zero, one)
