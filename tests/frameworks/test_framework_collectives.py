"""Every collective over torch, JAX and MindSpore arrays on real ranks, in both styles.

In place (torch-style functions) where the framework allows it, returning (``tensorcomm.ops``)
always: results come back as the caller's own type. One rank body per framework checks
everything, because importing a framework costs seconds per rank.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.testing import run_ranks

pytestmark = pytest.mark.multiprocess


def _torch_body() -> None:
    import torch

    from tensorcomm import ops

    rank, size = tc.get_rank(), tc.get_world_size()

    def data(r: int, n: int = 6, dtype=torch.float32):  # type: ignore[no-untyped-def]
        return (torch.arange(n) % 7 + r + 1).to(dtype)  # small integers: sums exact in any order

    def total(n: int = 6, dtype=torch.float32):  # type: ignore[no-untyped-def]
        return sum(data(r, n, torch.float64) for r in range(size)).to(dtype)

    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.float16, torch.float64):
        x = data(rank, 6, dtype)
        tc.all_reduce(x)
        assert x.dtype == dtype and torch.equal(x, total(6, dtype)), (dtype, x)
        y = ops.AllReduce("sum")(data(rank, 6, dtype))
        assert isinstance(y, torch.Tensor) and y.dtype == dtype and torch.equal(y, total(6, dtype))

    # Outputs that are not plain contiguous tensors: a strided column, a parameter, async.
    grid = torch.zeros(6, 3)
    grid[:, 1] = data(rank)
    tc.all_reduce(grid[:, 1], op="max")
    assert torch.equal(grid[:, 1], data(size - 1)) and grid[:, 0].abs().sum() == 0
    weight = torch.nn.Parameter(data(rank))
    tc.all_reduce(weight, op=tc.ReduceOp.AVG)
    assert torch.allclose(weight.detach(), total() / size) and weight.requires_grad
    x = data(rank)
    work = tc.all_reduce(x, async_op=True)
    work.wait()
    assert torch.equal(x, total())

    for root in range(size):
        x = data(rank, dtype=torch.bfloat16)
        tc.broadcast(x, src=root)
        assert torch.equal(x, data(root, dtype=torch.bfloat16))
        x = data(rank)
        tc.reduce(x, dst=root)
        assert torch.equal(x, total() if rank == root else data(rank))
        gathered = [torch.zeros(6) for _ in range(size)]
        tc.gather(data(rank), gathered if rank == root else None, dst=root)
        if rank == root:
            assert all(torch.equal(gathered[r], data(r)) for r in range(size))
        out = torch.zeros(6, dtype=torch.int32)
        tc.scatter(out, [data(r, dtype=torch.int32) * 10 for r in range(size)] if rank == root else None,
                   src=root)
        assert torch.equal(out, data(rank, dtype=torch.int32) * 10)

    gathered = [torch.zeros(6, dtype=torch.bfloat16) for _ in range(size)]
    tc.all_gather(gathered, data(rank, dtype=torch.bfloat16))
    assert all(torch.equal(gathered[r], data(r, dtype=torch.bfloat16)) for r in range(size))
    joined = torch.zeros(size, 6)
    tc.all_gather_into_tensor(joined, data(rank))
    assert torch.equal(joined, torch.stack([data(r) for r in range(size)]))
    out = torch.zeros(6)
    tc.reduce_scatter(out, [data(rank) * (r + 1) for r in range(size)])
    assert torch.equal(out, total() * (rank + 1))
    out = torch.zeros(2)
    tc.reduce_scatter_tensor(out, data(rank, 2 * size))
    assert torch.equal(out, total(2 * size)[2 * rank:2 * rank + 2])
    outs = [torch.zeros(2) for _ in range(size)]
    tc.all_to_all(outs, [torch.full((2,), 10.0 * rank + r) for r in range(size)])
    assert all(torch.equal(outs[r], torch.full((2,), 10.0 * r + rank)) for r in range(size))
    out = torch.zeros(size, 2)
    tc.all_to_all_single(out, torch.stack([torch.full((2,), 10.0 * rank + r) for r in range(size)]))
    assert torch.equal(out, torch.stack([torch.full((2,), 10.0 * r + rank) for r in range(size)]))

    received = torch.zeros(4, dtype=torch.bfloat16)
    incoming = tc.irecv(received, src=(rank - 1) % size)
    tc.send(torch.full((4,), float(rank), dtype=torch.bfloat16), dst=(rank + 1) % size)
    incoming.wait()
    assert torch.equal(received, torch.full((4,), float((rank - 1) % size), dtype=torch.bfloat16))

    # Returning style: new tensors of the input's kind, inputs untouched.
    x = data(rank, 2 * size, torch.bfloat16)
    before = x.clone()
    gathered = ops.AllGather()(x.reshape(2, size))
    assert isinstance(gathered, torch.Tensor) and gathered.dtype == torch.bfloat16
    assert torch.equal(gathered, torch.cat([data(r, 2 * size, torch.bfloat16).reshape(2, size)
                                            for r in range(size)]))
    block = ops.ReduceScatter("sum")(x)
    assert torch.equal(block, total(2 * size, torch.bfloat16)[2 * rank:2 * rank + 2])
    (copy,) = ops.Broadcast(root_rank=0)((x,))
    assert torch.equal(copy, data(0, 2 * size, torch.bfloat16))
    exchanged = ops.AlltoAll(split_count=size, split_dim=0, concat_dim=1)(
        torch.full((size, 2), float(rank)))
    assert exchanged.shape == (1, 2 * size) and isinstance(exchanged, torch.Tensor)
    assert torch.equal(exchanged[0, ::2], torch.arange(size, dtype=torch.float32))
    assert torch.equal(x, before)


def test_every_collective_over_torch_tensors() -> None:
    pytest.importorskip("torch")
    run_ranks(_torch_body, 3, timeout=90)


def _jax_body() -> None:
    import jax
    import jax.numpy as jnp

    from tensorcomm import ops

    rank, size = tc.get_rank(), tc.get_world_size()
    x = jnp.arange(4, dtype=jnp.bfloat16) + rank
    expected = sum(np.arange(4, dtype=np.float32) + r for r in range(size))
    total = ops.AllReduce()(x)
    assert isinstance(total, jax.Array) and total.dtype == jnp.bfloat16
    assert np.asarray(total, np.float32).tolist() == expected.tolist()
    gathered = ops.AllGather()(x.reshape(1, 4))
    assert isinstance(gathered, jax.Array) and gathered.shape == (size, 4)
    (copy,) = ops.Broadcast(root_rank=size - 1)((jnp.full(3, rank, jnp.int32),))
    assert np.asarray(copy).tolist() == [size - 1] * 3
    block = ops.ReduceScatter()(jnp.ones(2 * size, jnp.float32))
    assert isinstance(block, jax.Array) and np.asarray(block).tolist() == [float(size)] * 2

    # In place: JAX arrays may be inputs; as outputs the error points to the returning style.
    outs = [np.zeros(4, np.float32) for _ in range(size)]
    tc.all_gather(outs, jnp.arange(4, dtype=jnp.float32) + rank)
    assert all(outs[r].tolist() == (np.arange(4) + r).tolist() for r in range(size))
    try:
        tc.all_reduce(jnp.ones(2))
    except TypeError as exc:
        assert "tensorcomm.ops" in str(exc)
    else:
        raise AssertionError("all_reduce into a JAX array should raise TypeError")


def test_collectives_over_jax_arrays_return_jax_arrays() -> None:
    pytest.importorskip("jax")
    run_ranks(_jax_body, 2, timeout=90)


def _mindspore_body() -> None:
    import mindspore as ms

    from tensorcomm import ops

    rank, size = tc.get_rank(), tc.get_world_size()
    x = ms.Tensor(np.arange(4, dtype=np.float32) + rank)
    tc.all_reduce(x)
    expected = sum(np.arange(4, dtype=np.float32) + r for r in range(size))
    assert x.asnumpy().tolist() == expected.tolist()
    half = ms.Tensor(np.arange(4, dtype=np.float32) + rank).astype(ms.bfloat16)
    tc.broadcast(half, src=0)
    assert half.astype(ms.float32).asnumpy().tolist() == list(range(4))
    total = ops.AllReduce("sum")(ms.Tensor(np.arange(4, dtype=np.float32) + rank).astype(ms.bfloat16))
    assert isinstance(total, ms.Tensor) and total.dtype == ms.bfloat16
    assert total.astype(ms.float32).asnumpy().tolist() == expected.tolist()
    gathered = ops.AllGather()(ms.Tensor(np.full((1, 2), rank, np.int32)))
    assert isinstance(gathered, ms.Tensor) and gathered.asnumpy()[:, 0].tolist() == list(range(size))


def test_collectives_over_mindspore_tensors() -> None:
    pytest.importorskip("mindspore")
    run_ranks(_mindspore_body, 2, timeout=90)
