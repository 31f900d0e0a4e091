"""The shared-memory transport in one process: segments, fd passing, counters, waits and faults.

Ranks are threads here, each with its own ``ShmDomain`` (its own mapping of the segment, received
over the authenticated Unix socket as in real jobs), set up by ``helpers.open_domains``.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import numpy as np
import pytest

from tensorcomm.errors import (
    AuthenticationError,
    CollectiveMismatchError,
    CommTimeoutError,
    GroupAbortedError,
    PeerLostError,
)
from tensorcomm.rendezvous import auth
from tensorcomm.rendezvous.store import HashStore
from tensorcomm.signature import signature
from tensorcomm.transports.shm import arena, domain, slots
from tensorcomm.transports.shm.domain import ShmDomain, ShmUnavailable, open_domain
from tensorcomm.types import ReduceOp

from helpers import SECRET, close_all, ctx_for, describe, fast_thread_switches, open_domains, run_each_rank

pytestmark = pytest.mark.skipif(not slots.SUPPORTED, reason="shared memory needs x86-64")


@pytest.fixture(autouse=True)
def _fast_thread_switches():
    with fast_thread_switches():
        yield


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _dev_shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _ours() -> list[str]:
    """Descriptors a domain may hold (other tests' threads may open and close sockets meanwhile)."""
    return sorted(link for link in map(_link, _fds()) if "memfd:tensorcomm" in link or "pidfd" in link)


def test_segments_have_no_name_and_close_releases_every_descriptor():
    import gc

    gc.collect()  # domains other tests dropped without closing are freed by the collector
    before, names = _ours(), _dev_shm()
    domains = open_domains(3)
    assert _dev_shm() == names  # nothing named in /dev/shm, ever
    assert "memfd:tensorcomm-shm" in _maps()
    # What is open: per mapping, the duplicate descriptor CPython's mmap keeps; nothing per peer
    # (liveness reads /proc: a pidfd each made a member's descriptors grow with the group).
    opened = _ours()
    memfd = "/memfd:tensorcomm-shm (deleted)"
    assert opened.count(memfd) == 3 + before.count(memfd)
    assert len(opened) == 3 + len(before), opened
    close_all(domains)
    del domains
    gc.collect()
    assert _ours() == before
    assert "memfd:tensorcomm-shm" not in _maps()


def _maps() -> str:
    with open("/proc/self/maps") as maps:
        return maps.read()


def _link(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def test_one_member_needs_no_socket():
    (d,) = open_domains(1)
    assert d.size == 1 and d.peers == ()
    ctx = ctx_for(d, 0)
    d.start(ctx)
    d.close()


def test_a_stranger_without_the_secret_gets_no_segment():
    store = HashStore(timeout=30)
    result: list[Any] = []

    def stranger() -> None:
        address = store.get("shm/address", timeout=20).decode()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect("\0" + address)
            try:
                auth.handshake_client(sock, b"wrong secret", 5, arena.PURPOSE, address=address, rank=1,
                                      target=0)
            except AuthenticationError as exc:
                result.append(exc)

    thread = threading.Thread(target=stranger, daemon=True)
    thread.start()
    # Rank 1 joins only after the stranger was refused.
    store_view = store

    def setup(rank: int) -> ShmDomain:
        if rank == 1:
            thread.join(20)
        return open_domain(
            rank, [0, 1], "test", SECRET,
            publish=lambda a: store_view.set("shm/address", a.encode()),
            lookup=lambda s: (store_view.get("shm/address").decode() if store_view.check(["shm/address"])
                              else None),
            failed=lambda: None, timeout=20, describe=describe)

    domains = run_each_rank(2, setup)
    assert result and isinstance(result[0], AuthenticationError)
    close_all(domains)


def test_setup_stops_when_a_member_gives_up():
    store = HashStore(timeout=30)
    started = time.monotonic()
    with pytest.raises(ShmUnavailable, match="rank 1 cannot"):
        open_domain(0, [0, 1], "test", SECRET, publish=lambda a: None, lookup=lambda s: None,
                    failed=lambda: "rank 1 cannot reach the leader", timeout=20, describe=describe)
    assert time.monotonic() - started < 5
    del store


def test_other_cpus_fall_back(monkeypatch):
    monkeypatch.setattr(slots, "SUPPORTED", False)
    with pytest.raises(ShmUnavailable, match="x86-64"):
        open_domain(0, [0], "test", SECRET, lambda a: None, lambda s: None, lambda: None, 5, describe)


def test_posts_and_waits_keep_ranks_in_step():
    domains = open_domains(3)

    def body(rank: int) -> list[int]:
        d = domains[rank]
        seen = []
        for seq in range(50):
            ctx = ctx_for(d, seq)
            d.start(ctx)
            d.post()
            d.wait(d.peers, d.posts, ctx)
            seen.append(min(d.slots.counter(q) for q in range(3)))
        return seen

    results = run_each_rank(3, body)
    assert all(r[-1] >= 99 for r in results)
    close_all(domains)


def test_a_mismatched_call_is_reported_on_every_rank_with_both_signatures():
    domains = open_domains(2)
    mine = signature("all_reduce", np.dtype(np.float32), 4, ReduceOp.SUM)
    theirs = signature("all_gather", np.dtype(np.float32), 8)

    def body(rank: int) -> str:
        d = domains[rank]
        ctx = ctx_for(d, 17, mine if rank == 0 else theirs)
        with pytest.raises(CollectiveMismatchError) as info:
            d.start(ctx)
        return str(info.value)

    messages = run_each_rank(2, body)
    for message in messages:
        assert "all_reduce(float32[4], op=sum)" in message and "all_gather(float32[8])" in message
        assert "step 17" in message and "'test'" in message
    assert messages[0].startswith("rank 1 called all_gather(float32[8]) while rank 0 called all_reduce")
    close_all(domains)


def test_a_wait_times_out_naming_the_ranks_that_did_not_arrive():
    domains = open_domains(3)
    d = domains[0]
    ctx = ctx_for(d, 0, timeout=0.3)
    started = time.monotonic()
    with pytest.raises(CommTimeoutError, match=r"test call \(step 0\) timed out after 0.3 s on rank 0: "
                                               r"ranks 1, 2 did not arrive"):
        d.start(ctx)
    assert time.monotonic() - started < 5
    close_all(domains)


def test_abort_from_another_thread_ends_a_sleeping_wait_and_tells_the_peers():
    domains = open_domains(3)
    d = domains[0]
    ctx = ctx_for(d, 0)
    timer = threading.Timer(0.2, lambda: d.abort(GroupAbortedError("stop now")))  # after futex sleep set in
    timer.start()
    with pytest.raises(GroupAbortedError, match="stop now"):
        d.start(ctx)
    # A peer that arrives later fails at once, naming who aborted.
    peer = domains[1]
    ctx1 = ctx_for(peer, 0)
    with pytest.raises(GroupAbortedError, match="rank 0 aborted group 'test'"):
        peer.start(ctx1)
    close_all(domains)


def test_a_failure_reaches_waiting_peers_as_the_same_kind_of_error():
    domains = open_domains(2)

    def body(rank: int) -> None:
        d = domains[rank]
        ctx = ctx_for(d, 0)
        if rank == 0:
            time.sleep(0.1)
            d.fail(PeerLostError(5, "gone"), ctx)
            return
        with pytest.raises(PeerLostError) as info:
            d.start(ctx)
        assert info.value.rank == 5

    run_each_rank(2, body)
    # Later calls are refused on both ranks.
    for d in domains:
        with pytest.raises(PeerLostError):
            d.start(ctx_for(d, 1))
    close_all(domains)


def test_a_peer_that_left_is_lost():
    domains = open_domains(2)
    d = domains[0]
    ctx = ctx_for(d, 0)
    threading.Timer(0.05, domains[1].close).start()
    with pytest.raises(PeerLostError, match="peer rank 1 was lost: it left the group"):
        d.start(ctx)
    d.close()


def test_header_mismatch_is_refused():
    store = HashStore(timeout=30)

    def setup(rank: int) -> ShmDomain:
        return open_domain(
            rank, [0, 1], "test", SECRET,
            publish=lambda a: store.set("shm/address", a.encode()),
            lookup=lambda s: store.get("shm/address").decode() if store.check(["shm/address"]) else None,
            failed=lambda: None, timeout=20, describe=describe,
            slot_bytes=4096 if rank == 0 else 8192)

    with pytest.raises(ShmUnavailable):
        run_each_rank(2, setup)


def test_stacked_views_show_every_members_slot_as_one_row_each():
    domains = open_domains(3, slot_bytes=4096, out_bytes=8192)
    d = domains[0]
    for q, peer in enumerate(domains):
        peer.inbox[q][1][64:64 + 40] = np.full(10, q + 0.5, np.float32).view(np.uint8)
        peer.outbox[q][:8] = np.array([q], np.int64).view(np.uint8)
    stacked = d.stacked(1, np.dtype(np.float32), 10, offset=64)
    assert stacked.shape == (3, 10) and stacked.dtype == np.float32
    np.testing.assert_array_equal(stacked[:, 0], [0.5, 1.5, 2.5])
    np.testing.assert_array_equal(d.stacked_out(np.dtype(np.int64), 1)[:, 0], [0, 1, 2])
    with pytest.raises(ValueError, match="do not fit one IN slot"):
        d.stacked(0, np.dtype(np.float32), 1025)
    with pytest.raises(ValueError, match="do not fit one OUT region"):
        d.stacked_out(np.dtype(np.float32), 2047, offset=8)
    close_all(domains)


def test_out_regions_share_a_bounded_total_past_eight_members():
    assert all(domain.out_bytes_for(n) == domain.OUT_BYTES for n in range(1, 9))
    for n in (9, 16, 64, 128, 1000):
        assert domain.out_bytes_for(n) * n <= domain.OUT_TOTAL_BYTES
        assert domain.out_bytes_for(n) % 4096 == 0
    assert domain.segment_bytes(128, domain.SLOT_BYTES, domain.out_bytes_for(128)) <= 1 << 30
