"""DistributedDataParallel trains on the tensorcomm backend exactly as on Gloo.

Each rank trains the same small model (Linear layers and a BatchNorm) from the same seed twice,
once over tensorcomm and once over Gloo, on its own shard of data; the parameters and BatchNorm
statistics must agree between the two backends to floating-point tolerance, and between ranks.
A peer lost during backward must surface as an exception from ``backward()``, not a crash.
"""

from __future__ import annotations

import pytest

from tensorcomm.testing import run_ranks, spawn_ranks

pytestmark = pytest.mark.multiprocess
torch = pytest.importorskip("torch")


class _Net(torch.nn.Module):
    """A few layers, a BatchNorm (buffers DDP broadcasts every step) and an optional branch."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.BatchNorm1d(32),
                                        torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU())
        self.head = torch.nn.Linear(32, 4)
        self.aux = torch.nn.Linear(32, 4)  # used on even steps only

    def forward(self, x: torch.Tensor, use_aux: bool) -> torch.Tensor:
        hidden = self.body(x)
        out = self.head(hidden)
        return out + self.aux(hidden) if use_aux else out


# Gloo's process group can deadlock when its last reference goes away while the GIL is held
# (its destructor joins a worker thread that waits for the GIL: pytorch/pytorch#56297), which
# is what freeing a DDP module does. Rank processes end with os._exit, so keeping the modules
# here means they are never freed.
_MODULES: list[torch.nn.Module] = []


def _train(backend: str, steps: int, options: dict) -> list[torch.Tensor]:
    import torch.distributed as dist

    import tensorcomm.torch  # noqa: F401  (registers the backend)

    dist.init_process_group(backend=backend)
    rank = dist.get_rank()
    torch.manual_seed(0)  # same initial model everywhere; DDP broadcasts rank 0's anyway
    model = _Net()
    ddp = torch.nn.parallel.DistributedDataParallel(model, **options)
    _MODULES.append(ddp)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
    for step in range(steps):
        x, y = torch.randn(16, 8, generator=data), torch.randn(16, 4, generator=data)
        use_aux = step % 2 == 0 or not options.get("find_unused_parameters", False)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(ddp(x, use_aux), y).backward()
        optimizer.step()
    dist.barrier()
    dist.destroy_process_group()
    return [t.detach().clone() for t in (*model.parameters(), *model.buffers())]


_PARAMETERS = len(list(_Net().parameters()))  # the rest of _train's list are BatchNorm buffers


def _both_backends(steps: int, options: dict) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return _train("tensorcomm", steps, options), _train("gloo", steps, options)


@pytest.mark.parametrize("world_size, options", [
    (2, {}),
    (3, {"find_unused_parameters": True}),
    (2, {"static_graph": True, "gradient_as_bucket_view": True}),
], ids=["2-ranks", "3-ranks-find-unused", "2-ranks-static-graph"])
def test_ddp_on_tensorcomm_matches_gloo(world_size: int, options: dict) -> None:
    results = run_ranks(_both_backends, world_size, 6, options, timeout=90, init=False)
    reference = results[0][1]
    for rank, (ours, gloo) in enumerate(results):
        for index, (a, b) in enumerate(zip(ours, gloo)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"rank {rank} tensor {index}: {m}")
        # Parameters agree across ranks; BatchNorm statistics are updated locally by the last
        # forward (DDP broadcasts rank 0's at the start of the next one), so only per backend.
        for index, (a, c) in enumerate(zip(ours[:_PARAMETERS], reference)):
            torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"rank {rank} vs rank 0, parameter {index}: {m}")
    # Training moved the weights: the comparison above is not between two untouched models.
    torch.manual_seed(0)
    assert not torch.allclose(results[0][0][0], _Net().body[0].weight.detach(), atol=1e-3)


def _lose_peer_in_backward() -> str:
    import datetime
    import os

    import torch.distributed as dist

    import tensorcomm.torch  # noqa: F401

    dist.init_process_group(backend="tensorcomm", timeout=datetime.timedelta(seconds=20))
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(_Net())
    loss = ddp(torch.randn(4, 8), True).sum()
    if dist.get_rank() == 1:
        os._exit(3)  # vanish before the gradient all-reduce
    try:
        loss.backward()
    except RuntimeError as exc:
        return str(exc)
    return "backward returned"


def test_a_peer_lost_during_backward_raises_from_backward() -> None:
    outcomes = spawn_ranks(_lose_peer_in_backward, 2, timeout=60, init=False)
    survivor, lost = outcomes
    assert lost.exitcode == 3
    assert survivor.exitcode == 0, survivor.output  # not a crash (e.g. -11, SIGSEGV)
    assert "rank 1" in survivor.result, survivor.result
