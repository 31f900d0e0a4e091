"""Time one DistributedDataParallel training step on tensorcomm and on Gloo, same model, same ranks.

    python benchmarks/ddp_step.py                 # 2 ranks, 50 timed steps, hidden width 512
    python benchmarks/ddp_step.py --ranks 4 --steps 80 --hidden 1024 --rounds 2

Every rank trains a small MLP with a BatchNorm (as in tests/frameworks/test_ddp.py, wider) with
DDP: forward (which broadcasts the BatchNorm buffers), backward (one all-reduce per gradient
bucket, running beside the rest of backward on both backends) and an SGD step. Both backends
run in the same rank processes, one after the other and then again in the opposite order
(``--rounds`` times), so neither gets a warmer machine; each block initialises its backend,
times its steps after warm-up steps and a barrier, and destroys it. Prints the median and
quartiles of rank 0's step times and the ratio tensorcomm / Gloo. A benchmark, not a test: it
asserts nothing about time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from tensorcomm.testing import run_ranks

WARMUP_STEPS = 5

# Gloo's process group can deadlock if freed while the GIL is held (pytorch/pytorch#56297);
# rank processes end with os._exit, so modules kept here are never freed.
_MODULES: list[torch.nn.Module] = []


def _model(hidden: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(256, hidden), torch.nn.BatchNorm1d(hidden),
                               torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 10))


def _time_steps(backend: str, steps: int, hidden: int, batch: int) -> list[float]:
    import tensorcomm.torch  # noqa: F401  (registers the backend)

    dist.init_process_group(backend=backend)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(_model(hidden))
    _MODULES.append(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(dist.get_rank())
    x, y = torch.randn(batch, 256, generator=data), torch.randint(0, 10, (batch,), generator=data)
    times = []
    for step in range(WARMUP_STEPS + steps):
        if step == WARMUP_STEPS:
            dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    dist.barrier()
    dist.destroy_process_group()
    return times[WARMUP_STEPS:]


def _rank(steps: int, hidden: int, batch: int, rounds: int) -> dict[str, list[float]]:
    torch.set_num_threads(1)  # ranks share the machine's cores; one intra-op thread each
    times: dict[str, list[float]] = {"tensorcomm": [], "gloo": []}
    for backend in ("tensorcomm", "gloo", "gloo", "tensorcomm") * rounds:
        times[backend] += _time_steps(backend, max(steps // (2 * rounds), 1), hidden, batch)
    return times


def main() -> None:
    """Parse the arguments, run the ranks, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="rank processes (default 2)")
    parser.add_argument("--steps", type=int, default=50, help="timed steps per backend (default 50)")
    parser.add_argument("--hidden", type=int, default=512, help="hidden width (default 512)")
    parser.add_argument("--batch", type=int, default=64, help="samples per rank and step (default 64)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat the tensorcomm, gloo, gloo, tensorcomm blocks (default 1)")
    args = parser.parse_args()
    times = run_ranks(_rank, args.ranks, args.steps, args.hidden, args.batch, args.rounds,
                      init=False, timeout=600)[0]
    parameters = sum(p.numel() for p in _model(args.hidden).parameters())
    print(f"DDP step, {args.ranks} ranks, MLP 256-{args.hidden}-{args.hidden}-10 with BatchNorm "
          f"({parameters:,} parameters, {parameters * 4 / 1e6:.1f} MB of gradients), batch "
          f"{args.batch}, {len(times['gloo'])} timed steps per backend (rank 0)")
    print(f"{'backend':<12}{'median ms':>11}{'p25 ms':>9}{'p75 ms':>9}")
    medians = {}
    for backend, samples in times.items():
        q1, median, q3 = statistics.quantiles(samples, n=4)
        medians[backend] = median
        print(f"{backend:<12}{median * 1e3:>11.2f}{q1 * 1e3:>9.2f}{q3 * 1e3:>9.2f}")
    print(f"tensorcomm / gloo median step time: {medians['tensorcomm'] / medians['gloo']:.2f}")


if __name__ == "__main__":
    main()
