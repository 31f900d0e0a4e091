"""Training step time under torchrun: tensorcomm beside Gloo in the same ranks, interleaved.

    python benchmarks/ddp_step_torchrun.py                       # 2 and 4 ranks, via torchrun
    python benchmarks/ddp_step_torchrun.py --ranks 2 --steps 30 --rounds 2
    torchrun --nproc-per-node 2 benchmarks/ddp_step_torchrun.py  # one size, launched by hand

Three workloads: DDP on an MLP with a BatchNorm, DDP on a transformer encoder block, and FSDP2
(``fully_shard`` per layer) on an MLP. The default group is tensorcomm's; a Gloo group of the
same ranks is made beside it, and every round times each workload on one backend and then the
other (the order flips every round), so neither gets a warmer machine. Each block builds its
model from the same seed, runs warm-up steps and a barrier, then times its steps. Three floors
run after them in every round:

- ``local``: the same step with no communication at all (the compute);
- ``noop`` (DDP only): DDP with a comm hook that hands each bucket back untouched, so the step
  pays DDP's own bucket copies and hooks (and its buffer broadcast, on tensorcomm) but no
  gradient all-reduce; ``noop_gloo``: the same on the Gloo group (its buffer broadcast on
  Gloo), so that each backend's gradient all-reduces alone are its step less its own floor;
- ``meet`` (DDP only): the same hook after a one-element ``all_reduce`` per bucket, so the ranks
  wait for each other as often as a real backend makes them, and move no data.

Rank 0 prints the median and quartiles of each and its ratio to Gloo, what each backend adds
over the local step and their ratio, what each adds over its own ``noop`` floor (DDP) and their
ratio, the load average and the command. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.distributed as dist

WARMUP_STEPS = 4
_KEEP: list[Any] = []  # modules stay alive until the process ends (Gloo frees badly under the GIL)


def _mlp(hidden: int, norm: bool) -> torch.nn.Module:
    layers: list[torch.nn.Module] = [torch.nn.Linear(256, hidden)]
    if norm:
        layers.append(torch.nn.BatchNorm1d(hidden))
    layers += [torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
               torch.nn.Linear(hidden, 10)]
    return torch.nn.Sequential(*layers)


def _workload(name: str, group: Any, hidden: int) -> tuple[torch.nn.Module, Callable[[], Any]]:
    """The model (wrapped for ``group``; None: unwrapped) and a function computing its loss."""
    torch.manual_seed(0)
    data = torch.Generator().manual_seed(dist.get_rank())
    if name == "transformer":
        model: torch.nn.Module = torch.nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True,
                                                                  dropout=0.0)
        x = torch.randn(16, 32, 256, generator=data)
        if group is not None:
            model = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
        return model, lambda: model(x).pow(2).mean()
    x, y = torch.randn(64, 256, generator=data), torch.randint(0, 10, (64,), generator=data)
    if name == "ddp_mlp":
        model = _mlp(hidden, norm=True)
        if group is not None:
            model = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
    else:  # fsdp2
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard
        model = _mlp(hidden, norm=False)
        if group is not None:
            mesh = DeviceMesh.from_group(group, "cpu")
            for layer in model:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
    return model, lambda: torch.nn.functional.cross_entropy(model(x), y)


# DDP refuses a hook whose annotations are not its own classes, and postponed annotations are
# strings here: the hooks are left unannotated.
def _bucket_back(state, bucket):  # type: ignore[no-untyped-def]
    """A DDP comm hook that returns the bucket as it is (no communication)."""
    future = torch.futures.Future()  # type: ignore[var-annotated]
    future.set_result(bucket.buffer())
    return future


def _meet_then_bucket_back(state, bucket):  # type: ignore[no-untyped-def]
    """A DDP comm hook that meets the other ranks (one element) and returns the bucket as it is."""
    dist.all_reduce(torch.zeros(1))
    return _bucket_back(state, bucket)


FLOOR_HOOKS = {"noop": _bucket_back, "meet": _meet_then_bucket_back, "noop_gloo": _bucket_back}


def _time(name: str, backend: str, group: Any, hidden: int, steps: int) -> list[float]:
    model, loss = _workload(name, group, hidden)
    if backend in FLOOR_HOOKS:
        cast(torch.nn.parallel.DistributedDataParallel, model).register_comm_hook(None, FLOOR_HOOKS[backend])
    _KEEP.append(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    times = []
    for step in range(WARMUP_STEPS + steps):
        if step == WARMUP_STEPS:
            dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        loss().backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    dist.barrier()
    return times[WARMUP_STEPS:]


def _rank_main(args: argparse.Namespace) -> None:
    import tensorcomm.torch  # noqa: F401 (registers the backend)

    dist.init_process_group(backend="tensorcomm")
    world = dist.group.WORLD
    gloo = dist.new_group(backend="gloo")
    groups = {"tensorcomm": world, "gloo": gloo, "noop": world, "meet": world, "noop_gloo": gloo}
    rank, size = dist.get_rank(), dist.get_world_size()
    times: dict[tuple[str, str], list[float]] = {}
    for round_ in range(args.rounds):
        for name in args.workloads:
            order = ["tensorcomm", "gloo"] if round_ % 2 == 0 else ["gloo", "tensorcomm"]
            floors = ["local"] + list(FLOOR_HOOKS) * (name != "fsdp2")  # the hooks are DDP's
            for backend in order + floors:
                group = groups.get(backend)
                times.setdefault((name, backend), []).extend(_time(name, backend, group, args.hidden,
                                                                   args.steps))
    if rank == 0:
        load = " ".join(f"{v:.2f}" for v in os.getloadavg())
        print(f"{size} ranks, torch {torch.__version__}, {args.steps} steps x {args.rounds} rounds, "
              f"load average {load}")
        for name in args.workloads:
            medians = {backend: statistics.median(t) for (n, backend), t in times.items() if n == name}
            for backend, median in medians.items():
                q = statistics.quantiles(times[(name, backend)], n=4)
                print(f"  {name:11s} {backend:10s} {1e3 * median:8.2f} ms "
                      f"(p25-p75 {1e3 * q[0]:.2f}-{1e3 * q[2]:.2f})  / gloo {median / medians['gloo']:.2f}")
            added = {b: medians[b] - medians["local"] for b in ("tensorcomm", "gloo")}
            if added["gloo"] > 0:  # what communication adds to the local step, each backend
                print(f"  {name:11s} added over local: tensorcomm {1e3 * added['tensorcomm']:.2f} ms, "
                      f"gloo {1e3 * added['gloo']:.2f} ms, ratio {added['tensorcomm'] / added['gloo']:.2f}")
            if "noop_gloo" in medians:  # the gradients' all-reduces alone: each over its own noop floor
                floors = (("tensorcomm", "noop"), ("gloo", "noop_gloo"))
                comm = {b: medians[b] - medians[f] for b, f in floors}
                if comm["gloo"] > 0:
                    print(f"  {name:11s} added over its noop floor: tensorcomm "
                          f"{1e3 * comm['tensorcomm']:.2f} ms, gloo {1e3 * comm['gloo']:.2f} ms, "
                          f"ratio {comm['tensorcomm'] / comm['gloo']:.2f}")
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # Gloo's groups can deadlock when freed at exit (pytorch/pytorch#56297)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--workloads", nargs="+", default=["ddp_mlp", "transformer", "fsdp2"],
                        choices=["ddp_mlp", "transformer", "fsdp2"])
    args = parser.parse_args()
    if "LOCAL_RANK" in os.environ:  # started by torchrun
        _rank_main(args)
        return
    print("command:", " ".join([sys.executable, *sys.argv]), flush=True)
    for ranks in args.ranks:
        under_torchrun(__file__, ranks)


def under_torchrun(script: str, ranks: int) -> None:
    """Run ``script`` with this process's arguments under torchrun on ``ranks`` local ranks."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={ranks}", script, *sys.argv[1:]]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True)


if __name__ == "__main__":
    main()
