"""Shared arrays (``tensorcomm.empty`` / ``zeros``): collectives on them against numpy, members
that mix shared and plain arrays, mismatched shapes, groups without shared memory, and lifetime:
what a group frees when destroyed, what an array kept past ``destroy()`` is, and that nothing is
left behind when a rank is killed."""

from __future__ import annotations

import os
import signal
import threading

import ml_dtypes
import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.testing import rank_data, reduce_reference, run_ranks, spawn_ranks
from tensorcomm.transports.shm import cma, slots

pytestmark = [pytest.mark.multiprocess,
              pytest.mark.skipif(not (slots.SUPPORTED and cma.available()), reason="needs x86-64 Linux")]

COUNTS = [5, 20_000, 600_001]  # through the slots; a broadcast of 1.2-4.8 MB read in place


def _mapped_segments() -> int:
    with open("/proc/self/maps") as f:
        return sum("tensorcomm-shm" in line for line in f)


def body_collectives(mix: bool) -> list[str]:
    """Every collective with a direct-read row, on shared arrays (``mix``: rank 1's are plain)."""
    rank, size = tc.get_rank(), tc.get_world_size()
    ran = []

    def array(count: int, dtype: type) -> np.ndarray:
        shared = tc.zeros(count, dtype)  # collective: every rank allocates, even one that mixes
        return np.zeros(count, dtype) if mix and rank == 1 else shared

    for dtype in (np.float32, ml_dtypes.bfloat16, np.int64):
        for count in COUNTS:
            x = array(count * size, dtype)
            x[...] = rank_data(rank, count * size, dtype)
            tc.all_reduce(x)
            inputs = [rank_data(r, count * size, dtype) for r in range(size)]
            expected = reduce_reference(tc.ReduceOp.SUM, inputs).astype(np.float64)
            np.testing.assert_allclose(x.astype(np.float64), expected, rtol=1e-2)
            out = array(count, dtype)
            send = array(count * size, dtype)
            send[...] = rank_data(rank, count * size, dtype)
            tc.reduce_scatter_tensor(out, send)
            np.testing.assert_allclose(out.astype(np.float64), expected[rank * count:(rank + 1) * count],
                                       rtol=1e-2)
            for src in range(size):
                y = array(count, dtype)
                y[...] = rank_data(rank, count, dtype, salt=src)
                tc.broadcast(y, src=src)
                ran.append(tc.WORLD.last_call.algorithm)
                np.testing.assert_array_equal(y, rank_data(src, count, dtype, salt=src))
            mine = array(count, dtype)
            mine[...] = rank_data(rank, count, dtype)
            gathered = np.zeros(count * size, dtype)
            tc.all_gather_into_tensor(gathered, mine)
            np.testing.assert_array_equal(gathered, np.concatenate([rank_data(r, count, dtype)
                                                                    for r in range(size)]))
            got = np.zeros(count * size, dtype)
            tc.all_to_all_single(got, send)
            expected_a2a = np.concatenate([rank_data(r, count * size, dtype)[rank * count:(rank + 1) * count]
                                           for r in range(size)])
            np.testing.assert_array_equal(got, expected_a2a)
    return ran


@pytest.mark.parametrize("mix", [False, True], ids=["shared", "mixed"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_collectives_on_shared_arrays_match_numpy(world_size, mix):
    for ran in run_ranks(body_collectives, world_size, mix, timeout=300):
        # small calls through the slots, larger ones read in place
        assert "shm_cma" in ran and ran[0] != "shm_cma", ran


def body_mismatch() -> str:
    try:
        tc.zeros(100 + tc.get_rank(), np.float32)
    except tc.CollectiveMismatchError as exc:
        return str(exc)
    return "no error"


def test_different_shapes_fail_on_every_member():
    for text in run_ranks(body_mismatch, 2, timeout=60):
        assert "asked for a shared array of <f4[101]" in text or "asked for <f4[101]" in text, text


def body_without_shared_memory() -> tuple[bool, list[float]]:
    x = tc.zeros((2, 3), np.float64)
    x[...] = tc.get_rank() + 1
    tc.all_reduce(x)
    return x.base is None or isinstance(x.base, np.ndarray), x.ravel().tolist()


def test_a_group_over_tcp_gets_plain_arrays():
    for plain, values in run_ranks(body_without_shared_memory, 2, timeout=60,
                                   env={"TENSORCOMM_TRANSPORT": "tcp"}):
        assert plain and values == [3.0] * 6


def body_lifetime() -> dict:
    """A group's arrays go with the group; one kept past destroy() stays usable memory."""
    world_before = _mapped_segments()
    group = tc.new_group()
    dropped = tc.zeros(1 << 16, np.float32, group=group)
    kept = tc.zeros(1 << 16, np.float32, group=group)
    during = _mapped_segments()
    del dropped
    group.destroy()
    kept[...] = 5  # still this process's memory
    after_destroy = _mapped_segments()
    total = float(kept.sum())
    del kept
    after_drop = _mapped_segments()
    y = np.full(1 << 16, tc.get_rank() + 1.0, np.float32)
    tc.all_reduce(y)  # the world is unaffected
    return {"before": world_before, "during": during, "after_destroy": after_destroy,
            "after_drop": after_drop, "kept_sum": total, "y": float(y[0])}


def test_a_group_frees_its_shared_arrays_and_a_kept_one_stays_valid():
    for r in run_ranks(body_lifetime, 2, timeout=60):
        assert r["during"] == r["before"] + 3, r  # the group's segment and two arrays
        assert r["after_destroy"] == r["before"] + 1, r  # only the array still held
        assert r["after_drop"] == r["before"], r
        assert r["kept_sum"] == 5.0 * (1 << 16) and r["y"] == 3.0, r


def body_killed_holding_shared_arrays() -> str:
    arrays = [tc.zeros(1 << 20, np.float32) for _ in range(3)]
    if tc.get_rank() == 1:
        threading.Timer(0.2, os.kill, args=(os.getpid(), signal.SIGKILL)).start()
    try:
        for _ in range(100_000):
            tc.all_reduce(arrays[0])
    except tc.PeerLostError as exc:
        return str(exc)
    return "no error"


def test_a_killed_rank_leaves_nothing_behind():
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    outcomes = spawn_ranks(body_killed_holding_shared_arrays, 2, timeout=90, comm_timeout=60)
    assert outcomes[1].exitcode == -signal.SIGKILL
    assert outcomes[0].ok and "peer rank 1 was lost" in outcomes[0].result, outcomes[0].output
    assert (set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()) == before
