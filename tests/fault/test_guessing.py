"""A stranger who guesses the job secret offline: a user-set ``TENSORCOMM_SECRET`` that is short
is refused, and every user-set secret is stretched with scrypt before any MAC, so the proofs a
stranger can collect no longer answer a guess for the price of one HMAC.

The stranger is a standard-library script run as ``nobody`` (needs root, else those tests skip).
It collects what any local user can: the store's proof in answer to one HELLO (a job of
``tensorcomm run``), and the announcement of tensorcomm's own store in torch's store (the torchrun
path); then it tries a word list that holds the job's (guessable, but long enough) passphrase,
as the issue's dictionary attack did, with one HMAC per guess. It must find nothing, and the
collected MACs must verify under scrypt(secret): the key really is the stretched one.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tensorcomm import config
from tensorcomm.rendezvous import auth
from tensorcomm.rendezvous.discovery import discover
from tensorcomm.rendezvous.init_method import from_store, rendezvous
from tensorcomm.rendezvous.own_store import PURPOSE
from tensorcomm.rendezvous.store import HashStore
from tensorcomm.rendezvous.tcp_store import TCPStoreServer
from tensorcomm.testing import free_port

from torch_store_client import CLIENT  # same directory

pytestmark = [pytest.mark.fault, pytest.mark.timeout(180)]

NOBODY = 65534
PASSPHRASE = "correct horse battery staple"  # 28 bytes: long enough, and in the stranger's list
SHORT = "Summer2024!"
RECIPE = r"at least 16 bytes .*secrets\.token_hex\(32\)"


def _words() -> str:
    """A stranger's word list: some filler, and the passphrase."""
    filler = [f"{a} {b} {c} {d}" for a in ("red", "tall", "correct", "blue") for b in ("horse", "tree")
              for c in ("battery", "river", "lamp") for d in ("staple", "stone", "cloud")]
    return "\n".join([*filler, PASSPHRASE, "Summer2024!"])


def _stranger(python: str, script: str, *args: str) -> str:
    done = subprocess.run([python, "-c", script, *args], input=_words(), user=NOBODY, cwd="/",
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _field(output: str, name: str) -> bytes:
    line = next(line for line in output.splitlines() if line.startswith(name + " "))
    return bytes.fromhex(line.split()[1])


def _stretched(secret: str) -> bytes:
    """What the key must be: scrypt of the secret with the documented parameters."""
    return hashlib.scrypt(secret.encode(), salt=b"tensorcomm job secret v1", n=1 << 15, r=8, p=1,
                          maxmem=64 << 20, dklen=32)


# --- 1. short secrets are refused on every path a user can set one ---

def test_a_short_secret_is_refused_wherever_a_user_sets_one(tmp_path: Path) -> None:
    port = free_port()
    for url in (f"tcp://127.0.0.1:{port}", f"file://{tmp_path}/store"):
        with pytest.raises(ValueError, match=f"^TENSORCOMM_SECRET: the job secret is 11 bytes long; "
                                             f"{RECIPE}"):
            rendezvous(url, 0, 2, 5.0, environ={config.ENV_SECRET: SHORT})
    with pytest.raises(ValueError, match=f"^secret: .*{RECIPE}"):
        from_store(HashStore(), 0, 1, 5.0, secret=SHORT, environ={})
    with pytest.raises(ValueError, match=f"^secret: .*{RECIPE}"):
        TCPStoreServer("127.0.0.1", 0, SHORT)
    script = tmp_path / "rank.py"
    script.write_text("print('ran')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TENSORCOMM_", "MASTER_"))}
    done = subprocess.run([sys.executable, "-m", "tensorcomm", "run", "-n", "2", str(script)],
                          env={**env, config.ENV_SECRET: SHORT}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "ran" not in done.stdout, done.stdout + done.stderr
    assert "TENSORCOMM_SECRET: the job secret is 11 bytes long" in done.stderr, done.stderr
    assert 'python -c "import secrets; print(secrets.token_hex(32))"' in done.stderr, done.stderr


# --- 2. the store's proof: one HELLO, then guesses offline ---

ORACLE = textwrap.dedent("""
    import hmac, secrets, socket, struct, sys
    port, version = int(sys.argv[1]), int(sys.argv[2])
    header = b"TCAU" + bytes([version])
    address = f"127.0.0.1:{port}"
    hello = header + b"H" + struct.pack(">32siiIBB", secrets.token_bytes(32), -1, -1, 0, 0,
                                        len(address)) + address.encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    sock.sendall(hello)
    reply = b""
    while len(reply) < 6 + 36 + 32:
        chunk = sock.recv(6 + 36 + 32 - len(reply))
        if not chunk:
            raise SystemExit(f"closed after {reply!r}")
        reply += chunk
    proof, server_mac = reply[:6 + 36], reply[6 + 36:]
    transcript = bytes([5]) + b"store" + hello + proof
    for word in sys.stdin.read().splitlines():
        if hmac.digest(word.encode(), b"S" + transcript, "sha256") == server_mac:
            print("FOUND", word)
    print("TRANSCRIPT", transcript.hex())
    print("MAC", server_mac.hex())
""")

JOB = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import tensorcomm as tc
    work = Path(sys.argv[1])
    tc.init(timeout=30)
    (work / f"ready.{tc.get_rank()}").touch()
    deadline = time.monotonic() + 60
    while not (work / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    tc.destroy()
""")


def test_the_stores_proof_no_longer_answers_a_guess_of_the_secret(tmp_path: Path, nobody_python: str) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TENSORCOMM_", "MASTER_"))}
    job = subprocess.Popen([sys.executable, "-m", "tensorcomm", "run", "-n", "2", "--master",
                            f"127.0.0.1:{port}", str(script), str(tmp_path)],
                           env={**env, config.ENV_SECRET: PASSPHRASE}, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"ready.{r}").exists() for r in range(2)):
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()[0]
            time.sleep(0.05)
        output = _stranger(nobody_python, ORACLE, str(port), str(auth.VERSION))
    finally:
        (tmp_path / "release").touch()
        log = job.communicate(timeout=60)[0]
    assert job.returncode == 0, log
    assert "FOUND" not in output, output
    transcript, mac = _field(output, "TRANSCRIPT"), _field(output, "MAC")
    assert hmac.digest(_stretched(PASSPHRASE), b"S" + transcript, "sha256") == mac


# --- 3. torch's store: the announcement of tensorcomm's own store ---

ANNOUNCEMENT = CLIENT + textwrap.dedent("""
    import hmac, sys
    port = int(sys.argv[1])
    sock = connect(port)
    key = next(k for k in keys(sock) if k.endswith("own_store/address"))
    address, mac = get(sock, key).decode().split("\\n")
    full_key, generation = key.lstrip("/"), key.lstrip("/").split("/")[1]
    message = b"\\0".join([b"tensorcomm own store", full_key.encode(), generation.encode(),
                          str(port).encode(), address.encode()])
    for word in sys.stdin.read().splitlines():
        if hmac.new(word.encode(), message, "sha256").hexdigest() == mac:
            print("FOUND", word)
    print("MESSAGE", message.hex())
    print("MAC", mac)
""")


def test_the_announcement_in_torchs_store_no_longer_answers_a_guess(nobody_python: str) -> None:
    pytest.importorskip("torch")
    import torch.distributed as dist

    from tensorcomm.rendezvous.torch_store import TorchStore

    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, 1, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=30))
    joined: list = [None, None]

    def join(rank: int) -> None:
        client = dist.TCPStore("127.0.0.1", port, 1, is_master=False, timeout=datetime.timedelta(seconds=30))
        env = {config.ENV_SECRET: PASSPHRASE}
        joined[rank] = from_store(TorchStore(client, 20, discover(env)), rank, 2, 20, environ=env)

    threads = [threading.Thread(target=join, args=(rank,)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    try:
        assert all(joined), joined
        output = _stranger(nobody_python, ANNOUNCEMENT, str(port))
    finally:
        for rdv in reversed(joined):
            if rdv is not None:
                rdv.close()
        del server
    assert "FOUND" not in output, output
    message = _field(output, "MESSAGE")
    assert message.startswith(PURPOSE)
    mac = next(line.split()[1] for line in output.splitlines() if line.startswith("MAC "))
    assert hmac.new(_stretched(PASSPHRASE), message, "sha256").hexdigest() == mac
