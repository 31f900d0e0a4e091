"""Sealed frames on TCP links: each protection level on socket pairs, tampering, replay,
level agreement, and the handshake bound to the link inside ``connect_mesh``."""

from __future__ import annotations

import socket
import sys
import threading

import numpy as np
import pytest

from tensorcomm.errors import AuthenticationError, LinkAuthenticationError, PeerLostError
from tensorcomm.rendezvous.auth import Session, recv_exact
from tensorcomm.rendezvous.store import HashStore
from tensorcomm.transports.base import collective_tag, encode_abort
from tensorcomm.transports.tcp import framing, sealing
from tensorcomm.transports.tcp.sealing import Sealer
from tensorcomm.transports.tcp.transport import TcpTransport

from helpers import close_at_once, mesh_thread

try:
    import cryptography  # noqa: F401 - only whether it is there
    HAVE_CRYPTO = True
except ImportError:
    HAVE_CRYPTO = False
NEEDS_CRYPTO = pytest.mark.skipif(not HAVE_CRYPTO, reason="encrypt needs tensorcomm[crypto] (cryptography)")
KEY_0, KEY_1 = b"0" * 32, b"1" * 32
ENCRYPT = pytest.param(sealing.ENCRYPT, marks=NEEDS_CRYPTO, id="encrypt")
LEVELS = [pytest.param(sealing.HEADERS, id="headers"), pytest.param(sealing.MAC, id="mac"), ENCRYPT]
TAG = collective_tag(0, 1, 0)


def _ends(level: int) -> tuple[TcpTransport, socket.socket, Sealer]:
    """Rank 0's transport, the raw socket playing rank 1 and rank 1's sealer."""
    mine, theirs = socket.socketpair()
    transport = TcpTransport(0, 2, {1: (mine, Sealer(1, level, KEY_0, KEY_1))})
    return transport, theirs, Sealer(0, level, KEY_1, KEY_0)


def _frame(sealer: Sealer, payload: bytes, kind: int = framing.KIND_DATA, tag: int = TAG) -> bytearray:
    header = framing.pack_header(kind, tag, len(payload))
    return bytearray(b"".join(sealer.seal(header, memoryview(payload), kind == framing.KIND_DATA)))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("nbytes", [0, 8, 3 << 20])
def test_every_level_carries_data_both_ways(level: int, nbytes: int) -> None:
    a, b = socket.socketpair()
    ends = (TcpTransport(0, 2, {1: (a, Sealer(1, level, KEY_0, KEY_1))}),
            TcpTransport(1, 2, {0: (b, Sealer(0, level, KEY_1, KEY_0))}))
    sent = [np.random.default_rng(r).integers(0, 255, nbytes, np.uint8) for r in range(2)]
    got = [np.zeros(nbytes, np.uint8) for _ in range(2)]
    try:
        for _ in range(3):  # frame numbers advance in step on both ends
            requests = [ends[r].isend(1 - r, memoryview(sent[r]), TAG) for r in range(2)]
            requests += [ends[r].irecv(1 - r, memoryview(got[r]), TAG) for r in range(2)]
            for request in requests:
                request.wait(20)
            assert np.array_equal(got[0], sent[1]) and np.array_equal(got[1], sent[0])
    finally:
        close_at_once(ends)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("where", ["header", "header tag", "payload tag"])
def test_an_altered_header_fails_the_link_naming_the_peer(level: int, where: str) -> None:
    transport, peer, sealer = _ends(level)
    frame = _frame(sealer, b"12345678")
    frame[{"header": 8, "header tag": sealing.HEADER_BYTES - 1, "payload tag": 70}[where]] ^= 1
    try:
        request = transport.irecv(1, memoryview(bytearray(8)), TAG)
        peer.sendall(frame)
        with pytest.raises(LinkAuthenticationError, match="link to rank 1 failed authentication") as info:
            request.wait(5)
        assert info.value.rank == 1 and isinstance(info.value, PeerLostError)
        with pytest.raises(PeerLostError):  # the link is closed for good
            transport.irecv(1, memoryview(bytearray(8)), TAG).wait(1)
    finally:
        peer.close()
        transport.close(linger=0.1)


def test_a_replayed_or_dropped_frame_fails_the_link() -> None:
    transport, peer, sealer = _ends(sealing.HEADERS)
    first = _frame(sealer, b"first---")
    _frame(sealer, b"dropped-")  # sealed, never sent: the next one is out of sequence
    try:
        out = bytearray(8)
        peer.sendall(first)
        transport.irecv(1, memoryview(out), TAG).wait(5)
        assert out == b"first---"
        peer.sendall(first)  # the same frame again
        with pytest.raises(LinkAuthenticationError, match="frame 1 failed its header check"):
            transport.irecv(1, memoryview(out), TAG).wait(5)
    finally:
        peer.close()
        transport.close(linger=0.1)


@pytest.mark.parametrize("level", [pytest.param(sealing.MAC, id="mac"), ENCRYPT])
def test_an_altered_payload_fails_under_mac_and_encrypt(level: int) -> None:
    transport, peer, sealer = _ends(level)
    frame = _frame(sealer, bytes(1 << 16))
    frame[-5] ^= 0x40
    try:
        request = transport.irecv(1, memoryview(bytearray(1 << 16)), TAG)
        peer.sendall(frame)
        with pytest.raises(LinkAuthenticationError, match=r"rank 1 .*payload"):
            request.wait(5)
    finally:
        peer.close()
        transport.close(linger=0.1)


def test_headers_level_covers_control_payloads_but_not_data_payloads() -> None:
    transport, peer, sealer = _ends(sealing.HEADERS)
    data = _frame(sealer, b"12345678")
    data[-1] ^= 1  # documented: at this level a data payload is not covered
    record = encode_abort(RuntimeError("a real abort"), framing.MAX_ABORT_BYTES)
    abort = _frame(sealer, bytes(record), kind=framing.KIND_ABORT, tag=5)
    abort[-1] ^= 1
    try:
        out = bytearray(8)
        peer.sendall(data)
        transport.irecv(1, memoryview(out), TAG).wait(5)
        assert out == b"12345679"
        request = transport.irecv(1, memoryview(out), collective_tag(0, 2, 0))
        peer.sendall(abort)
        with pytest.raises(LinkAuthenticationError, match="payload check"):
            request.wait(5)
    finally:
        peer.close()
        transport.close(linger=0.1)


@NEEDS_CRYPTO
def test_encrypt_puts_no_plaintext_on_the_wire() -> None:
    transport, peer, sealer = _ends(sealing.ENCRYPT)
    secret = b"attack at dawn! " * 64
    try:
        transport.isend(1, memoryview(secret), TAG).wait(5)
        raw = recv_exact(peer, sealing.HEADER_BYTES + len(secret), 5)
        assert b"attack at dawn" not in raw
        header, number, tag = sealer.open_header(raw[:sealing.HEADER_BYTES])[4]
        payload = memoryview(bytearray(raw[sealing.HEADER_BYTES:]))
        sealer.open_payload(header, number, tag, payload, True)
        assert payload == secret
    finally:
        peer.close()
        transport.close(linger=0.1)


@NEEDS_CRYPTO
def test_a_link_runs_at_the_stronger_level_of_its_ends() -> None:
    session = Session(b"k" * 32, 3, sealing.ENCRYPT, True)
    assert Sealer.for_session(session, sealing.HEADERS).level == sealing.ENCRYPT
    assert Sealer.for_session(Session(b"k" * 32, 3, sealing.HEADERS, False), sealing.MAC).level == sealing.MAC
    with pytest.raises(LinkAuthenticationError, match="unknown link protection level 7"):
        Sealer.for_session(Session(b"k" * 32, 3, 7, True), sealing.HEADERS)


@pytest.mark.parametrize("value, level", [(None, sealing.HEADERS), ("", sealing.HEADERS),
                                          ("headers", sealing.HEADERS), (" MAC ", sealing.MAC),
                                          pytest.param("encrypt", sealing.ENCRYPT, marks=NEEDS_CRYPTO)])
def test_configured_level(monkeypatch: pytest.MonkeyPatch, value: str | None, level: int) -> None:
    if value is None:
        monkeypatch.delenv(sealing.ENV_LINK_PROTECTION, raising=False)
    else:
        monkeypatch.setenv(sealing.ENV_LINK_PROTECTION, value)
    assert sealing.configured_level() == level


def test_encrypt_without_cryptography_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sealing.ENV_LINK_PROTECTION, "encrypt")
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.ciphers.aead", None)
    with pytest.raises(ValueError, match=r"needs the 'cryptography' package \(pip install"):
        sealing.configured_level()


def test_configured_level_rejects_unknown_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sealing.ENV_LINK_PROTECTION, "none")
    with pytest.raises(ValueError, match="TENSORCOMM_LINK_PROTECTION: expected one of headers, mac, "
                                         "encrypt, got 'none'"):
        sealing.configured_level()


def test_mesh_links_agree_on_the_stronger_level() -> None:
    store, results = HashStore(), {}
    threads = [mesh_thread(0, 2, store, results, timeout=2, level=sealing.HEADERS),
               mesh_thread(1, 2, store, results, timeout=2, level=sealing.MAC)]
    for thread in threads:
        thread.join(30)
    (sock_0, sealer_0), (sock_1, sealer_1) = results[0][1], results[1][0]
    assert (sealer_0.level, sealer_0.peer, sealer_1.level, sealer_1.peer) == (sealing.MAC, 1, sealing.MAC, 0)
    sock_0.close()
    sock_1.close()


def test_mesh_refuses_a_relay_put_in_a_ranks_place() -> None:
    # Rank 1 is sent to a relay (its address swapped in the store) that forwards bytes to rank 0.
    # Rank 0 must refuse it and keep waiting for the real rank 1, which then joins.
    store, results, retried = HashStore(), {}, {}
    first = mesh_thread(0, 2, store, results)
    real = store.get("tcp/addr/0", timeout=10).decode()
    relay = socket.create_server(("127.0.0.1", 0))
    store.set("tcp/addr/0", f"127.0.0.1:{relay.getsockname()[1]}".encode())

    def forward() -> None:
        host, port = real.rsplit(":", 1)
        near, _ = relay.accept()
        far = socket.create_connection((host, int(port)))
        pumps = [threading.Thread(target=_pump, args=ends, daemon=True)
                 for ends in ((near, far), (far, near))]
        for pump in pumps:
            pump.start()
        for pump in pumps:
            pump.join(10)
        near.close()
        far.close()

    forwarder = threading.Thread(target=forward, daemon=True)
    forwarder.start()
    mesh_thread(1, 2, store, results).join(30)
    relay.close()
    assert isinstance(results[1], AuthenticationError), results[1]
    assert "address the client dialled is not this server's" in str(results[1])
    store.set("tcp/addr/0", real.encode())
    mesh_thread(1, 2, store, retried).join(30)
    first.join(30)
    assert isinstance(results[0], dict) and isinstance(retried[1], dict), (results[0], retried[1])
    for sock, _ in (results[0][1], retried[1][0]):
        sock.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass
