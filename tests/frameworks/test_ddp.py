"""DistributedDataParallel trains on the tensorcomm backend exactly as on Gloo.

Each rank trains the same small model (Linear layers and a BatchNorm) from the same seed twice,
once over tensorcomm and once over Gloo, on its own shard of data; the parameters and BatchNorm
statistics must agree between the two backends to floating-point tolerance, and between ranks.
A peer lost during backward must surface as an exception from ``backward()``, not a crash.
"""

from __future__ import annotations

import pytest

from tensorcomm.testing import run_ranks, spawn_ranks

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]  # margins for a loaded machine
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


def _both_backends(steps: int,
                   option_sets: list[dict]) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    return [(_train("tensorcomm", steps, options), _train("gloo", steps, options))
            for options in option_sets]


@pytest.mark.parametrize("world_size, option_sets", [
    (2, [{}, {"static_graph": True, "gradient_as_bucket_view": True}]),
    (3, [{"find_unused_parameters": True}]),
], ids=["2-ranks-plain-and-static-graph", "3-ranks-find-unused"])
def test_ddp_on_tensorcomm_matches_gloo(world_size: int, option_sets: list[dict]) -> None:
    per_rank = run_ranks(_both_backends, world_size, 6, option_sets, timeout=240, init=False)
    for case, options in enumerate(option_sets):
        reference = per_rank[0][case][1]
        for rank, runs in enumerate(per_rank):
            ours, gloo = runs[case]
            for index, (a, b) in enumerate(zip(ours, gloo, strict=True)):
                where = f"{options}, rank {rank} tensor {index}"
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6,
                                           msg=lambda m, where=where: f"{where}: {m}")
            # Parameters agree across ranks; BatchNorm statistics are updated locally by the last
            # forward (DDP broadcasts rank 0's at the start of the next one), so only per backend.
            for index, (a, c) in enumerate(zip(ours[:_PARAMETERS], reference[:_PARAMETERS], strict=True)):
                where = f"{options}, rank {rank} vs 0, parameter {index}"
                torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-6,
                                           msg=lambda m, where=where: f"{where}: {m}")
        # Training moved the weights: the comparison above is not between two untouched models.
        torch.manual_seed(0)
        assert not torch.allclose(per_rank[0][case][0][0], _Net().body[0].weight.detach(), atol=1e-3)


def _lose_peer(wrapper: str, when: str) -> list[str]:
    import datetime
    import os

    import torch.distributed as dist

    import tensorcomm.torch  # noqa: F401

    dist.init_process_group(backend="tensorcomm", timeout=datetime.timedelta(seconds=30))
    torch.manual_seed(0)
    # 2.6 MB of gradients: DDP buckets of 0.25 MB (the first 1 MB), FSDP2 one unit per layer, so
    # several calls are in flight when the peer goes.
    layers = [torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
              torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 4)]
    model = torch.nn.Sequential(*layers)
    if wrapper == "DDP":
        wrapped = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
    else:
        from torch.distributed.fsdp import fully_shard

        for layer in layers[::2]:
            fully_shard(layer)
        wrapped = fully_shard(model)
    _MODULES.append(wrapped)
    x = torch.randn(16, 256)
    wrapped(x).sum().backward()  # one whole step first: buckets rebuilt, every path warm
    if dist.get_rank() == 1:
        if when == "during forward":  # FSDP2 gathers the next layers' parameters ahead
            layers[2].register_forward_hook(lambda *args: os._exit(3))
        else:  # the first layer's gradients come last: the later layers' calls are under way
            layers[0].register_full_backward_pre_hook(lambda *args: os._exit(3))
    outcome = []
    try:
        wrapped(x).sum().backward()
        outcome.append("forward and backward returned")
    except RuntimeError as exc:
        outcome.append(f"raised: {exc}")
    try:
        dist.all_reduce(torch.ones(2))
        outcome.append("the next call returned")
    except RuntimeError as exc:
        outcome.append(f"the next call raised {type(exc).__name__}: {exc}")
    return outcome


@pytest.mark.parametrize("wrapper, when", [("DDP", "during backward"), ("FSDP2", "during forward"),
                                           ("FSDP2", "during backward")])
def test_a_peer_lost_mid_step_raises_in_the_step(wrapper: str, when: str) -> None:
    # A torch future completed with an error used to take the process down (SIGSEGV in DDP's
    # reducer): frontends/torch_work.py says why and how failures reach backward() instead.
    outcomes = spawn_ranks(_lose_peer, 2, wrapper, when, timeout=180, init=False)
    survivor, lost = outcomes
    assert lost.exitcode == 3, lost.output
    assert survivor.exitcode == 0, survivor.output  # not a crash (e.g. -11, SIGSEGV)
    step, next_call = survivor.result
    assert step.startswith("raised") and "rank 1" in step, survivor.result
    assert next_call.startswith("the next call raised"), survivor.result
