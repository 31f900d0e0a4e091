"""Ranks that call different collectives, shapes, dtypes, ops, roots or split sizes at the same
step all raise CollectiveMismatchError naming both calls; none hangs, none returns garbage."""

from __future__ import annotations

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.testing import run_ranks

pytestmark = pytest.mark.fault

TRANSPORTS = {"tcp": {"TENSORCOMM_TRANSPORT": "tcp"}, "default": {}}


def _call(kind: str, odd: bool) -> None:
    """Rank-dependent calls: odd ranks call the second variant of ``kind``."""
    size = tc.get_world_size()
    if kind == "collective":
        if odd:
            tc.all_gather_into_tensor(np.zeros(4 * size, np.float32), np.ones(4, np.float32))
        else:
            tc.all_reduce(np.ones(4, np.float32))
    elif kind == "shape":
        tc.all_reduce(np.ones(8 if odd else 4, np.float32))
    elif kind == "dtype":
        tc.all_reduce(np.ones(4, np.float64 if odd else np.float32))
    elif kind == "op":
        tc.all_reduce(np.ones(4, np.float32), op="max" if odd else "sum")
    elif kind == "root":
        tc.broadcast(np.ones(4, np.float32), src=1 if odd else 0)
    elif kind == "split_sizes":
        # every rank expects one row from each peer; odd ranks send two rows to rank 0
        sends = [2] + [1] * (size - 1) if odd else [1] * size
        tc.all_to_all_single(np.zeros((size, 2)), np.zeros((sum(sends), 2)), [1] * size, sends)
    elif kind == "skipped_call":
        if not odd:
            tc.all_reduce(np.ones(4, np.float32))
        tc.barrier()
    elif kind == "scan_exscan":
        (tc.exscan if odd else tc.scan)(np.ones(4, np.float32))
    elif kind == "scan_op":
        tc.scan(np.ones(4, np.float32), op="max" if odd else "sum")
    elif kind == "scan_all_reduce":
        (tc.all_reduce if odd else tc.scan)(np.ones(4, np.float32))
    elif kind == "split_all_gather":
        if odd:
            tc.all_gather_into_tensor(np.zeros(2 * size, np.int64), np.zeros(2, np.int64))
        else:
            tc.WORLD.split(0)
    else:
        raise AssertionError(kind)


def body_mismatch(kind: str) -> str:
    rank = tc.get_rank()
    try:
        _call(kind, odd=rank % 2 == 1)
        tc.barrier()  # not needed to detect it (see the test below), harmless if reached
    except tc.CollectiveMismatchError as exc:
        return str(exc)
    raise AssertionError(f"rank {rank}: no CollectiveMismatchError for a mismatched {kind}")


KINDS = ["collective", "shape", "dtype", "op", "root", "split_sizes", "skipped_call", "scan_exscan",
         "scan_op", "scan_all_reduce", "split_all_gather"]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("kind", KINDS)
def test_mismatch_raises_on_every_rank(kind, world_size, transport):
    messages = run_ranks(body_mismatch, world_size, kind, timeout=60, env=TRANSPORTS[transport])
    for message in messages:
        assert "called" in message or "byte message" in message, message
    if kind in ("shape", "dtype", "op", "collective"):
        assert any(" while rank " in m for m in messages), messages
    if kind == "split_all_gather":
        assert any("split(int64" in m for m in messages), messages


def body_mismatch_message() -> str:
    try:
        if tc.get_rank() == 1:
            tc.all_reduce(np.ones(4, np.float32))
        else:
            tc.all_gather_into_tensor(np.zeros(16, np.float32), np.ones(8, np.float32))
    except tc.CollectiveMismatchError as exc:
        return str(exc)
    raise AssertionError("no mismatch raised")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_mismatch_message_names_both_calls(transport):
    messages = run_ranks(body_mismatch_message, 2, timeout=60, env=TRANSPORTS[transport])
    joined = "\n".join(messages)
    assert "all_reduce(float32[4], op=sum)" in joined, joined
    assert "all_gather(float32[16])" in joined, joined


def body_mismatch_within_the_call(kind: str) -> str:
    """Ranks that only send in a call (roots, leaves) learn of a mismatch in that very call."""
    rank, n = tc.get_rank(), tc.get_world_size()
    x = np.ones(4, np.float32)
    try:
        if kind == "broadcast_src":  # every rank believes it is the root
            tc.broadcast(x, src=rank)
        elif kind == "scatter_src":
            tc.scatter(x, [x] * n, src=rank)
        elif kind == "gather_dst":
            tc.gather(x, [np.zeros(4, np.float32) for _ in range(n)], dst=rank)
        elif kind == "reduce_dst":
            tc.reduce(x, dst=rank)
        elif kind == "extra_broadcast":  # rank 0 broadcasts twice; the others barrier
            tc.broadcast(x, src=0)
            if rank == 0:
                tc.broadcast(x, src=0)
            else:
                tc.barrier()
    except tc.CollectiveMismatchError as exc:
        return str(exc)
    raise AssertionError(f"rank {rank}: the {kind} call passed")


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("kind", ["broadcast_src", "scatter_src", "gather_dst", "reduce_dst",
                                  "extra_broadcast"])
def test_a_rank_that_only_sends_learns_of_a_mismatch_in_the_call(kind, transport):
    for message in run_ranks(body_mismatch_within_the_call, 3, kind, timeout=60, env=TRANSPORTS[transport]):
        assert "called" in message, message


def body_algorithms_that_differ(algorithm: str, collective: str) -> str:
    """Rank 1 alone forces ``algorithm`` for ``collective`` (``TENSORCOMM_ALGORITHMS`` set on one
    rank: a launcher or a per-node script that passed it to some ranks only)."""
    import os

    if os.environ["RANK"] == "1":
        os.environ["TENSORCOMM_ALGORITHMS"] = f"{collective}={algorithm}"
    tc.init()
    try:
        team = tc.WORLD._target()._member_team()
        if team.shm is None or (algorithm == "shm_cma" and not team.shm.cma):
            return "skip: the group has no shared memory, or its members may not read each other"
        rank, size = tc.get_rank(), tc.get_world_size()
        x = np.full(1000, rank + 1.0, np.float32)
        try:
            if collective == "all_reduce":
                tc.all_reduce(x)
                got = x.tolist() == [size * (size + 1) / 2] * 1000
            elif collective == "broadcast":
                tc.broadcast(x, src=0)
                got = x.tolist() == [1.0] * 1000
            else:
                out = np.zeros(1000 * size, np.float32)
                tc.all_gather_into_tensor(out, x)
                got = out.tolist() == np.repeat(np.arange(1.0, size + 1), 1000).tolist()
        except tc.CollectiveMismatchError as exc:
            return str(exc)
        return f"no error ({'right' if got else 'wrong'} values, {tc.WORLD.last_call.algorithm})"
    finally:
        tc.destroy()


@pytest.mark.parametrize(("collective", "algorithm"), [("all_reduce", "shm_pipelined"),
                                                       ("broadcast", "shm_cma"), ("all_gather", "shm_cma")])
def test_ranks_that_choose_different_algorithms_for_one_call_fail_it(collective, algorithm):
    """On shared memory the members read each other's slots as their algorithm lays them out: a
    call run by two algorithms returned wrong values on one rank and failed on the other with an
    unrelated error (IndexError, a size "mismatch" of garbage)."""
    for text in run_ranks(body_algorithms_that_differ, 2, algorithm, collective, timeout=60, init=False):
        if text.startswith("skip: "):
            pytest.skip(text[6:])
        assert "chose different algorithms" in text and collective in text, text
        assert "TENSORCOMM_ALGORITHMS" in text, text
