"""A relay put in a rank's place through the store, or someone on the path: neither reads nor
alters the data unnoticed.

The attack of issue 21, against two real ranks over TCP: someone who can write to the store
(under torchrun, anyone who can reach torch's store) pre-sets rank 1's join entry so rank 0 goes
ahead alone, swaps rank 0's published data address for a relay's, and lets rank 1 start. Rank 1
dials the relay, which forwards every byte to the real rank 0 (reading them all, and in tamper
mode altering payload bytes on the way back; in exec mode swapping the pickle of a
``broadcast_object_list`` for one that runs code in rank 1). The test plays that attacker; it writes to the
store with the store's key, which torch's store never asks for. The relay is a stdlib process.

Before the handshake was bound to the dialled address, the relay passed and read every payload
(or altered them unnoticed); now rank 0 refuses the relayed link, rank 1 fails with an
``AuthenticationError`` that says so, and no payload crosses the relay.

Someone on the path itself (rank 1's connection to rank 0's real address delivered to a proxy)
passes the handshake, as it must; with ``TENSORCOMM_LINK_PROTECTION=mac`` or ``encrypt`` a payload
bit it flips makes rank 1 fail with ``LinkAuthenticationError`` naming rank 0, never return the
altered data (at the default ``headers`` level data payloads are not covered: docs/security.md).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tensorcomm.rendezvous.auth import generate_secret, secret_bytes
from tensorcomm.rendezvous.tcp_store import TCPStore, TCPStoreServer

JOB_TIMEOUT = 60.0
pytestmark = [pytest.mark.fault, pytest.mark.timeout(JOB_TIMEOUT + 60)]
MARKER = b"TOP-SECRET-PAYLOAD-"
ROUNDS = 10
try:
    import cryptography  # noqa: F401 - only whether it is there
    HAVE_CRYPTO = True
except ImportError:
    HAVE_CRYPTO = False
NEEDS_CRYPTO = pytest.mark.skipif(not HAVE_CRYPTO, reason="encrypt needs tensorcomm[crypto] (cryptography)")

RANK = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    import tensorcomm as tc
    rank = int(sys.argv[1])
    if len(sys.argv) > 5:  # the network delivers this rank's data connections to an on-path proxy
        import socket
        dial, proxy = socket.create_connection, int(sys.argv[5])
        def on_path(address, *args, **kwargs):
            if int(address[1]) != int(os.environ["MASTER_PORT"]):
                address = ("127.0.0.1", proxy)
            return dial(address, *args, **kwargs)
        socket.create_connection = on_path
    marker = np.frombuffer(sys.argv[2].encode() * 1024, np.uint8)
    outcome = {"correct": 0, "wrong": 0, "error": None}
    try:
        tc.init(rank=rank, world_size=2, timeout=float(sys.argv[3]))
        for i in range(int(sys.argv[4])):
            if os.environ.get("TEST_OBJECTS"):  # the object collective, which unpickles
                objects = [bytes(marker)] if rank == 0 else [None]
                tc.broadcast_object_list(objects, src=0)
                outcome["correct" if objects[0] == bytes(marker) else "wrong"] += 1
                continue
            x = marker.copy() if rank == 0 else np.zeros_like(marker)
            tc.broadcast(x, src=0)
            outcome["correct" if np.array_equal(x, marker) else "wrong"] += 1
        tc.destroy()
    except Exception as exc:
        outcome["error"] = f"{type(exc).__name__}: {exc}"
        outcome["classes"] = [cls.__name__ for cls in type(exc).__mro__]
    print("OUTCOME " + json.dumps(outcome), flush=True)
""")

RELAY = textwrap.dedent("""
    import socket, sys, threading
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)
    target, mode, log = sys.argv[1], sys.argv[2], sys.argv[3]
    # exec mode: a pickle that writes a file when unpickled, padded to the length it replaces
    evil = b"cbuiltins\\nexec\\n(Vopen(" + repr(log + ".ran").encode() + b", 'w').close()\\ntR."
    seen = open(log, "wb")
    flipped = []
    def pump(src, dst, tamper):
        try:
            while data := src.recv(65536):
                seen.write(data)
                seen.flush()
                if tamper and mode == "relay-tamper":  # payload bytes only, headers as they were
                    data = data.replace(b"SECRET", b"secret")
                elif tamper and mode == "exec" and (start := data.find(b"\\x80\\x05")) >= 0 \\
                        and len(data) - start > len(evil) and b"SECRET" in data[start:]:
                    data = data[:start] + evil + data[start + len(evil):]
                elif tamper and mode == "on-path" and len(data) >= 8192 and not flipped:
                    flipped.append(1)  # one bit in the middle of a large read: a payload's
                    middle = len(data) // 2
                    data = data[:middle] + bytes([data[middle] ^ 1]) + data[middle + 1:]
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
    near, _ = listener.accept()
    host, port = target.rsplit(":", 1)
    far = socket.create_connection((host, int(port)))
    threads = [threading.Thread(target=pump, args=(near, far, False)),
               threading.Thread(target=pump, args=(far, near, mode != "read"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
""")


# A join entry (core/world.py's _Joined: shm, process space, pid, start time, TCP address, host)
# written in rank 1's place: no shared memory, so rank 0 waits for rank 1 to dial it.
_STAND_IN = "\n".join(("0", "", "0", "0", "", socket.gethostname())).encode()
_JOIN_0 = "tensorcomm/0/join/0"
_ADDRESS = 4  # the field of a join entry that says where its rank's TCP listener is


def _address_of_rank_0(store: TCPStore) -> str:
    return store.get(_JOIN_0, timeout=JOB_TIMEOUT).decode().split("\n")[_ADDRESS]


def _redirect_rank_0(store: TCPStore, address: str) -> None:
    """Rewrite rank 0's join entry so that rank 1 dials ``address`` instead."""
    fields = store.get(_JOIN_0).decode().split("\n")
    fields[_ADDRESS] = address
    store.set(_JOIN_0, "\n".join(fields).encode())


def _rank(rank: int, port: int, secret: str, timeout: float, proxy: int | None = None,
          protection: str = "headers", objects: bool = False) -> subprocess.Popen[str]:
    env = {**os.environ, "TENSORCOMM_SECRET": secret, "TENSORCOMM_STORE_HOSTED": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TENSORCOMM_TRANSPORT": "tcp",
           "TENSORCOMM_LINK_PROTECTION": protection,
           "TENSORCOMM_JOIN_TIMEOUT": str(timeout)}  # a rank left waiting gives up, not killed
    if objects:
        env["TEST_OBJECTS"] = "1"
    command = [sys.executable, "-c", RANK, str(rank), MARKER.decode(), str(timeout), str(ROUNDS)]
    command += [] if proxy is None else [str(proxy)]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _outcome(proc: subprocess.Popen[str]) -> dict:
    try:
        output, _ = proc.communicate(timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        return {"error": "killed at the timeout", "output": output}
    for line in output.splitlines():
        if line.startswith("OUTCOME "):
            return json.loads(line[len("OUTCOME "):])
    return {"error": f"no outcome (exit {proc.returncode})", "output": output}


@pytest.mark.parametrize("mode", ["read", "relay-tamper", "exec"])
def test_a_relay_in_rank_0s_place_reads_and_alters_nothing(mode: str, tmp_path: Path) -> None:
    # exec: the ranks broadcast an object, and the relay swaps its pickle for one that runs code
    # (creates relay.bytes.ran) when rank 1 unpickles it.
    objects = mode == "exec"
    secret = generate_secret()
    seen = tmp_path / "relay.bytes"
    with TCPStoreServer("127.0.0.1", 0, secret_bytes(secret)) as server, \
            TCPStore("127.0.0.1", server.port, secret_bytes(secret), timeout=10) as attacker:
        attacker.set("tensorcomm/0/join/1", _STAND_IN)  # rank 0 goes ahead alone
        rank_0 = _rank(0, server.port, secret, timeout=10, objects=objects)
        relay = None
        try:
            real = _address_of_rank_0(attacker)
            relay, relay_port = _start_relay(real, mode, seen)
            _redirect_rank_0(attacker, f"127.0.0.1:{relay_port}")
            rank_1 = _rank(1, server.port, secret, timeout=10, objects=objects)
            outcomes = [_outcome(rank_0), _outcome(rank_1)]
        finally:
            for proc in (rank_0, relay):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
    relayed = seen.read_bytes() if seen.exists() else b""
    assert not Path(f"{seen}.ran").exists(), f"the relay's pickle ran code in rank 1: {outcomes}"
    assert MARKER not in relayed, f"the relay read the payload: {outcomes}"
    assert all(outcome.get("wrong", 0) == 0 for outcome in outcomes), outcomes
    # Rank 1 learns why: the link it dialled was refused as not rank 0's.
    assert "AuthenticationError" in outcomes[1]["classes"], outcomes
    assert "address the client dialled is not this server's" in outcomes[1]["error"], outcomes
    assert outcomes[0]["error"] is not None and outcomes[0].get("correct", 0) == 0, outcomes


def _start_relay(target: str, mode: str, seen: Path) -> tuple[subprocess.Popen[str], int]:
    relay = subprocess.Popen([sys.executable, "-c", RELAY, target, mode, str(seen)],
                             stdout=subprocess.PIPE, text=True)
    assert relay.stdout is not None
    return relay, int(relay.stdout.readline())


@pytest.mark.parametrize("protection", ["mac", pytest.param("encrypt", marks=NEEDS_CRYPTO)])
def test_a_payload_altered_on_the_path_fails_the_link_naming_the_sender(protection: str,
                                                                       tmp_path: Path) -> None:
    # Someone on the path (here: the network delivers rank 1's data connection to a proxy that
    # forwards it to rank 0's real address): the handshake passes, as it should, and the proxy
    # flips one payload bit on the way to rank 1.
    secret = generate_secret()
    with TCPStoreServer("127.0.0.1", 0, secret_bytes(secret)) as server, \
            TCPStore("127.0.0.1", server.port, secret_bytes(secret), timeout=10) as store:
        store.set("tensorcomm/0/join/1", _STAND_IN)  # rank 0 goes first
        rank_0 = _rank(0, server.port, secret, timeout=15, protection=protection)
        relay = None
        try:
            real = _address_of_rank_0(store)
            relay, relay_port = _start_relay(real, "on-path", tmp_path / "relay.bytes")
            rank_1 = _rank(1, server.port, secret, timeout=15, proxy=relay_port, protection=protection)
            outcomes = [_outcome(rank_0), _outcome(rank_1)]
        finally:
            for proc in (rank_0, relay):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
    assert all(outcome.get("wrong", 0) == 0 for outcome in outcomes), outcomes
    assert "LinkAuthenticationError" in outcomes[1]["classes"], outcomes
    assert "the link to rank 0 failed authentication" in outcomes[1]["error"], outcomes


def test_the_same_job_without_a_relay_runs(tmp_path: Path) -> None:
    # The harness itself works: with rank 0's own address left alone, the broadcasts arrive.
    secret = generate_secret()
    with TCPStoreServer("127.0.0.1", 0, secret_bytes(secret)) as server:
        ranks = [_rank(r, server.port, secret, timeout=30) for r in range(2)]
        outcomes = [_outcome(proc) for proc in ranks]
    assert [outcome["correct"] for outcome in outcomes] == [ROUNDS, ROUNDS], outcomes
