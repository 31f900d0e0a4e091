"""A host that vanishes (its link goes down: no FIN, no RST, just silence) is noticed in time.

The link of host 1 is taken down at the bridge while the job runs. The ranks on host 0 are the
survivors: each must fail with PeerLostError or CommTimeoutError naming a rank of host 1 within
the collective timeout, and no process may hang. Each rank writes what it caught to
``error<rank>.json`` in a shared directory (namespaces share the file system), because the
launcher stops a node's other ranks as soon as one exits and stdout could lose the rest.
"""

from __future__ import annotations

import json
import re
import secrets
import textwrap
import time
from pathlib import Path

import pytest

from tensorcomm.transports.tcp import mesh

from multihost_harness import Cluster, MakeCluster, Process

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(60)]

TIMEOUT = 5.0  # init(timeout=...) of the ranks: every blocking call must end within it
SLACK = 4.0  # scheduling delay on a loaded 2-core machine, on top of TIMEOUT
START_TIMEOUT = 30.0  # for the job to come up and reach the point where the link is cut
LOST_EXIT = 3  # a rank's exit code after it caught the failure it was expected to catch
# When keep-alive alone should have closed an idle link to a vanished peer (mesh.py's settings).
KEEPALIVE_NOTICE = (mesh.KEEPALIVE_IDLE_SECONDS
                    + mesh.KEEPALIVE_INTERVAL_SECONDS * mesh.KEEPALIVE_PROBES)

RANK_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np
    import tensorcomm as tc

    shared, mode, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    tc.init(timeout=timeout)
    rank, local_rank = tc.get_rank(), tc.get_local_rank()
    host_mates = range(rank - local_rank, rank - local_rank + int(os.environ["LOCAL_WORLD_SIZE"]))
    x = np.ones(256, np.float32)
    for _ in range(5):
        tc.all_reduce(x)

    def mark(name, record=None):  # atomically: the test polls for these files
        with open(os.path.join(shared, "." + name), "w") as f:
            json.dump(record, f)
        os.replace(os.path.join(shared, "." + name), os.path.join(shared, name))

    def cut():
        return os.path.exists(os.path.join(shared, "cut"))

    mark(f"ready{rank}")
    started = time.time()
    try:
        if mode == "loop":  # small all_reduces back to back until the link goes
            while True:
                started = time.time()
                tc.all_reduce(x)
        while not cut():
            time.sleep(0.01)
        if mode == "idle":  # long enough for keep-alive to have closed the link
            time.sleep(float(sys.argv[4]))
        elif mode == "large":  # more than the socket buffers hold: the send itself blocks
            x = np.ones(16 << 20, np.float32)
        elif mode == "ring":  # 256 KiB: a ring, whose blocks still fit the socket buffers
            x = np.ones(64 << 10, np.float32)
            if rank == 0:  # arrives late, as ranks often do
                time.sleep(float(sys.argv[4]))
        started = time.time()
        tc.all_reduce(x)
        mark(f"error{rank}", {"type": None})
        sys.exit(0)
    except tc.CommError as exc:
        mark(f"error{rank}", {"type": type(exc).__name__, "message": str(exc),
                              "started": started, "failed": time.time()})
    # Give host-mates time to record their own failure before the launcher stops them.
    deadline = time.monotonic() + 2 * timeout
    while time.monotonic() < deadline and not all(
            os.path.exists(os.path.join(shared, f"error{r}")) for r in host_mates):
        time.sleep(0.01)
    sys.exit(3)
""")


def _start(cluster: Cluster, shared: Path, mode: str, per_host: int, *extra: str,
           timeout: float = TIMEOUT) -> list[Process]:
    """Launch RANK_SCRIPT in ``mode`` on every host of ``cluster``; return the launchers."""
    script = shared / "rank.py"
    script.write_text(RANK_SCRIPT)
    secret = secrets.token_hex(32)
    return [cluster.launch(host, script, str(shared), mode, str(timeout), *extra, nprocs=per_host,
                           secret=secret, timeout=START_TIMEOUT + 60) for host in cluster.hosts]


def _unplug_when_ready(cluster: Cluster, shared: Path, ranks: int, jobs: list[Process]) -> float:
    """Wait until every rank has run collectives, take host 1's link down; return the time."""
    deadline = time.monotonic() + START_TIMEOUT
    while len(list(shared.glob("ready*"))) < ranks:
        if time.monotonic() > deadline or any(job.popen.poll() is not None for job in jobs):
            raise AssertionError("the job did not come up: " + repr([job.output() for job in jobs]))
        time.sleep(0.02)
    cluster.unplug(cluster.hosts[1])
    unplugged = time.time()
    (shared / "cut").touch()
    return unplugged


def _record(shared: Path, rank: int, wait: float) -> dict:
    """What ``rank`` caught, waiting up to ``wait`` seconds for it to say.

    Raises:
        AssertionError: nothing within ``wait`` seconds (the rank still hangs).
    """
    path = shared / f"error{rank}"
    deadline = time.monotonic() + wait
    while not path.exists():
        assert time.monotonic() < deadline, f"rank {rank} reported nothing within {wait:g} s"
        time.sleep(0.02)
    return json.loads(path.read_text())


def _names_a_lost_rank(message: str, lost: range) -> bool:
    return any(re.search(rf"\brank {r}\b", message) for r in lost)


def test_survivors_fail_within_the_timeout(netns_cluster: MakeCluster, tmp_path: Path) -> None:
    """2 hosts x 2 ranks in a loop of small all_reduces; host 1 vanishes mid-loop.

    Both survivors fail in time. Only one of them is sure to name a lost rank: the one waiting
    on host 1 directly; its host-mate may be waiting on it, in the next call, and name it
    instead (the relayed error usually wins that race; see the ring test below, which makes
    the wrong outcome certain).
    """
    cluster = netns_cluster(2)
    jobs = _start(cluster, tmp_path, "loop", 2)
    unplugged = _unplug_when_ready(cluster, tmp_path, 4, jobs)
    records = [_record(tmp_path, rank, TIMEOUT + SLACK) for rank in (0, 1)]
    for rank, record in enumerate(records):
        print(f"rank {rank} after {record.get('failed', unplugged) - unplugged:.1f} s: {record}")
        assert record["type"] in ("PeerLostError", "CommTimeoutError"), record
        assert record["failed"] - unplugged <= TIMEOUT + SLACK, record
    assert any(_names_a_lost_rank(r["message"], range(2, 4)) for r in records), records
    # Nobody hangs: the vanished host's ranks give up at their timeout as well.
    for job in jobs:
        result = job.finish(TIMEOUT + SLACK)
        assert result.returncode == LOST_EXIT, result


def test_survivors_name_the_lost_ranks_when_waiting_on_a_host_mate(netns_cluster: MakeCluster,
                                                                   tmp_path: Path) -> None:
    """Ring all_reduce after the cut, rank 0 one second late: ranks 0 and 1 still name 2 or 3."""
    cluster = netns_cluster(2)
    jobs = _start(cluster, tmp_path, "ring", 2, "1.0")
    _unplug_when_ready(cluster, tmp_path, 4, jobs)
    records = [_record(tmp_path, rank, 1.0 + TIMEOUT + SLACK) for rank in (0, 1)]
    print(records)
    for record in records:
        assert record["type"] in ("PeerLostError", "CommTimeoutError"), record
    for record in records:
        assert _names_a_lost_rank(record["message"], range(2, 4)), record


def test_large_send_to_a_vanished_host_ends_at_the_timeout(netns_cluster: MakeCluster,
                                                          tmp_path: Path) -> None:
    """After the cut, rank 0 all_reduces 64 MiB with rank 1 (gone): it fails within the timeout."""
    cluster = netns_cluster(2)
    jobs = _start(cluster, tmp_path, "large", 1)
    _unplug_when_ready(cluster, tmp_path, 2, jobs)
    record = _record(tmp_path, 0, TIMEOUT + SLACK)
    assert record["type"] in ("PeerLostError", "CommTimeoutError"), record
    assert _names_a_lost_rank(record["message"], range(1, 2)), record


def test_idle_link_to_a_vanished_host_is_noticed_by_keepalive(netns_cluster: MakeCluster,
                                                              tmp_path: Path) -> None:
    """Rank 0 idles past the keep-alive bound after the cut; its next call fails at once."""
    cluster = netns_cluster(2)
    idle = KEEPALIVE_NOTICE + 1.5
    # The call only has to show whether the loss is known already: a short timeout will do.
    jobs = _start(cluster, tmp_path, "idle", 1, str(idle), timeout=2.0)
    _unplug_when_ready(cluster, tmp_path, 2, jobs)
    record = _record(tmp_path, 0, idle + 2.0 + SLACK)
    print(record)
    assert record["type"] == "PeerLostError", record
    assert _names_a_lost_rank(record["message"], range(1, 2)), record
    assert record["failed"] - record["started"] < 1.0, record
