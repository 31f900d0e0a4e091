"""Direct reads between ranks (cross-memory attach, ``algorithms/shm_cma.py``) under attack.

- A rank killed while its peers read its arrays, or while it reads theirs, fails the call on
  every survivor with ``PeerLostError`` naming it within seconds, in both modes of a failed call's
  arrays; with the switch on, in-place arrays are left untouched or complete (all_reduce then
  runs through the slots, which the same test checks).
- A stranger (another user, without the job secret) who knows a rank's pid and the address of the
  array its peers read gains nothing: the kernel refuses it the reads and writes the job's ranks
  make of each other, and ``/proc/<pid>/mem``.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.testing import spawn_ranks
from tensorcomm.transports.shm import cma, slots

JOB_TIMEOUT = 150.0
DETECTION_BUDGET = 30.0  # seconds from a death to the survivors' PeerLostError (load: see test_peer_loss)
pytestmark = [pytest.mark.fault, pytest.mark.timeout(JOB_TIMEOUT + 60),
              pytest.mark.skipif(not (slots.SUPPORTED and cma.available()), reason="needs x86-64 Linux")]

MODES = {"keep_going": {"TENSORCOMM_KEEP_GOING": "1"}, "default": {}}
COUNT = 6 << 20  # float32 elements: 24 MiB (divisible by 2 and 3): the direct reads take long
VICTIM = 1


def _call(collective: str, rank: int, size: int):
    """A large call of ``collective`` and what its in-place array must hold after a failure."""
    if collective == "all_reduce":
        x = np.full(COUNT, rank + 1.0, np.float32)
        complete = float(sum(range(1, size + 1)))

        def run() -> None:
            x[...] = rank + 1.0
            tc.all_reduce(x)
        return run, x, (rank + 1.0, complete)
    if collective.startswith("broadcast"):
        root = 0 if collective == "broadcast_reader_killed" else VICTIM
        x = np.full(COUNT, -1.0 if rank != root else 7.0, np.float32)

        def run() -> None:
            if rank != root:
                x[...] = -1.0
            tc.broadcast(x, src=root)
        return run, (x if rank != root else None), (-1.0, 7.0)
    send = np.full(COUNT, rank, np.float32)
    out = np.empty(COUNT * size if collective == "all_gather" else
                   COUNT // size if collective == "reduce_scatter" else COUNT, np.float32)
    call = {"all_gather": lambda: tc.all_gather_into_tensor(out, send),
            "all_to_all": lambda: tc.all_to_all_single(out, send),
            "reduce_scatter": lambda: tc.reduce_scatter_tensor(out, send)}[collective]
    return call, None, None


def body_killed_mid_call(collective: str, stamp_dir: str, keep_going: bool) -> dict:
    rank, size = tc.get_rank(), tc.get_world_size()
    run, x, allowed = _call(collective, rank, size)
    run()
    ran = tc.WORLD.last_call
    # where failed calls keep arrays, all_reduce keeps to the slots' pipeline (select.py)
    expected = "shm_pipelined" if keep_going and collective == "all_reduce" else "shm_cma"
    assert ran is not None and ran.algorithm == expected, ran
    if rank == VICTIM:
        def die() -> None:
            Path(stamp_dir, "death").write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Timer(0.3, die).start()
    try:
        for _ in range(100_000):
            run()
    except tc.PeerLostError as exc:
        record = {"rank": exc.rank, "at": time.time(), "message": str(exc)}
        if keep_going and x is not None:
            values = np.unique(x).tolist()
            record["untouched_or_complete"] = len(values) == 1 and values[0] in allowed
            record["values"] = values[:4]
        return record
    raise AssertionError("the loop ended without an error")


# (collective, world size): a killed rank is both a reader and an owner in every collective but
# broadcast, where the root only owns (and writes) and the receivers only read
CASES = [("all_reduce", 2), ("all_reduce", 3), ("all_gather", 2), ("all_to_all", 3),
         ("reduce_scatter", 2), ("broadcast_owner_killed", 3), ("broadcast_reader_killed", 2)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("collective", "world_size"), CASES)
def test_a_rank_killed_mid_read_is_named_on_every_survivor(collective, world_size, mode, tmp_path):
    env = dict(MODES[mode])
    if not (mode == "keep_going" and collective == "all_reduce"):  # forced: whatever the crossovers
        forced = "broadcast" if collective.startswith("broadcast") else collective
        env["TENSORCOMM_ALGORITHMS"] = f"{forced}=shm_cma"
    outcomes = spawn_ranks(body_killed_mid_call, world_size, collective, str(tmp_path),
                           mode == "keep_going", timeout=JOB_TIMEOUT, comm_timeout=120, env=env)
    assert outcomes[VICTIM].exitcode == -signal.SIGKILL, outcomes[VICTIM].output
    death = float((tmp_path / "death").read_text())
    for outcome in outcomes:
        if outcome.rank == VICTIM:
            continue
        assert outcome.ok, outcome.output
        assert outcome.result["rank"] == VICTIM, outcome.result
        assert outcome.result["at"] - death < DETECTION_BUDGET, outcome.result
        assert outcome.result.get("untouched_or_complete", True), outcome.result


STRANGER = r"""
import ctypes, errno, json, os, sys
pid, address = int(sys.argv[1]), int(sys.argv[2])
libc = ctypes.CDLL(None, use_errno=True)
class Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(4096)
here, there = Iovec(ctypes.addressof(buf), 4096), Iovec(address, 4096)
found = {"uid": os.getuid()}
for name in ("process_vm_readv", "process_vm_writev"):
    moved = getattr(libc, name)(pid, ctypes.byref(here), 1, ctypes.byref(there), 1, 0)
    found[name] = (moved, ctypes.get_errno())
try:
    with open(f"/proc/{pid}/mem", "rb") as mem:
        mem.seek(address)
        found["mem"] = len(mem.read(4096))
except OSError as exc:
    found["mem"] = exc.errno
print(json.dumps(found))
"""
NOBODY = 65534  # conftest.NOBODY


def body_read_under_attack(work: str) -> dict:
    """Large all-gathers read directly; rank 0 says where its array is and waits for the stranger."""
    rank = tc.get_rank()
    send = np.full(COUNT, rank + 1, np.float32)
    out = np.empty(2 * COUNT, np.float32)
    tc.all_gather_into_tensor(out, send)
    ran = tc.WORLD.last_call
    if rank == 0:
        written = Path(work, "target.json.part")  # renamed when whole: the stranger reads it at once
        written.write_text(json.dumps({"pid": os.getpid(), "address": send.__array_interface__["data"][0]}))
        written.rename(Path(work, "target.json"))
    done, deadline = np.zeros(1, np.int64), time.monotonic() + 60
    while not done[0]:  # keep reading each other meanwhile, until rank 0 sees the stranger done
        done[0] = Path(work, "done").exists() or time.monotonic() > deadline
        tc.broadcast(done, src=0)
        tc.all_gather_into_tensor(out, send)
    intact = bool((send == rank + 1).all() and (out[:COUNT] == 1).all() and (out[COUNT:] == 2).all())
    return {"algorithm": ran.algorithm if ran else None, "intact": intact}


def test_a_stranger_of_another_user_cannot_read_or_write_a_rank(tmp_path, nobody_python):
    os.chmod(tmp_path, 0o755)
    results: list = []

    def stranger() -> None:
        deadline = time.monotonic() + 60
        target = tmp_path / "target.json"
        while not target.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        where = json.loads(target.read_text())
        done = subprocess.run([nobody_python, "-c", STRANGER, str(where["pid"]), str(where["address"])],
                              capture_output=True, text=True, timeout=60, user=NOBODY, group=NOBODY,
                              cwd="/")
        results.append(done)
        (tmp_path / "done").write_text("1")

    thread = threading.Thread(target=stranger)
    thread.start()
    outcomes = spawn_ranks(body_read_under_attack, 2, str(tmp_path), timeout=JOB_TIMEOUT)
    thread.join(70)
    for outcome in outcomes:
        assert outcome.ok, outcome.output
        assert outcome.result == {"algorithm": "shm_cma", "intact": True}, outcome.result
    done = results[0]
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["uid"] == NOBODY
    for name in ("process_vm_readv", "process_vm_writev"):
        assert found[name] == [-1, errno.EPERM], found
    assert found["mem"] in (errno.EACCES, errno.EPERM), found
