"""TCP links made when first needed (``mesh.Mesh`` + ``links.Links.open``): either end may dial,
both may at once, the messages of each sender stay in order (up to its goodbye, which may come
first on the other link), and a peer that is gone is named instead of waited for."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from tensorcomm.errors import PeerLostError
from tensorcomm.transports.tcp import mesh as mesh_module
from tensorcomm.transports.tcp.mesh import Mesh
from tensorcomm.transports.tcp.sealing import HEADERS, Sealer
from tensorcomm.transports.tcp.transport import TcpTransport

from helpers import SECRET, close_at_once

TAG = 7


@pytest.fixture
def unlinked() -> Iterator[list[TcpTransport]]:
    """Three ranks' transports with no link made at set-up."""
    meshes = [Mesh(rank, 3, SECRET, "127.0.0.1", b"lazy test") for rank in range(3)]
    addresses = [mesh.address for mesh in meshes]
    links = [mesh.connect(addresses, [], 5.0) for mesh in meshes]
    assert links == [{}, {}, {}]
    transports = [TcpTransport(rank, 3, {}, send_timeout=10.0, mesh=mesh) for rank, mesh in enumerate(meshes)]
    yield transports
    close_at_once(transports, linger=2.0)


def _exchange(transport: TcpTransport, peer: int, count: int) -> list[float]:
    """Send ``count`` numbered messages to ``peer`` while receiving as many from it."""
    got = [np.zeros(4) for _ in range(count)]
    recvs = [transport.irecv(peer, memoryview(buf).cast("B"), TAG) for buf in got]
    sends = [transport.isend(peer, memoryview(np.full(4, float(i))).cast("B"), TAG) for i in range(count)]
    for request in sends + recvs:
        request.wait(10.0)
    return [float(buf[0]) for buf in got]


def test_the_first_send_dials_and_the_other_end_answers_on_that_link(unlinked) -> None:
    zero, one, _ = unlinked
    data = np.arange(6, dtype=np.float64)
    out = np.zeros(6)
    sent = zero.isend(1, memoryview(data).cast("B"), TAG)
    one.irecv(0, memoryview(out).cast("B"), TAG).wait(10.0)
    sent.wait(10.0)
    assert out.tolist() == data.tolist()
    back = np.zeros(6)
    received = zero.irecv(1, memoryview(back).cast("B"), TAG)
    one.isend(0, memoryview(out * 2).cast("B"), TAG).wait(10.0)
    received.wait(10.0)
    assert back.tolist() == (data * 2).tolist()
    assert 0 not in unlinked[2]._links and 2 not in zero._links  # nobody dialled rank 2


def test_both_ends_dialling_at_once_keep_each_senders_order(unlinked) -> None:
    zero, one, _ = unlinked
    results: dict[int, list[float]] = {}
    threads = [threading.Thread(target=lambda t=t, p=p: results.update({t.rank: _exchange(t, p, 50)}))
               for t, p in ((zero, 1), (one, 0))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == {0: [float(i) for i in range(50)], 1: [float(i) for i in range(50)]}


def test_a_peer_that_is_gone_is_named_at_the_first_receive(unlinked) -> None:
    zero, _, two = unlinked
    two.close(linger=0.1)  # stops listening too: as a dead process would
    request = zero.irecv(2, memoryview(np.zeros(2)).cast("B"), TAG)
    with pytest.raises(PeerLostError) as info:
        request.wait(10.0)
    assert info.value.rank == 2
    with pytest.raises(PeerLostError, match="rank 2"):  # and at once from then on
        zero.isend(2, memoryview(np.zeros(2)).cast("B"), TAG).wait(1.0)


def _two_links() -> tuple[TcpTransport, TcpTransport]:
    """Ranks 0 and 1 joined by two links, as when both dialled at once: rank 0 sends on the
    first, rank 1 on the second."""
    first, second = socket.socketpair(), socket.socketpair()

    def sealer(me: int) -> Sealer:
        keys = (b"0" * 32, b"1" * 32)
        return Sealer(1 - me, HEADERS, keys[me], keys[1 - me])

    zero = TcpTransport(0, 2, {1: (first[0], sealer(0))}, send_timeout=10.0)
    one = TcpTransport(1, 2, {0: (second[1], sealer(1))}, send_timeout=10.0)
    zero.links.adopt(1, second[0], sealer(0))
    one.links.adopt(0, first[1], sealer(1))
    return zero, one


@pytest.mark.parametrize("posted", ["before", "after the first goodbye"])
def test_messages_sent_before_leaving_arrive_though_a_goodbye_comes_first_on_the_other_link(posted) -> None:
    # Rank 1 sends a large message, then a small one, then leaves: its goodbye on the link it
    # did not send on is read long before the small message, queued behind the large one.
    zero, one = _two_links()
    large, small = np.ones(1 << 20), np.full(4, 7.0)
    got_large, got_small = np.zeros_like(large), np.zeros_like(small)
    receiving = zero.irecv(1, memoryview(got_small).cast("B"), TAG + 1) if posted == "before" else None
    one.isend(0, memoryview(large).cast("B"), TAG)
    one.isend(0, memoryview(small).cast("B"), TAG + 1)
    leaving = threading.Thread(target=one.close, args=(10.0,))
    leaving.start()
    try:
        if receiving is None:
            deadline = time.monotonic() + 10.0
            while not zero._links[1].closed and time.monotonic() < deadline:  # its goodbye is read
                time.sleep(0.001)
            receiving = zero.irecv(1, memoryview(got_small).cast("B"), TAG + 1)
        zero.irecv(1, memoryview(got_large).cast("B"), TAG).wait(10.0)
        receiving.wait(10.0)
        assert (got_large == 1).all() and got_small.tolist() == small.tolist()
        with pytest.raises(PeerLostError, match="left the job") as info:  # nothing more comes
            zero.irecv(1, memoryview(got_small).cast("B"), TAG).wait(10.0)
        assert info.value.rank == 1 and info.value.left
    finally:
        leaving.join(15.0)
        zero.close(linger=0.1)


def test_a_link_its_peer_closed_unused_is_dropped_while_another_stays() -> None:
    # Rank 1 refused a link rank 0 dialled (it was leaving) and closed it before sending a frame
    # on it; the link it sends on stays. Rank 0 loses only that link, and sends on the other.
    spare, first = socket.socketpair(), socket.socketpair()
    keys = (b"0" * 32, b"1" * 32)
    zero = TcpTransport(0, 2, {1: (spare[0], Sealer(1, HEADERS, *keys))}, send_timeout=10.0)
    one = TcpTransport(1, 2, {0: (first[1], Sealer(0, HEADERS, *keys[::-1]))}, send_timeout=10.0)
    zero.links.adopt(1, first[0], Sealer(1, HEADERS, *keys))
    got, back = np.zeros(4), np.zeros(4)
    receiving = zero.irecv(1, memoryview(got).cast("B"), TAG)
    spare[1].close()
    deadline = time.monotonic() + 10.0
    while not zero.links._every[0].closed and time.monotonic() < deadline:  # its end was read
        time.sleep(0.001)
    try:
        answer = one.irecv(0, memoryview(back).cast("B"), TAG)
        zero.isend(1, memoryview(np.full(4, 3.0)).cast("B"), TAG).wait(10.0)
        answer.wait(10.0)
        one.isend(0, memoryview(np.full(4, 7.0)).cast("B"), TAG).wait(10.0)
        one.close(linger=10.0)
        receiving.wait(10.0)
        assert got.tolist() == [7.0] * 4 and back.tolist() == [3.0] * 4
        with pytest.raises(PeerLostError, match="left the job"):
            zero.irecv(1, memoryview(got).cast("B"), TAG).wait(10.0)
    finally:
        one.close(linger=0.1)
        zero.close(linger=0.1)


def test_a_rank_that_leaves_while_checking_a_dial_says_goodbye_on_it(unlinked, monkeypatch) -> None:
    # Rank 0's dial passes its side of the handshake; rank 1 begins to close before its side
    # is done. Rank 1 takes the link all the same and says goodbye on it: rank 0 learns that it
    # left, not that a link broke.
    zero, one, _ = unlinked
    checking, leaving = threading.Event(), threading.Event()
    handshake = mesh_module.auth.handshake_server

    def slow_handshake(*args, **kwargs):
        checking.set()
        leaving.wait(10.0)
        deadline = time.monotonic() + 10.0
        while not one.links._mesh._closed and time.monotonic() < deadline:  # rank 1 stopped listening
            time.sleep(0.001)
        return handshake(*args, **kwargs)

    monkeypatch.setattr(mesh_module.auth, "handshake_server", slow_handshake)
    dial = threading.Thread(target=zero.links.open, args=(1,))
    dial.start()
    assert checking.wait(10.0)
    closing = threading.Thread(target=one.close, args=(5.0,))
    closing.start()
    leaving.set()
    dial.join(10.0)
    closing.join(10.0)
    with pytest.raises(PeerLostError) as info:
        zero.irecv(1, memoryview(np.zeros(2)).cast("B"), TAG).wait(10.0)
    assert info.value.left, info.value


def test_a_message_sent_by_a_peer_that_left_while_its_dial_was_checked_arrives(unlinked, monkeypatch) -> None:
    # Rank 1 dials rank 0, sends and leaves while rank 0 is still taking that link in (its check
    # of the dial is held after the handshake); rank 0's own dial is then refused. Rank 0 lets
    # the check end and receives the message on rank 1's link instead of taking rank 1 for lost.
    zero, one, _ = unlinked
    held, go = threading.Event(), threading.Event()
    for_session = mesh_module.Sealer.for_session

    def held_for_session(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():  # a dial's server side
            held.set()
            go.wait(10.0)
        return for_session(*args, **kwargs)

    monkeypatch.setattr(mesh_module.Sealer, "for_session", held_for_session)
    payload = np.arange(4.0)
    one.isend(0, memoryview(payload).cast("B"), TAG).wait(10.0)
    assert held.wait(10.0)
    one.close(2.0)
    threading.Timer(0.3, go.set).start()  # rank 0's dial below is refused before the check ends
    got = np.zeros(4)
    zero.irecv(1, memoryview(got).cast("B"), TAG).wait(10.0)
    assert (got == payload).all()
