"""The TCP transport on socket pairs and a threads-as-ranks mesh: matching, signatures, aborts,
hostile bytes on a link and strangers at the door."""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time

import numpy as np
import pytest

from tensorcomm import config
from tensorcomm.errors import (
    CollectiveMismatchError,
    CommTimeoutError,
    GroupAbortedError,
    LinkAuthenticationError,
    PeerLostError,
)
from tensorcomm.rendezvous import gate
from tensorcomm.rendezvous.auth import recv_exact
from tensorcomm.rendezvous.store import HashStore
from tensorcomm.signature import signature
from tensorcomm.transports.base import ANY_SOURCE, collective_tag, encode_abort
from tensorcomm.transports.tcp import framing, sealing
from tensorcomm.transports.tcp import mesh as mesh_module
from tensorcomm.transports.tcp.sealing import Sealer
from tensorcomm.transports.tcp.transport import TcpTransport

from helpers import close_at_once, mesh_thread

KEY_0, KEY_1 = b"0" * 32, b"1" * 32  # what ranks 0 and 1 send with on a test link


def sealers(level: int = sealing.HEADERS) -> tuple[Sealer, Sealer]:
    """Rank 0's sealer for its link to rank 1, and rank 1's for its link to rank 0."""
    return Sealer(1, level, KEY_0, KEY_1), Sealer(0, level, KEY_1, KEY_0)


class RawPeer:
    """Plays a rank on a raw socket, sealing and opening frames as the rank's transport would."""

    def __init__(self, sock: socket.socket, sealer: Sealer) -> None:
        self.sock, self.sealer = sock, sealer

    def frame(self, tag: int, payload: bytes, sig=None, kind=framing.KIND_DATA) -> bytes:
        header = framing.pack_header(kind, tag, len(payload), sig)
        return b"".join(self.sealer.seal(header, memoryview(payload), kind == framing.KIND_DATA))

    def read_header(self):
        return self.sealer.open_header(recv_exact(self.sock, sealing.HEADER_BYTES, 5))[:4]

    def __getattr__(self, name: str):  # sendall, recv, shutdown, settimeout: the socket's
        return getattr(self.sock, name)


@pytest.fixture
def pair():
    """Rank 0's transport, and the raw socket that plays rank 1."""
    mine, theirs = socket.socketpair()
    ours, peers = sealers()
    transport = TcpTransport(0, 2, {1: (mine, ours)})
    yield transport, RawPeer(theirs, peers)
    theirs.close()
    transport.close(linger=0.1)


def test_posted_and_unexpected_messages_match_in_order(pair):
    transport, peer = pair
    tag = collective_tag(0, 5, 1)
    peer.sendall(peer.frame(tag, b"first---") + peer.frame(tag, b"second--"))
    a, b = bytearray(8), bytearray(8)
    transport.irecv(1, memoryview(a), tag).wait(5)
    transport.irecv(ANY_SOURCE, memoryview(b), tag).wait(5)
    assert (bytes(a), bytes(b)) == (b"first---", b"second--")


def test_signature_mismatch_names_both_calls(pair):
    transport, peer = pair
    tag = collective_tag(0, 1, 0)
    mine = signature("all_reduce", np.dtype(np.float32), 2)
    theirs = signature("all_gather", np.dtype(np.float32), 2)
    request = transport.irecv(1, memoryview(bytearray(8)), tag, mine)
    peer.sendall(peer.frame(tag, bytes(8), theirs))
    with pytest.raises(CollectiveMismatchError, match=r"rank 1 called all_gather\(float32\[2\]\) "
                                                      r"while rank 0 called all_reduce"):
        request.wait(5)
    # the group is aborted for later calls too, and the peer was told (an ABORT frame)
    with pytest.raises(CollectiveMismatchError):
        transport.irecv(1, memoryview(bytearray(8)), collective_tag(0, 2, 0), mine).wait(5)
    header = peer.read_header()
    assert header is not None and header[0] == framing.KIND_ABORT and header[1] == 0


def test_size_mismatch_is_an_error_not_an_overflow(pair):
    transport, peer = pair
    tag = collective_tag(0, 1, 0)
    out = bytearray(4)
    request = transport.irecv(1, memoryview(out), tag)
    peer.sendall(peer.frame(tag, b"12345678"))
    with pytest.raises(CollectiveMismatchError, match="8-byte message where a 4-byte"):
        request.wait(5)
    assert out == bytearray(4)


@pytest.mark.parametrize("first", ["message", "receive"])
def test_exchange_receives_and_sends_in_one_request(pair, first):
    """``exchange``: a message that came before its receive (copied in) or after it (read
    straight into it) fills it; the send goes out sealed; one request waits for both."""
    transport, peer = pair
    tag = collective_tag(0, 3, 0)
    mine = signature("all_to_all", np.dtype(np.float32), 2)
    out = bytearray(8)
    if first == "message":
        peer.sendall(peer.frame(tag, b"theirs!!", mine))
        assert transport.role.run_until(lambda: bool(transport.match.unexpected), 5)  # queued whole
    request = transport.exchange([(1, memoryview(out))], [(1, memoryview(b"ours!!!!"))], tag, mine)
    if first == "receive":
        assert not request.done()
        peer.sendall(peer.frame(tag, b"theirs!!", mine))
    assert request.wait(5) == ANY_SOURCE and request.done()
    assert out == b"theirs!!"
    kind, got_tag, nbytes, sig = peer.read_header()
    assert (kind, got_tag, nbytes, sig, peer.recv(8)) == (framing.KIND_DATA, tag, 8, mine, b"ours!!!!")


@pytest.mark.parametrize("first", ["message", "receive"])
def test_exchange_fails_on_a_message_that_does_not_fit(pair, first):
    transport, peer = pair
    tag = collective_tag(0, 4, 0)
    if first == "message":
        peer.sendall(peer.frame(tag, b"12345678"))
        assert transport.role.run_until(lambda: bool(transport.match.unexpected), 5)
    request = transport.exchange([(1, memoryview(bytearray(4)))], [], tag)
    if first == "receive":
        peer.sendall(peer.frame(tag, b"12345678"))
    with pytest.raises(CollectiveMismatchError, match="8-byte message where a 4-byte"):
        request.wait(5)


def test_exchange_names_a_peer_that_leaves(pair):
    transport, peer = pair
    request = transport.exchange([(1, memoryview(bytearray(4)))], [(1, memoryview(b"data"))], 11)
    peer.shutdown(socket.SHUT_RDWR)
    with pytest.raises(PeerLostError, match="rank 1"):
        request.wait(5)
    with pytest.raises(PeerLostError, match="rank 1"):  # and later exchanges are refused at once
        transport.exchange([(1, memoryview(bytearray(4)))], [], 12).wait(5)


def test_exchange_times_out_naming_the_silent_peer(pair):
    transport, _ = pair
    with pytest.raises(CommTimeoutError, match="no message from rank 1"):
        transport.exchange([(1, memoryview(bytearray(4)))], [], 13).wait(0.05)


def test_abort_frame_fails_only_that_group(pair):
    transport, peer = pair
    doomed = transport.irecv(1, memoryview(bytearray(1)), collective_tag(3, 0, 0))
    fine = transport.irecv(1, memoryview(bytearray(1)), collective_tag(4, 0, 0))
    record = encode_abort(CollectiveMismatchError("rank 1 saw a mismatch"), framing.MAX_ABORT_BYTES)
    peer.sendall(peer.frame(3, record, kind=framing.KIND_ABORT))
    with pytest.raises(CollectiveMismatchError, match=r"saw a mismatch \(reported by rank 1\)"):
        doomed.wait(5)
    peer.sendall(peer.frame(collective_tag(4, 0, 0), b"x"))
    fine.wait(5)


def _sealed(header: bytes):
    return lambda peer: b"".join(peer.sealer.seal(header, memoryview(b""), True))


@pytest.mark.parametrize("garbage", [
    _sealed(b"\x00" * framing.HEADER.size),  # wrong magic
    _sealed(struct.pack("<IIQQ5q", framing.MAGIC, 99, 0, 0, 0, 0, 0, 0, -1)),  # unknown kind
    _sealed(struct.pack("<IIQQ5q", framing.MAGIC, framing.KIND_DATA, 0, 1 << 60, 0, 0, 0, 0, -1)),
    lambda peer: peer.frame(collective_tag(0, 0, 0), b"12345678")[:-3],  # truncated, then EOF
], ids=["magic", "kind", "huge-length", "truncated"])
def test_hostile_bytes_close_the_link_with_a_clear_error(pair, garbage):
    # Even from a peer that holds the link's keys (a rank gone wrong).
    transport, peer = pair
    request = transport.irecv(1, memoryview(bytearray(8)), collective_tag(0, 0, 0))
    peer.sendall(garbage(peer))
    peer.shutdown(socket.SHUT_WR)
    with pytest.raises(PeerLostError, match="peer rank 1 was lost"):
        request.wait(5)
    with pytest.raises(PeerLostError):
        transport.isend(1, memoryview(b"x"), 0).wait(1)


def test_a_frame_without_the_links_key_fails_it_naming_the_peer(pair):
    transport, peer = pair
    request = transport.irecv(1, memoryview(bytearray(8)), collective_tag(0, 0, 0))
    forged = framing.pack_header(framing.KIND_DATA, collective_tag(0, 0, 0), 8) + bytes(32) + b"12345678"
    peer.sendall(forged)  # well formed, but not sealed with the link's key
    with pytest.raises(LinkAuthenticationError, match="link to rank 1 failed authentication"):
        request.wait(5)


def test_goodbye_is_not_a_crash(pair):
    transport, peer = pair
    peer.sendall(peer.frame(0, b"", kind=framing.KIND_BYE))
    with pytest.raises(PeerLostError, match="left the job"):
        transport.irecv(1, memoryview(bytearray(1)), 7).wait(5)


def test_abort_fails_pending_requests(pair):
    transport, _ = pair
    request = transport.irecv(1, memoryview(bytearray(1)), 9)
    transport.abort(GroupAbortedError("stop"))
    with pytest.raises(GroupAbortedError, match="stop"):
        request.wait(5)


@pytest.mark.parametrize("intrusion", [b"GET / HTTP/1.1\r\n\r\n", b"\xff" * 4096])
def test_stranger_cannot_join_the_mesh(intrusion, caplog):
    store = HashStore()
    caplog.set_level(logging.WARNING, logger="tensorcomm.tcp")
    results: dict = {}
    threads = [mesh_thread(0, 3, store, results)]
    host, port = store.get("tcp/addr/0", timeout=10).decode().rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as stranger:
        stranger.sendall(intrusion)  # queued ahead of the real ranks, so rank 0 meets it first
        threads += [mesh_thread(r, 3, store, results) for r in (1, 2)]
        for thread in threads:
            thread.join(30)
    assert all(isinstance(m, dict) and len(m) == 2 for m in results.values()), results
    assert "refused a data connection" in caplog.text
    for mesh in results.values():
        for sock, _ in mesh.values():
            sock.close()


def _await_handshake_threads(strangers: list[socket.socket], timeout: float) -> None:
    """Wait until a listener's gate runs a handshake thread for each of ``strangers``."""
    names = {f"tensorcomm-handshake-{host}:{port}" for host, port in (s.getsockname() for s in strangers)}
    deadline = time.monotonic() + timeout
    while not names <= {thread.name for thread in threading.enumerate()}:
        assert time.monotonic() < deadline, f"the listener took no handshake of {sorted(names)}"
        time.sleep(0.01)


def test_ranks_retry_while_strangers_fill_the_listener(monkeypatch, caplog):
    # Two strangers that spoke and stalled take both pending-handshake slots of rank 0: each
    # real rank cuts off the oldest handshake and gets in without waiting for their deadline.
    # That deadline is past the ranks' own 10 s, so only the cut-off lets them in.
    monkeypatch.setattr(config, "MAX_PENDING_HANDSHAKES", 2)
    monkeypatch.setattr(mesh_module, "HANDSHAKE_TIMEOUT", 60.0)
    caplog.set_level(logging.WARNING, logger="tensorcomm.tcp")
    store = HashStore()
    results: dict = {}
    threads = [mesh_thread(0, 3, store, results)]
    host, port = store.get("tcp/addr/0", timeout=10).decode().rsplit(":", 1)
    strangers = [socket.create_connection((host, int(port)), timeout=5) for _ in range(2)]
    for sock in strangers:
        sock.sendall(b"T")  # one byte of a handshake, then nothing
    try:
        _await_handshake_threads(strangers, timeout=10)  # rank 0 holds both, however loaded
        time.sleep(gate.GRACE + 0.05)  # they age past the grace, so a newcomer may cut one off
        threads += [mesh_thread(r, 3, store, results) for r in (1, 2)]
        for thread in threads:
            thread.join(30)
    finally:
        for sock in strangers:
            sock.close()
    assert all(isinstance(m, dict) and len(m) == 2 for m in results.values()), results
    assert "2 handshakes were pending" in caplog.text
    for mesh in results.values():
        for sock, _ in mesh.values():
            sock.close()


@pytest.mark.slow  # waits out the 3 s connect timeout
def test_wrong_secret_is_refused():
    store = HashStore()
    good, bad = b"right-secret", b"wrong-secret"
    results: dict = {}

    threads = [mesh_thread(0, 2, store, results, good, timeout=3),
               mesh_thread(1, 2, store, results, bad, timeout=3)]
    for thread in threads:
        thread.join(30)
    assert not isinstance(results[1], dict), "a rank with the wrong secret joined"
    assert not isinstance(results[0], dict) or 1 not in results[0]


def test_progress_probe_is_answered_by_the_reader_thread(pair):
    transport, peer = pair
    # the raw peer plays a rank that has reached call 41 of group 2, a barrier
    answered = threading.Thread(target=lambda: (
        peer.read_header(),
        peer.sendall(peer.frame(2, framing.PROBE_REPLY.pack(41), signature("barrier"),
                            kind=framing.KIND_PROBE_REPLY))))
    answered.start()
    assert transport.progress(2, [1], timeout=5) == {1: (41, signature("barrier"))}
    answered.join(5)
    # a peer that says nothing is reported as None after the wait
    assert transport.progress(3, [1], timeout=0.2) == {1: None}
    assert peer.read_header()[:2] == (framing.KIND_PROBE, 3)
    # and this rank answers probes about its own calls
    transport.isend(1, memoryview(b"x"), collective_tag(4, 7, 0), signature("barrier"))
    peer.read_header(), peer.recv(1)
    peer.sendall(peer.frame(4, b"", kind=framing.KIND_PROBE))
    kind, tag, nbytes, theirs = peer.read_header()
    assert (kind, tag, theirs) == (framing.KIND_PROBE_REPLY, 4, signature("barrier"))
    assert framing.PROBE_REPLY.unpack(peer.recv(nbytes)) == (7,)


def test_receive_posted_while_a_message_arrives_gets_all_of_it(pair):
    # The peer starts a large message before the receive exists: it goes to the unexpected queue,
    # then switches to the posted buffer; the bytes must come out whole and in order.
    transport, peer = pair
    tag = collective_tag(0, 1, 0)
    payload = np.arange(3 << 20, dtype=np.uint8).tobytes()  # larger than the socket buffers
    sender = threading.Thread(target=peer.sendall, args=(peer.frame(tag, payload),))
    sender.start()
    time.sleep(0.2)  # part of it is in the unexpected buffer by now
    out = bytearray(len(payload))
    transport.irecv(1, memoryview(out), tag).wait(10)
    sender.join(10)
    assert out == payload


def _transport_pair(send_timeout: float = 30.0, level: int = sealing.HEADERS,
                    a: socket.socket | None = None,
                    b: socket.socket | None = None) -> tuple[TcpTransport, TcpTransport]:
    if a is None or b is None:
        a, b = socket.socketpair()
    ours, theirs = sealers(level)
    return (TcpTransport(0, 2, {1: (a, ours)}, send_timeout=send_timeout),
            TcpTransport(1, 2, {0: (b, theirs)}, send_timeout=send_timeout))


def test_large_sends_both_ways_at_once_do_not_deadlock():
    # Each side sends before it receives, far more than the sockets buffer: whoever waits must
    # read while it writes.
    ends = _transport_pair()
    data = [np.full(8 << 20, rank + 1, np.uint8) for rank in range(2)]
    got = [np.zeros(8 << 20, np.uint8) for _ in range(2)]

    def rank(r: int) -> None:
        tag = collective_tag(0, 1, 0)
        sending = ends[r].isend(1 - r, memoryview(data[r]), tag)
        receiving = ends[r].irecv(1 - r, memoryview(got[r]), tag)
        sending.wait(20)
        receiving.wait(20)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    close_at_once(ends)
    assert np.all(got[0] == 2) and np.all(got[1] == 1)


def test_a_peer_that_stops_reading_fails_the_send_at_its_deadline():
    mine, theirs = socket.socketpair()  # theirs never reads
    stalled = TcpTransport(0, 2, {1: (mine, sealers()[0])}, send_timeout=0.1)
    try:
        request = stalled.isend(1, memoryview(bytes(32 << 20)), collective_tag(0, 1, 0))
        with pytest.raises(CommTimeoutError, match=r"rank 1 took no data for 0\.1 s"):
            request.wait(10)
        with pytest.raises(PeerLostError, match="stalled send"):  # the link is closed for good
            stalled.isend(1, memoryview(b"x"), collective_tag(0, 2, 0)).wait(1)
    finally:
        stalled.close(linger=0.1)
        theirs.close()


def test_probes_are_answered_while_the_caller_is_busy(pair):
    transport, peer = pair
    transport.isend(1, memoryview(b"x"), collective_tag(6, 3, 0), signature("barrier"))
    peer.read_header(), peer.recv(1)
    # nobody waits on the transport: its background thread must answer
    peer.sendall(peer.frame(6, b"", kind=framing.KIND_PROBE))
    peer.settimeout(5)
    kind, tag, nbytes, theirs = peer.read_header()
    assert (kind, tag, theirs) == (framing.KIND_PROBE_REPLY, 6, signature("barrier"))
    assert framing.PROBE_REPLY.unpack(peer.recv(nbytes)) == (3,)


def _tcp_sockets() -> tuple[socket.socket, socket.socket]:
    """The two ends of one loopback TCP connection."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname(), timeout=5)
        b, _ = listener.accept()
    a.settimeout(None)
    return a, b


@pytest.mark.parametrize("kind", ["tcp", "unix"])
def test_closing_the_two_ends_one_after_the_other_does_not_wait_out_the_linger(kind: str) -> None:
    """The first end to close needs only its bytes to have reached the peer, not the peer's
    goodbye (which comes only once this close returns, here): neither close waits its 1 s linger."""
    ends = _transport_pair(a=None, b=None) if kind == "unix" else _transport_pair(30.0, sealing.HEADERS,
                                                                                    *_tcp_sockets())
    tag = collective_tag(0, 1, 0)
    got = np.zeros(1 << 16, np.uint8)
    receiving = ends[1].irecv(0, memoryview(got), tag)
    ends[0].isend(1, memoryview(np.ones(1 << 16, np.uint8)), tag).wait(5)
    receiving.wait(5)
    took = []
    for end in ends:
        start = time.monotonic()
        end.close(linger=1.0)
        took.append(time.monotonic() - start)
    assert max(took) < 0.5, took
    assert (got == 1).all()
