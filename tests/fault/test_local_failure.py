"""A call that fails on one rank only (out of memory, Ctrl-C, a bug) ends the group on every
member within seconds, naming that rank, over TCP as over shared memory; bad arguments that only
this rank can see are a ValueError before anything is sent."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.testing import run_ranks

pytestmark = pytest.mark.fault

TRANSPORTS = {"tcp": {"TENSORCOMM_TRANSPORT": "tcp"}, "shm": {}}
FAILING = 1


def _stay_alive_until_the_others_are_done(done_dir: str, others: int, prefix: str = "done") -> None:
    """The failing rank lives on (a process that exits would be noticed by its sockets closing)
    until ``others`` files starting with ``prefix`` are in ``done_dir``."""
    deadline = time.monotonic() + 45
    while (sum(name.startswith(prefix) for name in os.listdir(done_dir)) < others
           and time.monotonic() < deadline):
        time.sleep(0.05)


def _call(collective: str) -> None:
    n = tc.get_world_size()
    if collective == "all_reduce":
        tc.all_reduce(np.ones(1000, np.float32))
    elif collective == "broadcast":
        tc.broadcast(np.ones(1000, np.float32), src=0)
    else:
        tc.all_to_all_single(np.zeros(4 * n, np.float32), np.ones(4 * n, np.float32))


def body_fail_inside(collective: str, done_dir: str) -> dict:
    rank = tc.get_rank()
    n = tc.get_world_size()
    _call(collective)  # every rank has the call's plan now
    tc.barrier()  # and has finished that call (an abort ends every call in flight)
    # Leaving the barrier does not mean the others have left it too (they may still owe their
    # last message): the failing rank waits until they say so, outside tensorcomm.
    if rank == FAILING:
        _stay_alive_until_the_others_are_done(done_dir, n - 1, "left-barrier")
    else:
        open(os.path.join(done_dir, f"left-barrier{rank}"), "w").close()
    if rank == FAILING:  # the next call of that shape runs out of memory inside the call
        def out_of_memory(*args, **kwargs):
            raise MemoryError("injected")
        for plan in tc.WORLD._target()._plans.values():
            plan.run = out_of_memory
    start = time.monotonic()
    try:
        _call(collective)
        # A rank that needed nothing from the failing one (a broadcast root) may finish the call;
        # its next call on the group fails.
        tc.barrier()
        result = {"error": None, "seconds": time.monotonic() - start}
    except BaseException as exc:  # noqa: BLE001 - what each rank got is the result
        result = {"error": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - start}
    if rank == FAILING:
        _stay_alive_until_the_others_are_done(done_dir, n - 1)
    else:
        open(os.path.join(done_dir, f"done{rank}"), "w").close()
    return result


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("collective", ["all_reduce", "broadcast", "all_to_all_single"])
def test_a_local_failure_ends_the_call_on_every_rank(collective, transport, tmp_path):
    results = run_ranks(body_fail_inside, 3, collective, str(tmp_path), timeout=110,
                        env=TRANSPORTS[transport])
    assert results[FAILING]["error"] == "MemoryError", results
    for rank, result in enumerate(results):
        if rank == FAILING:
            continue
        assert result["error"] in ("GroupAbortedError", "PeerLostError", "CommError"), (rank, result)
        assert f"rank {FAILING}" in result["message"], (rank, result)
        assert result["seconds"] < 30, (rank, result)  # not the timeout, nor the 45 s above


def body_own_block_sizes() -> list[str]:
    n, r = tc.get_world_size(), tc.get_rank()
    messages = []
    with pytest.raises(ValueError, match="sends itself") as info:
        tc.all_to_all([np.zeros(2) for _ in range(n)], [np.zeros(3) for _ in range(n)])
    messages.append(str(info.value))
    sends = [1] * n
    sends[r] = 2
    with pytest.raises(ValueError, match="sends itself") as info:
        tc.all_to_all_single(np.zeros((n, 2)), np.zeros((n + 1, 2)), [1] * n, sends)
    messages.append(str(info.value))
    tc.barrier()
    return messages


def test_own_block_of_different_sizes_is_a_value_error():
    for messages in run_ranks(body_own_block_sizes, 2, timeout=60):
        assert "input_tensor_list" in messages[0] and "input_split_sizes" in messages[1], messages
