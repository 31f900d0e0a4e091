"""Members that wait for each other on one core move apart (``transports/shm/apart.py``): in one
process, with the peer's word written by hand; and on two real rank processes put on one core."""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.testing import run_ranks
from tensorcomm.transports.shm import apart, slots

pytestmark = pytest.mark.skipif(
    not slots.SUPPORTED or not hasattr(os, "sched_setaffinity") or apart.usable_cores() < 2,
    reason="needs Linux on x86-64 with two cores to move between")

_getcpu = ctypes.CDLL(None).sched_getcpu


def _words() -> memoryview:
    return memoryview(bytearray(16)).cast("q")  # member 0's word, then member 1's


def _in_thread(body):  # type: ignore[no-untyped-def]
    """Run ``body`` on a thread of its own (a move changes that thread only); return its result."""
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(body()))
    thread.start()
    thread.join(10)
    return out[0]


def test_moves_off_the_core_its_peer_waits_on_and_keeps_its_mask() -> None:
    def body() -> tuple[int, int, int, set[int], set[int]]:
        mask = os.sched_getaffinity(0)
        words = _words()
        member = apart.Apart(words, (0, 1), 0)
        for _ in range(5):  # again if the kernel moved this thread between the two reads
            cpu = _getcpu()
            words[1] = cpu + 1  # the peer last waited here
            member.check(1, 0.0)
            if member.moves:
                break
        return cpu, words[0] - 1, member.moves, mask, os.sched_getaffinity(0)

    cpu, published, moves, before, after = _in_thread(body)
    assert moves == 1
    assert published != cpu  # it runs elsewhere now, and says so
    assert after == before


def test_stays_when_the_peer_is_elsewhere_and_moves_at_most_every_move_seconds() -> None:
    def body() -> tuple[int, int, int, int]:
        words = _words()
        member = apart.Apart(words, (0, 1), 0)
        cpu = _getcpu()
        words[1] = cpu + 2  # another core
        member.check(1, 0.0)
        stayed = member.moves
        words[1] = _getcpu() + 1
        member.check(1, 0.0)  # moves
        words[1] = _getcpu() + 1
        member.check(1, apart.MOVE_SECONDS / 2)  # too soon
        again = member.moves
        words[1] = _getcpu() + 1
        member.check(1, apart.MOVE_SECONDS)
        return stayed, again, member.moves, words[0] - 1

    stayed, again, last, published = _in_thread(body)
    assert (stayed, again, last) == (0, 1, 2)
    assert published >= 0


def test_a_thread_bound_to_one_core_stays_bound() -> None:
    def body() -> tuple[int, set[int], int]:
        cpu = _getcpu()
        os.sched_setaffinity(0, {cpu})
        words = _words()
        member = apart.Apart(words, (0, 1), 0)
        words[1] = cpu + 1
        member.check(1, 0.0)
        return member.moves, os.sched_getaffinity(0), cpu

    moves, mask, cpu = _in_thread(body)
    assert moves == 0
    assert mask == {cpu}


def test_a_refused_mask_stops_the_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(pid: int, mask: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setaffinity", refused)
    words = _words()
    member = apart.Apart(words, (0, 1), 0)
    for _ in range(5):  # again if the kernel moved this thread between the two reads
        words[1] = _getcpu() + 1
        member.check(1, 0.0)  # no error: the wait goes on as before
        if not member.enabled:
            break
    assert (member.moves, member.enabled) == (0, False)


def test_more_members_than_cores_never_check() -> None:
    cores = apart.usable_cores()
    words = memoryview(bytearray(8 * (cores + 1))).cast("q")
    assert not apart.Apart(words, tuple(range(cores + 1)), 0).enabled
    assert apart.Apart(words, tuple(range(cores)), 0).enabled


def body_on_one_core() -> int:
    """Both ranks put on core 0 (their masks set back at once), then small all_reduces, right
    each time; returns how often this rank moved."""
    rank = tc.get_rank()
    apart = tc.WORLD._member_team().shm.slots.apart
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {0})
    os.sched_setaffinity(0, mask)
    before = apart.moves
    for _ in range(200):
        x = np.full(2, rank, np.float32)
        tc.all_reduce(x)
        assert x.tolist() == [1.0, 1.0]
    return int(apart.moves - before)


@pytest.mark.timeout(90)
def test_two_ranks_put_on_one_core_move_apart() -> None:
    moves = run_ranks(body_on_one_core, 2, timeout=60)
    assert sum(moves) >= 1, moves


def body_mpi_on_one_core() -> int:
    """As ``body_on_one_core``, with a ping-pong of small objects through ``tensorcomm.MPI``."""
    from tensorcomm import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    apart = tc.WORLD._member_team().shm.slots.apart

    def ping_pong(times: int) -> None:
        for i in range(times):
            if rank == 0:
                comm.send({"i": i}, dest=1, tag=1)
                assert comm.recv(source=1, tag=2) == {"i": i + 1}
            else:
                comm.send({"i": comm.recv(source=0, tag=1)["i"] + 1}, dest=0, tag=2)

    ping_pong(5)  # the communicator set up: from here on only point-to-point waits
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {0})
    os.sched_setaffinity(0, mask)
    before = apart.moves
    ping_pong(200)
    return int(apart.moves - before)


@pytest.mark.timeout(90)
def test_mpi_ranks_put_on_one_core_move_apart() -> None:
    moves = run_ranks(body_mpi_on_one_core, 2, timeout=60)
    assert sum(moves) >= 1, moves
