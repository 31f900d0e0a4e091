"""Time a DDP step whose model has a sparse embedding, on tensorcomm and on Gloo, in the same ranks.

    python benchmarks/ddp_sparse_step.py                       # 2 ranks, 30 steps, 2 rounds
    PYTHONPATH=/path/to/other/src python benchmarks/ddp_sparse_step.py   # another tensorcomm

The model is ``nn.Embedding(rows, dim, sparse=True)`` (mean of a few looked-up rows per sample)
followed by an MLP, so backward makes one sparse gradient (the embedding's, all-reduced as a
sparse COO tensor) and dense ones (the MLP's buckets). The sparse all-reduce is issued first in
backward; where it runs beside the rest of backward the MLP's compute and buckets overlap it.
Each round runs tensorcomm then Gloo, or the reverse (order flipped every round); each block
initialises its backend, times ``--steps`` steps after warm-up, and destroys it. Prints the
median of rank 0's step times per backend and the ratio, and ``uptime``. A benchmark, not a
test: it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

from tensorcomm.testing import run_ranks

WARMUP_STEPS = 3
_KEEP: list[object] = []  # DDP modules are never freed (Gloo can deadlock on free: see ddp_step.py)


def _model(rows: int, dim: int, hidden: int) -> torch.nn.Module:
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = torch.nn.Embedding(rows, dim, sparse=True)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.ReLU(),
                                           torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                                           torch.nn.Linear(hidden, 1))

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.mlp(self.embedding(ids).mean(1))

    return Net()


def _block(backend: str, args: argparse.Namespace) -> list[float]:
    import tensorcomm.torch  # noqa: F401 (registers the backend)

    dist.init_process_group(backend=backend)
    model = torch.nn.parallel.DistributedDataParallel(_model(args.rows, args.dim, args.hidden))
    _KEEP.append(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(dist.get_rank())
    times = []
    for step in range(WARMUP_STEPS + args.steps):
        ids = torch.randint(args.rows, (args.batch, 8), generator=data)
        if step == WARMUP_STEPS:
            dist.barrier()
        start = time.perf_counter()
        model(ids).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        if step >= WARMUP_STEPS:
            times.append(time.perf_counter() - start)
    dist.barrier()
    dist.destroy_process_group()
    return times


def _rank(args: argparse.Namespace) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"tensorcomm": [], "gloo": []}
    for round_ in range(args.rounds):
        for backend in ("tensorcomm", "gloo") if round_ % 2 == 0 else ("gloo", "tensorcomm"):
            times[backend] += _block(backend, args)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rows", type=int, default=200_000, help="embedding rows")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    times = run_ranks(_rank, args.ranks, args, timeout=1800, init=False)[0]
    medians = {backend: statistics.median(t) * 1e3 for backend, t in times.items()}
    print(f"torch {torch.__version__}, {args.ranks} ranks, embedding {args.rows} x {args.dim} sparse, "
          f"MLP {args.dim}-{args.hidden}-{args.hidden}-1, batch {args.batch} x 8 ids; "
          f"median step of rank 0 over {args.rounds} rounds of {args.steps} steps")
    for backend, median in medians.items():
        print(f"  {backend:10s} {median:8.2f} ms")
    print(f"  tensorcomm / gloo: {medians['tensorcomm'] / medians['gloo']:.2f}")
    print(f"  uptime: {os.popen('uptime').read().strip()}")


if __name__ == "__main__":
    main()
