"""One conformance suite run over every Store, plus PrefixStore isolation and TCP hardening."""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from tensorcomm.errors import AuthenticationError, CommTimeoutError, RendezvousError
from tensorcomm.rendezvous import (
    FileStore,
    HashStore,
    PrefixStore,
    Store,
    TCPStore,
    TCPStoreServer,
    gate,
    tcp_store,
)
from tensorcomm.rendezvous.auth import handshake_client, secret_bytes
from tensorcomm.testing import free_port

SECRET = secret_bytes("store-unit-test-secret")  # the key, as handshakes use it
# A factory returns a new handle onto the one store under test (another "process" of the job).
Handles = Callable[..., Store]


@pytest.fixture(params=["hash", "file", "tcp"])
def handles(request: pytest.FixtureRequest, tmp_path) -> Iterator[Handles]:
    made: list[Store] = []
    server = None
    if request.param == "hash":
        shared = HashStore(timeout=5)

        def make(timeout: float = 5) -> Store:
            shared.timeout = timeout
            return shared
    elif request.param == "file":
        def make(timeout: float = 5) -> Store:
            made.append(FileStore(str(tmp_path / "store"), timeout=timeout))
            return made[-1]
    else:
        server = TCPStoreServer("127.0.0.1", 0, SECRET)

        def make(timeout: float = 5) -> Store:
            made.append(TCPStore("127.0.0.1", server.port, SECRET, timeout=timeout))
            return made[-1]
    yield make
    for store in made:
        store.close()
    if server is not None:
        server.close()


def in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list]:
    """Run ``fn`` in a thread; the returned list receives its result or the exception it raised."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the test's assertions
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


# --- conformance: every store ---

def test_set_get_roundtrip_and_overwrite(handles: Handles) -> None:
    a, b = handles(), handles()
    a.set("k", b"v1")
    assert b.get("k") == b"v1"
    b.set("k", "v2 \u00e9")  # str is stored as UTF-8
    assert a.get("k") == "v2 \u00e9".encode()
    a.set("empty", b"")
    assert b.get("empty") == b""
    a.set("big", bytes(range(256)) * 4096)  # 1 MiB
    assert b.get("big") == bytes(range(256)) * 4096


def test_get_waits_for_a_later_set(handles: Handles) -> None:
    a, b = handles(), handles()
    thread, result = in_thread(lambda: b.get("late", timeout=5))
    time.sleep(0.05)
    a.set("late", b"here")
    thread.join(5)
    assert result == [b"here"]


def test_get_timeout_names_key_and_timeout(handles: Handles) -> None:
    store = handles()
    start = time.monotonic()
    with pytest.raises(CommTimeoutError, match=r"'missing'.*0\.1 s"):
        store.get("missing", timeout=0.1)
    assert 0.09 <= time.monotonic() - start < 4  # the timeout, not a hang; margin for load


def test_default_timeout_applies_when_none(handles: Handles) -> None:
    store = handles(timeout=0.1)
    with pytest.raises(CommTimeoutError, match="missing"):
        store.get("missing")
    with pytest.raises(CommTimeoutError, match="missing"):
        store.wait(["missing"])


def test_add_creates_at_zero_and_counts(handles: Handles) -> None:
    a, b = handles(), handles()
    assert a.add("n", 3) == 3
    assert b.add("n", -5) == -2
    assert a.get("n") == b"-2"
    assert b.add("n", 0) == -2


def test_add_on_non_counter_is_value_error(handles: Handles) -> None:
    store = handles()
    store.set("text", b"hello")
    with pytest.raises(ValueError, match="not a counter"):
        store.add("text", 1)
    assert store.get("text") == b"hello"


def test_add_is_atomic_across_threads(handles: Handles) -> None:
    stores = [handles() for _ in range(4)]
    threads = [in_thread(lambda s=s: [s.add("count", 1) for _ in range(50)])[0] for s in stores]
    for thread in threads:
        thread.join(10)
    assert stores[0].add("count", 0) == 200


def test_wait_names_only_missing_keys(handles: Handles) -> None:
    store = handles()
    store.set("a", b"1")
    store.wait(["a"], timeout=0.1)
    store.wait([], timeout=0)
    with pytest.raises(CommTimeoutError) as info:
        store.wait(["a", "b", "c"], timeout=0.1)
    assert "'b', 'c'" in str(info.value) and "'a'" not in str(info.value)


def test_wait_returns_when_all_keys_set(handles: Handles) -> None:
    a, b = handles(), handles()
    thread, result = in_thread(lambda: b.wait(["x", "y"], timeout=5))
    a.set("x", b"")
    time.sleep(0.02)
    assert thread.is_alive()
    a.add("y", 1)
    thread.join(5)
    assert result == [None]


def test_multi_get_returns_the_values_in_order_once_all_are_set(handles: Handles) -> None:
    a, b = handles(), handles()
    thread, result = in_thread(lambda: b.multi_get(["y", "x", "empty"], timeout=5))
    a.set("x", b"1")
    a.set("empty", b"")
    time.sleep(0.02)
    assert thread.is_alive()
    a.set("y", b"\x00two")
    thread.join(5)
    assert result == [[b"\x00two", b"1", b""]]
    assert b.multi_get([], timeout=0.1) == []


def test_multi_get_names_only_missing_keys(handles: Handles) -> None:
    store = handles()
    store.set("a", b"1")
    with pytest.raises(CommTimeoutError) as info:
        store.multi_get(["a", "b", "c"], timeout=0.1)
    assert "'b', 'c'" in str(info.value) and "'a'" not in str(info.value)


def test_multi_get_through_a_prefix_store(handles: Handles) -> None:
    store = handles()
    store.set("job/k1", b"v1")
    store.set("job/k2", b"v2")
    assert PrefixStore("job", store).multi_get(["k2", "k1"], timeout=1) == [b"v2", b"v1"]


def test_concurrent_waiters_all_released(handles: Handles) -> None:
    setter = handles()
    stores = [handles() for _ in range(5)]
    waiters = [in_thread(lambda s=s: s.get("go", timeout=5)) for s in stores]
    time.sleep(0.05)
    setter.set("go", b"now")
    for thread, result in waiters:
        thread.join(5)
        assert result == [b"now"]


def test_check(handles: Handles) -> None:
    store = handles()
    assert store.check([])
    assert not store.check(["a"])
    store.set("a", b"1")
    assert store.check(["a"])
    assert not store.check(["a", "b"])


def test_delete(handles: Handles) -> None:
    a, b = handles(), handles()
    a.set("k", b"v")
    assert b.delete("k") is True
    assert a.delete("k") is False
    assert not a.check(["k"])
    with pytest.raises(CommTimeoutError):
        a.get("k", timeout=0.05)


@pytest.mark.parametrize("call, error", [
    (lambda s: s.set(1, b"v"), TypeError),
    (lambda s: s.set("k", 1), TypeError),
    (lambda s: s.get(b"k"), TypeError),
    (lambda s: s.add("k", True), TypeError),
    (lambda s: s.add("k", 1.5), TypeError),
    (lambda s: s.add("k", 1 << 63), ValueError),
    (lambda s: s.wait("abc"), TypeError),
    (lambda s: s.check("abc"), TypeError),
    (lambda s: s.get("k", timeout=-1), ValueError),
    (lambda s: s.get("k", timeout=float("nan")), ValueError),
    (lambda s: s.get("k", timeout=1e10), ValueError),  # beyond the timers: not an OverflowError
    (lambda s: s.wait(["k"], timeout=1e300), ValueError),
    (lambda s: s.set("x" * 5000, b""), ValueError),
])
def test_bad_arguments(handles: Handles, call: Callable[[Store], object], error: type) -> None:
    with pytest.raises(error):
        call(handles())


def test_closed_store_raises(handles: Handles) -> None:
    store = handles()
    store.close()
    store.close()  # idempotent
    with pytest.raises(RendezvousError):
        store.set("k", b"v")


# --- PrefixStore ---

def test_prefix_store_isolates_namespaces() -> None:
    base = HashStore(timeout=1)
    g1, g2 = PrefixStore("g1", base), PrefixStore("g2", base)
    g1.set("addr", b"one")
    g2.set("addr", b"two")
    assert g1.get("addr") == b"one" and g2.get("addr") == b"two"
    assert base.get("g1/addr") == b"one"
    assert g1.add("n", 1) == 1 and g2.add("n", 5) == 5
    g1.set("only1", b"")
    assert g1.check(["only1"]) and not g2.check(["only1"])
    with pytest.raises(CommTimeoutError, match="g2/only1"):
        g2.wait(["only1"], timeout=0.05)
    assert g2.delete("addr") and g1.get("addr") == b"one"
    g1.close()
    assert base.get("g1/addr") == b"one"  # the wrapped store stays open


def test_prefix_store_inherits_timeout_and_nests() -> None:
    inner = PrefixStore("b", PrefixStore("a", HashStore(timeout=0.05)))
    assert inner.timeout == 0.05
    inner.set("k", b"v")
    assert inner.store.store.get("a/b/k") == b"v"
    with pytest.raises(CommTimeoutError):
        inner.get("missing")


# --- FileStore ---

def test_file_store_removes_file_after_last_close(tmp_path) -> None:
    path = tmp_path / "f"
    a, b = FileStore(str(path)), FileStore(str(path))
    a.set("k", b"v")
    a.close()
    assert path.exists() and b.get("k") == b"v"
    b.close()
    assert not path.exists()
    assert FileStore(str(path)).check(["k"]) is False
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)


# --- TCP store: authentication, hardening, connection behaviour ---

@pytest.fixture
def server() -> Iterator[TCPStoreServer]:
    srv = TCPStoreServer("127.0.0.1", 0, SECRET)
    yield srv
    srv.close()


def assert_serves(srv: TCPStoreServer) -> None:
    with TCPStore("127.0.0.1", srv.port, SECRET, timeout=2) as good:
        good.set("alive", b"yes")
        assert good.get("alive") == b"yes"
        good.ping()


def assert_dropped(sock: socket.socket) -> None:
    sock.settimeout(2)
    try:
        assert sock.recv(1 << 16) == b""
    except ConnectionResetError:
        pass


def test_wrong_secret_is_refused_and_server_keeps_serving(server: TCPStoreServer, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="tensorcomm.store"):
        with pytest.raises(AuthenticationError, match="secret"):
            TCPStore("127.0.0.1", server.port, b"a-wrong-secret-here", timeout=2)
        assert_serves(server)
        # The server logs once it sees the refused client hang up, which may be after we return.
        deadline = time.monotonic() + 2
        while not any("rejected connection from 127.0.0.1:" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "no warning logged for the refused connection"
            time.sleep(0.01)


def authenticated_socket(srv: TCPStoreServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=2)
    handshake_client(sock, SECRET, 2, b"store", address=f"127.0.0.1:{srv.port}")
    return sock


@pytest.mark.parametrize("payload", [
    pytest.param(b"GET / HTTP/1.1\r\n\r\n" * 4, id="garbage-before-handshake"),
    pytest.param(None, id="frame-claiming-2**60-bytes"),
    pytest.param(struct.pack("!BHQd", 1, 10, 10, 0.0) + b"short", id="truncated-frame-then-close"),
    pytest.param(struct.pack("!BHQd", 99, 0, 0, 0.0), id="unknown-op"),
    pytest.param(struct.pack("!BHQd", 2, 5000, 0, 0.0), id="key-too-long"),
    pytest.param(struct.pack("!BHQd", 2, 1, 0, float("nan")) + b"k", id="nan-timeout"),
    pytest.param(struct.pack("!BHQd", 1, 2, 0, 0.0) + b"\xff\xfe", id="key-not-utf8"),
    pytest.param(struct.pack("!BHQd", 3, 1, 3, 0.0) + b"k123", id="add-amount-wrong-size"),
    pytest.param(struct.pack("!BHQd", 4, 0, 3, 0.0) + b"\x00\x09a", id="bad-key-list"),
])
def test_malformed_input_drops_only_that_connection(server: TCPStoreServer, payload: bytes | None,
                                                    caplog) -> None:
    caplog.set_level(logging.WARNING, logger="tensorcomm.store")
    if payload is None:
        sock = authenticated_socket(server)
        sock.sendall(struct.pack("!BHQd", 1, 1, 2 ** 60, 0.0) + b"k")
    elif payload.startswith(b"GET"):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=2)
        sock.sendall(payload)
    else:
        sock = authenticated_socket(server)
        sock.sendall(payload)
        if b"short" in payload:
            sock.shutdown(socket.SHUT_WR)
    with sock:
        assert_dropped(sock)
    assert_serves(server)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "from 127.0.0.1:" in warnings[0]


def test_stalled_or_silent_peers_do_not_block_others(server: TCPStoreServer, monkeypatch) -> None:
    monkeypatch.setattr(tcp_store, "FRAME_TIMEOUT", 0.2)
    silent = socket.create_connection(("127.0.0.1", server.port))  # never handshakes
    stalled = authenticated_socket(server)
    stalled.sendall(struct.pack("!BHQd", 1, 1, 100, 0.0) + b"k")  # body never completes
    assert_serves(server)
    with stalled:
        assert_dropped(stalled)  # dropped after FRAME_TIMEOUT
    silent.close()


def test_blocking_get_does_not_hold_other_clients(server: TCPStoreServer) -> None:
    with TCPStore("127.0.0.1", server.port, SECRET, timeout=5) as waiter, \
            TCPStore("127.0.0.1", server.port, SECRET, timeout=5) as other:
        thread, result = in_thread(lambda: waiter.get("later", timeout=5))
        time.sleep(0.05)
        start = time.monotonic()
        other.set("x", b"1")
        assert other.get("x") == b"1"
        assert time.monotonic() - start < 2.5  # well before the waiter's 5 s: not held
        other.set("later", b"done")
        thread.join(5)
        assert result == [b"done"]


def test_client_retries_until_a_late_server_starts() -> None:
    port = free_port()
    servers: list[TCPStoreServer] = []
    starter = threading.Timer(0.3, lambda: servers.append(TCPStoreServer("127.0.0.1", port, SECRET)))
    starter.start()
    try:
        with TCPStore("127.0.0.1", port, SECRET, timeout=5) as client:
            client.set("k", b"v")
            assert client.get("k") == b"v"
    finally:
        starter.join()
        for srv in servers:
            srv.close()


def test_client_gives_up_naming_the_address() -> None:
    port = free_port()
    start = time.monotonic()
    with pytest.raises(RendezvousError, match=f"127.0.0.1:{port}"):
        TCPStore("127.0.0.1", port, SECRET, timeout=0.2)
    assert time.monotonic() - start < 2


def test_server_binds_exact_host_and_refuses_busy_port(server: TCPStoreServer) -> None:
    assert server.host == "127.0.0.1" and server.port > 0
    with pytest.raises(RendezvousError, match=f"127.0.0.1:{server.port}"):
        TCPStoreServer("127.0.0.1", server.port, SECRET)


@pytest.mark.parametrize("closer", ["server", "client"])
def test_closing_either_end_wakes_a_waiting_client(closer: str) -> None:
    srv = TCPStoreServer("127.0.0.1", 0, SECRET)
    client = TCPStore("127.0.0.1", srv.port, SECRET, timeout=5)
    thread, outcome = in_thread(lambda: client.get("never", timeout=5))
    time.sleep(0.05)
    start = time.monotonic()
    for _ in range(2):  # close is idempotent
        (srv if closer == "server" else client).close()
    thread.join(5)
    assert time.monotonic() - start < 2.5  # woken, not the 5 s timeout (margin for load)
    assert len(outcome) == 1 and isinstance(outcome[0], RendezvousError)
    with pytest.raises(RendezvousError):
        client.set("k", b"v")
    client.close()
    srv.close()


def test_a_gate_drops_the_oldest_silent_connection_and_logs_once_per_interval(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="test.gate")
    door = gate.Gate("test listener", logging.getLogger("test.gate"), silent_limit=2)
    pairs = [socket.socketpair() for _ in range(4)]
    try:
        assert all(door.admit(ours, f"silent{i}", lambda conn, peer: None)
                   for i, (ours, _) in enumerate(pairs))
        for _, theirs in pairs[:2]:  # the two oldest made room
            theirs.settimeout(2)
            assert theirs.recv(1) == b""
        warnings = [r.getMessage() for r in caplog.records]
        assert warnings == [("test listener: dropped a silent connection from silent0: "
                             "2 connections were waiting to speak; the oldest was closed")]
        door.close()
        for _, theirs in pairs[2:]:  # closing the gate closes the rest
            theirs.settimeout(2)
            assert theirs.recv(1) == b""
        door.join(5)
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def test_a_gate_cuts_off_the_oldest_handshake_for_a_newcomer(monkeypatch, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="test.gate")
    door = gate.Gate("test listener", logging.getLogger("test.gate"), limit=1)
    release, outcomes = threading.Event(), []
    pairs = [socket.socketpair() for _ in range(3)]

    def stalled(conn: socket.socket, peer: str) -> None:  # reads until its connection fails
        conn.settimeout(10)
        outcomes.append((peer, conn.recv(64)))
        release.wait(5)

    def arrive(i: int) -> None:
        ours, theirs = pairs[i]
        theirs.sendall(b"x")  # it spoke: its handshake starts
        assert door.admit(ours, f"client{i}", stalled)
        deadline = time.monotonic() + 5
        while (f"client{i}", b"x") not in outcomes and time.monotonic() < deadline:
            try:
                if theirs.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                    return  # closed by the gate
            except BlockingIOError:
                pass
            except ConnectionResetError:  # closed by the gate with our byte unread
                return
            time.sleep(0.01)

    try:
        monkeypatch.setattr(gate, "GRACE", 0.0)  # every handshake is old enough to cut off
        arrive(0)
        arrive(1)
        pairs[0][1].settimeout(2)
        assert pairs[0][1].recv(1) == b""  # the oldest was cut off for the newcomer
        assert ("client1", b"x") in outcomes
        assert "cut off the oldest handshake: 1 handshakes were pending" in caplog.text
        monkeypatch.setattr(gate, "GRACE", 60.0)  # client1 is young: the newcomer is closed
        arrive(2)
        pairs[2][1].settimeout(2)
        with contextlib.suppress(ConnectionResetError):  # closed before any proof: it retries
            assert pairs[2][1].recv(1) == b""
        assert ("client2", b"x") not in outcomes
        release.set()
        door.join(5)
    finally:
        release.set()
        for a, b in pairs:
            a.close()
            b.close()
