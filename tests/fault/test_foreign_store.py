"""A stranger with access to torch's store (issue 21): under torchrun and through
``init_process_group(backend="tensorcomm")``, torch's TCPStore lets anyone who can connect list,
read and write its keys. tensorcomm keeps its rendezvous keys in a store of its own, so the
stranger sees no link or shared-memory address, cannot redirect a rank (at worst it stops the
start, with an error on every rank that says so), and cannot make a group give up shared memory.

The stranger is a standard-library script speaking torch's TCPStore protocol, run as ``nobody``
(needs root, else these tests skip). Rank 1 of each job waits for the stranger to finish its
move before it starts, so every run plays the attack out the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tensorcomm import config
from tensorcomm.testing import free_port
from tensorcomm.transports.shm import slots as shm_slots

from helpers import NOBODY
from torch_store_client import CLIENT  # same directory

pytest.importorskip("torch")

pytestmark = [pytest.mark.fault, pytest.mark.timeout(120)]

PAYLOAD = b"PAYLOAD-of-rank-0-not-for-strangers"
RENDEZVOUS_KEYS = ("join/", "tcp/addr", "shm/", "hier/", "group/")  # none may be in torch's store

JOB = textwrap.dedent("""
    import datetime, os, sys, time
    from pathlib import Path
    import numpy as np

    work, launcher = Path(sys.argv[1]), sys.argv[2]
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    def wait_for(name):
        deadline = time.monotonic() + 60
        while not (work / name).exists() and time.monotonic() < deadline:
            time.sleep(0.02)

    if rank == 1:
        wait_for("go")  # the stranger has made its move
    try:
        import tensorcomm as tc
        if launcher == "torchrun":
            tc.init(timeout=20)
        else:
            import torch.distributed as dist
            import tensorcomm.torch
            store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), size, is_master=rank == 0,
                                  wait_for_workers=False, timeout=datetime.timedelta(seconds=20))
            dist.init_process_group("tensorcomm", store=store, rank=rank, world_size=size,
                                    timeout=datetime.timedelta(seconds=20))
        payload = PAYLOAD_BYTES
        data = np.frombuffer(payload, np.uint8).copy() if rank == 0 else np.zeros(len(payload), np.uint8)
        tc.broadcast(data, src=0)
        print(f"rank {rank} got {data.tobytes()!r} over {tc.WORLD.transport_kind.name}", flush=True)
    except Exception as exc:
        print(f"rank {rank} failed: {type(exc).__name__}: {exc}", flush=True)
        sys.exit(0)  # so that torchrun does not stop the other rank before it reports
    (work / f"started.{rank}").touch()
    wait_for("release")  # the stranger reads the store meanwhile
""").replace("PAYLOAD_BYTES", repr(PAYLOAD))

# Standard library only, as ``nobody`` (``torch_store_client.CLIENT``: torch's TCPStore protocol).
STRANGER = CLIENT + textwrap.dedent("""
    import json, sys, threading

    port, mode = int(sys.argv[1]), sys.argv[2]
    deadline = time.monotonic() + 30
    sock = connect(port)

    listener = socket.create_server(("127.0.0.1", 0))
    dialled = []
    def accept():
        while True:
            conn, _ = listener.accept()
            dialled.append(1)
            conn.close()
    threading.Thread(target=accept, daemon=True).start()
    mine = f"127.0.0.1:{listener.getsockname()[1]}".encode()

    def move(found):
        # One look at the store: make the move if its keys are there yet; say what was done.
        for key in found:
            if mode == "tamper":
                if key.endswith("/join/0") and key[:-1] + "1" not in found:  # as in issue 21:
                    put(sock, key[:-1] + "1", get(sock, key))  # rank 0 goes on without rank 1
                if key.endswith("/tcp/addr/0"):
                    put(sock, key, mine)
                    return key
                if key.endswith("/own_store/address"):
                    put(sock, key, mine + b"\\n" + b"0" * 64)
                    return key
            if mode == "shm":
                if key.endswith("/join/0"):
                    put(sock, key[:-len("join/0")] + "shm/0/failed", b"rank 1: injected")
                    return key
                if key.endswith("/own_store/address"):  # where the world's keys would be
                    world = key[:-len("own_store/address")] + "tensorcomm/0/"
                    put(sock, world + "shm/0/failed", b"rank 1: injected")
                    return key
        return None

    done = None
    if mode == "read":
        found = keys(sock)
        print(json.dumps({key: get(sock, key).decode("latin-1") for key in found}), flush=True)
        sys.exit(0)
    while done is None and time.monotonic() < deadline:
        done = move(keys(sock))
        time.sleep(0.005)
    print(f"MOVED {done}", flush=True)
    sys.stdin.read()  # until the test is done with the job
    print(json.dumps({"moved": done, "dialled": len(dialled)}), flush=True)
""")


def _start_job(launcher: str, work: Path, port: int, secret: bool = False) -> list[subprocess.Popen[str]]:
    script = work / "job.py"
    script.write_text(JOB)
    secrets = work / "secrets"
    secrets.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TENSORCOMM_", "MASTER_", "TORCHELASTIC"))}
    env[config.ENV_SECRET_DIR] = str(secrets)  # no TENSORCOMM_SECRET: rank 0 generates one
    if secret:
        env[config.ENV_SECRET] = "foreign-store-test-secret"
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
               "127.0.0.1", "--master-port", str(port), str(script), str(work), launcher]
        return [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)]
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2")
    return [subprocess.Popen([sys.executable, str(script), str(work), launcher],
                             env={**env, "RANK": str(rank)}, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
            for rank in range(2)]


def _finish(procs: list[subprocess.Popen[str]], work: Path) -> str:
    (work / "release").touch()
    output = ""
    for proc in procs:
        try:
            output += proc.communicate(timeout=60)[0]
        finally:
            proc.kill()
    return output


def _wait_started(work: Path, procs: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + 60
    while not all((work / f"started.{r}").exists() for r in range(2)):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "the job did not start"
        time.sleep(0.05)


def _stranger(python: str, port: int, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen([python, "-c", STRANGER, str(port), mode], user=NOBODY, cwd="/",
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _got(output: str, rank: int, over: str) -> bool:
    return f"rank {rank} got {PAYLOAD!r} over {over}" in output


LAUNCHERS = ["torchrun", "init_process_group"]


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_stranger_reading_torchs_store_sees_no_rendezvous_key(launcher: str, tmp_path: Path,
                                                                 nobody_python: str) -> None:
    port = free_port()
    (tmp_path / "go").touch()
    procs = _start_job(launcher, tmp_path, port)
    try:
        _wait_started(tmp_path, procs)
        stranger = subprocess.run([nobody_python, "-c", STRANGER, str(port), "read"], user=NOBODY, cwd="/",
                                  capture_output=True, text=True, timeout=60)
    finally:
        output = _finish(procs, tmp_path)
    assert stranger.returncode == 0, stranger.stderr
    seen = json.loads(stranger.stdout)
    ours = [key for key in seen if "tensorcomm" in key]
    assert ours, seen  # the stranger did reach the store the job met on
    assert not [key for key in seen if any(part in key for part in RENDEZVOUS_KEYS)], seen
    assert all(PAYLOAD.decode() not in value for value in seen.values())
    assert all(f"rank {r} got {PAYLOAD!r}" in output for r in range(2)), output


@pytest.mark.parametrize("launcher, secret", [("torchrun", False), ("init_process_group", False),
                                              ("torchrun", True)])
def test_a_stranger_rewriting_an_address_in_torchs_store_redirects_nobody(
        launcher: str, secret: bool, tmp_path: Path, nobody_python: str) -> None:
    port = free_port()
    procs = _start_job(launcher, tmp_path, port, secret)
    stranger = _stranger(nobody_python, port, "tamper")
    try:
        assert stranger.stdout is not None
        moved = stranger.stdout.readline()
        assert moved.startswith("MOVED /"), (moved, stranger.stderr)  # it found a key to rewrite
        (tmp_path / "go").touch()
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"started.{r}").exists() for r in range(2)) \
                and any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        output = _finish(procs, tmp_path)
        report = json.loads(stranger.communicate("", timeout=30)[0])
    assert report["dialled"] == 0, (report, output)  # no rank ever dialled the stranger
    assert "got" not in output or all(f"rank {r} got {PAYLOAD!r}" in output for r in range(2)), output
    if "got" not in output:  # the start stopped: every rank says why
        for rank in range(2):
            assert f"rank {rank} failed: AuthenticationError" in output and "tampered with" in output, output


@pytest.mark.skipif(not shm_slots.SUPPORTED, reason="shared memory needs x86-64")
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_stranger_cannot_make_a_group_give_up_shared_memory(launcher: str, tmp_path: Path,
                                                             nobody_python: str) -> None:
    port = free_port()
    procs = _start_job(launcher, tmp_path, port)
    stranger = _stranger(nobody_python, port, "shm")
    try:
        assert stranger.stdout is not None
        moved = stranger.stdout.readline()
        assert moved.startswith("MOVED /"), (moved, stranger.stderr)
        (tmp_path / "go").touch()
        _wait_started(tmp_path, procs)
    finally:
        output = _finish(procs, tmp_path)
        stranger.communicate("", timeout=30)
    assert all(_got(output, rank, "SHM") for rank in range(2)), output


def test_only_torch_stores_over_tensorcomms_own_are_trusted() -> None:
    import torch.distributed as dist

    from tensorcomm.rendezvous import HashStore
    from tensorcomm.rendezvous.discovery import discover
    from tensorcomm.rendezvous.torch_store import TorchStore
    from tensorcomm.torch import _TorchOverTcStore

    over_ours = _TorchOverTcStore(HashStore(), "127.0.0.1", 1)  # torch's env:// under tensorcomm run
    assert not TorchStore(dist.PrefixStore("default_pg", over_ours), 5, discover({})).foreign
    assert TorchStore(dist.PrefixStore("default_pg", dist.HashStore()), 5, discover({})).foreign
