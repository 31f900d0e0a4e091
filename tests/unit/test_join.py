"""init's join (``core/world.py``): every rank's entry read in one store request, a rank that
comes just after the deadline is no failure, and the processes of ranks on this host are watched
without a descriptor each (``transports/liveness.py``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tensorcomm.core import world
from tensorcomm.errors import CommTimeoutError, RendezvousError
from tensorcomm.rendezvous.store import HashStore
from tensorcomm.transports.liveness import ProcessWatch, start_time


class LastRankAtTheDeadline(HashStore):
    """A store on which the last rank joins just as a wait for it times out (as happened with
    64 ranks on a busy host: the wait ended, then the recount found everyone there)."""

    def __init__(self, late_key: str) -> None:
        super().__init__()
        self.late_key = late_key
        self.requests = 0

    def _wait_for(self, keys: list[str], timeout: float, op: str) -> list[bytes]:
        self.requests += 1
        try:
            return super()._wait_for(keys, timeout, op)
        except CommTimeoutError:
            if not self.check([self.late_key]):
                self.set(self.late_key, b"late")
            raise


def test_a_rank_that_joins_just_after_the_deadline_is_no_failure() -> None:
    store = LastRankAtTheDeadline("join/2")
    store.set("join/0", b"zero")
    store.set("join/1", b"one")
    assert world._await_everyone(store, 0, 3, 0.05) == [b"zero", b"one", b"late"]


def test_a_rank_that_never_joins_is_named_with_those_that_did() -> None:
    store = HashStore()
    store.set("join/0", b"zero")
    store.set("join/2", b"two")
    with pytest.raises(RendezvousError, match=r"ranks \[1\] of 3 did not join within 0.05 s "
                                              r"\(arrived: \[0, 2\]\)"):
        world._await_everyone(store, 0, 3, 0.05)


def test_every_entry_comes_in_one_request() -> None:
    store = LastRankAtTheDeadline("unused")
    for rank in range(64):
        store.set(f"join/{rank}", str(rank).encode())
    assert world._await_everyone(store, 5, 64, 1.0) == [str(r).encode() for r in range(64)]
    assert store.requests == 1


def test_a_join_entry_round_trips_and_says_who_are_partners() -> None:
    me = world._Joined(True, "boot/4026531836", 10, 99, "10.0.0.1:4000", "host a\nb")
    assert world._Joined.decode(me.encode()) == me
    assert me.partners(me._replace(pid=11))
    assert not me.partners(me._replace(host="other"))
    assert not me.partners(me._replace(shm=False))
    assert not me.partners(me._replace(space="boot/1"))  # another pid namespace or machine
    assert not me._replace(space="").partners(me._replace(space=""))  # unknown: never


def test_a_process_watch_sees_an_exit_and_a_recycled_pid() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    started = start_time(child.pid)
    assert started is not None and start_time(os.getpid()) is not None
    watch = ProcessWatch({1: child.pid, 2: os.getpid()})
    recycled = ProcessWatch({3: os.getpid()}, started={3: 1})  # this pid once named another process
    assert watch.dead() == [] and recycled.dead() == [3]
    child.communicate(b"")  # it exits (and is reaped)
    assert watch.dead() == [1] and watch.dead([2]) == []


def test_a_zombie_counts_as_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    watch = ProcessWatch({1: child.pid})
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    assert watch.dead() == [1]
    child.wait()
