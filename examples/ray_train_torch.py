"""Ray Train's TorchTrainer running DDP on tensorcomm's torch backend, 2 workers:

    pip install 'tensorcomm[ray,torch]' 'ray[train]' && python examples/ray_train_torch.py

``tensorcomm.ray.train.TorchConfig()`` joins the workers to one tensorcomm job through a Ray
actor (no secret in the environment), then Ray Train's ``init_process_group(backend="tensorcomm")``
adopts it. Each worker fits a linear model to its own shard for 20 steps with DDP; every worker
prints the backend, its last loss on its shard and the weights, which are identical on all
workers since DDP averages the gradients.
"""

import ray
import torch
import torch.distributed as dist
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer

from tensorcomm.ray.train import TorchConfig


def train(config: dict) -> None:
    torch.manual_seed(dist.get_rank())
    x = torch.randn(64, 4)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1, bias=False))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(20):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
        loss.backward()
        optimizer.step()
    weights = model.module.weight.detach().clone()
    gathered = [torch.zeros_like(weights) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, weights)
    assert all(torch.equal(g, weights) for g in gathered), "DDP keeps the replicas identical"
    print(f"rank {dist.get_rank()}: backend {dist.get_backend()}, loss {loss.item():.4f}, "
          f"weights {[round(w, 3) for w in weights.squeeze(0).tolist()]}", flush=True)


if __name__ == "__main__":
    ray.init(num_cpus=2, include_dashboard=False)
    trainer = TorchTrainer(train, scaling_config=ScalingConfig(num_workers=2),
                           torch_config=TorchConfig(timeout_s=120))
    trainer.fit()  # raises if training failed
    ray.shutdown()
