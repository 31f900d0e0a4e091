"""Strangers with access to torch's store, beyond tests/fault/test_foreign_store.py.

A stranger who copies one job's announcement of tensorcomm's own store into another job's
torch store (issue 21, round 3 review): with the same ``TENSORCOMM_SECRET`` (one user's jobs), or
with the other job's secret-file announcement copied too, the copy verifies unless the MAC binds
the store it was made for. Two jobs meet on two torch TCPStores at once; the stranger, a
standard-library script run as ``nobody``, copies job A's announcement into job B's store after
B's rank 0 made its own. B's rank 1 must refuse it as tampered with, not walk into job A.
A stranger who changes the count of inits splits the ranks into generations: the start fails,
and says why.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tensorcomm import config
from tensorcomm.errors import CommError, RendezvousError
from tensorcomm.rendezvous.discovery import discover
from tensorcomm.rendezvous.init_method import from_store
from tensorcomm.testing import free_port

from torch_store_client import CLIENT  # same directory

pytest.importorskip("torch")

import torch.distributed as dist

from tensorcomm.rendezvous.torch_store import TorchStore

pytestmark = [pytest.mark.fault, pytest.mark.timeout(150)]

NOBODY = 65534

RANK = textwrap.dedent("""
    import datetime, os, sys, time
    from pathlib import Path
    import torch.distributed as dist
    import tensorcomm as tc
    from tensorcomm.rendezvous.discovery import discover
    from tensorcomm.rendezvous.torch_store import TorchStore

    work, job, port, rank = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

    def wait_for(name):
        deadline = time.monotonic() + 60
        while not (work / name).exists() and time.monotonic() < deadline:
            time.sleep(0.02)

    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=30))
    if job == "B" and rank == 1:
        wait_for("go")  # the stranger has copied A's announcement into B's store
    try:
        # B's rank 0 waits here for its rank 1, which waits for the stranger: on a loaded machine
        # (three runs of this test at once) 10 s ran out first, B's torch store closed under the
        # stranger, and the test failed for that.
        tc.init(store=TorchStore(store, 60, discover()), rank=rank, world_size=2, timeout=60)
        print(f"{job} rank {rank} started", flush=True)
    except Exception as exc:
        print(f"{job} rank {rank} failed: {type(exc).__name__}: {exc}", flush=True)
    (work / f"{job}.{rank}").touch()
    if job == "A":
        wait_for("release")
""")

# Standard library only, as ``nobody`` (``torch_store_client.CLIENT``: torch's TCPStore protocol).
STRANGER = CLIENT + textwrap.dedent("""
    import sys

    port_a, port_b = int(sys.argv[1]), int(sys.argv[2])

    def announcement(sock):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for key in keys(sock):
                if key.endswith("own_store/address"):
                    return key, get(sock, key)
            time.sleep(0.02)
        raise SystemExit("no announcement")

    key, value = announcement(connect(port_a))
    b = connect(port_b)
    announcement(b)  # B's rank 0 has announced: replace it with A's
    put(b, key, value)
    print("COPIED" if get(b, key) == value else "NOT COPIED", flush=True)
""")


def test_an_announcement_copied_from_another_job_is_refused(tmp_path: Path, nobody_python: str) -> None:
    python = nobody_python
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TENSORCOMM_", "MASTER_", "TORCHELASTIC"))}
    env[config.ENV_SECRET] = "one-users-secret-for-every-job"
    ports = {"A": free_port(), "B": free_port()}
    procs = []
    try:
        procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path), job, str(ports[job]),
                                   str(rank)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)
                 for job in "AB" for rank in range(2)]
        stranger = subprocess.run([python, "-c", STRANGER, str(ports["A"]), str(ports["B"])], user=NOBODY,
                                  cwd="/", capture_output=True, text=True, timeout=60)
        assert "COPIED" in stranger.stdout, stranger.stderr
        (tmp_path / "go").touch()
        deadline = time.monotonic() + 60  # every rank has ended its init before A's may exit
        while (not all((tmp_path / name).exists() for name in ("A.0", "A.1", "B.1"))
               and time.monotonic() < deadline):
            time.sleep(0.05)
    finally:
        (tmp_path / "release").touch()
        output = ""
        for proc in procs:
            try:
                output += proc.communicate(timeout=60)[0]
            finally:
                proc.kill()
    assert "B rank 1 failed: AuthenticationError" in output and "tampered" in output, output
    # Job A, whose announcement was copied, is neither redirected nor refused.
    assert "A rank 0 started" in output and "A rank 1 started" in output, output


JOINS = CLIENT + textwrap.dedent("""
    import sys
    sock = connect(int(sys.argv[1]))
    key = "/tensorcomm/joins"  # torch's clients put "/" first; as if one init counted itself
    put(sock, key, b"1")
    get(sock, key)  # answered once the set is done
""")



def test_a_bumped_count_of_inits_is_named_when_the_start_times_out(nobody_python: str) -> None:
    """A stranger sets torch's count of inits before the ranks count themselves: they land in
    different generations and time out; the error says why (in 3 s here)."""
    python = nobody_python
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, 1, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=30))
    subprocess.run([python, "-c", JOINS, str(port)], user=NOBODY, cwd="/", check=True, timeout=60)
    errors: dict[int, CommError] = {}

    def join(rank: int) -> None:
        client = dist.TCPStore("127.0.0.1", port, 1, is_master=False, timeout=datetime.timedelta(seconds=30))
        try:
            from_store(TorchStore(client, 3, discover({})), rank, 2, 3, secret="a-secret-for-tests").close()
        except CommError as exc:
            errors[rank] = exc

    threads = [threading.Thread(target=join, args=(rank,)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    del server
    assert sorted(errors) == [0, 1], errors
    for exc in errors.values():
        assert isinstance(exc, RendezvousError)
        assert "'tensorcomm/joins' reads 3, not a multiple of the world size 2" in str(exc), exc
