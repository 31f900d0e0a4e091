"""A message that arrived before a waiter's deadline, while the waiter's process was stopped, is
read when it runs again: the TCP driver polls once more at its deadline, and a thread waiting
for the driver gives it a moment to hand over the role for that poll, instead of calling it a
timeout.

Rank 1 waits for two messages from rank 0 over TCP, one in its main thread (the driver) and one
in a second thread. Rank 0 stops rank 1 (SIGSTOP) while both wait, sends both messages, and
continues rank 1 (SIGCONT) after both deadlines have passed. Rank 1 has a SIGCONT handler in its
main thread only (every other thread blocks the signal), so the driver's ``poll`` returns
interrupted, past its deadline, with no events: the moment a preempted waiter meets.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.testing import spawn_ranks

pytestmark = [pytest.mark.fault, pytest.mark.timeout(120)]

TIMEOUT = 3.0  # the ranks' communication timeout: each receive's deadline
STOPPED_FOR = TIMEOUT + 1.5  # seconds rank 1 stays stopped, past both deadlines


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.01)


def body_stopped_while_a_message_arrives(work: str) -> dict:
    workdir = Path(work)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCONT})  # every thread made from here on
    tc.init(timeout=TIMEOUT)
    rank = tc.get_rank()
    if rank == 0:
        _wait_for(workdir / "waiting")
        time.sleep(0.5)  # rank 1 is in its waits
        pid = int((workdir / "waiting").read_text())
        os.kill(pid, signal.SIGSTOP)
        tc.send(np.full(4, 7.0, np.float32), dst=1, tag=1)
        tc.send(np.full(4, 8.0, np.float32), dst=1, tag=2)
        time.sleep(STOPPED_FOR)
        os.kill(pid, signal.SIGCONT)
        tc.barrier()
        return {}
    first, second = np.zeros(4, np.float32), np.zeros(4, np.float32)
    outcome: dict = {}
    later = tc.irecv(second, src=0, tag=2)

    def wait_second() -> None:
        try:
            later.wait()
            outcome["second"] = float(second[0])
        except tc.CommError as exc:
            outcome["second"] = f"{type(exc).__name__}: {exc}"

    thread = threading.Thread(target=wait_second)
    thread.start()  # blocks SIGCONT, as the mask it inherits says
    signal.signal(signal.SIGCONT, lambda *_: None)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCONT})  # this thread only
    (workdir / "waiting.part").write_text(str(os.getpid()))
    (workdir / "waiting.part").rename(workdir / "waiting")  # whole when it appears: rank 0 reads it at once
    try:
        tc.recv(first, src=0, tag=1)
        outcome["first"] = float(first[0])
    except tc.CommError as exc:
        outcome["first"] = f"{type(exc).__name__}: {exc}"
    thread.join(30)
    tc.barrier()
    return outcome


def test_what_arrived_before_the_deadline_is_read_after_a_stop(tmp_path: Path) -> None:
    outcomes = spawn_ranks(body_stopped_while_a_message_arrives, 2, str(tmp_path), timeout=90,
                           init=False, env={"TENSORCOMM_TRANSPORT": "tcp"})
    assert all(o.ok for o in outcomes), [o.output for o in outcomes]
    assert outcomes[1].result == {"first": 7.0, "second": 8.0}, outcomes[1].result
