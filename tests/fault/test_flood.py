"""A sustained flood of silent connections to the store's port keeps no job from starting
(issue 21): a stranger process (standard library only) holds 100 or 1000 connections open and
reopens each one the job closes, while a 2-rank TCP job sets up on that port and runs.

The measured start times are printed (``-s`` shows them), never asserted: the hard timeout is
the only limit, because a loaded machine may be slow.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
import time

import pytest

from tensorcomm import config
from tensorcomm.testing import free_port

pytestmark = pytest.mark.fault

SECRET = "flood-test-secret"
JOB_TIMEOUT = 60  # seconds the ranks' init may take; the test's hard limit is above it

# Holds `count` connections to 127.0.0.1:port, reopening each one the other side closes (and
# retrying while nothing listens yet); prints "holding N" once it held them all at least once.
STRANGER = textwrap.dedent("""
    import selectors, socket, sys, time
    port, count = int(sys.argv[1]), int(sys.argv[2])
    sel = selectors.DefaultSelector()
    held, opened, reported = 0, 0, False
    def open_one():
        global held, opened
        sock = socket.socket()
        sock.setblocking(False)
        if sock.connect_ex(("127.0.0.1", port)) not in (0, 115):  # 115: EINPROGRESS
            sock.close()
            return False
        sel.register(sock, selectors.EVENT_READ)
        held += 1
        opened += 1
        return True
    while True:
        while held < count:
            if not open_one():
                time.sleep(0.01)
                break
        if held >= count and not reported:
            print(f"holding {held}", flush=True)
            reported = True
        for key, _ in sel.select(0.05):
            sock = key.fileobj
            try:
                data = sock.recv(64)
            except OSError:
                data = b""
            if not data:  # closed by the job (or refused): open another in its place
                sel.unregister(sock)
                sock.close()
                held -= 1
""")

RANK = textwrap.dedent("""
    import sys, time
    start = time.monotonic()
    import numpy as np
    import tensorcomm as tc
    imported = time.monotonic()
    tc.init(timeout=JOB_TIMEOUT)
    init = time.monotonic() - imported
    x = np.full(4, tc.get_rank() + 1, np.float32)
    tc.all_reduce(x)
    print(f"rank {tc.get_rank()} started: import {imported - start:.2f} s, init {init:.2f} s; "
          f"got {x[0]:g}", flush=True)
    tc.destroy()
""").replace("JOB_TIMEOUT", str(JOB_TIMEOUT))


@pytest.mark.parametrize("connections", [100, 1000])
def test_a_job_starts_while_a_stranger_floods_its_store_port(connections: int) -> None:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < connections + 200:
        pytest.skip(f"the descriptor limit RLIMIT_NOFILE = {soft} is too low for {connections} "
                    f"connections (raise it with `ulimit -n`)")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TENSORCOMM_", "MASTER_"))}
    env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
                config.ENV_SECRET: SECRET, config.ENV_TRANSPORT: "tcp"})
    stranger = subprocess.Popen([sys.executable, "-c", STRANGER, str(port), str(connections)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={"PATH": os.environ.get("PATH", "")})
    ranks: list[subprocess.Popen[str]] = []
    try:
        time.sleep(0.5)  # the stranger is already dialling when the job begins
        begin = time.monotonic()
        ranks = [subprocess.Popen([sys.executable, "-c", RANK], env={**env, "RANK": str(rank)},
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for rank in range(2)]
        outputs = [rank.communicate(timeout=JOB_TIMEOUT + 30)[0] for rank in ranks]
        wall = time.monotonic() - begin
        assert stranger.poll() is None, "the stranger stopped before the job ended"
    finally:
        for proc in [*ranks, stranger]:
            proc.kill()
            proc.wait(10)
    flood_log = stranger.stdout.read() if stranger.stdout else ""
    print(f"\n{connections} silent connections ({flood_log.strip() or 'never held them all'}); "
          f"job wall time {wall:.2f} s; load average {os.getloadavg()[0]:.2f}")
    for output in outputs:
        print("  " + " | ".join(line for line in output.splitlines() if "started" in line))
    assert [rank.returncode for rank in ranks] == [0, 0], outputs
    assert all(f"rank {r} started" in outputs[r] and "got 3" in outputs[r] for r in range(2)), outputs
