"""Every collective gives numpy's answer when the ranks are spread over several hosts.

Each host is a network namespace (see conftest.py) with its own ``tensorcomm run`` launcher, as a
user would start a job on several machines: node 0 hosts the store on 10.77.0.1, the others dial
it, and data links go over the veths and the bridge, the only path between the namespaces.
"""

from __future__ import annotations

import re
import secrets
import textwrap
from pathlib import Path

import pytest

from multihost_harness import MakeCluster

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(60)]

COLLECTIVE_TIMEOUT = 20.0  # init(timeout=...) of the ranks
JOB_TIMEOUT = 40.0  # the launchers' --timeout backstop, and how long the test waits for them

RANK_SCRIPT = textwrap.dedent("""
    import os, sys
    import numpy as np
    import tensorcomm as tc
    from tensorcomm.core.lifecycle import current_world

    tc.init(timeout=float(sys.argv[1]))
    rank, size = tc.get_rank(), tc.get_world_size()
    hosts = current_world().hosts_of(range(size))
    print(f"host {os.environ['TENSORCOMM_HOST_ID']} local_rank {tc.get_local_rank()} "
          f"sees {len(set(hosts))} hosts")
    failures, checks = [], 0

    def check(name, got, want):
        global checks
        checks += 1
        if not np.array_equal(got, want):
            failures.append(name)

    def data(r, n, dtype):
        # small positive integers: sums and products are exact in every dtype and order
        return ((np.arange(n) * 7 + 3 * r) % 5 + 1).astype(dtype)

    last = size - 1
    for n in (5, 300_000):  # an odd tiny message and a ring-sized one (1.2 MB of float32)
        everyone = [data(r, n, np.float32) for r in range(size)]
        mine, total = everyone[rank], np.sum(everyone, axis=0)
        for op, want in ((tc.ReduceOp.SUM, total), (tc.ReduceOp.PROD, np.prod(everyone, axis=0)),
                         (tc.ReduceOp.MIN, np.min(everyone, axis=0)),
                         (tc.ReduceOp.MAX, np.max(everyone, axis=0)),
                         (tc.ReduceOp.AVG, total / size)):
            x = mine.copy()
            tc.all_reduce(x, op=op)
            check(f"all_reduce {op} {n}", x, want.astype(np.float32))
        ints = [data(r, n, np.int64) * (r + 1) for r in range(size)]
        for op, ufunc in ((tc.ReduceOp.BAND, np.bitwise_and), (tc.ReduceOp.BOR, np.bitwise_or),
                          (tc.ReduceOp.BXOR, np.bitwise_xor)):
            x = ints[rank].copy()
            tc.all_reduce(x, op=op)
            check(f"all_reduce {op} {n}", x, ufunc.reduce(ints))
        x = data(rank, n, np.float64)
        tc.all_reduce(x, async_op=True).wait()
        check(f"async all_reduce {n}", x, np.sum([data(r, n, np.float64) for r in range(size)], 0))

        x = mine.copy()
        tc.reduce(x, dst=last)
        check(f"reduce {n}", x, total if rank == last else mine)
        x = mine.copy()
        tc.broadcast(x, src=last)
        check(f"broadcast {n}", x, everyone[last])
        out = [np.empty_like(mine) for _ in range(size)]
        tc.all_gather(out, mine)
        check(f"all_gather {n}", np.stack(out), np.stack(everyone))
        out = np.empty(size * n, np.float32)
        tc.all_gather_into_tensor(out, mine)
        check(f"all_gather_into_tensor {n}", out, np.concatenate(everyone))
        out = [np.zeros_like(mine) for _ in range(size)]
        tc.gather(mine, out if rank == last else None, dst=last)
        if rank == last:
            check(f"gather {n}", np.stack(out), np.stack(everyone))
        x = np.empty_like(mine)
        tc.scatter(x, everyone if rank == last else None, src=last)
        check(f"scatter {n}", x, mine)

        chunks = [data(rank * size + i, n, np.float32) for i in range(size)]
        x = np.empty_like(mine)
        tc.reduce_scatter(x, chunks)
        check(f"reduce_scatter {n}", x, np.sum([data(r * size + rank, n, np.float32)
                                                for r in range(size)], axis=0))
        block = n // size + 1
        x = np.empty(block, np.float32)
        flat = [data(r, block * size, np.float32) for r in range(size)]
        tc.reduce_scatter_tensor(x, flat[rank])
        check(f"reduce_scatter_tensor {n}", x, np.sum(flat, 0)[rank * block:(rank + 1) * block])
        out = [np.empty_like(mine) for _ in range(size)]
        tc.all_to_all(out, chunks)
        check(f"all_to_all {n}", np.stack(out),
              np.stack([data(r * size + rank, n, np.float32) for r in range(size)]))
        # uneven splits: rank r sends j + 1 elements to rank j
        sends = [j + 1 for j in range(size)]
        x = np.empty((rank + 1) * size, np.float32)
        tc.all_to_all_single(x, np.arange(sum(sends), dtype=np.float32) + 100 * rank,
                             output_split_sizes=[rank + 1] * size, input_split_sizes=sends)
        starts = np.cumsum([0] + sends)
        check(f"all_to_all_single {n}", x, np.concatenate(
            [np.arange(starts[rank], starts[rank + 1], dtype=np.float32) + 100 * r
             for r in range(size)]))

        got = np.empty_like(mine)
        receiving = tc.irecv(got, src=(rank - 1) % size)
        tc.send(mine, dst=(rank + 1) % size)
        receiving.wait()
        check(f"send/recv ring {n}", got, everyone[(rank - 1) % size])

    objects = [None] * size
    tc.all_gather_object(objects, {"rank": rank})
    check("all_gather_object", [o["rank"] for o in objects], list(range(size)))
    spanning = tc.new_group([1, last])  # a subgroup with a member on each end of the job
    if rank in (1, last):
        x = np.full(3, rank, np.int32)
        tc.all_reduce(x, group=spanning)
        check("all_reduce on a spanning subgroup", x, np.full(3, 1 + last, np.int32))
    # One group per host: within a host tensorcomm may use shared memory, never across hosts.
    per_host = int(os.environ["LOCAL_WORLD_SIZE"])
    host_groups = [tc.new_group(range(h, h + per_host)) for h in range(0, size, per_host)]
    x = np.full(3, rank, np.float64)
    tc.all_reduce(x, group=host_groups[rank // per_host])
    first = rank - tc.get_local_rank()
    check("all_reduce within a host", x, np.full(3, sum(range(first, first + per_host)), float))
    tc.barrier()
    tc.destroy()
    if failures:
        print(f"WRONG: {failures}")
        sys.exit(1)
    print(f"ok: {checks} results match numpy")
""")


@pytest.mark.parametrize("hosts, per_host", [(2, 2), (3, 1)], ids=["2hosts-x2", "3hosts-x1"])
def test_every_collective_across_hosts(netns_cluster: MakeCluster, tmp_path: Path,
                                       hosts: int, per_host: int) -> None:
    """Each node's launcher runs its ranks; all of them check every result against numpy."""
    cluster = netns_cluster(hosts)
    script = tmp_path / "collectives.py"
    script.write_text(RANK_SCRIPT)
    secret = secrets.token_hex(32)
    jobs = [cluster.launch(host, script, str(COLLECTIVE_TIMEOUT), nprocs=per_host, secret=secret,
                           timeout=JOB_TIMEOUT) for host in cluster.hosts]
    results = [job.finish(JOB_TIMEOUT + 10) for job in jobs]
    report = "\n".join(f"node {i} exit {r.returncode}:\n{r.stdout}{r.stderr}"
                       for i, r in enumerate(results))
    print(report)
    assert [r.returncode for r in results] == [0] * hosts, report
    for host, result in zip(cluster.hosts, results, strict=True):
        ranks = range(host.index * per_host, (host.index + 1) * per_host)
        for rank in ranks:
            # Output comes back with the global rank as prefix, from the node that ran it.
            assert re.search(rf"^\[rank {rank}\] host {host.netns} local_rank {rank % per_host} "
                             rf"sees {hosts} hosts$", result.stdout, re.M), report
            assert re.search(rf"^\[rank {rank}\] ok: \d+ results match numpy$", result.stdout,
                             re.M), report
        assert "WRONG" not in result.stdout
