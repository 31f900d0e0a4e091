"""A node started with the wrong TENSORCOMM_SECRET cannot join, and the whole job ends, clearly.

One job runs for the module (2 hosts x 2 ranks; node 1 has another secret); the tests below each
examine one side of its outcome.
"""

from __future__ import annotations

import re
import secrets
import textwrap

import pytest

from multihost_harness import Finished, MakeCluster

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(60)]

INIT_TIMEOUT = 5.0  # TENSORCOMM_JOIN_TIMEOUT: how long node 0's ranks wait for the missing ones
SLACK = 6.0  # start-up of launcher and ranks plus scheduling delay on a loaded machine

RANK_SCRIPT = textwrap.dedent("""
    import os
    import sys
    import numpy as np
    import tensorcomm as tc

    os.environ["TENSORCOMM_JOIN_TIMEOUT"] = sys.argv[1]  # joining has a deadline of its own
    tc.init(timeout=float(sys.argv[1]))
    x = np.ones(4)
    tc.all_reduce(x)
    print("joined a job it should not have")
""")


@pytest.fixture(scope="module")
def outcome(module_netns_cluster: MakeCluster,
            tmp_path_factory: pytest.TempPathFactory) -> dict[str, Finished]:
    """Both nodes' results; node 0 (the store's host) has the job's secret, node 1 another."""
    cluster = module_netns_cluster(2)
    script = tmp_path_factory.mktemp("secret") / "rank.py"
    script.write_text(RANK_SCRIPT)
    jobs = [cluster.launch(host, script, str(INIT_TIMEOUT), nprocs=2, secret=secrets.token_hex(32),
                           timeout=INIT_TIMEOUT + 30) for host in cluster.hosts]
    results = [job.finish(INIT_TIMEOUT + SLACK) for job in jobs]
    for i, result in enumerate(results):
        print(f"node {i} exit {result.returncode} after {result.seconds:.1f} s:\n"
              f"{result.stdout}{result.stderr}")
    return {"node0": results[0], "node1": results[1]}


def _errors(stderr: str) -> dict[int, str]:
    """``{rank: the exception line it printed}`` (``[rank N] tensorcomm.errors.Kind: message``).

    The launcher stops a node's other ranks as soon as one fails, so a rank may be stopped
    before it prints its own error; the rank the launcher names as failed always has one.
    """
    errors = {}
    for line in stderr.splitlines():
        match = re.match(r"\[rank (\d+)\] (tensorcomm\.errors\.\w+: .*)", line)
        if match:
            errors[int(match[1])] = match[2]
    failed = re.search(r"^tensorcomm: rank (\d+) exited with code 1", stderr, re.M)
    assert failed and int(failed[1]) in errors, stderr
    return errors


def test_wrong_secret_node_is_refused_and_the_job_ends(outcome: dict[str, Finished]) -> None:
    """Node 1's ranks fail authenticating at once; node 0's give up at their timeout; no hang."""
    node0, node1 = outcome["node0"], outcome["node1"]
    refused = _errors(node1.stderr)
    assert set(refused) <= {2, 3}
    for line in refused.values():
        assert line.startswith("tensorcomm.errors.AuthenticationError: ") and "secret" in line
    assert node1.returncode == 1
    # The store's host logs whom it refused, so an operator can see which node is misconfigured.
    assert "rejected connection from 10.77.0.2" in node0.stderr, node0.stderr
    assert node0.returncode == 1
    waited = _errors(node0.stderr)
    assert set(waited) <= {0, 1}
    for line in waited.values():
        assert line.startswith(("tensorcomm.errors.RendezvousError: ",
                                "tensorcomm.errors.CommTimeoutError: ")), line
    assert "joined" not in node0.stdout + node1.stdout


def test_waiting_ranks_name_the_missing_ones(outcome: dict[str, Finished]) -> None:
    """Node 0's ranks say which ranks never arrived (2 and 3), in a RendezvousError."""
    for line in _errors(outcome["node0"].stderr).values():
        assert line.startswith("tensorcomm.errors.RendezvousError: "), line
        assert "2" in line and "3" in line, line
