"""What a local stranger can and cannot do to a job (issue 10): no job runs on a key a stranger
can know, no file or socket trusts another user, a silent connection delays nobody, a flood of
connections costs bounded threads and descriptors, and a huge timeout is an argument error.

Ranks are threads here (each with its own store client, mesh or mapping, as in real jobs);
"another user" is a child process run as ``nobody`` and needs root, else those tests skip.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tensorcomm import config
from tensorcomm.errors import AuthenticationError, RendezvousError
from tensorcomm.rendezvous import FileStore, Rendezvous, TCPStore, TCPStoreServer, rendezvous, tcp_store
from tensorcomm.rendezvous.auth import JobKey, handshake_client, secret_bytes
from tensorcomm.rendezvous.store import HashStore
from tensorcomm.testing import free_port
from tensorcomm.transports.shm import arena
from tensorcomm.transports.tcp.mesh import connect_mesh

pytestmark = pytest.mark.fault

OLD_FIXED_KEY = b"tensorcomm-loopback-default-secret-not-private"  # what 8ec3e14 used
NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="running a process as another user needs root")
SECRET = secret_bytes("security-test-secret")  # the key, as handshakes use it


def in_threads(count: int, fn: Callable[[int], Any], timeout: float = 60.0) -> list[Any]:
    """Run ``fn(i)`` in ``count`` threads; return results (or the exceptions raised) by index."""
    results: list[Any] = [None] * count

    def run(i: int) -> None:
        try:
            results[i] = fn(i)
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(thread.is_alive() for thread in threads), "a thread hung"
    return results


def ok(results: list[Any]) -> list[Any]:
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


@pytest.fixture
def private_dir(tmp_path: Path) -> Path:
    path = tmp_path / "secrets"
    path.mkdir(mode=0o700)
    return path


def env_for(private_dir: Path, **extra: str) -> dict[str, str]:
    return {config.ENV_SECRET_DIR: str(private_dir), **extra}


# --- 1. no job runs on a key a stranger can know ---

def test_a_loopback_job_without_secret_refuses_the_old_fixed_key(private_dir: Path) -> None:
    port = free_port()
    url, env = f"tcp://127.0.0.1:{port}", env_for(private_dir)
    rdvs = ok(in_threads(2, lambda rank: rendezvous(url, rank, 2, 10.0, environ=env)))
    try:
        assert rdvs[0].secret == rdvs[1].secret != OLD_FIXED_KEY
        assert len(bytes.fromhex(rdvs[0].secret.decode().removeprefix("generated:"))) == 32
        with pytest.raises(AuthenticationError):
            TCPStore("127.0.0.1", port, JobKey(OLD_FIXED_KEY), timeout=2)
    finally:
        for rdv in reversed(rdvs):
            rdv.close()


def test_two_jobs_get_different_secrets(private_dir: Path) -> None:
    secrets = []
    for _ in range(2):
        url = f"tcp://127.0.0.1:{free_port()}"
        rdvs = ok(in_threads(2, lambda rank, url=url: rendezvous(url, rank, 2, 10.0,
                                                                 environ=env_for(private_dir))))
        secrets.append(rdvs[0].secret)
        for rdv in reversed(rdvs):
            rdv.close()
    assert secrets[0] != secrets[1]


def test_the_generated_secret_lives_in_a_private_file_until_the_store_closes(private_dir: Path) -> None:
    host = rendezvous(f"tcp://127.0.0.1:{free_port()}", 0, 2, 10.0, environ=env_for(private_dir))
    try:
        (entry,) = list(private_dir.iterdir())
        info = entry.lstat()
        assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
        assert info.st_uid == os.geteuid()
        assert entry.read_bytes() == host.secret
    finally:
        host.close()
    assert list(private_dir.iterdir()) == []


def test_the_default_directory_is_made_private(tmp_path: Path) -> None:
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    host = rendezvous(f"tcp://127.0.0.1:{free_port()}", 0, 2, 10.0,
                      environ={"XDG_RUNTIME_DIR": str(runtime)})
    with host:
        (entry,) = list((runtime / "tensorcomm").iterdir())
        assert entry.read_bytes() == host.secret
        assert stat.S_IMODE((runtime / "tensorcomm").stat().st_mode) == 0o700


@pytest.mark.parametrize("problem", ["group-readable", "symlink", "missing-parent", "other-owner"])
def test_an_unsafe_secret_directory_is_refused(tmp_path: Path, problem: str) -> None:
    target = tmp_path / "secrets"
    if problem == "group-readable":
        target.mkdir(mode=0o700)
        target.chmod(0o750)
        expected = "permission"
    elif problem == "symlink":
        (tmp_path / "real").mkdir(mode=0o700)
        target.symlink_to(tmp_path / "real")
        expected = "symbolic link"
    elif problem == "missing-parent":
        target = tmp_path / "no" / "such" / "dir"
        expected = "cannot"
    else:
        if os.geteuid() != 0:
            pytest.skip("making a directory owned by another user needs root")
        target.mkdir(mode=0o700)
        os.chown(target, NOBODY, NOBODY)
        expected = f"owned by uid {NOBODY}"
    start = time.monotonic()
    with pytest.raises(RendezvousError, match=expected) as caught:
        rendezvous(f"tcp://127.0.0.1:{free_port()}", 0, 2, 10.0, environ=env_for(target))
    assert str(target) in str(caught.value) and config.ENV_SECRET in str(caught.value)
    assert time.monotonic() - start < 5  # refused at once, not at the timeout


def test_members_outwait_a_stale_file_and_the_host_replaces_it(private_dir: Path) -> None:
    port = free_port()
    url, env = f"tcp://127.0.0.1:{port}", env_for(private_dir)
    first = rendezvous(url, 0, 2, 10.0, environ=env)
    (entry,) = list(private_dir.iterdir())
    first.close()
    # As left by a SIGKILLed earlier job on the same port: its file, another secret.
    fd = os.open(entry, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"0" * 64)
    os.close(fd)

    def join(rank: int) -> Rendezvous:
        if rank == 0:
            time.sleep(0.5)  # the member reads the stale file first
        return rendezvous(url, rank, 2, 20.0, environ=env)

    rdvs = ok(in_threads(2, join))
    try:
        assert rdvs[0].secret == rdvs[1].secret != b"0" * 64
        assert entry.read_bytes() == rdvs[0].secret
    finally:
        for rdv in reversed(rdvs):
            rdv.close()


PLAIN_ENV_JOB = textwrap.dedent("""
    import numpy as np, tensorcomm as tc
    for world in range(3):  # destroy() and init() again: each world gets a fresh secret
        tc.init(timeout=60)
        x = np.full(4, tc.get_rank() + 1, np.float32)
        tc.all_reduce(x)
        print(f"world {world}: rank {tc.get_rank()} got {x[0]:g}", flush=True)
        tc.destroy()
""")


def test_a_plain_env_job_without_secret_runs_on_a_private_one(private_dir: Path) -> None:
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TENSORCOMM_", "MASTER_"))}
    base.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "3",
                 config.ENV_SECRET_DIR: str(private_dir)})
    ranks = [subprocess.Popen([sys.executable, "-c", PLAIN_ENV_JOB], env={**base, "RANK": str(rank)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(3)]
    outputs = []
    for rank in ranks:
        try:
            outputs.append(rank.communicate(timeout=90)[0])
        finally:
            rank.kill()
    assert [rank.returncode for rank in ranks] == [0, 0, 0], outputs
    assert all(f"world {w}: rank {r} got 6" in outputs[r] for r in range(3) for w in range(3)), outputs
    assert list(private_dir.iterdir()) == []  # rank 0 removed the secret with the store


def test_a_non_loopback_store_without_secret_is_refused_at_once() -> None:
    start = time.monotonic()
    with pytest.raises(RendezvousError, match=r"TENSORCOMM_SECRET is not set.*192\.0\.2\.1.*generate_secret"):
        rendezvous(None, 1, 2, 20.0, environ={"MASTER_ADDR": "192.0.2.1", "MASTER_PORT": "29500"})
    assert time.monotonic() - start < 5


def test_a_hosted_store_without_secret_is_refused_at_once() -> None:
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "TENSORCOMM_STORE_HOSTED": "1"}
    start = time.monotonic()
    with pytest.raises(RendezvousError, match=r"TENSORCOMM_STORE_HOSTED.*TENSORCOMM_SECRET"):
        rendezvous(None, 1, 2, 20.0, environ=env)
    assert time.monotonic() - start < 5


class RecordingTorchStore:
    """A torch store stand-in that remembers every value written to it."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self._store = dist.HashStore()
        self.written: list[bytes] = []

    def set(self, key: str, value: Any) -> None:
        self.written.append(bytes(value))
        self._store.set(key, value)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def _torchstore_ranks(store: RecordingTorchStore, envs: list[dict[str, str]],
                      timeout: float) -> list[Any]:
    from tensorcomm.rendezvous.discovery import discover
    from tensorcomm.rendezvous.init_method import from_store
    from tensorcomm.rendezvous.torch_store import TorchStore

    def join(rank: int) -> Rendezvous:  # as the torch backend meets on the store torch gives it
        bridge = TorchStore(store, timeout, discover(envs[rank]))  # type: ignore[arg-type]
        return from_store(bridge, rank, len(envs), timeout, environ=envs[rank])

    return in_threads(len(envs), join)


def test_the_secret_never_travels_through_torchs_store(private_dir: Path) -> None:
    pytest.importorskip("torch")
    store = RecordingTorchStore()
    rdvs = ok(_torchstore_ranks(store, [env_for(private_dir)] * 2, 10.0))
    try:
        assert rdvs[0].secret == rdvs[1].secret
        assert store.written and not any(rdvs[0].secret in value for value in store.written)
    finally:
        for rdv in reversed(rdvs):
            rdv.close()
    assert list(private_dir.iterdir()) == []


def test_ranks_on_another_host_are_refused_at_once_under_torch(private_dir: Path) -> None:
    pytest.importorskip("torch")
    envs = [env_for(private_dir, TENSORCOMM_HOST_ID=host) for host in ("host-a", "host-b")]
    start = time.monotonic()
    results = _torchstore_ranks(RecordingTorchStore(), envs, 20.0)
    assert all(isinstance(result, RendezvousError) for result in results), results
    assert "host-a" in str(results[1]) and config.ENV_SECRET in str(results[1])
    assert "rank 1" in str(results[0]) and "host-a" in str(results[0])  # rank 0 stops too
    assert time.monotonic() - start < 10  # well under the 20 s timeout


# --- 1b. Unix sockets check the peer's uid ---

def _leader_and_member(secret: bytes, before_member: Callable[[str], None] | None = None,
                       timeout: float = 20.0) -> tuple[list[Any], float]:
    """Set up a 2-member segment with threads; ``before_member(address)`` runs first."""
    store = HashStore(timeout=30)

    def member_ready(rank: int) -> arena.Arena:
        if rank == 1 and before_member is not None:
            before_member(store.get("address", timeout=20).decode())
        return arena.establish(rank, 2, 4096, secret, lambda a: store.set("address", a.encode()),
                               lambda s: store.get("address").decode() if store.check(["address"]) else None,
                               lambda: None, timeout)

    start = time.monotonic()
    results = in_threads(2, member_ready)
    return results, time.monotonic() - start


HELLO_AND_READ = textwrap.dedent("""
    import socket, sys
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect("\\0" + sys.argv[1])
    try:
        sock.sendall(b"TCAU\\x01H" + bytes(32))
        print(len(sock.recv(100)))
    except OSError:  # closed (or reset) before the leader said a word
        print(0)
""")


@needs_root
def test_the_segment_leader_refuses_another_user(caplog: pytest.LogCaptureFixture,
                                                  nobody_python: str) -> None:
    caplog.set_level(logging.WARNING, logger="tensorcomm.shm")
    answers: list[str] = []

    def stranger(address: str) -> None:
        done = subprocess.run([nobody_python, "-c", HELLO_AND_READ, address], user=NOBODY,
                              capture_output=True, text=True, timeout=30)
        answers.append(done.stdout.strip() + done.stderr)

    results, _ = _leader_and_member(SECRET, stranger)
    for result in ok(results):
        result.close()
    assert answers == ["0"], answers  # closed before the leader proved anything
    assert f"uid {NOBODY}" in caplog.text


FAKE_LEADER = textwrap.dedent("""
    import socket, sys, time
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\\0" + sys.argv[1])
    listener.listen(4)
    print("ready", flush=True)
    conn, _ = listener.accept()
    time.sleep(20)
""")


@needs_root
def test_a_member_refuses_a_leader_of_another_user(nobody_python: str) -> None:
    address = f"tensorcomm-test-{os.getpid()}-{time.monotonic_ns()}"
    leader = subprocess.Popen([nobody_python, "-c", FAKE_LEADER, address], user=NOBODY,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert leader.stdout is not None and leader.stdout.readline().strip() == "ready"
        start = time.monotonic()
        with pytest.raises(arena.ShmUnavailable, match=f"uid {NOBODY}"):
            arena.establish(1, 2, 4096, SECRET, lambda a: None, lambda s: address, lambda: None, 20.0)
        assert time.monotonic() - start < 10
    finally:
        leader.kill()
        leader.wait()


# --- 2. file:// trusts no file someone else made ---

@pytest.mark.parametrize("problem", ["world-readable", "other-owner", "symlink"])
def test_file_store_refuses_a_file_it_did_not_make_private(tmp_path: Path, problem: str) -> None:
    path = tmp_path / "rdv"
    if problem == "world-readable":
        path.touch()
        path.chmod(0o666)
        expected = "mode 0666"
    elif problem == "other-owner":
        if os.geteuid() != 0:
            pytest.skip("making a file owned by another user needs root")
        path.touch()
        os.chown(path, NOBODY, NOBODY)
        path.chmod(0o600)
        expected = f"owned by uid {NOBODY}"
    else:
        (tmp_path / "elsewhere").touch(mode=0o600)
        path.symlink_to(tmp_path / "elsewhere")
        expected = "symbolic link"
    with pytest.raises(RendezvousError, match=expected) as caught:
        rendezvous(f"file://{path}", 0, 2, 5.0, environ={})
    assert str(path) in str(caught.value)
    target = tmp_path / "elsewhere" if problem == "symlink" else path
    assert target.read_bytes() == b""  # the secret was not written


def test_file_store_creates_its_file_private(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        store = FileStore(str(tmp_path / "rdv"), timeout=1)
    finally:
        os.umask(old)
    with store:
        assert stat.S_IMODE((tmp_path / "rdv").stat().st_mode) == 0o600


# --- 3. a silent connection delays nobody ---

def test_a_silent_local_connection_does_not_stall_the_segment() -> None:
    silent: list[socket.socket] = []

    def connect_silently(address: str) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect("\0" + address)
        silent.append(sock)
        time.sleep(0.3)  # the leader accepts it before the real member

    results, elapsed = _leader_and_member(SECRET, connect_silently, timeout=20.0)
    for result in ok(results):
        result.close()
    assert elapsed < 10, f"set-up took {elapsed:.1f} s with a silent connection (timeout 20 s)"
    silent[0].settimeout(config.HANDSHAKE_TIMEOUT + 10)
    assert silent[0].recv(1) == b""  # dropped at its own handshake deadline
    silent[0].close()


def test_a_silent_stranger_on_a_data_listener_delays_nobody() -> None:
    store = HashStore(timeout=30)
    strangers: list[socket.socket] = []

    def rank_main(rank: int) -> dict[int, socket.socket]:
        if rank > 0:
            address = store.get("tcp/addr/0", timeout=20).decode()
            if rank == 1:
                host, port = address.rsplit(":", 1)
                strangers.append(socket.create_connection((host, int(port))))
                time.sleep(0.3)
            else:
                store.get("stranger-in", timeout=20)
        if rank == 1:
            store.set("stranger-in", b"1")
        return connect_mesh(rank, 3, store, SECRET, "127.0.0.1", timeout=20)

    start = time.monotonic()
    meshes = ok(in_threads(3, rank_main))
    elapsed = time.monotonic() - start
    for mesh in meshes:
        assert len(mesh) == 2
        for sock, _ in mesh.values():
            sock.close()
    strangers[0].close()
    assert elapsed < 10, f"the mesh took {elapsed:.1f} s with a silent stranger (timeout 20 s)"


# --- 4. floods cost bounded threads and descriptors ---

def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_flood_of_silent_connections_is_bounded(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tensorcomm.store")
    flood = config.MAX_SILENT_CONNECTIONS + 44
    threads_before, fds_before = threading.active_count(), _open_fds()
    with TCPStoreServer("127.0.0.1", 0, SECRET) as server:
        clients = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(flood)]
        try:
            time.sleep(1.0)  # let the server accept them all
            grown_threads = threading.active_count() - threads_before
            grown_fds = _open_fds() - fds_before - flood  # the server's side only
            assert grown_threads <= 4, grown_threads  # silent ones wait in one selector thread
            assert grown_fds <= config.MAX_SILENT_CONNECTIONS + 8, grown_fds
            # The oldest made room for the newest, long before any handshake deadline.
            clients[0].settimeout(config.HANDSHAKE_TIMEOUT / 2)
            assert clients[0].recv(1) == b""
            start = time.monotonic()
            with TCPStore("127.0.0.1", server.port, SECRET, timeout=20) as good:
                good.set("k", b"v")
                assert good.get("k") == b"v"
            # A real client speaks first, so the silent ones do not hold it back at all.
            assert time.monotonic() - start < 15
        finally:
            for sock in clients:
                sock.close()
    assert "dropped a silent connection" in caplog.text and "waiting to speak" in caplog.text


def test_a_store_at_its_connection_limit_refuses_more(monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tensorcomm.store")
    monkeypatch.setattr(tcp_store, "MAX_STORE_CLIENTS", 2)
    with TCPStoreServer("127.0.0.1", 0, SECRET) as server:
        first = TCPStore("127.0.0.1", server.port, SECRET, timeout=5)
        second = TCPStore("127.0.0.1", server.port, SECRET, timeout=5)
        start = time.monotonic()
        with pytest.raises(RendezvousError, match="refused"):
            TCPStore("127.0.0.1", server.port, SECRET, timeout=1)
        assert time.monotonic() - start < 5
        second.close()
        with TCPStore("127.0.0.1", server.port, SECRET, timeout=5) as third:  # a slot is free again
            third.set("k", b"v")
        first.close()
    assert "2 connections" in caplog.text


OUT_OF_DESCRIPTORS = textwrap.dedent("""
    import logging, os, resource, socket, sys, threading, time
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
    from tensorcomm.rendezvous.store import HashStore
    from tensorcomm.rendezvous.tcp_store import TCPStoreServer
    from tensorcomm.transports.tcp.mesh import connect_mesh
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    def exhaust():
        held = []
        while True:
            try:
                held.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                return held

    if sys.argv[1] == "mesh":
        store, outcome = HashStore(), []
        def rank0():
            try:
                connect_mesh(0, 2, store, b"k", "127.0.0.1", timeout=20)
                outcome.append("connected")
            except Exception as exc:
                outcome.append(f"{type(exc).__name__}: {exc}")
        thread = threading.Thread(target=rank0)
        thread.start()
        host, port = store.get("tcp/addr/0", timeout=10).decode().rsplit(":", 1)
        client = socket.socket()
        start = time.monotonic()
        held = exhaust()
        client.connect((host, int(port)))
        thread.join(30)
        print(outcome[0], f"after {time.monotonic() - start:.1f} s")
    else:
        server = TCPStoreServer("127.0.0.1", 0, b"a-secret-of-16+bytes")
        client = socket.socket()
        held = exhaust()
        client.connect(("127.0.0.1", server.port))
        time.sleep(2)
        print("end")
""")


def _out_of_descriptors(kind: str) -> str:
    done = subprocess.run([sys.executable, "-c", OUT_OF_DESCRIPTORS, kind], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_running_out_of_descriptors_names_the_limit_not_the_peers() -> None:
    output = _out_of_descriptors("mesh")
    assert "RendezvousError" in output and "descriptor limit" in output and "128" in output, output
    assert "did not connect" not in output, output
    seconds = float(output.rsplit("after ", 1)[1].split()[0])
    assert seconds < 10, output  # at once, not at the 20 s timeout


def test_the_store_server_logs_the_descriptor_limit_once_in_a_while() -> None:
    output = _out_of_descriptors("store")
    lines = [line for line in output.splitlines() if "descriptor limit" in line]
    assert lines and "128" in lines[0], output
    assert len(lines) <= 2, output  # not one line per retry


# --- 5. a huge timeout is an argument error, never an OverflowError ---

@pytest.mark.parametrize("timeout", [1e10, 1e300])
def test_huge_timeouts_name_the_argument(timeout: float, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="timeout"):
        rendezvous("tcp://127.0.0.1:1", 0, 1, timeout, environ={})
    with pytest.raises(ValueError, match="timeout"):
        HashStore(timeout=timeout)
    with TCPStoreServer("127.0.0.1", 0, SECRET) as server, \
            TCPStore("127.0.0.1", server.port, SECRET, timeout=5) as client:
        with pytest.raises(ValueError, match="timeout"):
            client.get("k", timeout=timeout)
        client.set("k", b"v")  # the client is still usable
        assert client.get("k") == b"v"


def test_the_server_survives_a_huge_timeout_on_the_wire() -> None:
    crashed: list[Any] = []
    saved = threading.excepthook
    threading.excepthook = lambda args: crashed.append(args.exc_value)
    try:
        with TCPStoreServer("127.0.0.1", 0, SECRET) as server:
            raw = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            with raw:
                handshake_client(raw, SECRET, 5, b"store", address=f"127.0.0.1:{server.port}")
                raw.sendall(struct.pack("!BHQd", tcp_store.GET, 1, 0, 1e300) + b"k")
                time.sleep(0.3)
                with TCPStore("127.0.0.1", server.port, SECRET, timeout=5) as other:
                    other.set("k", b"late")
                status, length = struct.unpack("!BQ", raw.recv(9))
                assert (status, raw.recv(length)) == (tcp_store.OK, b"late")
    finally:
        threading.excepthook = saved
    assert crashed == []


@pytest.fixture(autouse=True)
def _no_leftover_threads() -> Iterator[None]:
    yield
    # Handshake threads end at their own deadline; none may outlive it by much.
    deadline = time.monotonic() + config.HANDSHAKE_TIMEOUT + 5
    while True:
        left = [t.name for t in threading.enumerate() if t.name.startswith("tensorcomm-handshake")]
        if not left:
            break
        assert time.monotonic() < deadline, f"handshake threads outlived their deadline: {left}"
        time.sleep(0.05)
