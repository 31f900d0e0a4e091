"""torch's own Gloo test cases, rewritten as bodies that run on Gloo and on tensorcomm alike.

The cases follow what torch's ``test/distributed/test_c10d_gloo.py`` checks (each body is
written here, at 2 ranks, against the public c10d API and the ``ProcessGroup`` methods Gloo
answers): every collective with its default arguments, every root, several tensors per process
where Gloo takes them, the Work API, the checks Gloo makes, stress loops of asynchronous calls,
``monitored_barrier`` and ``split_group``. Each backend runs every body in one job (the bodies run
in order, sharing the ranks); each body is a test of its own, failing with the rank's error.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import pytest

from tensorcomm.testing import run_ranks

pytestmark = pytest.mark.multiprocess
torch = pytest.importorskip("torch")

WORLD = 2


def _data(rank: int, n: int = 4, dtype: Any = None) -> Any:
    return (torch.arange(n, dtype=torch.float64) * (rank + 1) + rank).to(dtype or torch.float32)


def _total(size: int, n: int = 4, dtype: Any = None) -> Any:
    return sum(_data(r, n, torch.float64) for r in range(size)).to(dtype or torch.float32)


# -- broadcast -------------------------------------------------------------------------------

def broadcast_basics(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    for root in range(size):
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        x = _data(rank)
        pg.broadcast([x], opts).wait()
        assert torch.equal(x, _data(root))


def broadcast_default_root(pg: Any, rank: int, size: int) -> None:
    x = _data(rank)
    pg.broadcast([x]).wait()  # c10d's default options: root 0
    assert torch.equal(x, _data(0))
    y = _data(rank)
    pg.broadcast(y, 1).wait()  # the (tensor, root) overload
    assert torch.equal(y, _data(1))


def broadcast_several_tensors(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    for root in range(size):
        for root_tensor in range(3):
            opts = dist.BroadcastOptions()
            opts.rootRank, opts.rootTensor = root, root_tensor
            xs = [_data(rank) * 10 + i for i in range(3)]
            pg.broadcast(xs, opts).wait()
            assert all(torch.equal(x, _data(root) * 10 + root_tensor) for x in xs)


def broadcast_stress(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    inputs = [torch.tensor([i * size + rank], dtype=torch.float32) for i in range(40)]
    works = [dist.broadcast(t, src=i % size, async_op=True) for i, t in enumerate(inputs)]
    for i, work in enumerate(works):
        work.wait()
        assert inputs[i].item() == i * size + i % size


def broadcast_checks(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    opts = dist.BroadcastOptions()
    opts.rootRank = size  # out of range
    with pytest.raises((ValueError, RuntimeError)):
        pg.broadcast([torch.zeros(1)], opts)
    opts.rootRank = -1
    with pytest.raises((ValueError, RuntimeError)):
        pg.broadcast([torch.zeros(1)], opts)


# -- all_reduce ------------------------------------------------------------------------------

def allreduce_basics(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    cases = [(dist.ReduceOp.SUM, _total(size)), (dist.ReduceOp.MIN, _data(0)),
             (dist.ReduceOp.MAX, _data(size - 1)),
             (dist.ReduceOp.PRODUCT, _data(0) * _data(1))]
    for op, expected in cases:
        opts = dist.AllreduceOptions()
        opts.reduceOp = op
        x = _data(rank)
        pg.allreduce([x], opts).wait()
        assert torch.equal(x, expected), (op, x)


def allreduce_default_op(pg: Any, rank: int, size: int) -> None:
    x = _data(rank)
    pg.allreduce([x]).wait()  # default options: SUM
    assert torch.equal(x, _total(size))
    y = _data(rank)
    pg.allreduce(y).wait()  # the single-tensor overload
    assert torch.equal(y, _total(size))


def allreduce_several_tensors(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    xs = [_data(rank) + i for i in range(3)]
    pg.allreduce(xs).wait()
    expected = sum(_data(r) + i for r in range(size) for i in range(3))
    assert all(torch.equal(x, expected) for x in xs)
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    ys = [_data(rank) + i for i in range(2)]
    pg.allreduce(ys, opts).wait()
    assert all(torch.equal(y, _data(size - 1) + 1) for y in ys)


def allreduce_work_result(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    x = _data(rank)
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    assert work.is_completed() and work.is_success()
    assert torch.equal(work.result()[0], _total(size))
    assert torch.equal(work.get_future().wait()[0], _total(size))


def allreduce_stress(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    inputs = [torch.tensor([i + rank], dtype=torch.float32) for i in range(50)]
    works = [dist.all_reduce(t, async_op=True) for t in inputs]
    for i, work in enumerate(works):
        work.wait()
        assert inputs[i].item() == size * i + sum(range(size))


def allreduce_dtypes(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    for dtype in (torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8,
                  torch.int32, torch.int64):
        x = _data(rank, dtype=dtype)
        dist.all_reduce(x)
        assert torch.equal(x, _total(size, dtype=dtype)), dtype


def allreduce_bitwise(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    values = [0b1100, 0b1010]
    for op, expected in ((dist.ReduceOp.BAND, 0b1000), (dist.ReduceOp.BOR, 0b1110),
                         (dist.ReduceOp.BXOR, 0b0110)):
        x = torch.full((3,), values[rank], dtype=torch.int32)
        dist.all_reduce(x, op=op)
        assert torch.equal(x, torch.full((3,), expected, dtype=torch.int32)), op


def allreduce_empty(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    x = torch.zeros(0)
    dist.all_reduce(x)
    assert x.numel() == 0


def allreduce_noncontiguous(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    base = _data(rank, 8).reshape(4, 2)
    view = base.t()  # not contiguous
    dist.all_reduce(view)
    assert torch.equal(base, _total(size, 8).reshape(4, 2))


def allreduce_coalesced_basics(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    xs = [_data(rank, 3), _data(rank, 5) * 2, _data(rank, 1)]
    dist.all_reduce_coalesced(xs)
    assert torch.equal(xs[0], _total(size, 3)) and torch.equal(xs[1], _total(size, 5) * 2)
    assert torch.equal(xs[2], _total(size, 1))


def allreduce_coalesced_checks(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    with pytest.raises((ValueError, RuntimeError)):
        pg.allreduce_coalesced([torch.zeros(1), torch.zeros(1, dtype=torch.float64)],
                               dist.AllreduceCoalescedOptions())


# -- reduce ----------------------------------------------------------------------------------

def reduce_basics(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    for root in range(size):
        opts = dist.ReduceOptions()
        opts.rootRank, opts.reduceOp = root, dist.ReduceOp.SUM
        x = _data(rank)
        pg.reduce([x], opts).wait()
        if rank == root:
            assert torch.equal(x, _total(size))


def reduce_default_root(pg: Any, rank: int, size: int) -> None:
    x = _data(rank)
    pg.reduce([x]).wait()  # default options: root 0, SUM
    if rank == 0:
        assert torch.equal(x, _total(size))


def reduce_stress(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    inputs = [torch.tensor([i + rank], dtype=torch.float32) for i in range(30)]
    works = [dist.reduce(t, dst=i % size, async_op=True) for i, t in enumerate(inputs)]
    for i, work in enumerate(works):
        work.wait()
        if rank == i % size:
            assert inputs[i].item() == size * i + sum(range(size))


def reduce_checks(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    opts = dist.ReduceOptions()
    opts.rootRank = size
    with pytest.raises((ValueError, RuntimeError)):
        pg.reduce([torch.zeros(1)], opts)


# -- all_gather ------------------------------------------------------------------------------

def allgather_basics(pg: Any, rank: int, size: int) -> None:
    outputs = [[torch.zeros(4) for _ in range(size)]]
    pg.allgather(outputs, [_data(rank)]).wait()
    assert all(torch.equal(outputs[0][r], _data(r)) for r in range(size))


def allgather_several_tensors(pg: Any, rank: int, size: int) -> None:
    for n in (2, 3):
        inputs = [_data(rank) + 100 * i for i in range(n)]
        outputs = [[torch.zeros(4) for _ in range(size * n)] for _ in range(n)]
        pg.allgather(outputs, inputs).wait()
        expected = [_data(r) + 100 * i for r in range(size) for i in range(n)]
        for got in outputs:
            assert all(torch.equal(g, e) for g, e in zip(got, expected, strict=True))


def allgather_stress(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    outputs = [[torch.zeros(1) for _ in range(size)] for _ in range(30)]
    works = [dist.all_gather(out, torch.tensor([float(i + rank)]), async_op=True)
             for i, out in enumerate(outputs)]
    for i, work in enumerate(works):
        work.wait()
        assert [t.item() for t in outputs[i]] == [float(i + r) for r in range(size)]


def allgather_coalesced_basics(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    outputs = [[torch.zeros(2), torch.zeros(3)] for _ in range(size)]
    dist.all_gather_coalesced(outputs, [_data(rank, 2), _data(rank, 3)])
    for r in range(size):
        assert torch.equal(outputs[r][0], _data(r, 2)) and torch.equal(outputs[r][1], _data(r, 3))


def allgather_into_tensor(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    out = torch.zeros(size * 4)
    dist.all_gather_into_tensor(out, _data(rank))
    assert torch.equal(out, torch.cat([_data(r) for r in range(size)]))
    rows = torch.zeros(size * 2, 3)
    dist.all_gather_into_tensor(rows, _data(rank, 6).reshape(2, 3))
    assert torch.equal(rows, torch.cat([_data(r, 6).reshape(2, 3) for r in range(size)]))


def allgather_checks(pg: Any, rank: int, size: int) -> None:
    with pytest.raises((ValueError, RuntimeError)):
        pg.allgather([[torch.zeros(4)] * (size + 1)], [torch.zeros(4)])


# -- gather / scatter ------------------------------------------------------------------------

def gather_basics(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    for root in range(size):
        opts = dist.GatherOptions()
        opts.rootRank = root
        outputs = [[torch.zeros(4) for _ in range(size)]] if rank == root else []
        pg.gather(outputs, [_data(rank)], opts).wait()
        if rank == root:
            assert all(torch.equal(outputs[0][r], _data(r)) for r in range(size))


def gather_stress(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    outputs = [[torch.zeros(1) for _ in range(size)] for _ in range(30)]
    works = [dist.gather(torch.tensor([float(i + rank)]), out if rank == i % size else None,
                         dst=i % size, async_op=True) for i, out in enumerate(outputs)]
    for i, work in enumerate(works):
        work.wait()
        if rank == i % size:
            assert [t.item() for t in outputs[i]] == [float(i + r) for r in range(size)]


def scatter_basics(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    for root in range(size):
        opts = dist.ScatterOptions()
        opts.rootRank = root
        out = torch.zeros(4)
        inputs = [[_data(r) * 7 for r in range(size)]] if rank == root else []
        pg.scatter([out], inputs, opts).wait()
        assert torch.equal(out, _data(rank) * 7)


def scatter_stress(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    outputs = [torch.zeros(1) for _ in range(30)]
    works = [dist.scatter(out, [torch.tensor([float(i * 10 + r)]) for r in range(size)]
                          if rank == i % size else None, src=i % size, async_op=True)
             for i, out in enumerate(outputs)]
    for i, work in enumerate(works):
        work.wait()
        assert outputs[i].item() == float(i * 10 + rank)


# -- reduce_scatter / all_to_all -------------------------------------------------------------

def reduce_scatter_basics(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    out = torch.zeros(4)
    dist.reduce_scatter(out, [_data(rank) * (r + 1) for r in range(size)])
    assert torch.equal(out, _total(size) * (rank + 1))


def reduce_scatter_tensor(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    out = torch.zeros(3)
    dist.reduce_scatter_tensor(out, _data(rank, 3 * size))
    assert torch.equal(out, _total(size, 3 * size)[3 * rank:3 * rank + 3])


def alltoall_base_equal(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    out = torch.zeros(size * 2)
    dist.all_to_all_single(out, torch.arange(size * 2, dtype=torch.float32) + 100 * rank)
    expected = torch.cat([torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float32) + 100 * r
                          for r in range(size)])
    assert torch.equal(out, expected)


def alltoall_base_uneven(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    send = [r + 1 for r in range(size)]  # rank r gets r + 1 rows from everyone
    recv = [rank + 1] * size
    out = torch.zeros(sum(recv))
    dist.all_to_all_single(out, torch.full((sum(send),), float(rank)), recv, send)
    assert torch.equal(out, torch.cat([torch.full((rank + 1,), float(r)) for r in range(size)]))


def alltoall_list(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    outs = [torch.zeros(2) for _ in range(size)]
    dist.all_to_all(outs, [torch.full((2,), 10.0 * rank + r) for r in range(size)])
    assert all(torch.equal(outs[r], torch.full((2,), 10.0 * r + rank)) for r in range(size))


# -- point to point, barriers ----------------------------------------------------------------

def send_recv_all_to_all(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    outputs = [torch.full((2,), -1.0) for _ in range(size)]
    works = []
    for peer in range(size):
        if peer != rank:
            works.append(dist.isend(torch.full((2,), float(rank)), peer))
            works.append(dist.irecv(outputs[peer], peer))
    for work in works:
        work.wait()
    assert all(torch.equal(outputs[p], torch.full((2,), float(p))) for p in range(size) if p != rank)


def send_recv_tags(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    peer = 1 - rank
    first, second = torch.zeros(1), torch.zeros(1)
    if rank == 0:
        dist.send(torch.tensor([2.0]), peer, tag=2)
        dist.send(torch.tensor([1.0]), peer, tag=1)
    else:
        later = dist.irecv(second, peer, tag=2)
        dist.recv(first, peer, tag=1)
        later.wait()
        assert (first.item(), second.item()) == (1.0, 2.0)


def batch_isend_irecv(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    got = torch.zeros(3, dtype=torch.int64)
    ops = [dist.P2POp(dist.isend, torch.full((3,), rank), nxt), dist.P2POp(dist.irecv, got, prv)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    assert torch.equal(got, torch.full((3,), prv))


def barrier_implies_wait(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    tensors = [torch.full((64,), float(i)) for i in range(20)]
    for t in tensors:
        dist.all_reduce(t, async_op=True)
    dist.barrier()
    assert all(torch.equal(t, torch.full((64,), float(i * size))) for i, t in enumerate(tensors))


def monitored_barrier_passes(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30), wait_all_ranks=True)


def monitored_barrier_names_missing_rank(pg: Any, rank: int, size: int) -> None:
    # The last body: rank 1 never arrives, and Gloo's group is unusable after the timeout.
    import time

    import torch.distributed as dist
    if rank == 0:
        with pytest.raises(RuntimeError, match="1"):
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=2), wait_all_ranks=True)
    else:
        time.sleep(6)  # past rank 0's timeout, before this rank's connections close


# -- groups, objects -------------------------------------------------------------------------

def new_group_collectives(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    pair = dist.new_group(list(range(size)))
    x = _data(rank)
    dist.all_reduce(x, group=pair)
    assert torch.equal(x, _total(size))
    alone = dist.new_group([1])
    if rank == 1:
        y = _data(rank)
        dist.all_reduce(y, group=alone)
        assert torch.equal(y, _data(1)) and dist.get_rank(alone) == 0


def split_group_collectives(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    if not hasattr(dist, "split_group"):
        return
    child = dist.split_group(split_ranks=[[1, 0]])
    assert child is not None and dist.get_world_size(child) == size
    x = _data(rank)
    dist.all_reduce(x, group=child)
    assert torch.equal(x, _total(size))
    y = _data(rank)
    dist.broadcast(y, group_src=0, group=child)  # group rank 0 of [1, 0] is global rank 1
    assert torch.equal(y, _data(1))


def object_collectives(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    objects: list[Any] = [None] * size
    dist.all_gather_object(objects, {"rank": rank})
    assert objects == [{"rank": r} for r in range(size)]
    payload = ["hello", rank] if rank == 1 else [None, None]
    dist.broadcast_object_list(payload, src=1)
    assert payload == ["hello", 1]


def object_point_to_point(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    if rank == 0:
        dist.send_object_list([{"a": 1}, "two", torch.arange(3)], dst=1)
    elif rank == 1:
        got: list[Any] = [None, None, None]
        assert dist.recv_object_list(got, src=0) == 0
        assert got[:2] == [{"a": 1}, "two"] and torch.equal(got[2], torch.arange(3))


def round_robin_of_groups(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    groups = [dist.new_group(list(range(size))) for _ in range(3)]
    x = torch.ones(2)
    for i in range(6):
        dist.all_reduce(x, group=groups[i % 3])
    assert torch.equal(x, torch.full((2,), float(size ** 6)))


# -- sparse allreduce ------------------------------------------------------------------------

def _sparse(rank: int, sparse_dim: int = 1, repeat: bool = False) -> Any:
    """Rank ``rank``'s COO tensor of size (6, 3): rows overlapping other ranks', rank+2 entries
    (``repeat``: its first row given twice, uncoalesced)."""
    rows = [(rank + 2 * i) % 6 for i in range(rank + 2)] + ([rank % 6] if repeat else [])
    if sparse_dim == 1:
        values = torch.stack([torch.arange(3.0) + 10 * rank + i for i in range(len(rows))])
        return torch.sparse_coo_tensor([rows], values, (6, 3))
    cols = [(r + rank) % 3 for r in rows]
    return torch.sparse_coo_tensor([rows, cols], torch.arange(len(rows), dtype=torch.float32) + rank,
                                   (6, 3))


def _sparse_total(size: int, sparse_dim: int = 1, repeat: bool = False) -> Any:
    return sum(_sparse(r, sparse_dim, repeat).to_dense() for r in range(size))


def sparse_allreduce_basics(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    for sparse_dim in (1, 2):
        x = _sparse(rank, sparse_dim)
        pg.allreduce([x], dist.AllreduceOptions()).wait()
        assert x.is_sparse and x.is_coalesced()
        assert torch.equal(x.to_dense(), _sparse_total(size, sparse_dim))
        y = _sparse(rank, sparse_dim)
        dist.all_reduce(y)  # the public call, SUM by default
        assert torch.equal(y.to_dense(), _sparse_total(size, sparse_dim))


def sparse_allreduce_several_tensors(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    xs = [_sparse(rank), _sparse(rank + 1)]
    pg.allreduce(xs, dist.AllreduceOptions()).wait()
    want = sum(_sparse(r).to_dense() + _sparse(r + 1).to_dense() for r in range(size))
    assert all(torch.equal(x.to_dense(), want) for x in xs)


def sparse_allreduce_checks(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    dense, small = torch.zeros(2), torch.sparse_coo_tensor([[0]], [1.0], (2,))
    large = torch.sparse_coo_tensor([[0]], [1.0], (4,))
    with pytest.raises((ValueError, RuntimeError), match="layout"):
        pg.allreduce([dense, small], dist.AllreduceOptions())
    with pytest.raises((ValueError, RuntimeError), match="size"):
        pg.allreduce([small, large], dist.AllreduceOptions())
    for op in (dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX):
        opts = dist.AllreduceOptions()
        opts.reduceOp = op
        with pytest.raises((ValueError, RuntimeError)):
            pg.allreduce([large], opts).wait()


def sparse_allreduce_coalesced_indices(pg: Any, rank: int, size: int) -> None:
    import torch.distributed as dist
    x = _sparse(rank, repeat=True)
    assert not x.is_coalesced()
    pg.allreduce([x], dist.AllreduceOptions()).wait()
    want = _sparse_total(size, repeat=True)
    assert x.is_coalesced()
    rows = x.indices()[0]
    assert torch.equal(rows, torch.unique(rows))  # sorted, each row once
    given = sum(_sparse(r, repeat=True).to_dense().abs().sum(1) for r in range(size)) > 0
    assert torch.equal(rows, torch.nonzero(given).flatten())  # every row some rank gave
    assert torch.equal(x.to_dense(), want)


BODIES: list[Callable[[Any, int, int], None]] = [
    broadcast_basics, broadcast_default_root, broadcast_several_tensors, broadcast_stress,
    broadcast_checks, allreduce_basics, allreduce_default_op, allreduce_several_tensors,
    allreduce_work_result, allreduce_stress, allreduce_dtypes, allreduce_bitwise, allreduce_empty,
    allreduce_noncontiguous, allreduce_coalesced_basics, allreduce_coalesced_checks,
    reduce_basics, reduce_default_root, reduce_stress, reduce_checks, allgather_basics,
    allgather_several_tensors, allgather_stress, allgather_coalesced_basics,
    allgather_into_tensor, allgather_checks, gather_basics, gather_stress, scatter_basics,
    scatter_stress, reduce_scatter_basics, reduce_scatter_tensor, alltoall_base_equal,
    alltoall_base_uneven, alltoall_list, send_recv_all_to_all, send_recv_tags,
    batch_isend_irecv, barrier_implies_wait, monitored_barrier_passes, new_group_collectives,
    split_group_collectives, object_collectives, object_point_to_point, round_robin_of_groups,
    monitored_barrier_names_missing_rank,
]


def _skipped(body: Callable[[Any, int, int], None], backend: str) -> str:
    """Why ``body`` cannot run on ``backend`` with this torch ("" when it can)."""
    release = tuple(int(n) for n in torch.__version__.split("+")[0].split(".")[:2])
    if body in (monitored_barrier_passes, monitored_barrier_names_missing_rank) \
            and release < (2, 14) and backend != "gloo":
        return "torch 2.13 runs monitored_barrier on Gloo only"
    if body is split_group_collectives and release < (2, 15):
        return "torch before 2.15 splits only a group bound to a device (device_id=), Gloo's too"
    return ""


SPARSE: list[Callable[[Any, int, int], None]] = [
    sparse_allreduce_basics, sparse_allreduce_several_tensors, sparse_allreduce_checks,
    sparse_allreduce_coalesced_indices,
]


def _run_all(backend: str) -> dict[str, str]:
    """Every body in order on ``backend``; its name -> "" (passed) or the error."""
    import traceback

    import torch.distributed as dist

    import tensorcomm.torch  # noqa: F401 (registers the backend)

    dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=60))
    pg = dist.group.WORLD
    rank, size = dist.get_rank(), dist.get_world_size()
    outcome = {}
    for body in [*SPARSE, *BODIES]:
        reason = _skipped(body, backend)
        if reason:
            outcome[body.__name__] = f"skip: {reason}"
            continue
        try:
            body(pg, rank, size)
            outcome[body.__name__] = ""
        except Exception:  # noqa: BLE001 (a body's error is its test's result)
            outcome[body.__name__] = traceback.format_exc(limit=4)
        if body is not monitored_barrier_names_missing_rank:
            dist.barrier()
    dist.destroy_process_group()
    return outcome


_results: dict[str, list[dict[str, str]]] = {}


def _outcome(backend: str, name: str) -> str:
    if backend not in _results:
        _results[backend] = run_ranks(_run_all, WORLD, backend, timeout=400, init=False)
    outcomes = [o[name] for o in _results[backend]]
    if outcomes[0].startswith("skip: "):
        pytest.skip(outcomes[0][len("skip: "):])
    return "\n".join(f"rank {r}: {o}" for r, o in enumerate(outcomes) if o)


@pytest.mark.parametrize("backend", ["gloo", "tensorcomm"])
@pytest.mark.parametrize("body", [b.__name__ for b in BODIES])
def test_gloo_case(body: str, backend: str) -> None:
    errors = _outcome(backend, body)
    assert not errors, errors


@pytest.mark.parametrize("backend", ["gloo", "tensorcomm"])
@pytest.mark.parametrize("body", [b.__name__ for b in SPARSE])
def test_gloo_sparse_case(body: str, backend: str) -> None:
    errors = _outcome(backend, body)
    assert not errors, errors
