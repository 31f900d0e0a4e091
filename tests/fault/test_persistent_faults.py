"""Persistent collectives (``all_reduce_init`` and its kin) fail as ordinary calls do: a rank killed
while the others' runs are started is named on every survivor (whether the run goes ahead on the
thread that waits or on the group's worker), later runs fail at once with the same error, and a
stopped rank makes a started run time out naming the call. On the base commit (no ``*_init``)
every test here fails."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.testing import spawn_ranks

JOB_TIMEOUT = 150.0
DETECTION_BUDGET = 30.0  # seconds from a death to the survivors' PeerLostError
STOP_TIMEOUT = 5.0  # the ranks' communication timeout in the stopped-rank test
pytestmark = [pytest.mark.fault, pytest.mark.timeout(JOB_TIMEOUT + 60)]

TRANSPORTS = {"tcp": {"TENSORCOMM_TRANSPORT": "tcp"}, "default": {}}
VICTIM = 1


def body_die_while_started(collective: str, progress: str, stamp_dir: str) -> dict:
    """Every rank runs a persistent call with start()/wait() in a loop; the victim is killed
    part-way. ``progress``: "wait" waits at once (the run goes ahead on this thread), "worker"
    sleeps between start and wait (the group's worker runs it), "call" runs 8-byte calls with
    ``request()`` (on shared memory: its bound round, ``core.bound``)."""
    rank, size = tc.get_rank(), tc.get_world_size()
    x = np.ones(2 if progress == "call" else 1 << 18, np.float32)
    if collective == "all_reduce":
        request = tc.all_reduce_init(x)
    else:
        out = np.empty(size * x.size, np.float32)
        request = tc.all_gather_into_tensor_init(out, x)
    assert progress != "call" or request.transport != "shm" or request._bound.one is not None  # one round
    if rank == VICTIM:
        def die() -> None:
            with open(os.path.join(stamp_dir, "death"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Timer(0.5, die).start()
    try:
        for _ in range(100_000_000 if progress == "call" else 100_000):
            x[...] = 1
            if progress == "call":
                request()
                continue
            request.start()
            if progress == "worker":
                time.sleep(0.02)
            request.wait()
    except tc.PeerLostError as exc:
        at = time.time()
        try:
            request()  # a later run fails at once with the same error
        except tc.CommError as later:
            again = f"{type(later).__name__}: {later}"
        else:
            again = "no error"
        return {"rank": exc.rank, "at": at, "message": str(exc), "again": again}
    raise AssertionError("the loop ended without an error")


@pytest.mark.parametrize("progress", ["wait", "worker", "call"])
@pytest.mark.parametrize("collective", ["all_reduce", "all_gather"])
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_rank_killed_during_started_runs_is_named_on_every_survivor(world_size, transport, collective,
                                                                     progress, tmp_path):
    outcomes = spawn_ranks(body_die_while_started, world_size, collective, progress, str(tmp_path),
                           timeout=JOB_TIMEOUT, env=TRANSPORTS[transport])
    death = float((tmp_path / "death").read_text())
    for outcome in outcomes:
        if outcome.rank == VICTIM:
            assert outcome.exitcode == -signal.SIGKILL, outcome.output
            continue
        assert outcome.ok, outcome.output
        result = outcome.result
        assert result["rank"] == VICTIM, result
        assert f"peer rank {VICTIM} was lost" in result["message"], result
        assert result["at"] - death < DETECTION_BUDGET, result
        assert result["again"].startswith("PeerLostError"), result


def body_stop_while_started(stamp_dir: str, how: str) -> dict:
    """``how``: "start" (``start()`` then ``wait()``) or "call" (``request()``: on shared memory,
    its bound round, ``core.bound``)."""
    rank = tc.get_rank()
    with open(os.path.join(stamp_dir, f"pid{rank}"), "w") as f:
        f.write(str(os.getpid()))
    x = np.ones(1024, np.float32)
    request = tc.all_reduce_init(x)
    assert how != "call" or request.transport != "shm" or request._bound.one is not None  # one round
    request()
    if rank == VICTIM:
        os.kill(os.getpid(), signal.SIGSTOP)
    start = time.monotonic()
    try:
        if how == "call":
            request()
        else:
            request.start()
            request.wait()
    except tc.CommTimeoutError as exc:
        try:  # the other survivor may have killed it first, and its parent reaped it
            with open(os.path.join(stamp_dir, f"pid{VICTIM}")) as f:
                os.kill(int(f.read()), signal.SIGKILL)
        except ProcessLookupError:
            pass
        return {"elapsed": time.monotonic() - start, "message": str(exc)}
    raise AssertionError(f"no CommTimeoutError: the run returned with values {np.unique(x)}")


@pytest.mark.parametrize("how", ["start", "call"])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_stopped_rank_makes_a_started_run_time_out_naming_the_call(transport, how, tmp_path):
    outcomes = spawn_ranks(body_stop_while_started, 3, str(tmp_path), how, timeout=JOB_TIMEOUT,
                           comm_timeout=STOP_TIMEOUT, env=TRANSPORTS[transport])
    survivors = [o for o in outcomes if o.rank != VICTIM]
    for outcome in survivors:
        assert outcome.ok, outcome.output
        assert "all_reduce" in outcome.result["message"], outcome.result
        assert outcome.result["elapsed"] < STOP_TIMEOUT + DETECTION_BUDGET, outcome.result
    assert any(f"rank {VICTIM}" in o.result["message"] for o in survivors), [o.result for o in survivors]


def body_stop_before_the_later_rounds(stamp_dir: str) -> dict:
    """3 ranks: rank 1 sends rank 2 a block larger than a slot, so the all_to_all goes on past its
    first round; rank 0's request is bound as one round. Rank 1 posts its first round and stops;
    rank 0 then starts: its ``start()`` must return at once (the rest waits for rank 1) and its
    ``wait()`` time out naming the call."""
    rank, b, big = tc.get_rank(), 4, 1 << 19
    with open(os.path.join(stamp_dir, f"pid{rank}"), "w") as f:
        f.write(str(os.getpid()))
    sends = {0: [b, b, b], 1: [b, b, big], 2: [b, b, b]}
    gets = {0: [b, b, b], 1: [b, b, b], 2: [b, big, b]}
    x = np.concatenate([np.full(n, 10 * rank + j, np.float32) for j, n in enumerate(sends[rank])])
    out = np.zeros(sum(gets[rank]), np.float32)
    request = tc.all_to_all_single_init(out, x, gets[rank], sends[rank])
    assert (request._bound.one is not None) == (rank == 0)
    request()
    slots = tc.WORLD._target()._member_team().shm.slots
    if rank == VICTIM:
        posts = slots.posts
        request.start()  # queued: the worker posts its first round
        while slots.posts == posts:
            time.sleep(0.0005)
        os.kill(os.getpid(), signal.SIGSTOP)
    if rank == 0:  # every peer's first round is there before this rank starts
        while any(slots.words[w] <= slots.posts for w in slots._peer_counters):
            time.sleep(0.0005)
    begin = time.monotonic()
    request.start()
    started = time.monotonic() - begin
    try:
        request.wait()
    except tc.CommTimeoutError as exc:
        try:
            with open(os.path.join(stamp_dir, f"pid{VICTIM}")) as f:
                os.kill(int(f.read()), signal.SIGKILL)
        except ProcessLookupError:
            pass
        return {"start": started, "message": str(exc)}
    raise AssertionError("no CommTimeoutError")


def test_a_start_whose_run_goes_on_does_not_wait_for_a_stopped_peer(tmp_path):
    outcomes = spawn_ranks(body_stop_before_the_later_rounds, 3, str(tmp_path), timeout=JOB_TIMEOUT,
                           comm_timeout=STOP_TIMEOUT)
    for outcome in outcomes:
        if outcome.rank != VICTIM:
            assert outcome.ok, outcome.output
            assert "all_to_all" in outcome.result["message"], outcome.result
    assert outcomes[0].result["start"] < STOP_TIMEOUT / 2, outcomes[0].result
