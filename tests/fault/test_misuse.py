"""What careless use gets: a clear error at once, never a silent wrong answer or a long stall.

Two threads on one group, a forked child using its parent's groups, an immutable scalar as an
output, timeouts too large for the OS, groups made and destroyed by the hundred, and destroy()
beside a stopped peer."""

from __future__ import annotations

import datetime
import os
import signal
import threading
import time

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.testing import run_ranks, spawn_ranks

pytestmark = pytest.mark.fault

TRANSPORTS = {"tcp": {"TENSORCOMM_TRANSPORT": "tcp"}, "shm": {}}


def body_two_threads() -> str:
    """Rank 0 has an all_reduce in flight on one thread when a second thread calls another."""
    if tc.get_rank() == 0:
        pending = tc.all_reduce(np.ones(4, np.float32), async_op=True)  # waits for rank 1
        with pytest.raises(tc.ConcurrentUseError, match="thread") as info:
            errors: list[BaseException] = []

            def other() -> None:
                try:
                    tc.all_reduce(np.ones(4, np.float32))
                except BaseException as exc:  # noqa: BLE001
                    errors.append(exc)

            thread = threading.Thread(target=other)
            thread.start()
            thread.join()
            raise errors[0]
        with pytest.raises(tc.CommError):
            pending.wait()
        return str(info.value)
    time.sleep(1.0)  # rank 0's first call stays in flight meanwhile
    with pytest.raises(tc.CommError) as info:
        tc.all_reduce(np.ones(4, np.float32))
    return str(info.value)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_two_threads_on_one_group_raise_and_end_the_group(transport):
    first, second = run_ranks(body_two_threads, 2, timeout=60, env=TRANSPORTS[transport])
    assert "while thread" in first, first
    assert "two threads" in second, second  # the peer learns why the group ended


def body_threads_on_different_groups() -> list[float]:
    """Different groups from different threads at once are fine."""
    groups = [tc.new_group([0, 1]), tc.new_group([0, 1])]
    sums: list[float] = [0.0, 0.0]

    def loop(index: int) -> None:
        x = np.ones(4, np.float32)
        for _ in range(50):
            x[...] = index + 1
            tc.all_reduce(x, group=groups[index])
            sums[index] += float(x[0])

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sums


def test_threads_on_different_groups_get_right_answers():
    for sums in run_ranks(body_threads_on_different_groups, 2, timeout=60):
        assert sums == [100.0, 200.0]


def body_fork() -> dict:
    pair = tc.new_group([0, 1])
    peer = 1 - tc.get_rank()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: every way into the parent's groups is refused
        outcome = []
        for call in (lambda: tc.all_reduce(np.ones(4, np.float32), group=pair),
                     lambda: tc.send(np.ones(4, np.float32), dst=peer, group=pair),
                     lambda: tc.all_reduce(np.ones(4, np.float32))):
            try:
                call()
                outcome.append("ran")
            except RuntimeError as exc:
                outcome.append("forked" if "forked" in str(exc) else "not initialized"
                               if "not initialized" in str(exc) else repr(exc))
        os.write(write, ",".join(outcome).encode())
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    child = os.read(read, 1000).decode()
    x = np.full(4, tc.get_rank() + 1, np.float32)  # the parents go on unharmed
    tc.all_reduce(x, group=pair)
    return {"child": child, "status": status, "sum": float(x[0])}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_forked_child_cannot_use_its_parents_groups(transport):
    for result in run_ranks(body_fork, 2, timeout=60, env=TRANSPORTS[transport]):
        assert result["child"] == "forked,forked,not initialized", result
        assert result["status"] == 0 and result["sum"] == 3.0, result


def body_scalar_output() -> str:
    with pytest.raises(ValueError, match="read-only") as info:
        tc.all_reduce(np.float32(3.0))
    tc.all_reduce(np.array(3.0, np.float32))  # a 0-d array is fine
    return str(info.value)


def test_an_immutable_scalar_is_refused_as_an_output():
    assert all("numpy scalars" in m for m in run_ranks(body_scalar_output, 2, timeout=60))


def body_huge_timeouts() -> list[float]:
    sums = []
    for timeout in (1e10, datetime.timedelta.max, float(10**30)):
        tc.init(timeout=timeout)
        x = np.ones(2, np.float32)
        tc.all_reduce(x)
        sums.append(float(x[0]))
        tc.destroy()
    return sums


def test_timeouts_beyond_what_the_os_accepts_mean_no_practical_limit():
    for sums in run_ranks(body_huge_timeouts, 2, init=False, timeout=60):
        assert sums == [2.0, 2.0, 2.0]


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def body_many_groups(count: int) -> dict:
    before = _descriptors()
    for _ in range(count):
        group = tc.new_group([0, 1])
        x = np.ones(4, np.float32)
        tc.all_reduce(x, group=group)
        assert x[0] == 2
        group.destroy()
    after = _descriptors()
    group = tc.new_group([0, 1])
    tc.destroy(group)  # torch's destroy_process_group(group) spelling
    with pytest.raises(tc.GroupAbortedError, match="destroyed"):
        tc.all_reduce(np.ones(4, np.float32), group=group)
    tc.barrier()  # the world goes on
    return {"before": before, "after": after}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_groups_destroyed_one_by_one_free_their_descriptors(transport):
    for result in run_ranks(body_many_groups, 2, 200, timeout=120, env=TRANSPORTS[transport]):
        assert result["after"] - result["before"] <= 2, result


def body_destroyed_while_a_peer_waits() -> str:
    group = tc.new_group([0, 1])
    tc.barrier(group=group)
    if tc.get_rank() == 1:
        group.destroy()
        tc.barrier()
        return ""
    with pytest.raises(tc.PeerLostError) as info:
        tc.all_reduce(np.ones(1 << 16, np.float32), group=group)  # rank 1 never makes this call
    tc.barrier()
    return str(info.value)


def test_a_peer_waiting_on_a_destroyed_group_is_told():
    message = run_ranks(body_destroyed_while_a_peer_waits, 2, timeout=60)[0]
    assert "rank 1" in message, message


def body_destroy_beside_a_stopped_peer() -> float:
    pids = [None] * tc.get_world_size()
    tc.all_gather_object(pids, os.getpid())
    if tc.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
        return 0.0  # never reached: rank 0 kills this process
    time.sleep(0.5)
    start = time.monotonic()
    tc.destroy()
    seconds = time.monotonic() - start
    os.kill(pids[1], signal.SIGKILL)
    return seconds


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_destroy_beside_a_stopped_peer_does_not_stall(transport):
    outcomes = spawn_ranks(body_destroy_beside_a_stopped_peer, 2, timeout=60, env=TRANSPORTS[transport])
    assert outcomes[0].ok, outcomes[0].output
    assert outcomes[0].result < 7.0, outcomes[0].result  # a stopped peer cost 10 s more before
