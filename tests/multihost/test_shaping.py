"""An all_reduce of a few MB stays correct over a link shaped to 100 Mbit/s (tc tbf).

This kernel has no netem, so only bandwidth is shaped (the DESIGN's choice); the time is printed,
not asserted, as load on a shared machine moves it. The qdisc's byte counters prove the data
really went through the shaped link.
"""

from __future__ import annotations

import re
import secrets
import shutil
import textwrap
from pathlib import Path

import pytest

from multihost_harness import MakeCluster

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(60)]

RATE = "100mbit"
RATE_BYTES_PER_SECOND = 100e6 / 8
ELEMENTS = 1 << 20  # float32: 4 MiB per rank
COLLECTIVE_TIMEOUT = 20.0
JOB_TIMEOUT = 40.0

RANK_SCRIPT = textwrap.dedent("""
    import sys, time
    import numpy as np
    import tensorcomm as tc

    tc.init(timeout=float(sys.argv[1]))
    rank, size = tc.get_rank(), tc.get_world_size()
    count = int(sys.argv[2])
    x = ((np.arange(count) + rank) % 11).astype(np.float32)
    want = sum(((np.arange(count) + r) % 11).astype(np.float32) for r in range(size))
    tc.barrier()
    start = time.perf_counter()
    tc.all_reduce(x)
    seconds = time.perf_counter() - start
    tc.destroy()
    if not np.array_equal(x, want):
        print("WRONG result")
        sys.exit(1)
    print(f"all_reduce of {x.nbytes} bytes: correct, {seconds:.3f} s")
""")


def _sent_bytes(stats: str) -> int:
    match = re.search(r"Sent (\d+) bytes", stats)
    assert match, stats
    return int(match[1])


@pytest.mark.skipif(shutil.which("tc") is None, reason="the `tc` command (iproute2) is missing")
def test_all_reduce_over_a_shaped_link(netns_cluster: MakeCluster,
                                       tmp_path: Path) -> None:
    """Two hosts, one rank each; host 1's link is limited to 100 Mbit/s both ways."""
    cluster = netns_cluster(2)
    shaped = cluster.hosts[1]
    cluster.shape(shaped, RATE)
    script = tmp_path / "shaped.py"
    script.write_text(RANK_SCRIPT)
    secret = secrets.token_hex(32)
    jobs = [cluster.launch(host, script, str(COLLECTIVE_TIMEOUT), str(ELEMENTS), nprocs=1,
                           secret=secret, timeout=JOB_TIMEOUT) for host in cluster.hosts]
    results = [job.finish(JOB_TIMEOUT + 10) for job in jobs]
    report = "\n".join(f"node {i} exit {r.returncode}:\n{r.stdout}{r.stderr}"
                       for i, r in enumerate(results))
    assert [r.returncode for r in results] == [0, 0], report
    nbytes = ELEMENTS * 4
    for rank, result in enumerate(results):
        assert re.search(rf"^\[rank {rank}\] all_reduce of {nbytes} bytes: correct, ",
                         result.stdout, re.M), report
    # Each rank sends its whole buffer to the other (2 ranks: one exchange), so each direction
    # of the shaped link carries at least nbytes.
    outbound = _sent_bytes(cluster.tc(shaped.netns, "-s", "qdisc", "show", "dev", shaped.ifname))
    inbound = _sent_bytes(cluster.tc(cluster.switch, "-s", "qdisc", "show", "dev", shaped.port))
    assert outbound >= nbytes and inbound >= nbytes, (outbound, inbound)
    print(f"\n{report}\nshaped link carried {outbound} bytes out, {inbound} in; at {RATE} one "
          f"direction needs at least {nbytes / RATE_BYTES_PER_SECOND:.3f} s")
