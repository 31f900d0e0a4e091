"""The per-job secret and the mutual HMAC challenge run on every connection of a job.

Owns: generating and normalising the job secret, the handshake both ends of a store connection
(``purpose=b"store"``) or a data link (``purpose=b"data"``) run before anything else, and the
fixed-size socket read it is built on. Imports nothing from tensorcomm but ``errors``.

Wire format (every message has a fixed size; nothing sent by the peer sizes an allocation)::

    client -> server   HELLO  = MAGIC VERSION b"H" client_nonce                  (38 bytes)
    server -> client   PROOF  = MAGIC VERSION b"P" server_nonce server_mac       (70 bytes)
    client -> server   ANSWER = MAGIC VERSION b"A" client_mac                    (38 bytes)
    server -> client   OK     = MAGIC VERSION b"K"                               (6 bytes)

    server_mac = HMAC-SHA256(secret, purpose + b"S" + server_nonce + client_nonce)
    client_mac = HMAC-SHA256(secret, purpose + b"C" + client_nonce + server_nonce)

Fresh nonces from both sides make a recorded exchange useless later (no replay); the role byte
(``S``/``C``) in each MAC means a proof the server produces can never serve as a client answer,
so a connection reflected back at the job cannot pass; ``purpose`` keeps a store proof from
opening a data link. A server that rejects a client closes the connection without a word, which
the client sees as a missing ``OK``. A server that closes the connection before its ``PROOF``
(a listener at its limit of pending handshakes, or one shutting down) has judged nothing:
the client raises :class:`HandshakeRefused`, which callers retry.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import time

from tensorcomm.errors import AuthenticationError, CommTimeoutError

MAGIC = b"TCAU"
VERSION = 1
NONCE_BYTES = 32
MAC_BYTES = 32  # SHA-256 digest size

_HEADER = MAGIC + bytes([VERSION])
_HELLO, _PROOF, _ANSWER, _OK = b"H", b"P", b"A", b"K"
_HEADER_BYTES = len(_HEADER) + 1
# A socket timeout above the platform's limit overflows; recv_exact waits in slices of this.
_SLICE_SECONDS = 3600.0


class HandshakeRefused(AuthenticationError):
    """The server closed the connection before proving anything (busy or closing): retry later."""


def generate_secret() -> str:
    """Return a fresh job secret: the hex form of 32 random bytes."""
    return secrets.token_hex(32)


def secret_bytes(secret: str | bytes) -> bytes:
    """Return the HMAC key for ``secret``: bytes as given, a string as its UTF-8 encoding.

    Raises:
        TypeError: ``secret`` is neither str nor bytes.
        ValueError: ``secret`` is empty.
    """
    if isinstance(secret, str):
        key = secret.encode("utf-8")
    elif isinstance(secret, (bytes, bytearray)):
        key = bytes(secret)
    else:
        raise TypeError(f"secret: expected str or bytes, got {type(secret).__name__}")
    if not key:
        raise ValueError("secret: the job secret must not be empty")
    return key


def recv_exact(sock: socket.socket, n: int, timeout: float | None) -> bytes:
    """Read exactly ``n`` bytes from ``sock`` within ``timeout`` seconds (None: no limit).

    The socket's own timeout is restored afterwards.

    Raises:
        ConnectionError: the peer closed the connection before ``n`` bytes arrived.
        CommTimeoutError: ``timeout`` passed first.
    """
    buf = bytearray(n)
    view = memoryview(buf)
    deadline = None if timeout is None else time.monotonic() + timeout
    saved = sock.gettimeout()
    got = 0
    try:
        while got < n:
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CommTimeoutError(f"timed out after {timeout} s with {got} of {n} bytes received")
                sock.settimeout(min(remaining, _SLICE_SECONDS))
            else:
                sock.settimeout(None)
            try:
                count = sock.recv_into(view[got:])
            except TimeoutError:
                continue  # a slice ended; the deadline decides
            if count == 0:
                raise ConnectionError(f"connection closed after {got} of {n} bytes")
            got += count
    finally:
        view.release()
        try:
            sock.settimeout(saved)
        except OSError:  # the socket was closed under us; nothing left to restore
            pass
    return bytes(buf)


def handshake_client(sock: socket.socket, secret: bytes, timeout: float, purpose: bytes) -> None:
    """Prove knowledge of ``secret`` to the accepting side of ``sock`` and check its proof.

    Args:
        sock: a freshly connected socket; nothing may have been sent on it yet.
        secret: the job's HMAC key (see :func:`secret_bytes`).
        timeout: seconds the whole exchange may take.
        purpose: what the connection is for, e.g. ``b"store"`` or ``b"data"``.

    Raises:
        HandshakeRefused: the server closed the connection before its proof (busy or closing).
        AuthenticationError: the peer does not know the secret, rejected ours, spoke another
            protocol, closed the connection or did not answer within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    client_nonce = secrets.token_bytes(NONCE_BYTES)
    try:
        try:
            _send(sock, _HEADER + _HELLO + client_nonce, deadline)
            body = _expect(sock, _PROOF, NONCE_BYTES + MAC_BYTES, deadline)
        except ConnectionError as exc:  # EOF or reset before any proof: nothing was judged
            raise HandshakeRefused(f"the server closed the connection before the handshake "
                                   f"(busy with other connections, or closing): {exc}") from exc
        server_nonce, server_mac = body[:NONCE_BYTES], body[NONCE_BYTES:]
        if not hmac.compare_digest(server_mac, _mac(secret, purpose, b"S", server_nonce, client_nonce)):
            raise AuthenticationError("the server holds a different job secret "
                                      "(is TENSORCOMM_SECRET the same on every rank?)")
        _send(sock, _HEADER + _ANSWER + _mac(secret, purpose, b"C", client_nonce, server_nonce), deadline)
        try:
            _expect(sock, _OK, 0, deadline)
        except ConnectionError:
            raise AuthenticationError("the server rejected our proof of the job secret") from None
    except OSError as exc:  # also ConnectionError and CommTimeoutError (a TimeoutError)
        raise AuthenticationError(f"handshake with the server failed: {exc}") from exc


def handshake_server(sock: socket.socket, secret: bytes, timeout: float, purpose: bytes) -> None:
    """Check that the connecting side of ``sock`` knows ``secret`` and prove that we do.

    Args:
        sock: a freshly accepted socket.
        secret: the job's HMAC key (see :func:`secret_bytes`).
        timeout: seconds the whole exchange may take.
        purpose: what the connection is for; must equal the client's.

    Raises:
        AuthenticationError: the client sent something malformed, a wrong answer, closed the
            connection or stayed silent past ``timeout``. The caller should close ``sock``.
    """
    deadline = time.monotonic() + timeout
    try:
        client_nonce = _expect(sock, _HELLO, NONCE_BYTES, deadline)
        server_nonce = secrets.token_bytes(NONCE_BYTES)
        proof = _mac(secret, purpose, b"S", server_nonce, client_nonce)
        _send(sock, _HEADER + _PROOF + server_nonce + proof, deadline)
        client_mac = _expect(sock, _ANSWER, MAC_BYTES, deadline)
        if not hmac.compare_digest(client_mac, _mac(secret, purpose, b"C", client_nonce, server_nonce)):
            raise AuthenticationError("the client does not know the job secret")
        _send(sock, _HEADER + _OK, deadline)
    except OSError as exc:  # also ConnectionError and CommTimeoutError (a TimeoutError)
        raise AuthenticationError(f"handshake with the client failed: {exc}") from exc


def _mac(secret: bytes, purpose: bytes, role: bytes, own_nonce: bytes, peer_nonce: bytes) -> bytes:
    return hmac.new(secret, purpose + role + own_nonce + peer_nonce, hashlib.sha256).digest()


def _remaining(deadline: float) -> float:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise CommTimeoutError("timed out")
    return remaining


def _send(sock: socket.socket, data: bytes, deadline: float) -> None:
    saved = sock.gettimeout()
    sock.settimeout(_remaining(deadline))
    try:
        sock.sendall(data)
    except TimeoutError:
        raise CommTimeoutError("timed out sending") from None
    finally:
        sock.settimeout(saved)


def _expect(sock: socket.socket, kind: bytes, body_bytes: int, deadline: float) -> bytes:
    """Read one message of ``kind`` and return its body; anything else is an AuthenticationError."""
    # The header is read and checked on its own so a peer speaking another protocol is rejected
    # at once rather than when the timeout ends.
    header = recv_exact(sock, _HEADER_BYTES, _remaining(deadline))
    if header[:len(MAGIC)] != MAGIC:
        raise AuthenticationError(f"the peer does not speak the tensorcomm handshake "
                                  f"(got {header[:len(MAGIC)]!r} instead of {MAGIC!r})")
    if header[len(MAGIC)] != VERSION:
        raise AuthenticationError(f"handshake version mismatch: peer speaks {header[len(MAGIC)]}, "
                                  f"we speak {VERSION}")
    if header[len(_HEADER):] != kind:
        raise AuthenticationError(f"unexpected handshake message {header[len(_HEADER):]!r}, "
                                  f"expected {kind!r}")
    return recv_exact(sock, body_bytes, _remaining(deadline)) if body_bytes else b""
