"""The per-job secret and the mutual, link-bound HMAC handshake run on every connection of a job.

Owns: generating the job secret and turning it into the MAC key (a user-set secret is checked
and stretched with scrypt, a generated one used as it is), the handshake both ends of a store connection
(``purpose=b"store"``), a shared-memory join (``b"shm"``) or a data link (``b"data"``) run before
anything else, the :class:`Session` it yields, and the fixed-size socket read it is built on.
Imports nothing from tensorcomm but ``errors``.

Wire format (big-endian; every field has a fixed size or a one-byte length, so nothing the peer
sends sizes an allocation past 255 bytes)::

    client -> server   HELLO  = MAGIC VERSION b"H" client_nonce rank target options
                                len(scope) len(address) scope address
    server -> client   PROOF  = MAGIC VERSION b"P" server_nonce options server_mac
    client -> server   ANSWER = MAGIC VERSION b"A" client_mac
    server -> client   OK     = MAGIC VERSION b"K"
    server -> client   REFUSE = MAGIC VERSION b"R" reason          (instead of PROOF or OK)

    transcript = len(purpose) purpose HELLO PROOF-without-its-mac
    server_mac = HMAC-SHA256(key, b"S" transcript)
    client_mac = HMAC-SHA256(key, b"C" transcript server_mac)
    session key = HMAC-SHA256(key, transcript server_mac client_mac b"session key")

``key`` is :func:`secret_bytes` of the job secret: the server's proof is public to anyone who
sends a HELLO, so a guessable secret would fall to offline guessing if ``key`` were the secret
itself; scrypt makes each guess cost what deriving ``key`` cost a rank once.

``rank`` is the client's rank, ``target`` the rank it means to reach, ``address`` what it dialled
and ``scope`` what the link is for (a group or generation); ``options`` are each side's wishes
(the TCP transport's link protection). The server refuses a HELLO whose target is not itself,
whose address is not one of its own or whose scope differs, and both MACs cover the whole
transcript: a relay that dials the real server in a rank's place presents its own address (and is
refused) or alters the HELLO (and the client rejects the server's MAC). Fresh nonces from both
sides make a recorded exchange useless later, the role byte keeps a server proof from serving as
a client answer, ``purpose`` keeps a store proof from opening a data link, and every link gets a
session key of its own (:meth:`Session.direction_key` splits it per direction).
The client speaks first. A server that closes the connection before its ``PROOF`` (a listener at
its limit of pending handshakes, or one shutting down) has judged nothing: the client raises
:class:`HandshakeRefused`, which callers retry. A ``REFUSE`` names why (an unauthenticated hint:
a relay may forge one, which only stops the link, as closing it would).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets
import socket
import struct
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from tensorcomm.errors import AuthenticationError, CommTimeoutError

MAGIC = b"TCAU"
VERSION = 3  # 3: the key is the scrypt stretch of a user-set secret
NONCE_BYTES = 32
MAC_BYTES = 32  # SHA-256 digest size
ANY_RANK = -1  # a rank field that names no rank (a store client, a store server)

_HEADER = MAGIC + bytes([VERSION])
_HELLO, _PROOF, _ANSWER, _OK, _REFUSE = b"H", b"P", b"A", b"K", b"R"
_HEADER_BYTES = len(_HEADER) + 1
_HELLO_FIXED = struct.Struct(f">{NONCE_BYTES}siiIBB")
_PROOF_FIXED = struct.Struct(f">{NONCE_BYTES}sI")
_REASONS = {1: "the address the client dialled is not this server's",
            2: "the client means to reach another rank",
            3: "the client belongs to another group or generation",
            4: "the client does not know the job secret"}
_WRONG_ADDRESS, _WRONG_RANK, _WRONG_SCOPE, _BAD_MAC = 1, 2, 3, 4
# A socket timeout above the platform's limit overflows; recv_exact waits in slices of this.
_SLICE_SECONDS = 3600.0

GENERATED = "generated:"  # what generate_secret() puts before its hex digits
GENERATED_BYTES = 32  # random bytes in a generated secret
MIN_SECRET_BYTES = 16  # 128 bits: a user-set secret shorter than this is refused
SECRET_RECIPE = "python -c \"import secrets; print(secrets.token_hex(32))\""
# A user-set secret is stretched with scrypt before any MAC: each guess a stranger tests offline
# (against a handshake proof, or torch's store's announcement) costs 32 MiB and about 0.1 s of a
# core, as it cost each rank once. The salt is a fixed label, not a random one: every rank, on
# every host, and a launcher's store must derive the same key from the secret alone, before any
# channel exists to agree on a salt (docs/security.md).
SCRYPT_N, SCRYPT_R, SCRYPT_P = 1 << 15, 8, 1
SCRYPT_MAXMEM = 64 << 20  # above scrypt's 128 * r * n bytes (32 MiB)
SCRYPT_SALT = b"tensorcomm job secret v1"


class HandshakeRefused(AuthenticationError):
    """The server closed the connection before proving anything (busy or closing): retry later."""


class JobKey(bytes):
    """A job's MAC key (what :func:`secret_bytes` returns), as opposed to a secret still to be
    checked and stretched: stores and handshakes given one use it as it is."""


@dataclass(frozen=True)
class Session:
    """What a passed handshake yields: the link's key and what the peer said of itself."""

    key: bytes  # secret to this link (both ends derive it; nobody else can)
    peer_rank: int  # the client's rank as it claimed it (server side), or the rank dialled
    peer_options: int
    client: bool  # whether this end dialled

    def direction_key(self, label: bytes, outgoing: bool) -> bytes:
        """A key for ``label`` in one direction: ours for ``outgoing``, else the peer's sending key."""
        direction = b"client->server" if outgoing == self.client else b"server->client"
        return hmac.digest(self.key, label + b"|" + direction, "sha256")


def generate_secret() -> str:
    """Return a fresh job secret: ``"generated:"`` and the hex form of 32 random bytes.

    :func:`secret_bytes` uses a secret of this form as it is (it cannot be guessed, so
    stretching it would buy nothing); any other secret is checked and stretched.
    """
    return GENERATED + secrets.token_hex(GENERATED_BYTES)


def check_secret(secret: str | bytes, name: str = "secret") -> bytes:
    """Return the bytes of a user-set ``secret`` (a string's UTF-8 encoding), refusing a short one.

    Raises:
        TypeError: ``secret`` is neither str nor bytes.
        ValueError: ``secret`` is shorter than ``MIN_SECRET_BYTES`` (the message says how to make
            a good one); ``name`` names it.
    """
    if isinstance(secret, str):
        raw = secret.encode("utf-8")
    elif isinstance(secret, (bytes, bytearray)):
        raw = bytes(secret)
    else:
        raise TypeError(f"{name}: expected the job secret as str or bytes, got {type(secret).__name__}")
    if len(raw) < MIN_SECRET_BYTES:
        raise ValueError(
            f"{name}: the job secret is {len(raw)} bytes long; at least {MIN_SECRET_BYTES} bytes "
            f"(128 bits) are required, and a random one is best, since anyone who can reach a "
            f"port of the job can test guesses of it offline. Make one with: {SECRET_RECIPE}")
    return raw


def secret_bytes(secret: str | bytes, name: str = "secret") -> JobKey:
    """Return the job's MAC key for ``secret``: what every handshake and announcement uses.

    A :class:`JobKey` is returned as it is, and so is a secret :func:`generate_secret` made
    (its bytes). Any other secret is a user's: it is checked (:func:`check_secret`) and
    stretched with scrypt, once per process (later calls return the cached key), so that each
    offline guess of it costs a stranger what it cost this process once.

    Raises:
        TypeError: ``secret`` is neither str nor bytes.
        ValueError: a user-set ``secret`` is too short; ``name`` names it.
    """
    if isinstance(secret, JobKey):
        return secret
    if isinstance(secret, str) and _generated(secret):
        return JobKey(secret.encode("ascii"))
    return _stretch(check_secret(secret, name))


def _generated(secret: str) -> bool:
    """Whether ``secret`` has the form :func:`generate_secret` gives."""
    digits = secret[len(GENERATED):]
    return (secret.startswith(GENERATED) and len(digits) == 2 * GENERATED_BYTES
            and all(c in "0123456789abcdef" for c in digits))


@functools.lru_cache(maxsize=4)
def _stretch(raw: bytes) -> JobKey:
    return JobKey(hashlib.scrypt(raw, salt=SCRYPT_SALT, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P,
                                 maxmem=SCRYPT_MAXMEM, dklen=MAC_BYTES))


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


def handshake_client(sock: socket.socket, secret: bytes, timeout: float, purpose: bytes, *,
                     address: str, rank: int = ANY_RANK, target: int = ANY_RANK, scope: bytes = b"",
                     options: int = 0) -> Session:
    """Prove knowledge of ``secret`` to the accepting side of ``sock``, bound to this link.

    Args:
        sock: a freshly connected socket; nothing may have been sent on it yet.
        secret: the job's HMAC key (see :func:`secret_bytes`).
        timeout: seconds the whole exchange may take.
        purpose: what the connection is for, e.g. ``b"store"`` or ``b"data"``.
        address: the address ``sock`` dialled, exactly as the server published it.
        rank: this process's rank (``ANY_RANK``: none).
        target: the rank the server must be (``ANY_RANK``: a server that has none).
        scope: the group or generation the link belongs to; must equal the server's.
        options: this side's wishes, passed to the server (a ``u32``).

    Returns:
        The link's :class:`Session`; its ``peer_rank`` is ``target``.

    Raises:
        HandshakeRefused: the server closed the connection before its proof (busy or closing).
        AuthenticationError: the peer does not know the secret, refused this link (another
            address, rank or scope: a relay), spoke another protocol, closed the connection or
            did not answer within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    hello = _HEADER + _HELLO + _pack_hello(secrets.token_bytes(NONCE_BYTES), rank, target, options,
                                           scope, address)
    try:
        try:
            _send(sock, hello, deadline)
            body = _expect(sock, _PROOF, _PROOF_FIXED.size + MAC_BYTES, deadline)
        except ConnectionError as exc:  # EOF or reset before any proof: nothing was judged
            raise HandshakeRefused(f"the server closed the connection before the handshake "
                                   f"(busy with other connections, or closing): {exc}") from exc
        proof, server_mac = body[:_PROOF_FIXED.size], body[_PROOF_FIXED.size:]
        transcript = _transcript(purpose, hello, _HEADER + _PROOF + proof)
        if not hmac.compare_digest(server_mac, _mac(secret, b"S", transcript)):
            raise AuthenticationError(
                f"the server at {address} failed the handshake: it holds a different job secret "
                "(is TENSORCOMM_SECRET the same on every rank?) or a relay altered the exchange")
        client_mac = _mac(secret, b"C", transcript + server_mac)
        _send(sock, _HEADER + _ANSWER + client_mac, deadline)
        try:
            _expect(sock, _OK, 0, deadline)
        except ConnectionError:
            raise AuthenticationError(f"the server at {address} rejected our proof of the job "
                                      "secret") from None
    except OSError as exc:  # also ConnectionError and CommTimeoutError (a TimeoutError)
        raise AuthenticationError(f"handshake with the server at {address} failed: {exc}") from exc
    (_, options_of_server) = _PROOF_FIXED.unpack(proof)
    return Session(_session_key(secret, transcript, server_mac, client_mac), target,
                   options_of_server, True)


def handshake_server(sock: socket.socket, secret: bytes, timeout: float, purpose: bytes, *,
                     addresses: Collection[str] | Callable[[str], bool], rank: int = ANY_RANK,
                     scope: bytes = b"", options: int = 0) -> Session:
    """Check that the connecting side of ``sock`` knows ``secret`` and dialled us; prove that we do.

    Args:
        sock: a freshly accepted socket.
        secret: the job's HMAC key (see :func:`secret_bytes`).
        timeout: seconds the whole exchange may take.
        purpose: what the connection is for; must equal the client's.
        addresses: the addresses this server published (or a test of one): the address the
            client dialled must be among them.
        rank: this process's rank; the client's target must equal it.
        scope: the group or generation; the client's must equal it.
        options: this side's wishes, passed to the client.

    Returns:
        The link's :class:`Session`; its ``peer_rank`` is the rank the client claimed.

    Raises:
        AuthenticationError: the client sent something malformed, dialled another address or
            rank, belongs to another scope, gave a wrong answer, closed the connection or stayed
            silent past ``timeout``. The caller should close ``sock``.
    """
    deadline = time.monotonic() + timeout
    try:
        fixed = _expect(sock, _HELLO, _HELLO_FIXED.size, deadline)
        _, client_rank, target, client_options, scope_len, address_len = _HELLO_FIXED.unpack(fixed)
        rest = scope_len + address_len
        tail = recv_exact(sock, rest, _remaining(deadline)) if rest else b""
        their_scope, dialled = tail[:scope_len], tail[scope_len:].decode("utf-8", "replace")
        ours = addresses(dialled) if callable(addresses) else dialled in addresses
        if not ours:
            _refuse(sock, _WRONG_ADDRESS, deadline, f"the client dialled {dialled!r}, not this server")
        if target != rank:
            _refuse(sock, _WRONG_RANK, deadline, f"the client means to reach rank {target}, not {rank}")
        if their_scope != scope:
            _refuse(sock, _WRONG_SCOPE, deadline, f"the client's scope {their_scope!r} is not {scope!r}")
        hello = _HEADER + _HELLO + fixed + tail
        proof = _HEADER + _PROOF + _PROOF_FIXED.pack(secrets.token_bytes(NONCE_BYTES), options)
        transcript = _transcript(purpose, hello, proof)
        server_mac = _mac(secret, b"S", transcript)
        _send(sock, proof + server_mac, deadline)
        client_mac = _expect(sock, _ANSWER, MAC_BYTES, deadline)
        if not hmac.compare_digest(client_mac, _mac(secret, b"C", transcript + server_mac)):
            _refuse(sock, _BAD_MAC, deadline, "the client does not know the job secret")
        _send(sock, _HEADER + _OK, deadline)
    except OSError as exc:  # also ConnectionError and CommTimeoutError (a TimeoutError)
        raise AuthenticationError(f"handshake with the client failed: {exc}") from exc
    return Session(_session_key(secret, transcript, server_mac, client_mac), client_rank,
                   client_options, False)


def _pack_hello(nonce: bytes, rank: int, target: int, options: int, scope: bytes, address: str) -> bytes:
    encoded = address.encode("utf-8")
    for name, field in (("scope", scope), ("address", encoded)):
        if len(field) > 255:
            raise ValueError(f"{name}: at most 255 bytes, got {len(field)}")
    return _HELLO_FIXED.pack(nonce, rank, target, options, len(scope), len(encoded)) + scope + encoded


def _transcript(purpose: bytes, hello: bytes, proof: bytes) -> bytes:
    return bytes([len(purpose)]) + purpose + hello + proof


def _mac(secret: bytes, role: bytes, data: bytes) -> bytes:
    return hmac.digest(secret, role + data, "sha256")


def _session_key(secret: bytes, transcript: bytes, server_mac: bytes, client_mac: bytes) -> bytes:
    return hmac.new(secret, transcript + server_mac + client_mac + b"session key", hashlib.sha256).digest()


def _refuse(sock: socket.socket, reason: int, deadline: float, detail: str) -> None:
    """Tell the client why (best effort) and raise; the caller closes ``sock``."""
    try:
        _send(sock, _HEADER + _REFUSE + bytes([reason]), deadline)
    except OSError:
        pass
    raise AuthenticationError(detail)


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
    got = header[len(_HEADER):]
    if got == _REFUSE and kind in (_PROOF, _OK):
        (reason,) = recv_exact(sock, 1, _remaining(deadline))
        raise AuthenticationError(f"the server refused the link: "
                                  f"{_REASONS.get(reason, f'reason {reason}')}")
    if got != kind:
        raise AuthenticationError(f"unexpected handshake message {got!r}, expected {kind!r}")
    return recv_exact(sock, body_bytes, _remaining(deadline)) if body_bytes else b""
