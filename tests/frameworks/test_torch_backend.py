"""torch.distributed on the "tensorcomm" backend: every collective, object collectives, groups,
point-to-point, and the lifecycle (init under tensorcomm's store, barrier, destroy).

Ranks come from ``run_ranks``, whose environment is what ``tensorcomm run`` gives a script
(``MASTER_ADDR``/``MASTER_PORT`` naming tensorcomm's store, ``TENSORCOMM_STORE_HOSTED=1``), so
``init_process_group(backend="tensorcomm")`` with no further arguments is the README's usage.
"""

from __future__ import annotations

import pytest

from tensorcomm.testing import run_ranks

pytestmark = pytest.mark.multiprocess
torch = pytest.importorskip("torch")


def _body() -> str:
    import torch.distributed as dist

    import tensorcomm
    import tensorcomm.torch  # registers the backend

    dist.init_process_group(backend="tensorcomm")
    assert dist.get_backend() == "tensorcomm" and tensorcomm.is_initialized()
    rank, size = dist.get_rank(), dist.get_world_size()

    def data(r: int, n: int = 4, dtype=torch.float32):  # type: ignore[no-untyped-def]
        return (torch.arange(n) % 5 + r + 1).to(dtype)

    def total(n: int = 4, dtype=torch.float32):  # type: ignore[no-untyped-def]
        return sum(data(r, n, torch.float64) for r in range(size)).to(dtype)

    for dtype in (torch.float32, torch.bfloat16, torch.int32, torch.float64):
        x = data(rank, 4, dtype)
        dist.all_reduce(x)
        assert torch.equal(x, total(4, dtype)), (dtype, x)
    for op, expected in ((dist.ReduceOp.MAX, data(size - 1)), (dist.ReduceOp.MIN, data(0)),
                         (dist.ReduceOp.AVG, total() / size)):
        x = data(rank)
        dist.all_reduce(x, op=op)
        assert torch.allclose(x, expected), (op, x)
    x = data(rank)
    work = dist.all_reduce(x, async_op=True)
    assert work.wait() and torch.equal(work.get_future().wait()[0], total())

    for root in range(size):
        x = data(rank, dtype=torch.bfloat16)
        dist.broadcast(x, src=root)
        assert torch.equal(x, data(root, dtype=torch.bfloat16))
        x = data(rank)
        dist.reduce(x, dst=root)
        assert torch.equal(x, total() if rank == root else data(rank))
        gathered = [torch.zeros(4) for _ in range(size)] if rank == root else None
        dist.gather(data(rank), gathered, dst=root)
        if rank == root:
            assert all(torch.equal(gathered[r], data(r)) for r in range(size))
        out = torch.zeros(4)
        dist.scatter(out, [data(r) * 3 for r in range(size)] if rank == root else None, src=root)
        assert torch.equal(out, data(rank) * 3)

    gathered = [torch.zeros(4, dtype=torch.bfloat16) for _ in range(size)]
    dist.all_gather(gathered, data(rank, dtype=torch.bfloat16))
    assert all(torch.equal(gathered[r], data(r, dtype=torch.bfloat16)) for r in range(size))
    joined = torch.zeros(size * 4)
    dist.all_gather_into_tensor(joined, data(rank))
    assert torch.equal(joined, torch.cat([data(r) for r in range(size)]))
    out = torch.zeros(4)
    dist.reduce_scatter(out, [data(rank) * (r + 1) for r in range(size)])
    assert torch.equal(out, total() * (rank + 1))
    out = torch.zeros(2)
    dist.reduce_scatter_tensor(out, data(rank, 2 * size))
    assert torch.equal(out, total(2 * size)[2 * rank:2 * rank + 2])
    outs = [torch.zeros(2) for _ in range(size)]
    dist.all_to_all(outs, [torch.full((2,), 10.0 * rank + r) for r in range(size)])
    assert all(torch.equal(outs[r], torch.full((2,), 10.0 * r + rank)) for r in range(size))
    # Uneven all_to_all_single: rank r sends r + 1 rows to every peer.
    rows_in = [rank + 1] * size
    rows_out = [r + 1 for r in range(size)]
    out = torch.zeros(sum(rows_out), 2)
    dist.all_to_all_single(out, torch.full((sum(rows_in), 2), float(rank)), rows_out, rows_in)
    assert torch.equal(out[:, 0], torch.cat([torch.full((r + 1,), float(r)) for r in range(size)]))

    # Point to point: a ring, blocking and non-blocking, and batched.
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    received = torch.zeros(3)
    request = dist.irecv(received, src=prv)
    dist.send(torch.full((3,), float(rank)), dst=nxt)
    request.wait()
    assert torch.equal(received, torch.full((3,), float(prv)))
    received = torch.zeros(3, dtype=torch.int64)
    ops = [dist.P2POp(dist.isend, torch.full((3,), rank), nxt),
           dist.P2POp(dist.irecv, received, prv)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    assert torch.equal(received, torch.full((3,), prv))
    try:
        dist.recv(torch.zeros(1))
    except ValueError as exc:
        assert "src" in str(exc)
    else:
        raise AssertionError("recv from any source should be refused at the call")

    # Object collectives, built by torch on top of the backend's tensor collectives.
    objects = [None] * size
    dist.all_gather_object(objects, {"rank": rank, "name": f"r{rank}"})
    assert objects == [{"rank": r, "name": f"r{r}"} for r in range(size)]
    payload = [f"from {rank}", rank] if rank == 0 else [None, None]
    dist.broadcast_object_list(payload, src=0)
    assert payload == ["from 0", 0]

    # A subgroup of the first two ranks, made by every rank as torch requires.
    pair = dist.new_group([0, 1], backend="tensorcomm")
    if rank in (0, 1):
        x = torch.ones(2) * (rank + 1)
        dist.all_reduce(x, group=pair)
        assert torch.equal(x, torch.full((2,), 3.0))
        assert dist.get_rank(pair) == rank and dist.get_world_size(pair) == 2

    dist.barrier()
    dist.destroy_process_group()
    assert not tensorcomm.is_initialized()  # destroy ends the world the backend started
    return "ok"


@pytest.mark.parametrize("world_size", [2, 3])
def test_torch_distributed_runs_every_collective_on_tensorcomm(world_size: int) -> None:
    assert run_ranks(_body, world_size, timeout=90, init=False) == ["ok"] * world_size


def _reuse_body() -> None:
    import torch.distributed as dist

    import tensorcomm
    import tensorcomm.torch  # registers the backend

    # tensorcomm was started by the user (run_ranks' init): the backend joins that world and
    # leaves it running when torch's group is destroyed.
    dist.init_process_group(backend="tensorcomm")
    x = torch.ones(3)
    dist.all_reduce(x)
    tensorcomm.all_reduce(x)
    assert torch.equal(x, torch.full((3,), 4.0))
    dist.destroy_process_group()
    assert tensorcomm.is_initialized()


def test_backend_reuses_a_world_the_user_started() -> None:
    run_ranks(_reuse_body, 2, timeout=60)


def _alternate_backends() -> list[float]:
    import datetime
    import os
    import time

    import torch.distributed as dist

    import tensorcomm.torch  # noqa: F401

    sums = []
    for round_, backend in enumerate(("tensorcomm", "gloo", "gloo", "tensorcomm", "gloo")):
        if round_ == 2 and os.environ["RANK"] == "0":
            time.sleep(1.0)  # the others read the store before rank 0 has re-announced itself
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=30))
        x = torch.ones(2) * (dist.get_rank() + 1)
        dist.all_reduce(x)
        sums.append(x[0].item())
        dist.destroy_process_group()
    return sums


def test_backends_alternate_with_init_and_destroy_under_tensorcomm_run() -> None:
    # The launcher's store outlives each init_process_group; Gloo used to find the addresses
    # of the previous init under the same keys and wait for peers that had gone.
    assert run_ranks(_alternate_backends, 2, timeout=120, init=False) == [[3.0] * 5] * 2


def _late_monitored_barrier() -> list[str]:
    import datetime
    import time

    import torch.distributed as dist

    import tensorcomm.torch  # noqa: F401

    dist.init_process_group(backend="tensorcomm", timeout=datetime.timedelta(seconds=30))
    rank, outcomes = dist.get_rank(), []
    if rank == 1:
        time.sleep(2.0)  # late: rank 0 gives up after 1 s, and this rank is not released
    for seconds in (1, 20):
        try:
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=seconds))
            outcomes.append("passed")
        except RuntimeError as exc:
            outcomes.append(str(exc).split(" within")[0])
    x = torch.ones(1)
    dist.all_reduce(x)
    dist.destroy_process_group()
    return [*outcomes, str(x.item())]


def test_a_failed_monitored_barrier_leaves_nothing_for_the_next() -> None:
    # Nothing of the first barrier (a receive left posted, a late arrival) is taken by the second.
    if tuple(int(n) for n in torch.__version__.split("+")[0].split(".")[:2]) < (2, 14):
        pytest.skip("torch 2.13 runs monitored_barrier on Gloo only")
    assert run_ranks(_late_monitored_barrier, 2, timeout=90, init=False) == [
        ["monitored_barrier: rank 1 of group 'world' did not arrive", "passed", "2.0"],
        ["monitored_barrier: rank 1 was not released by rank 0", "passed", "2.0"]]


def _sparse_async() -> list[float]:
    import datetime

    import torch.distributed as dist

    import tensorcomm.torch  # noqa: F401

    dist.init_process_group(backend="tensorcomm", timeout=datetime.timedelta(seconds=30))
    rank = dist.get_rank()
    rows = torch.sparse_coo_tensor([[rank, 3]], torch.ones(2, 2) * (rank + 1), (4, 2))
    go = torch.zeros(1)
    if rank == 0:
        # returns before rank 1 has even issued its call: it waits for the message below
        work = dist.all_reduce(rows, async_op=True)
        assert not work.is_completed()
        dist.send(go, dst=1)
        work.wait()
    else:
        dist.recv(go, src=0)
        dist.all_reduce(rows)  # a blocking sparse call waits for its turn behind queued ones
    dense = rows.to_dense()
    # a second torch group over the same members (the same tensorcomm group) has its own twin
    again = torch.sparse_coo_tensor([[rank]], torch.ones(1, 2), (4, 2))
    dist.all_reduce(again, group=dist.new_group([0, 1]))
    assert again.to_dense().sum().item() == 4.0
    dist.destroy_process_group()
    return dense.sum(1).tolist()


def test_sparse_all_reduce_runs_beside_the_caller() -> None:
    # DDP's sparse gradient buckets are async calls: they must not hold up backward
    assert run_ranks(_sparse_async, 2, timeout=90, init=False) == [[2.0, 4.0, 0.0, 6.0]] * 2
