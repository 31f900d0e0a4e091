"""Nothing outlives a job: no rank process, no shared-memory segment, no listening socket —
after a normal end, after a rank is killed, and after the launcher itself is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.fault

RANK_SCRIPT = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import tensorcomm as tc
    tc.init()
    with open(os.path.join(sys.argv[1], f"pid{tc.get_rank()}"), "w") as f:
        f.write(str(os.getpid()))
    x = np.ones(1 << 16, np.float32)
    mode = sys.argv[2]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        tc.all_reduce(x)
        if mode == "kill-rank" and tc.get_rank() == 1 and len(os.listdir(sys.argv[1])) == 3:
            os.kill(os.getpid(), 9)
    tc.destroy()
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes (its parent has not reaped it yet)
    state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    return state != "Z"


def _listening_inodes_of(pids: list[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except FileNotFoundError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def _shm_entries() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if "tensorcomm" in name}


def _start(tmp_path: Path, mode: str) -> subprocess.Popen:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    return subprocess.Popen([sys.executable, "-m", "tensorcomm", "run", "-n", "3", str(script),
                             str(pids_dir), mode], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _rank_pids(tmp_path: Path, count: int = 3, timeout: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout
    pids_dir = tmp_path / "pids"
    while time.monotonic() < deadline:
        files = list(pids_dir.iterdir())
        if len(files) == count and all(f.read_text() for f in files):
            return [int(f.read_text()) for f in files]
        time.sleep(0.05)
    raise AssertionError(f"ranks did not start: {list(pids_dir.iterdir())}")


def _wait_gone(pids: list[int], timeout: float = 10) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def test_launcher_sigkill_takes_every_rank_with_it(tmp_path):
    before = _shm_entries()
    launcher = _start(tmp_path, "loop")
    pids = _rank_pids(tmp_path)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait(10)
    leftovers = _wait_gone(pids)
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    assert not leftovers, f"ranks {leftovers} outlived a SIGKILLed launcher"
    assert _shm_entries() <= before


def test_killed_rank_stops_the_job_and_leaves_nothing(tmp_path):
    before = _shm_entries()
    launcher = _start(tmp_path, "kill-rank")
    pids = _rank_pids(tmp_path)
    _, stderr = launcher.communicate(timeout=60)
    assert launcher.returncode == 128 + signal.SIGKILL, stderr.decode()
    assert b"rank 1" in stderr
    assert not _wait_gone(pids)
    assert not _listening_inodes_of(pids)
    assert _shm_entries() <= before
