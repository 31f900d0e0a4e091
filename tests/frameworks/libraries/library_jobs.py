"""Each training library's smallest multi-process CPU example, on a backend named on the command line.

    torchrun --nproc-per-node 2 library_jobs.py JOB BACKEND OUT [--steps N] [--width W]
    python -m tensorcomm run -n 2 library_jobs.py JOB BACKEND OUT

Every rank trains from the same seeds and writes ``OUT/rank<r>.pt``: the losses it saw, its final
parameters (whole tensors), and when each step ended, in wall time (``time.perf_counter``) and in
the process's CPU time over all its threads (``time.process_time``). test_libraries.py compares
the losses and parameters between backends bit for bit; benchmarks/trainer_steps.py times the steps.
The libraries are used as their own docs show, with the backend's name as the only change (and
the group initialised first where a library keeps a fixed list of names). Nothing here imports
tensorcomm: torch loads the backend itself.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


class Record:
    """What one rank saw: each step's loss and when it ended, then the final parameters."""

    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []
        self.step_ends: list[float] = []
        self.step_cpu_ends: list[float] = []
        self.params: dict[str, torch.Tensor] = {}

    def step_ended(self) -> None:
        """Note that a step ended now (wall and CPU time)."""
        self.step_ends.append(time.perf_counter())
        self.step_cpu_ends.append(time.process_time())

    def step(self, loss: Any) -> None:
        """Note a step's loss (a tensor or a Python float) and that the step ended now."""
        self.step_ended()
        self.losses.append(loss.detach().clone() if isinstance(loss, torch.Tensor)
                           else torch.tensor(loss, dtype=torch.float64))

    def finish(self, model: torch.nn.Module) -> None:
        """Keep ``model``'s parameters, whole (a sharded DTensor is gathered)."""
        for name, param in model.named_parameters():
            whole = param.full_tensor() if hasattr(param, "full_tensor") else param
            self.params[name] = whole.detach().clone()


def mlp_and_data(width: int, samples: int) -> tuple[torch.nn.Module, torch.utils.data.TensorDataset]:
    """A two-layer classifier and ``samples`` inputs with labels, from the current seed."""
    model = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Linear(width, 4))
    data = torch.utils.data.TensorDataset(torch.randn(samples, 16), torch.randint(0, 4, (samples,)))
    return model, data


def lightning_job(record: Record, backend: str, steps: int, width: int, fsdp2: bool) -> None:
    import lightning
    from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
    from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

    class Model(BoringModel):  # Lightning's own test model: Linear(32, 2) on random data
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.Linear(width, 2))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = self.step(batch)
            self.log("train_loss", loss, on_epoch=True, sync_dist=True)  # AVGs over the ranks
            return loss

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            record.step(outputs["loss"])

        def configure_model(self) -> None:
            if fsdp2:
                from torch.distributed.fsdp import fully_shard
                for layer in self.layer:
                    fully_shard(layer, mesh=self.device_mesh["data_parallel"])

        def train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(RandomDataset(32, 8 * steps), batch_size=4)

    lightning.seed_everything(0)
    strategy = (ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1,
                                      process_group_backend=backend) if fsdp2
                else DDPStrategy(process_group_backend=backend))
    trainer = lightning.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, deterministic=True)
    model = Model()
    trainer.fit(model)
    record.finish(model)


def accelerate_job(record: Record, backend: str, steps: int, width: int) -> None:
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    dist.init_process_group(backend)  # first: Accelerate takes the group it finds
    accelerator = Accelerator(cpu=True)  # cpu=True, or it runs as one process per rank
    set_seed(0)
    model, data = mlp_and_data(width, 8 * steps)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        record.step(loss)
    record.finish(accelerator.unwrap_model(model))


def transformers_job(record: Record, backend: str, steps: int, width: int) -> None:
    import tempfile

    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    dist.init_process_group(backend)  # first: the Trainer takes the group it finds

    class Recording(Trainer):
        def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
            loss = super().training_step(*args, **kwargs)
            record.losses.append(loss.detach().clone())
            return loss

    class StepEnds(TrainerCallback):
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            record.step_ended()

    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=width, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=2 * width, max_position_embeddings=32)
    model = BertForSequenceClassification(config)
    generator = torch.Generator().manual_seed(1)
    data = [{"input_ids": torch.randint(0, 64, (16,), generator=generator),
             "labels": torch.randint(0, 2, (), generator=generator)} for _ in range(8 * steps)]
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, num_train_epochs=1,
                                 seed=0, use_cpu=True, report_to=[], save_strategy="no",
                                 logging_strategy="no", disable_tqdm=True)
        Recording(model=model, args=args, train_dataset=data, callbacks=[StepEnds()]).train()
    record.finish(model)


def deepspeed_job(record: Record, backend: str, steps: int, width: int, stage: int) -> None:
    import deepspeed

    deepspeed.init_distributed(dist_backend=backend)
    torch.manual_seed(0)
    model, data = mlp_and_data(width, 8 * steps)
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
              "zero_optimization": {"stage": stage}}
    engine, _, loader, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                training_data=data, config=config)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        record.step(loss)
    record.finish(engine.module)


def ignite_job(record: Record, backend: str, steps: int, width: int) -> None:
    import ignite.distributed as idist
    from ignite.engine import Events, create_supervised_trainer

    dist.init_process_group(backend)  # first: Ignite takes the group it finds
    torch.manual_seed(0)
    model, data = mlp_and_data(width, 8 * steps)
    model = idist.auto_model(model)
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):  # Ignite wraps for gloo only
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = idist.auto_optim(torch.optim.AdamW(model.parameters(), lr=1e-2))
    loader = idist.auto_dataloader(data, batch_size=8, shuffle=True)  # 4 a rank
    trainer = create_supervised_trainer(model, optimizer, torch.nn.functional.cross_entropy)
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda engine: record.step(engine.state.output))
    trainer.run(loader, max_epochs=1)
    record.finish(model.module)


JOBS: dict[str, Callable[[Record, str, int, int], None]] = {
    "lightning_ddp": lambda *a: lightning_job(*a, fsdp2=False),
    "lightning_fsdp2": lambda *a: lightning_job(*a, fsdp2=True),
    "accelerate": accelerate_job,
    "transformers": transformers_job,
    "deepspeed_zero1": lambda *a: deepspeed_job(*a, stage=1),
    "deepspeed_zero2": lambda *a: deepspeed_job(*a, stage=2),
    "ignite": ignite_job,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", choices=sorted(JOBS))
    parser.add_argument("backend")
    parser.add_argument("out", help="folder for rank<r>.pt")
    parser.add_argument("--steps", type=int, default=4, help="steps per rank (one epoch, batch 4)")
    parser.add_argument("--width", type=int, default=32, help="hidden width of each model")
    args = parser.parse_args()
    record = Record()
    JOBS[args.job](record, args.backend, args.steps, args.width)
    torch.save(vars(record), os.path.join(args.out, f"rank{dist.get_rank()}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
