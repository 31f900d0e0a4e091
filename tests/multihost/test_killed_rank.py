"""A rank killed in the middle of a large, chunked all_reduce across hosts.

2 hosts x 2 ranks all_reduce 64 MiB in a loop (the pipelined ring: many chunks in flight both
ways on every link); rank 3 SIGKILLs itself mid-call. The ranks of host 0 must fail with a named
``CommError`` within the collective timeout, and the array each passed must be untouched or
complete (every element the full sum), never half-written. Each rank records its outcome in a file
of a shared directory, as in test_vanished_host.py.
"""

from __future__ import annotations

import json
import secrets
import textwrap
import time
from pathlib import Path

import pytest

from multihost_harness import MakeCluster

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(90)]

TIMEOUT = 10.0  # init(timeout=...) of the ranks
SLACK = 5.0  # scheduling delay on a loaded 2-core machine
VICTIM = 3

RANK_SCRIPT = textwrap.dedent("""
    import json, os, signal, sys, threading, time
    import numpy as np
    import tensorcomm as tc

    shared, timeout, victim = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    tc.init(timeout=timeout, keep_going=True)  # the arrays of a failed call: untouched or complete
    rank, size = tc.get_rank(), tc.get_world_size()
    x = np.empty(16 << 20, np.float32)
    total = sum(range(1, size + 1))
    tc.barrier()
    if rank == victim:  # dies while the second or third call is in flight
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
    started = time.time()
    try:
        for _ in range(50):
            x[...] = rank + 1
            started = time.time()
            tc.all_reduce(x)
        record = {"type": None}
    except tc.CommError as exc:
        untouched = bool(np.all(x == rank + 1))
        complete = bool(np.all(x == total))
        record = {"type": type(exc).__name__, "message": str(exc), "untouched": untouched,
                  "complete": complete, "started": started, "failed": time.time()}
    with open(os.path.join(shared, f".error{rank}"), "w") as f:
        json.dump(record, f)
    os.replace(os.path.join(shared, f".error{rank}"), os.path.join(shared, f"error{rank}"))
    time.sleep(1.0)  # let the host-mate record its own outcome before the launcher stops it
    sys.exit(3 if record["type"] else 0)
""")


def test_survivors_fail_in_time_with_arrays_untouched_or_complete(netns_cluster: MakeCluster,
                                                                  tmp_path: Path) -> None:
    cluster = netns_cluster(2)
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    secret = secrets.token_hex(32)
    jobs = [cluster.launch(host, script, str(tmp_path), str(TIMEOUT), str(VICTIM), nprocs=2,
                           secret=secret, timeout=60) for host in cluster.hosts]
    records = {}
    deadline = time.monotonic() + 60
    while len(records) < 2:
        for rank in (0, 1):
            path = tmp_path / f"error{rank}"
            if rank not in records and path.exists():
                records[rank] = json.loads(path.read_text())
        assert time.monotonic() < deadline, ("survivors reported nothing", [j.output() for j in jobs])
        time.sleep(0.05)
    for record in records.values():
        assert record["type"] in ("PeerLostError", "GroupAbortedError", "CommTimeoutError"), record
        assert record["failed"] - record["started"] <= TIMEOUT + SLACK, record
        assert record["untouched"] or record["complete"], record
    assert any(f"rank {VICTIM}" in record["message"] for record in records.values()), records
    for job in jobs:  # nobody hangs
        job.finish(TIMEOUT + SLACK + 30)
