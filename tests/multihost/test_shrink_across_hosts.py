"""``Group.shrink`` across hosts: 3 hosts x 2 ranks run tests/elastic's data-parallel job under
``tensorcomm run --keep-going``; both ranks of host 0 are SIGKILLed at step 20. The 4 survivors
on hosts 1 and 2 shrink the world to a group that spans those hosts (hierarchical: shared memory
within each host, TCP between them) and finish with equal parameters. Host 0's launcher hosts
the store: with its own ranks gone it must keep serving the survivors, who agree through it.
"""

from __future__ import annotations

import importlib.util
import json
import secrets
import sys
from pathlib import Path

import numpy as np
import pytest

from multihost_harness import MakeCluster

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(150)]

_JOB = Path(__file__).resolve().parent.parent / "elastic" / "elastic_job.py"
_spec = importlib.util.spec_from_file_location("elastic_job", _JOB)
assert _spec is not None and _spec.loader is not None
elastic_job = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(elastic_job)

STEPS = 60
PLAN = {"steps": STEPS, "timeout": 30, "shrink_timeout": 30, "kill": {"0": 20, "1": 20}}


def test_survivors_on_two_hosts_shrink_and_finish(netns_cluster: MakeCluster, tmp_path: Path) -> None:
    cluster = netns_cluster(3)
    secret = secrets.token_hex(32)
    jobs = [cluster.spawn(host, [sys.executable, "-m", "tensorcomm", "run", "--nnodes", "3",
                                 "--node-rank", str(host.index), "--master", cluster.master, "-n", "2",
                                 "--keep-going", "--timeout", "120", str(_JOB), str(tmp_path),
                                 json.dumps(PLAN)],
                          {"TENSORCOMM_SECRET": secret}, label=f"node {host.index}")
            for host in cluster.hosts]
    finished = [job.finish(140) for job in jobs]
    output = "\n".join(f.stdout + f.stderr for f in finished)
    assert finished[0].returncode == 137, output  # both of its ranks were killed
    assert finished[1].returncode == finished[2].returncode == 0, output
    assert "serving the store while ranks of other nodes use it" in finished[0].stderr, output
    records = {rank: json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2, 6)}
    shrinks = [[{k: s[k] for k in ("resume", "ranks", "hierarchical")} for s in r["shrinks"]]
               for r in records.values()]
    # Host 0's ranks die after their own step 19 returned; a survivor still missing their last
    # bytes of step 19 (a finished send is not a delivered one: a killed socket may reset them)
    # fails that step, and the survivors agree to redo it. Either resume point is right; the
    # parameters are checked below against the one they agreed on.
    assert shrinks[0] in [[{"resume": resume, "ranks": [2, 3, 4, 5], "hierarchical": True}]
                          for resume in (19, 20)], shrinks
    assert all(s == shrinks[0] for s in shrinks), shrinks
    expected = elastic_job.reference(STEPS, 6, records[2]["shrinks"])
    for rank, record in records.items():
        assert np.array_equal(np.array(record["params"]), expected), rank
