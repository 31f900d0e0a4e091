"""``TENSORCOMM_WIRE_DTYPE=bfloat16`` across hosts: float32 sums bit-identical on every rank,
within bfloat16's rounding of the exact sum, and half the bytes through the shaped link.

2 hosts x 1 rank, host 1's link under a tbf qdisc (whose byte counter is read): the same
all_reduce runs once without and once with compression, in separate jobs.
"""

from __future__ import annotations

import re
import secrets
import shutil
import textwrap
from pathlib import Path

import pytest

from multihost_harness import MakeCluster

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(90)]

ELEMENTS = 1 << 22  # 16 MiB of float32 per rank
JOB_TIMEOUT = 60.0

RANK_SCRIPT = textwrap.dedent("""
    import hashlib, sys
    import numpy as np
    import tensorcomm as tc

    tc.init(timeout=30)
    rank, size = tc.get_rank(), tc.get_world_size()
    rng = [np.random.default_rng(r) for r in range(size)]
    inputs = [g.standard_normal(int(sys.argv[1])).astype(np.float32) for g in rng]
    x = inputs[rank].copy()
    tc.all_reduce(x)
    exact = np.sum([a.astype(np.float64) for a in inputs], axis=0)
    worst = float(np.max(np.abs(x - exact) / np.maximum(np.sum(np.abs(inputs), axis=0), 1e-30)))
    print(f"digest {hashlib.sha256(x.tobytes()).hexdigest()} worst {worst:.3e}")
    tc.destroy()
""")


def _sent_bytes(stats: str) -> int:
    match = re.search(r"Sent (\d+) bytes", stats)
    assert match, stats
    return int(match[1])


@pytest.mark.skipif(shutil.which("tc") is None, reason="the `tc` command (iproute2) is missing")
def test_bfloat16_wire_halves_the_bytes_and_agrees_everywhere(netns_cluster: MakeCluster,
                                                              tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    outcomes = {}
    for wire in ("", "bfloat16"):
        cluster = netns_cluster(2)
        shaped = cluster.hosts[1]
        cluster.shape(shaped, "1gbit")
        env = {"TENSORCOMM_WIRE_DTYPE": wire} if wire else {}
        secret = secrets.token_hex(32)
        jobs = [cluster.launch(host, script, str(ELEMENTS), nprocs=1, secret=secret,
                               timeout=JOB_TIMEOUT, env=env) for host in cluster.hosts]
        results = [job.finish(JOB_TIMEOUT + 10) for job in jobs]
        assert [r.returncode for r in results] == [0, 0], [r.stdout + r.stderr for r in results]
        found = [re.search(r"digest (\w+) worst (\S+)", r.stdout) for r in results]
        assert all(found), [r.stdout for r in results]
        digests = {m[1] for m in found if m}
        assert len(digests) == 1, f"ranks disagree with wire={wire!r}: {digests}"
        sent = _sent_bytes(cluster.tc(shaped.netns, "-s", "qdisc", "show", "dev", shaped.ifname))
        outcomes[wire] = (sent, max(float(m[2]) for m in found if m))
    print(outcomes)
    (full, exact_error), (compressed, bf16_error) = outcomes[""], outcomes["bfloat16"]
    assert exact_error < 1e-6  # float32 sums of two terms
    assert bf16_error <= 3 * 2.0 ** -8  # each term and the sum rounded once to bfloat16
    payload = ELEMENTS * 4
    assert full >= payload and compressed < 0.6 * full, outcomes
