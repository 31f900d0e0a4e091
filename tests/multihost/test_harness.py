"""The namespace harness itself: hosts reach each other and nothing else, and nothing outlives it.

Every test's ``netns_cluster`` teardown already fails on leftovers; this checks, independently of
that bookkeeping, that the teardown removes stubborn processes (SIGTERM ignored, a child escaped
into its own session) and every namespace and link, also when the test body fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from multihost_harness import MakeCluster

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(60)]

STUBBORN = textwrap.dedent("""
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    time.sleep(60)
""")

# A connect that must succeed between hosts (retried until the listener is up); prints the
# local address it used.
CONNECT = textwrap.dedent("""
    import socket, sys, time
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) as s:
                print(s.getsockname()[0])
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
""")
LISTEN = textwrap.dedent("""
    import socket
    with socket.create_server(("0.0.0.0", 7000)) as server:
        server.accept()[0].close()
""")


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True,
                          timeout=10).stdout


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_hosts_reach_each_other_over_their_own_subnet_only(netns_cluster: MakeCluster) -> None:
    """Each host routes nothing but the cluster's /24, and host 1 reaches host 0 through it."""
    cluster = netns_cluster(2)
    for host in cluster.hosts:
        routes = [line.strip() for line in _ip("-n", host.netns, "route", "show").splitlines()]
        expected = f"10.77.0.0/24 dev {host.ifname} proto kernel scope link src {host.address}"
        assert routes == [expected], routes
    server = cluster.spawn(cluster.hosts[0], [sys.executable, "-c", LISTEN])
    client = cluster.spawn(cluster.hosts[1], [sys.executable, "-c", CONNECT,
                                              cluster.hosts[0].address, "7000"])
    done = client.finish(15)
    assert done.returncode == 0 and done.stdout.strip() == cluster.hosts[1].address, done
    assert server.finish(15).returncode == 0


def test_teardown_leaves_no_namespace_process_or_link(netns_harness: Callable,
                                                     tmp_path: Path) -> None:
    """Stubborn processes in every host, then a failing body: all of it is gone afterwards."""
    seen_pids: set[int] = set()
    names: list[str] = []
    tag = ""
    with pytest.raises(RuntimeError, match="the test body failed"), netns_harness(tmp_path) as make:
        cluster = make(3)
        tag, names = cluster.tag, cluster.namespaces
        for host in cluster.hosts:
            cluster.spawn(host, [sys.executable, "-c", STUBBORN])
        deadline = time.monotonic() + 15
        while len(seen_pids) < 2 * len(cluster.hosts) and time.monotonic() < deadline:
            seen_pids = {int(p) for host in cluster.hosts
                         for p in _ip("netns", "pids", host.netns).split()}
            time.sleep(0.05)
        assert len(seen_pids) == 2 * len(cluster.hosts), seen_pids  # parents and children
        raise RuntimeError("the test body failed")
    assert not set(names) & {line.split()[0] for line in _ip("netns", "list").splitlines()}
    assert not [pid for pid in seen_pids if _running(pid)]
    assert f"tc{tag}" not in _ip("-o", "link", "show")
    assert os.listdir(tmp_path)  # the cluster's output files stay for post-mortems
