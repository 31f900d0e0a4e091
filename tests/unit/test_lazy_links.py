"""TCP links made when first needed (``mesh.Mesh`` + ``TcpTransport._open``): either end may dial,
both may at once, the messages of each sender stay in order, and a peer that is gone is named
instead of waited for."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest

from tensorcomm.errors import PeerLostError
from tensorcomm.transports.tcp.mesh import Mesh
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
