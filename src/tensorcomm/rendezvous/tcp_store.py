"""The store over TCP: a server hosted by rank 0 (or the launcher) and the client every rank uses.

Owns: :class:`TCPStoreServer`, :class:`TCPStore` and their wire protocol. Every connection runs
the ``auth`` handshake (purpose ``b"store"``) before its first frame, admitted by a ``gate``
(concurrent handshakes, each within ``config.HANDSHAKE_TIMEOUT``, a bounded number pending);
the server holds at most ``config.MAX_STORE_CLIENTS`` connections and closes any beyond at
once. Imports ``auth``, ``gate``, ``store``, ``config`` and ``errors`` only.

Protocol, after the handshake; all integers big-endian::

    request   op:u8  key_len:u16  value_len:u64  timeout:f64  key  value
    response  status:u8  value_len:u64  value

    op      SET=1 GET=2 ADD=3 WAIT=4 CHECK=5 DELETE=6 PING=7 COMPARE_SET=8 MULTI_GET=9
    status  OK=0, TIMEOUT=1 (value: the missing keys), ERROR=2 (value: a UTF-8 message)

ADD carries and returns an i64; WAIT, CHECK and MULTI_GET carry their keys in ``value`` as
repeated ``len:u16 key`` (MULTI_GET returns the values as repeated ``len:u64 value``, at most
``MAX_VALUE_BYTES`` in all); COMPARE_SET carries ``expected_len:u64 expected desired`` and returns the value
the key holds afterwards (``store.compare_and_set``'s rule); ``timeout`` (seconds) is read by GET,
WAIT and MULTI_GET only, so the server answers a blocking request by then and the client never has to
abandon a connection mid-frame. Lengths are checked against ``MAX_KEY_BYTES``/``MAX_VALUE_BYTES``
before anything is read or allocated; a frame that breaks a rule closes that connection and is
logged, and the server serves on.
"""

from __future__ import annotations

import logging
import math
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import NoReturn

from tensorcomm.config import CONNECT_RETRY_INTERVAL, HANDSHAKE_TIMEOUT, MAX_STORE_CLIENTS, MAX_TIMEOUT
from tensorcomm.errors import AuthenticationError, CommTimeoutError, RendezvousError
from tensorcomm.rendezvous.auth import (
    HandshakeRefused,
    handshake_client,
    handshake_server,
    recv_exact,
    secret_bytes,
)
from tensorcomm.rendezvous.gate import Gate, describe_error, out_of_descriptors
from tensorcomm.rendezvous.store import (
    MAX_KEY_BYTES,
    MAX_VALUE_BYTES,
    Store,
    add_to_counter,
    check_amount,
    check_key,
    check_keys,
    check_value,
    compare_and_set,
    timeout_error,
)

logger = logging.getLogger("tensorcomm.store")

ACCEPT_BACKOFF = 0.1  # seconds between accept attempts after one failed (out of descriptors)
# Once a frame's header has arrived its body follows at once; a peer that stalls mid-frame (or
# stops reading a response) for this long is dropped so it cannot pin a server thread forever.
FRAME_TIMEOUT = 60.0
# Extra seconds a client waits, beyond a GET/WAIT's own timeout, for the server's answer.
RESPONSE_GRACE = 10.0

_REQUEST = struct.Struct("!BHQd")
_RESPONSE = struct.Struct("!BQ")
_KEY_LEN = struct.Struct("!H")
_I64 = struct.Struct("!q")
_U64 = struct.Struct("!Q")
SET, GET, ADD, WAIT, CHECK, DELETE, PING, COMPARE_SET, MULTI_GET = range(1, 10)
_OP_NAMES = {SET: "set", GET: "get", ADD: "add", WAIT: "wait", CHECK: "check", DELETE: "delete", PING: "ping",
             COMPARE_SET: "compare_set", MULTI_GET: "multi_get"}
OK, TIMEOUT, ERROR = 0, 1, 2


class BadStoreMessage(Exception):
    """A peer broke the store protocol; the connection it came on is unusable."""


def encode_keys(keys: Sequence[str]) -> bytes:
    """Pack checked ``keys`` as repeated ``len:u16 key``; ValueError if over MAX_VALUE_BYTES."""
    data = b"".join(_KEY_LEN.pack(len(raw)) + raw for raw in (k.encode("utf-8") for k in keys))
    if len(data) > MAX_VALUE_BYTES:
        raise ValueError(f"keys: the key list is {len(data)} bytes, at most {MAX_VALUE_BYTES} allowed")
    return data


def decode_keys(data: bytes) -> list[str]:
    """Unpack :func:`encode_keys` output; BadStoreMessage if it is malformed."""
    keys, pos = [], 0
    while pos < len(data):
        if pos + _KEY_LEN.size > len(data):
            raise BadStoreMessage("truncated key list")
        (length,) = _KEY_LEN.unpack_from(data, pos)
        pos += _KEY_LEN.size
        if length > MAX_KEY_BYTES or pos + length > len(data):
            raise BadStoreMessage(f"bad key length {length} in key list")
        keys.append(_decode_key(data[pos:pos + length]))
        pos += length
    return keys


def _decode_key(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadStoreMessage("key is not UTF-8") from None


def _peer(addr: object) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        host = f"[{addr[0]}]" if ":" in str(addr[0]) else addr[0]
        return f"{host}:{addr[1]}"
    return str(addr)


class TCPStoreServer:
    """Serve a store on ``host:port`` to clients that know the job secret; a thread per client.

    Connections are admitted as the module docstring says; a failing ``accept`` (out of
    descriptors) is logged naming the descriptor limit, at most once per ``gate.LOG_INTERVAL``.

    Args:
        host: the address to bind, exactly (no wildcard unless given one).
        port: the port; 0 picks a free one, see ``.port``.
        secret: the job secret, or its key from ``auth.secret_bytes`` (a user-set secret is
            checked and stretched as ``secret_bytes`` says).

    Raises:
        RendezvousError: the address cannot be bound (in use, not local).
        ValueError: a user-set ``secret`` is too short.
    """

    def __init__(self, host: str, port: int, secret: str | bytes) -> None:
        self._secret = secret_bytes(secret)
        self.host = host
        try:
            family, kind, proto, _, sockaddr = socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
            self._listener = socket.socket(family, kind, proto)
        except OSError as exc:
            raise RendezvousError(f"cannot serve the store on {host}:{port}: {exc}") from exc
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind(sockaddr)
            self._listener.listen(128)
        except OSError as exc:
            self._listener.close()
            raise RendezvousError(f"cannot serve the store on {host}:{port}: {exc}") from exc
        self.port: int = self._listener.getsockname()[1]
        self._data: dict[str, bytes] = {}
        self._mutex = threading.Lock()  # guards _data and _waiting
        # Requests that wait, by the key each waits for (its first missing one): a set wakes those
        # of its key only, not every waiting request (64 ranks joining woke 64 x 63 threads).
        self._waiting: dict[str, list[threading.Condition]] = {}
        self._lock = threading.Lock()  # guards _closed and _conns
        self._closed = False
        self._conns: set[socket.socket] = set()  # pending and authenticated, at most MAX_STORE_CLIENTS
        self._gate = Gate(f"store {host}:{self.port}", logger, dropped=self._forget)
        self._acceptor = threading.Thread(target=self._accept_loop, name=f"tensorcomm-store:{self.port}",
                                          daemon=True)
        self._acceptor.start()

    def close(self) -> None:
        """Stop serving, drop every client (waiting ones see the connection close), join threads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conns = list(self._conns)
        with self._mutex:
            for waiters in self._waiting.values():
                for waiter in waiters:
                    waiter.notify()
        for sock in [self._listener, *conns]:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept/recv on it
            except OSError:
                pass
        self._acceptor.join(FRAME_TIMEOUT)
        self._listener.close()
        self._gate.close()
        self._gate.join(FRAME_TIMEOUT)

    def clients(self) -> int:
        """How many connections the server holds (authenticated or still authenticating)."""
        with self._lock:
            return len(self._conns)

    def __enter__(self) -> TCPStoreServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, addr = self._listener.accept()
            except OSError as exc:
                if self._closed:
                    return
                self._gate.warn(f"cannot accept connections: {describe_error(exc)}")
                time.sleep(ACCEPT_BACKOFF)  # e.g. out of descriptors: do not spin
                continue
            peer = _peer(addr)
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                full = len(self._conns) >= MAX_STORE_CLIENTS
                if not full:
                    self._conns.add(conn)
            if full:
                self._gate.refuse(conn, peer, f"it holds {MAX_STORE_CLIENTS} connections, the most it serves")
            elif not self._gate.admit(conn, peer, self._authenticate):
                self._forget(conn)

    def _authenticate(self, conn: socket.socket, peer: str) -> Callable[[], None] | None:
        """Run the handshake (in a gate thread); return the serving loop, or None if refused."""
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(FRAME_TIMEOUT)
            handshake_server(conn, self._secret, HANDSHAKE_TIMEOUT, b"store", addresses=self._dialled_us)
        except (AuthenticationError, OSError) as exc:
            if not self._closed:
                self._gate.warn(f"rejected connection from {peer}: {exc}")
            self._forget(conn)
            return None
        return lambda: self._serve(conn, peer)

    def _dialled_us(self, address: str) -> bool:
        """Whether a client that dialled ``address`` meant this server: the same port (a relay on
        this host cannot hold it; the host part names us in as many ways as we have names)."""
        return address.rpartition(":")[2] == str(self.port)

    def _serve(self, conn: socket.socket, peer: str) -> None:
        threading.current_thread().name = f"tensorcomm-store-client:{peer}"  # no longer a handshake
        try:
            while self._handle(conn):
                pass
        except BadStoreMessage as exc:
            logger.warning("store %s:%s: dropped connection from %s: %s", self.host, self.port, peer, exc)
        except OSError as exc:  # the client went away, stalled, or we are closing
            logger.debug("store %s:%s: connection from %s ended: %s", self.host, self.port, peer, exc)
        finally:
            self._forget(conn)

    def _forget(self, conn: socket.socket) -> None:
        conn.close()
        with self._lock:
            self._conns.discard(conn)

    def _handle(self, conn: socket.socket) -> bool:
        """Serve one request; return False when the client closed the connection between frames."""
        try:
            header = recv_exact(conn, _REQUEST.size, None)  # clients may idle between requests
        except ConnectionError:
            return False
        op, key_len, value_len, timeout = _REQUEST.unpack(header)
        if op not in _OP_NAMES:
            raise BadStoreMessage(f"unknown op {op}")
        if key_len > MAX_KEY_BYTES:
            raise BadStoreMessage(f"key of {key_len} bytes exceeds {MAX_KEY_BYTES}")
        if value_len > MAX_VALUE_BYTES:
            raise BadStoreMessage(f"value of {value_len} bytes exceeds {MAX_VALUE_BYTES}")
        if not (math.isfinite(timeout) and timeout >= 0):
            raise BadStoreMessage(f"bad timeout {timeout}")
        try:
            body = recv_exact(conn, key_len + value_len, FRAME_TIMEOUT)
        except (ConnectionError, CommTimeoutError) as exc:
            raise BadStoreMessage(f"incomplete {_OP_NAMES[op]} frame: {exc}") from None
        key, value = _decode_key(body[:key_len]), body[key_len:]
        status, reply = self._dispatch(op, key, value, timeout)
        conn.sendall(_RESPONSE.pack(status, len(reply)) + reply)
        return True

    def _dispatch(self, op: int, key: str, value: bytes, timeout: float) -> tuple[int, bytes]:
        if op == SET:
            with self._mutex:
                self._data[key] = value
                self._changed(key)
            return OK, b""
        if op == GET:
            values, missing = self._await([key], timeout)
            return (TIMEOUT, encode_keys(missing)) if missing else (OK, values[0])
        if op == ADD:
            if len(value) != _I64.size:
                raise BadStoreMessage(f"add amount of {len(value)} bytes, expected {_I64.size}")
            with self._mutex:
                try:
                    count, stored = add_to_counter(key, self._data.get(key), _I64.unpack(value)[0])
                    reply = _I64.pack(count)
                except (ValueError, struct.error) as exc:
                    return ERROR, str(exc).encode("utf-8")
                self._data[key] = stored
                self._changed(key)
            return OK, reply
        if op == WAIT:
            _, missing = self._await(decode_keys(value), timeout)
            return (TIMEOUT, encode_keys(missing)) if missing else (OK, b"")
        if op == MULTI_GET:
            values, missing = self._await(decode_keys(value), timeout)
            if missing:
                return TIMEOUT, encode_keys(missing)
            reply = b"".join(_U64.pack(len(v)) + v for v in values)
            if len(reply) > MAX_VALUE_BYTES:
                return ERROR, f"multi_get: values of {len(reply)} bytes, over {MAX_VALUE_BYTES}".encode()
            return OK, reply
        if op == CHECK:
            keys = decode_keys(value)
            with self._mutex:
                return OK, bytes([all(k in self._data for k in keys)])
        if op == DELETE:
            with self._mutex:
                return OK, bytes([self._data.pop(key, None) is not None])
        if op == COMPARE_SET:
            if len(value) < _U64.size or _U64.unpack_from(value)[0] > len(value) - _U64.size:
                raise BadStoreMessage(f"compare_set value of {len(value)} bytes does not hold its parts")
            split = _U64.size + _U64.unpack_from(value)[0]
            with self._mutex:
                store, reply = compare_and_set(self._data.get(key), value[_U64.size:split], value[split:])
                if store:
                    self._data[key] = reply
                    self._changed(key)
            return OK, reply
        return OK, b""  # PING

    def _changed(self, key: str) -> None:
        """Wake the requests waiting for ``key`` (hold ``_mutex``)."""
        for waiter in self._waiting.pop(key, ()):
            waiter.notify()

    def _await(self, keys: list[str], timeout: float) -> tuple[list[bytes], list[str]]:
        """Wait until ``keys`` are set (other clients run meanwhile); return (values, missing keys).

        Each wake-up waits for the first key still missing, so keys set in any order cost a
        request a few wake-ups (about ln(len(keys)) for a random order), not one per key."""
        deadline = time.monotonic() + timeout
        waiter = threading.Condition(self._mutex)
        with self._mutex:
            while True:
                if self._closed:
                    raise ConnectionAbortedError("the store server is closing")
                missing = [k for k in keys if k not in self._data]
                remaining = deadline - time.monotonic()
                if not missing or remaining <= 0:
                    return ([] if missing else [self._data[k] for k in keys]), missing
                waiting = self._waiting.setdefault(missing[0], [])
                waiting.append(waiter)
                # A client may send any finite timeout; one wait beyond the platform's limit
                # would overflow, so wait in slices.
                waiter.wait(min(remaining, MAX_TIMEOUT))
                if waiter in waiting:  # a timeout (still listed), or the list a set took
                    waiting.remove(waiter)
                    if not waiting and self._waiting.get(missing[0]) is waiting:
                        del self._waiting[missing[0]]


class TCPStore(Store):
    """A :class:`Store` client of a :class:`TCPStoreServer`; thread-safe (one request at a time).

    Args:
        host, port: where the server listens; it may start later.
        secret: the job secret, or its key (as for :class:`TCPStoreServer`).
        timeout: seconds to keep retrying the connection (the handshake then has up to
            ``config.HANDSHAKE_TIMEOUT``), and the default for ``get``/``wait`` and other requests.

    Raises:
        RendezvousError: no server answered at ``host:port`` (or it stayed too busy to take
            the connection) within ``timeout``.
        AuthenticationError: the server and this process disagree on the secret.
    """

    def __init__(self, host: str, port: int, secret: str | bytes, timeout: float = 300.0) -> None:
        super().__init__(timeout)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"port: expected an int in 1..65535, got {port!r}")
        self.host, self.port = host, port
        self._lock = threading.Lock()
        self._sock: socket.socket | None = _connect(host, port, secret_bytes(secret), self.timeout)

    def set(self, key: str, value: bytes) -> None:
        self._request(SET, check_key(key), check_value(value))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        key, timeout = check_key(key), self._timeout(timeout)
        return self._request(GET, key, b"", timeout, "get")

    def add(self, key: str, amount: int) -> int:
        reply = self._request(ADD, check_key(key), _I64.pack(check_amount(amount)))
        if len(reply) != _I64.size:
            self._fail("add", f"reply of {len(reply)} bytes")
        return _I64.unpack(reply)[0]

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        key, expected, desired = check_key(key), check_value(expected), check_value(desired)
        if _U64.size + len(expected) + len(desired) > MAX_VALUE_BYTES:
            raise ValueError(f"compare_set: expected and desired values of {len(expected) + len(desired)} "
                             f"bytes together exceed {MAX_VALUE_BYTES - _U64.size}")
        return self._request(COMPARE_SET, key, _U64.pack(len(expected)) + expected + desired)

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        keys, timeout = check_keys(keys), self._timeout(timeout)
        if keys:
            self._request(WAIT, "", encode_keys(keys), timeout, "wait")

    def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        keys, timeout = check_keys(keys), self._timeout(timeout)
        if not keys:
            return []
        reply = memoryview(self._request(MULTI_GET, "", encode_keys(keys), timeout, "multi_get"))
        values, at = [], 0
        for _ in keys:
            if at + _U64.size > len(reply) or at + _U64.size + _U64.unpack_from(reply, at)[0] > len(reply):
                self._fail("multi_get", f"reply of {len(reply)} bytes for {len(keys)} keys")
            end = at + _U64.size + _U64.unpack_from(reply, at)[0]
            values.append(bytes(reply[at + _U64.size:end]))
            at = end
        if at != len(reply):
            self._fail("multi_get", f"{len(reply) - at} bytes beyond {len(keys)} values")
        return values

    def check(self, keys: Sequence[str]) -> bool:
        keys = check_keys(keys)
        return not keys or self._request(CHECK, "", encode_keys(keys)) == b"\x01"

    def delete(self, key: str) -> bool:
        return self._request(DELETE, check_key(key), b"") == b"\x01"

    def ping(self) -> None:
        """Round-trip an empty request; RendezvousError if the server is gone."""
        self._request(PING, "", b"")

    def close(self) -> None:
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in a request
            except OSError:
                pass
        with self._lock:
            self._drop()

    def _request(self, op: int, key: str, value: bytes, timeout: float = 0.0, waiting: str = "") -> bytes:
        """Send one frame and return the OK reply's value; ``waiting`` names a blocking op."""
        name = _OP_NAMES[op]
        raw_key = key.encode("utf-8")
        with self._lock:
            if self._sock is None:
                raise RendezvousError(f"the store client for {self.host}:{self.port} is closed")
            sock = self._sock
            try:
                sock.settimeout(self.timeout)
                sock.sendall(_REQUEST.pack(op, len(raw_key), len(value), timeout) + raw_key + value)
                answer_within = timeout + RESPONSE_GRACE if waiting else self.timeout
                status, length = _RESPONSE.unpack(recv_exact(sock, _RESPONSE.size, answer_within))
                if length > MAX_VALUE_BYTES:
                    raise ConnectionError(f"malformed reply: {length} bytes announced")
                reply = recv_exact(sock, length, self.timeout)
            except OSError as exc:  # EOF, reset, timeout: the stream may be mid-frame, so drop it
                self._drop()
                raise RendezvousError(f"lost the store at {self.host}:{self.port} during {name}: "
                                      f"{exc}") from exc
        if status == OK:
            return reply
        if status == TIMEOUT and waiting:
            try:
                missing = decode_keys(reply)
            except BadStoreMessage as exc:
                self._fail(name, str(exc))
            raise timeout_error(waiting, missing, timeout)
        if status == ERROR:
            raise ValueError(reply.decode("utf-8", "replace"))
        self._fail(name, f"status {status}")

    def _fail(self, op: str, what: str) -> NoReturn:
        with self._lock:
            self._drop()
        raise RendezvousError(f"the store at {self.host}:{self.port} sent a malformed {op} reply ({what})")

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _connect(host: str, port: int, secret: bytes, timeout: float) -> socket.socket:
    """Connect to the store and authenticate, retrying while nobody listens yet or while the
    server is too busy to take the connection."""
    deadline = time.monotonic() + timeout
    pause = CONNECT_RETRY_INTERVAL
    while True:
        sock = _dial(host, port, deadline, timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            handshake_client(sock, secret, HANDSHAKE_TIMEOUT, b"store", address=f"{host}:{port}")
            return sock
        except HandshakeRefused as exc:
            sock.close()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RendezvousError(f"the store at {host}:{port} refused the connection for "
                                      f"{timeout:g} s: {exc}") from exc
            time.sleep(min(pause, remaining))
            pause = min(2 * pause, 1.0)
        except BaseException:
            sock.close()
            raise


def _dial(host: str, port: int, deadline: float, timeout: float) -> socket.socket:
    """Open a TCP connection to the store, retrying while nobody listens yet."""
    while True:
        remaining = deadline - time.monotonic()
        try:
            return socket.create_connection((host, port), timeout=max(remaining, CONNECT_RETRY_INTERVAL))
        except OSError as exc:  # refused (server not up yet), unreachable, name not resolvable yet
            if out_of_descriptors(exc):
                raise RendezvousError(f"cannot connect to the store at {host}:{port}: "
                                      f"{describe_error(exc)}") from exc
            if remaining <= 0:
                raise RendezvousError(f"could not reach the store at {host}:{port} within {timeout:g} s: "
                                      f"{exc}") from exc
            time.sleep(min(CONNECT_RETRY_INTERVAL, max(remaining, 0.0)))
