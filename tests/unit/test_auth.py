"""The job secret and the mutual HMAC handshake, over socket pairs."""

from __future__ import annotations

import hashlib
import hmac
import socket
import threading
import time
from collections.abc import Callable

import pytest

from tensorcomm.errors import AuthenticationError, CommTimeoutError
from tensorcomm.rendezvous.auth import (
    MAGIC,
    VERSION,
    HandshakeRefused,
    generate_secret,
    handshake_client,
    handshake_server,
    recv_exact,
    secret_bytes,
)

KEY = b"job-secret"
HELLO, PROOF, ANSWER, OK = 38, 70, 38, 6  # message sizes, fixed by the protocol


def run_side(fn: Callable[[], None]) -> tuple[threading.Thread, list]:
    """Run one side of a handshake in a thread; the list gets None or the exception raised."""
    outcome: list = []

    def run() -> None:
        try:
            fn()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's assertions
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def handshake(client_key: bytes, server_key: bytes, client_purpose: bytes = b"store",
              server_purpose: bytes = b"store") -> tuple[object, object]:
    client, server = socket.socketpair()
    with client, server:
        thread, outcome = run_side(lambda: handshake_server(server, server_key, 2, server_purpose))
        try:
            handshake_client(client, client_key, 2, client_purpose)
            client_result: object = None
        except AuthenticationError as exc:
            client_result = exc
            client.close()  # as a real client does; the server then sees the connection end
        thread.join(5)
    return client_result, outcome[0]


def test_matching_secrets_authenticate() -> None:
    assert handshake(KEY, KEY) == (None, None)


def test_wrong_secret_fails_on_both_sides() -> None:
    client_result, server_result = handshake(b"other", KEY)
    assert isinstance(client_result, AuthenticationError) and "secret" in str(client_result)
    assert isinstance(server_result, AuthenticationError)


def test_purpose_separates_store_from_data_links() -> None:
    client_result, server_result = handshake(KEY, KEY, client_purpose=b"data", server_purpose=b"store")
    assert isinstance(client_result, AuthenticationError)
    assert isinstance(server_result, AuthenticationError)


def relay_handshake() -> tuple[bytes, bytes]:
    """Run a good handshake through a relay; return the client's HELLO and ANSWER as recorded."""
    client, relay_a = socket.socketpair()
    relay_b, server = socket.socketpair()
    with client, relay_a, relay_b, server:
        c_thread, c_out = run_side(lambda: handshake_client(client, KEY, 2, b"store"))
        s_thread, s_out = run_side(lambda: handshake_server(server, KEY, 2, b"store"))
        hello = recv_exact(relay_a, HELLO, 2)
        relay_b.sendall(hello)
        relay_a.sendall(recv_exact(relay_b, PROOF, 2))
        answer = recv_exact(relay_a, ANSWER, 2)
        relay_b.sendall(answer)
        relay_a.sendall(recv_exact(relay_b, OK, 2))
        c_thread.join(5)
        s_thread.join(5)
    assert c_out == [None] and s_out == [None]
    return hello, answer


def test_recorded_handshake_cannot_be_replayed() -> None:
    hello, answer = relay_handshake()
    attacker, server = socket.socketpair()
    with attacker, server:
        thread, outcome = run_side(lambda: handshake_server(server, KEY, 2, b"store"))
        attacker.sendall(hello)
        recv_exact(attacker, PROOF, 2)  # a fresh server nonce: the old answer no longer fits
        attacker.sendall(answer)
        thread.join(5)
        assert isinstance(outcome[0], AuthenticationError)
        attacker.setblocking(False)
        with pytest.raises(BlockingIOError):
            attacker.recv(16)  # no OK was sent


def test_reflected_server_proof_is_not_a_client_answer() -> None:
    attacker, server = socket.socketpair()
    with attacker, server:
        thread, outcome = run_side(lambda: handshake_server(server, KEY, 2, b"store"))
        attacker.sendall(MAGIC + bytes([VERSION]) + b"H" + bytes(32))
        proof = recv_exact(attacker, PROOF, 2)
        server_mac = proof[-32:]
        attacker.sendall(MAGIC + bytes([VERSION]) + b"A" + server_mac)
        thread.join(5)
        assert isinstance(outcome[0], AuthenticationError)


@pytest.mark.parametrize("payload, match", [
    (b"GET / HTTP/1.1\r\n", "does not speak"),
    (b"TCAU\x09H" + bytes(32), "version"),
    (b"TCAU\x01A" + bytes(32), "unexpected handshake message"),
    (b"TCAU\x01H" + bytes(8), "handshake with the client failed"),  # short, then EOF
])
def test_malformed_hello_is_rejected_promptly(payload: bytes, match: str) -> None:
    attacker, server = socket.socketpair()
    with attacker, server:
        thread, outcome = run_side(lambda: handshake_server(server, KEY, 5, b"store"))
        attacker.sendall(payload)
        attacker.shutdown(socket.SHUT_WR)
        thread.join(2)
        assert not thread.is_alive()
        assert isinstance(outcome[0], AuthenticationError)
        assert match in str(outcome[0])


def test_silent_peer_times_out_on_both_roles() -> None:
    for side in (handshake_server, handshake_client):
        a, b = socket.socketpair()
        with a, b:
            start = time.monotonic()
            with pytest.raises(AuthenticationError, match="timed out"):
                side(a, KEY, 0.1, b"store")
            assert time.monotonic() - start < 3  # timed out, not hung (margin for load)


def test_client_sees_a_silent_rejection_as_authentication_error() -> None:
    client, server = socket.socketpair()
    with client, server:

        def reject_after_proof() -> None:
            # Behave like a server with the right key that then refuses the client's answer.
            hello = recv_exact(server, HELLO, 2)
            nonce = bytes(32)
            mac = hmac.new(KEY, b"store" + b"S" + nonce + hello[6:], hashlib.sha256).digest()
            server.sendall(MAGIC + bytes([VERSION]) + b"P" + nonce + mac)
            recv_exact(server, ANSWER, 2)
            server.shutdown(socket.SHUT_RDWR)

        thread, _ = run_side(reject_after_proof)
        with pytest.raises(AuthenticationError, match="rejected"):
            handshake_client(client, KEY, 2, b"store")
        thread.join(5)


def test_recv_exact_reads_across_chunks_and_restores_timeout() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.settimeout(7.0)
        b.sendall(b"abc")

        def send_the_rest_later() -> None:
            time.sleep(0.02)
            b.sendall(b"defg")

        thread, _ = run_side(send_the_rest_later)
        assert recv_exact(a, 7, 2) == b"abcdefg"
        assert a.gettimeout() == 7.0
        thread.join(5)


def test_a_server_closing_before_its_proof_is_a_refusal_to_retry() -> None:
    # A listener at its limit of pending handshakes closes new connections unread: nothing was
    # judged, so the client may try again (a wrong secret is never a HandshakeRefused).
    client, server = socket.socketpair()
    with client:
        server.close()
        with pytest.raises(HandshakeRefused, match="before the handshake"):
            handshake_client(client, KEY, 2, b"store")
    client_result, _ = handshake(b"other", KEY)
    assert isinstance(client_result, AuthenticationError) and not isinstance(client_result, HandshakeRefused)


def test_recv_exact_takes_a_timeout_beyond_the_platform_limit() -> None:
    a, b = socket.socketpair()
    with a, b:
        b.sendall(b"abc")
        assert recv_exact(a, 3, 1e12) == b"abc"  # a socket timeout this long would overflow


def test_recv_exact_eof_and_timeout() -> None:
    a, b = socket.socketpair()
    with a, b:
        with pytest.raises(CommTimeoutError):
            recv_exact(a, 4, 0.05)
        b.sendall(b"xy")
        b.close()
        with pytest.raises(ConnectionError, match="2 of 4"):
            recv_exact(a, 4, 1)


def test_generate_secret_is_fresh_hex() -> None:
    first, second = generate_secret(), generate_secret()
    assert len(first) == 64 and bytes.fromhex(first) and first != second


def test_secret_bytes() -> None:
    assert secret_bytes("abc") == b"abc"
    assert secret_bytes(b"\x00\x01") == b"\x00\x01"
    with pytest.raises(ValueError, match="empty"):
        secret_bytes("")
    with pytest.raises(TypeError, match="str or bytes"):
        secret_bytes(123)  # type: ignore[arg-type]
