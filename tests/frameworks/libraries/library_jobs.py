"""Each training library's smallest multi-process CPU example, on a backend named on the command line.

    torchrun --nproc-per-node 2 library_jobs.py JOB BACKEND OUT
    python -m tensorcomm run -n 2 library_jobs.py JOB BACKEND OUT

Every rank trains from the same seeds and writes ``OUT/rank<r>.pt``: the losses it saw and its
final parameters (full tensors), which test_libraries.py compares between backends bit for bit.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

STEPS = 4


def lightning_job(backend: str, fsdp2: bool) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    import lightning as L
    from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
    from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

    losses: list[torch.Tensor] = []

    class Model(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = self.step(batch)
            self.log("train_loss", loss, on_epoch=True, sync_dist=True)  # AVGs over the ranks
            losses.append(loss.detach().clone())
            return loss

        def configure_model(self) -> None:
            if fsdp2:
                from torch.distributed.fsdp import fully_shard
                fully_shard(self.layer, mesh=self.device_mesh["data_parallel"])

        def train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(RandomDataset(32, 64), batch_size=4)

    L.seed_everything(0)
    strategy = (ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1,
                                      process_group_backend=backend) if fsdp2
                else DDPStrategy(process_group_backend=backend))
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_steps=STEPS,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, deterministic=True)
    model = Model()
    trainer.fit(model)
    return losses, full_parameters(model)


def full_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of ``model`` whole (a DTensor shard gathered), detached and cloned."""
    out = {}
    for name, param in model.named_parameters():
        tensor = param.full_tensor() if hasattr(param, "full_tensor") else param
        out[name] = tensor.detach().clone()
    return out


def accelerate_job(backend: str) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    dist.init_process_group(backend)  # first: Accelerate takes the group as it finds it
    accelerator = Accelerator(cpu=True)
    set_seed(0)
    model, data = small_mlp_and_data()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach().clone())
    return losses, full_parameters(accelerator.unwrap_model(model))


def transformers_job(backend: str) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    import tempfile

    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    dist.init_process_group(backend)  # first: the Trainer takes the group as it finds it
    losses: list[torch.Tensor] = []

    class Recording(Trainer):
        def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
            loss = super().training_step(*args, **kwargs)
            losses.append(loss.detach().clone())
            return loss

    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32)
    model = BertForSequenceClassification(config)
    generator = torch.Generator().manual_seed(1)
    data = [{"input_ids": torch.randint(0, 64, (16,), generator=generator),
             "labels": torch.randint(0, 2, (), generator=generator)} for _ in range(32)]
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=STEPS, seed=0,
                                 use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
                                 disable_tqdm=True, dataloader_num_workers=0)
        Recording(model=model, args=args, train_dataset=data).train()
    return losses, full_parameters(model)


def deepspeed_job(backend: str, stage: int) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    import deepspeed

    deepspeed.init_distributed(dist_backend=backend)
    torch.manual_seed(0)
    model, data = small_mlp_and_data()
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
              "zero_optimization": {"stage": stage}}
    engine, _, loader, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                training_data=data, config=config)
    losses = []
    for step, (x, y) in enumerate(loader):
        if step == STEPS:
            break
        loss = torch.nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.detach().clone())
    return losses, full_parameters(engine.module)


def ignite_job(backend: str) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    import ignite.distributed as idist
    from ignite.engine import Events, create_supervised_trainer

    dist.init_process_group(backend)  # first: Ignite takes the group as it finds it
    torch.manual_seed(0)
    model, data = small_mlp_and_data()
    model = idist.auto_model(model)
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):  # Ignite wraps for gloo only
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = idist.auto_optim(torch.optim.AdamW(model.parameters(), lr=1e-2))
    loader = idist.auto_dataloader(data, batch_size=8, shuffle=True)
    trainer = create_supervised_trainer(model, optimizer, torch.nn.functional.cross_entropy)
    losses: list[torch.Tensor] = []
    trainer.add_event_handler(Events.ITERATION_COMPLETED,
                              lambda engine: losses.append(torch.tensor(engine.state.output, dtype=torch.float64)))
    trainer.run(loader, max_epochs=1)
    return losses, full_parameters(model)


def small_mlp_and_data() -> tuple[torch.nn.Module, torch.utils.data.TensorDataset]:
    """A two-layer classifier and 32 samples of its input, from the current seed."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    data = torch.utils.data.TensorDataset(torch.randn(32, 16), torch.randint(0, 4, (32,)))
    return model, data


JOBS: dict[str, Callable[[str], tuple[list[torch.Tensor], dict[str, torch.Tensor]]]] = {
    "lightning_ddp": lambda backend: lightning_job(backend, fsdp2=False),
    "lightning_fsdp2": lambda backend: lightning_job(backend, fsdp2=True),
    "accelerate": accelerate_job,
    "transformers": transformers_job,
    "deepspeed_zero1": lambda backend: deepspeed_job(backend, stage=1),
    "deepspeed_zero2": lambda backend: deepspeed_job(backend, stage=2),
    "ignite": ignite_job,
}


def main() -> None:
    job, backend, out = sys.argv[1:4]
    losses, params = JOBS[job](backend)
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ["RANK"])
    torch.save({"losses": losses, "params": params}, os.path.join(out, f"rank{rank}.pt"))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
