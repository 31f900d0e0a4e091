"""The job secret and the mutual, link-bound HMAC handshake, over socket pairs."""

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
    Session,
    generate_secret,
    handshake_client,
    handshake_server,
    recv_exact,
    secret_bytes,
)

KEY = b"job-secret"
ADDRESS = "10.0.0.1:4000"  # what the server published; clients dial it
PROOF, ANSWER, OK = 74, 38, 6  # message sizes, fixed by the protocol


def hello_bytes(address: str = ADDRESS, scope: bytes = b"") -> int:
    """The size of a HELLO carrying ``address`` and ``scope``."""
    return 6 + 46 + len(scope) + len(address.encode())


def run_side(fn: Callable[[], object], sock: socket.socket | None = None) -> tuple[threading.Thread, list]:
    """Run one side of a handshake in a thread; the list gets its result or the exception raised.

    A side that fails closes ``sock``, as the code that calls a handshake does, so the other end
    learns of it at once instead of at its timeout."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the test's assertions
            outcome.append(exc)
            if sock is not None:
                sock.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def client(sock: socket.socket, key: bytes = KEY, purpose: bytes = b"store", **binding: object) -> Session:
    fields: dict = {"address": ADDRESS, "rank": 1, "target": 0, **binding}
    return handshake_client(sock, key, 2, purpose, **fields)


def server(sock: socket.socket, key: bytes = KEY, purpose: bytes = b"store", timeout: float = 2,
           **binding: object) -> Session:
    fields: dict = {"addresses": (ADDRESS,), "rank": 0, **binding}
    return handshake_server(sock, key, timeout, purpose, **fields)


def handshake(client_key: bytes = KEY, server_key: bytes = KEY, client_purpose: bytes = b"store",
              server_purpose: bytes = b"store", client_binding: dict | None = None,
              server_binding: dict | None = None) -> tuple[object, object]:
    """Run both sides over a socket pair; return each side's Session or exception."""
    a, b = socket.socketpair()
    with a, b:
        thread, outcome = run_side(lambda: server(b, server_key, server_purpose, **(server_binding or {})))
        try:
            client_result: object = client(a, client_key, client_purpose, **(client_binding or {}))
        except AuthenticationError as exc:
            client_result = exc
            a.close()  # as a real client does; the server then sees the connection end
        thread.join(5)
    return client_result, outcome[0]


def test_matching_secrets_authenticate_and_agree_on_a_session() -> None:
    mine, theirs = handshake(client_binding={"options": 2, "scope": b"gen 3"},
                             server_binding={"options": 1, "scope": b"gen 3"})
    assert isinstance(mine, Session) and isinstance(theirs, Session)
    assert mine.key == theirs.key and len(mine.key) == 32 and KEY not in mine.key
    assert (mine.peer_rank, mine.peer_options, mine.client) == (0, 1, True)
    assert (theirs.peer_rank, theirs.peer_options, theirs.client) == (1, 2, False)


def test_session_keys_differ_per_link_and_per_direction() -> None:
    first, first_server = handshake()
    second, _ = handshake()
    assert isinstance(first, Session) and isinstance(second, Session) and isinstance(first_server, Session)
    assert first.key != second.key  # fresh nonces: every link its own key
    out, back = first.direction_key(b"frames", True), first.direction_key(b"frames", False)
    assert out != back
    assert out == first_server.direction_key(b"frames", False)
    assert back == first_server.direction_key(b"frames", True)


def test_wrong_secret_fails_on_both_sides() -> None:
    client_result, server_result = handshake(b"other", KEY)
    assert isinstance(client_result, AuthenticationError) and "secret" in str(client_result)
    assert isinstance(server_result, AuthenticationError)


def test_purpose_separates_store_from_data_links() -> None:
    client_result, server_result = handshake(KEY, KEY, client_purpose=b"data", server_purpose=b"store")
    assert isinstance(client_result, AuthenticationError)
    assert isinstance(server_result, AuthenticationError)


@pytest.mark.parametrize("client_binding, server_binding, reason", [
    ({"address": "10.0.0.66:4000"}, {}, "address the client dialled"),  # a relay's own address
    ({"target": 2}, {}, "another rank"),
    ({"scope": b"gen 1"}, {"scope": b"gen 2"}, "another group or generation"),
])
def test_server_refuses_a_link_meant_for_another_address_rank_or_scope(
        client_binding: dict, server_binding: dict, reason: str) -> None:
    client_result, server_result = handshake(client_binding=client_binding, server_binding=server_binding)
    assert isinstance(client_result, AuthenticationError) and reason in str(client_result)
    assert not isinstance(client_result, HandshakeRefused)  # judged: not to be retried
    assert isinstance(server_result, AuthenticationError)


def test_server_takes_a_test_of_its_addresses() -> None:
    mine, _ = handshake(server_binding={"addresses": lambda dialled: dialled.endswith(":4000")})
    assert isinstance(mine, Session)


def relay(edit_hello: Callable[[bytes], bytes] = lambda hello: hello,
          edit_proof: Callable[[bytes], bytes] = lambda proof: proof,
          edit_answer: Callable[[bytes], bytes] = lambda answer: answer,
          dialled: str = ADDRESS) -> tuple[object, object, bytes, bytes]:
    """Relay one handshake between a client that dialled ``dialled`` and the real server,
    editing each message on the way; return both outcomes and the HELLO and ANSWER recorded."""
    a, relay_a = socket.socketpair()
    relay_b, b = socket.socketpair()
    with a, relay_a, relay_b, b:
        c_thread, c_out = run_side(lambda: client(a, address=dialled), a)
        s_thread, s_out = run_side(lambda: server(b), b)
        hello = recv_exact(relay_a, hello_bytes(dialled), 2)
        answer = b""
        try:
            relay_b.sendall(edit_hello(hello))
            relay_a.sendall(edit_proof(recv_exact(relay_b, PROOF, 2)))
            answer = recv_exact(relay_a, ANSWER, 2)
            relay_b.sendall(edit_answer(answer))
            relay_a.sendall(recv_exact(relay_b, OK, 2))
        except (ConnectionError, CommTimeoutError):
            pass
        finally:  # what is not relayed by now never will be: both sides see the connection end
            relay_a.close()
            relay_b.close()
        c_thread.join(5)
        s_thread.join(5)
    return c_out[0], s_out[0], hello, answer


def flip(offset: int) -> Callable[[bytes], bytes]:
    return lambda message: message[:offset] + bytes([message[offset] ^ 1]) + message[offset + 1:]


def test_a_transparent_relay_at_the_published_address_learns_nothing_it_can_use() -> None:
    client_result, server_result, _, _ = relay()
    assert isinstance(client_result, Session) and isinstance(server_result, Session)


def test_a_relay_at_another_address_fails_even_if_it_rewrites_the_hello() -> None:
    relayed = "10.0.0.9:4000"  # as long as ADDRESS, so the rewrite keeps the lengths
    as_is = relay(dialled=relayed)
    assert isinstance(as_is[0], AuthenticationError) and isinstance(as_is[1], AuthenticationError)
    # Put the server's own address in the HELLO: the server now proves a transcript the client
    # never saw, so the client rejects it.
    rewritten = relay(edit_hello=lambda hello: hello.replace(relayed.encode(), ADDRESS.encode()),
                      dialled=relayed)
    assert isinstance(rewritten[0], AuthenticationError) and "relay" in str(rewritten[0])
    assert not isinstance(rewritten[1], Session)


@pytest.mark.parametrize("where", ["hello rank", "hello options", "proof options", "answer"])
def test_a_tampered_transcript_fails(where: str) -> None:
    edits = {"hello rank": {"edit_hello": flip(6 + 32 + 3)},  # the client's rank
             "hello options": {"edit_hello": flip(6 + 32 + 11)},
             "proof options": {"edit_proof": flip(6 + 32 + 3)},
             "answer": {"edit_answer": flip(6)}}
    client_result, server_result, _, _ = relay(**edits[where])
    assert not (isinstance(client_result, Session) and isinstance(server_result, Session))
    assert isinstance(client_result, AuthenticationError) or isinstance(server_result, AuthenticationError)


def test_recorded_handshake_cannot_be_replayed() -> None:
    _, _, hello, answer = relay()
    attacker, b = socket.socketpair()
    with attacker, b:
        thread, outcome = run_side(lambda: server(b))
        attacker.sendall(hello)
        recv_exact(attacker, PROOF, 2)  # a fresh server nonce: the old answer no longer fits
        attacker.sendall(answer)
        thread.join(5)
        assert isinstance(outcome[0], AuthenticationError)
        assert recv_exact(attacker, 7, 2)[5:6] == b"R"  # refused, no OK


def test_reflected_server_proof_is_not_a_client_answer() -> None:
    _, _, hello, _ = relay()
    attacker, b = socket.socketpair()
    with attacker, b:
        thread, outcome = run_side(lambda: server(b))
        attacker.sendall(hello)
        proof = recv_exact(attacker, PROOF, 2)
        attacker.sendall(MAGIC + bytes([VERSION]) + b"A" + proof[-32:])
        thread.join(5)
        assert isinstance(outcome[0], AuthenticationError)


@pytest.mark.parametrize("payload, match", [
    (b"GET / HTTP/1.1\r\n", "does not speak"),
    (b"TCAU\x09H" + bytes(32), "version"),
    (b"TCAU\x01H" + bytes(46), "version"),  # the first handshake version: no binding, no key
    (b"TCAU\x02H" + bytes(46), "version"),  # the second: the secret itself was the key
    (b"TCAU\x03A" + bytes(32), "unexpected handshake message"),
    (b"TCAU\x03H" + bytes(8), "handshake with the client failed"),  # short, then EOF
])
def test_malformed_hello_is_rejected_promptly(payload: bytes, match: str) -> None:
    attacker, b = socket.socketpair()
    with attacker, b:
        thread, outcome = run_side(lambda: server(b, timeout=5))
        attacker.sendall(payload)
        attacker.shutdown(socket.SHUT_WR)
        thread.join(2)
        assert not thread.is_alive()
        assert isinstance(outcome[0], AuthenticationError)
        assert match in str(outcome[0])


def test_a_hello_field_past_its_size_is_refused_before_sending() -> None:
    a, b = socket.socketpair()
    with a, b, pytest.raises(ValueError, match="address"):
        client(a, address="x" * 256)


def test_silent_peer_times_out_on_both_roles() -> None:
    sides: list[Callable[[socket.socket], object]] = [
        lambda sock: handshake_server(sock, KEY, 0.1, b"store", addresses=(ADDRESS,)),
        lambda sock: handshake_client(sock, KEY, 0.1, b"store", address=ADDRESS)]
    for side in sides:
        a, b = socket.socketpair()
        with a, b:
            start = time.monotonic()
            with pytest.raises(AuthenticationError, match="timed out"):
                side(a)
            assert time.monotonic() - start < 3  # timed out, not hung (margin for load)


def test_client_sees_a_silent_rejection_as_authentication_error() -> None:
    a, b = socket.socketpair()
    with a, b:

        def reject_after_proof() -> None:
            # Behave like a server with the right key that then closes instead of its OK.
            hello = recv_exact(b, hello_bytes(), 2)
            proof = MAGIC + bytes([VERSION]) + b"P" + bytes(36)
            transcript = bytes([5]) + b"store" + hello + proof
            b.sendall(proof + hmac.new(KEY, b"S" + transcript, hashlib.sha256).digest())
            recv_exact(b, ANSWER, 2)
            b.shutdown(socket.SHUT_RDWR)

        thread, _ = run_side(reject_after_proof)
        with pytest.raises(AuthenticationError, match="rejected"):
            client(a)
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
            handshake_client(client, KEY, 2, b"store", address=ADDRESS)
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


def test_generate_secret_is_fresh_and_marked() -> None:
    first, second = generate_secret(), generate_secret()
    assert first.startswith("generated:") and first != second
    assert len(bytes.fromhex(first.removeprefix("generated:"))) == 32


def test_a_generated_secret_is_its_own_key() -> None:
    secret = generate_secret()
    assert secret_bytes(secret) == secret.encode()
    key = secret_bytes(secret)
    assert secret_bytes(key) is key  # a key is never stretched again


def test_a_user_set_secret_is_stretched_with_scrypt_once() -> None:
    secret = "correct horse battery staple"
    key = secret_bytes(secret)
    assert key == hashlib.scrypt(secret.encode(), salt=b"tensorcomm job secret v1", n=1 << 15, r=8, p=1,
                                 maxmem=64 << 20, dklen=32)
    assert secret_bytes(secret.encode()) == key  # bytes are a secret too, not a key
    assert secret_bytes(secret) is key  # cached: stretched once per process
    assert secret_bytes(key) is key
    # What looks generated but is not (a wrong length, upper case) is a user's secret.
    for almost in ("generated:" + "ab" * 31, "generated:" + "AB" * 32):
        assert secret_bytes(almost) != almost.encode()


@pytest.mark.parametrize("short", ["", "Summer2024!", "0123456789abcde", b"\x00\x01", "\u00e9" * 7])
def test_a_short_user_set_secret_is_refused_with_a_recipe(short: str | bytes) -> None:
    with pytest.raises(ValueError, match=r"^TENSORCOMM_SECRET: .*at least 16 bytes.*secrets.token_hex\(32\)"):
        secret_bytes(short, "TENSORCOMM_SECRET")


def test_sixteen_bytes_are_enough_and_bad_types_are_named() -> None:
    assert len(secret_bytes("0123456789abcdef")) == 32
    with pytest.raises(TypeError, match="str or bytes"):
        secret_bytes(123)  # type: ignore[arg-type]
