"""Where a DDP step's communication time goes on the tensorcomm backend, bucket by bucket.

    python benchmarks/ddp_buckets.py                          # 2 ranks, the transformer block
    python benchmarks/ddp_buckets.py --ranks 4 --workload ddp_mlp --steps 80
    torchrun --nproc-per-node 2 benchmarks/ddp_buckets.py     # launched by hand

Runs DDP steps of a workload of ``ddp_step_torchrun.py`` on tensorcomm and records, for every
gradient bucket of every step on every rank: when DDP issued its all-reduce, when the backend's
``allreduce`` returned, when the call started and ended on whichever thread ran it (the group's
worker, or a thread that waited for it), and when it completed. ``time.perf_counter`` is the
system-wide monotonic clock on Linux, so the ranks' times compare. Rank 0 prints, per bucket, the
median and quartiles over the timed steps of:

- issue skew: the spread of the ranks' issue times (what the earliest rank waits for);
- issue cost: how long DDP's thread spent in ``allreduce``;
- hand-off: from the issue to the call starting on the worker (0 when the issuing thread ran it);
- run: the call's own time, from its start to its end;
- done after last issue: from the last rank's issue to completion (the bucket's share of the
  critical path once every rank is there);

and the step time, the load and the command. Instruments by wrapping methods, so the times
include the wrappers' few microseconds. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

WARMUP_STEPS = 10


def _instrument() -> tuple[list[list[float]], list[tuple[int, float, float]]]:
    """Wrap the backend's allreduce and the engine's runner; return where they record:
    per call ``[issued, returned, done]``, and per run ``(thread id, started, ended)``."""
    import threading

    from tensorcomm.core import engine
    from tensorcomm.frontends import torch_backend

    calls: list[list[float]] = []
    runs: list[tuple[int, float, float]] = []
    allreduce = torch_backend.ProcessGroupTensorcomm.allreduce
    run_one = engine.Engine._run_one

    def timed_allreduce(self: Any, tensors: Any, opts: Any = None, *args: Any, **kwargs: Any) -> Any:
        issued = time.perf_counter()
        work = allreduce(self, tensors, opts, *args, **kwargs)
        record = [issued, time.perf_counter(), 0.0]
        calls.append(record)
        if work._work is not None:
            work._work._on_done(lambda done: record.__setitem__(2, time.perf_counter()))
        else:
            record[2] = record[1]
        return work

    def timed_run_one(self: Any, call: Any, job: Any, work: Any) -> None:
        started = time.perf_counter()
        try:
            run_one(self, call, job, work)
        finally:
            runs.append((threading.get_ident(), started, time.perf_counter()))

    torch_backend.ProcessGroupTensorcomm.allreduce = timed_allreduce  # type: ignore[method-assign]
    engine.Engine._run_one = timed_run_one  # type: ignore[method-assign]
    return calls, runs


def _rank_main(args: argparse.Namespace) -> None:
    import threading

    import tensorcomm.torch  # noqa: F401 (registers the backend)

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from ddp_step_torchrun import _workload

    dist.init_process_group(backend="tensorcomm")
    rank, size = dist.get_rank(), dist.get_world_size()
    calls, runs = _instrument()
    model, loss = _workload(args.workload, dist.group.WORLD, args.hidden)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    me = threading.get_ident()
    steps = []
    for step in range(WARMUP_STEPS + args.steps):
        calls.clear()
        runs.clear()
        began = time.perf_counter()
        optimizer.zero_grad()
        loss().backward()
        optimizer.step()
        ended = time.perf_counter()
        while any(record[2] == 0.0 for record in calls):  # a completion callback still running
            time.sleep(0)
        if step >= WARMUP_STEPS:
            # the runs of this step's bucket calls, in order (DDP's forward may run others first)
            mine = [(start, end, thread != me) for thread, start, end in runs][-len(calls):] if calls else []
            steps.append({"step": (began, ended), "calls": [list(c) for c in calls], "runs": mine})
    everyone: list[Any] = [None] * size
    dist.all_gather_object(everyone, steps)
    if rank == 0:
        _report(everyone, args, size)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def _quartiles(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return f"{1e3 * statistics.median(values):8.3f} ms (p25-p75 {1e3 * q[0]:.3f}-{1e3 * q[2]:.3f})"


def _report(everyone: list[Any], args: argparse.Namespace, size: int) -> None:
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"{size} ranks, {args.workload}, torch {torch.__version__}, {args.steps} steps, "
          f"load average {load}")
    buckets = min(len(step["calls"]) for rank in everyone for step in rank)
    step_times = [end - start for start, end in (s["step"] for s in everyone[0])]
    print(f"  step (rank 0)            {_quartiles(step_times)}")
    for b in range(buckets):
        skew, cost, handoff, run, after, on_worker = [], [], [], [], [], 0
        for i in range(len(everyone[0])):
            issued = [rank[i]["calls"][b][0] for rank in everyone]
            last = max(issued)
            skew.append(last - min(issued))
            for rank in everyone:
                call, runs = rank[i]["calls"][b], rank[i]["runs"]
                cost.append(call[1] - call[0])
                after.append(call[2] - last)
                if b < len(runs):
                    start, end, worker = runs[b]
                    handoff.append(start - call[0] if worker else 0.0)
                    run.append(end - start)
                    on_worker += worker
        total = len(everyone[0]) * len(everyone)
        print(f"  bucket {b}: {on_worker} of {total} calls ran on the worker")
        for name, values in (("issue skew", skew), ("issue cost", cost), ("hand-off", handoff),
                             ("run", run), ("done after last issue", after)):
            if values:
                print(f"    {name:22s} {_quartiles(values)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--workload", default="transformer", choices=["ddp_mlp", "transformer"])
    args = parser.parse_args()
    if "LOCAL_RANK" in os.environ:  # started by torchrun
        _rank_main(args)
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from ddp_step_torchrun import under_torchrun

    under_torchrun(__file__, args.ranks)


if __name__ == "__main__":
    main()
