"""DistributedDataParallel with a sparse embedding trains on tensorcomm exactly as on Gloo.

Each rank trains the same model (an ``nn.Embedding(sparse=True)``, whose gradients are sparse COO
tensors DDP all-reduces as they are, and a dense head) from the same seed twice, over tensorcomm
and over Gloo, on its own batches of token ids; the parameters must agree between the backends
and between ranks.
"""

from __future__ import annotations

import pytest

from tensorcomm.testing import run_ranks

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]
torch = pytest.importorskip("torch")

_ROWS = 50
_MODULES: list[torch.nn.Module] = []  # never freed: see test_ddp.py (pytorch/pytorch#56297)


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(_ROWS, 8, sparse=True)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(ids).mean(1))


def _train(backend: str, steps: int) -> list[torch.Tensor]:
    import torch.distributed as dist

    import tensorcomm.torch  # noqa: F401  (registers the backend)

    dist.init_process_group(backend=backend)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = _Net()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    _MODULES.append(ddp)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.5)
    data = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        # A few rows per rank, repeated within a batch and overlapping the other ranks' rows.
        ids = torch.randint(0, _ROWS // 2 + 5 * rank, (4, 6), generator=data)
        y = torch.randn(4, 2, generator=data)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(ddp(ids), y).backward()
        assert model.embedding.weight.grad.is_sparse
        optimizer.step()
    dist.barrier()
    dist.destroy_process_group()
    return [p.detach().clone() for p in model.parameters()]


def _both(steps: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return _train("tensorcomm", steps), _train("gloo", steps)


@pytest.mark.parametrize("world_size, env", [(2, {}), (3, {}), (3, {"TENSORCOMM_TRANSPORT": "tcp"})],
                         ids=["2-ranks-shm", "3-ranks-shm", "3-ranks-tcp"])
def test_ddp_sparse_embedding_matches_gloo(world_size: int, env: dict) -> None:
    per_rank = run_ranks(_both, world_size, 5, timeout=240, init=False, env=env)
    for rank, (ours, gloo) in enumerate(per_rank):
        for index, (a, b, c) in enumerate(zip(ours, gloo, per_rank[0][0], strict=True)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m, i=index, r=rank:
                                       f"rank {r} parameter {i}, tensorcomm vs gloo: {m}")
            torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-6, msg=lambda m, i=index, r=rank:
                                       f"rank {r} vs rank 0, parameter {i}: {m}")
    # Training moved the embedding, in rows beyond any one rank's share too.
    torch.manual_seed(0)
    start = _Net().embedding.weight.detach()
    moved = (per_rank[0][0][0] - start).abs().sum(1) > 0
    assert moved.sum() > _ROWS // 2
