"""Training step time of each training library on tensorcomm beside Gloo, interleaved.

    python benchmarks/trainer_steps.py                        # every job, under torchrun
    python benchmarks/trainer_steps.py --launcher tensorcomm  # under `tensorcomm run`
    python benchmarks/trainer_steps.py --jobs transformers --rounds 6 --steps 40

Runs each library's 2-rank example from tests/frameworks/libraries/library_jobs.py (Lightning DDP
and FSDP2, Accelerate, the Transformers Trainer, DeepSpeed ZeRO-1 and ZeRO-2, Ignite) once per
backend per round, alternating the backends and flipping their order every round, so neither
gets a quieter machine. Each run is a fresh launch with the same seeds; a step's time is the
time between two step ends on a rank (data loading, forward, backward, optimizer and the
library's own calls), the first ``--warmup`` steps of each run left out. Prints the median and
quartiles per backend, the ratio to Gloo, the median CPU time a rank's process spent per step
(all its threads: steadier than wall time on a busy machine, and what a backend that spins
while it waits pays), whether every run's losses and parameters are the same bits as Gloo's,
and the load average before each round. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

JOBS = Path(__file__).resolve().parents[1] / "tests" / "frameworks" / "libraries" / "library_jobs.py"
ALL_JOBS = ["lightning_ddp", "lightning_fsdp2", "accelerate", "transformers", "deepspeed_zero1",
            "deepspeed_zero2", "ignite"]
BACKENDS = ("tensorcomm", "gloo")


def launch(launcher: str, job: str, backend: str, out: str, args: argparse.Namespace) -> None:
    """Run ``job`` on 2 ranks under ``launcher``, its output to ``out``; raise if it fails."""
    script = [str(JOBS), job, backend, out, "--steps", str(args.steps), "--width", str(args.width)]
    if launcher == "torchrun":
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                *script]
    else:
        argv = [sys.executable, "-m", "tensorcomm", "run", "-n", "2", *script]
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} exited {done.returncode}:\n{done.stdout[-3000:]}"
                           f"{done.stderr[-3000:]}")


def fingerprint(results: list[dict[str, Any]]) -> list[bytes]:
    """Every rank's losses and parameters as bytes: what must equal Gloo's bit for bit."""
    out = []
    for result in results:
        tensors = [*result["losses"], *(result["params"][name] for name in sorted(result["params"]))]
        out += [t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() for t in tensors]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launcher", choices=["torchrun", "tensorcomm"], default="torchrun")
    parser.add_argument("--jobs", nargs="+", choices=ALL_JOBS, default=ALL_JOBS)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30, help="steps per run (per rank)")
    parser.add_argument("--warmup", type=int, default=5, help="steps of each run left out")
    parser.add_argument("--width", type=int, default=256, help="hidden width of each job's model")
    args = parser.parse_args()
    print("command:", shlex.join([sys.executable, *sys.argv]), flush=True)
    times: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    prints: dict[tuple[str, str], set[tuple[bytes, ...]]] = {}
    for round_ in range(args.rounds):
        load = " ".join(f"{v:.2f}" for v in os.getloadavg())
        print(f"round {round_ + 1} of {args.rounds}, load average {load}", flush=True)
        for job in args.jobs:
            for backend in BACKENDS if round_ % 2 == 0 else BACKENDS[::-1]:
                with tempfile.TemporaryDirectory(prefix="trainer-steps-") as out:
                    launch(args.launcher, job, backend, out, args)
                    results = [torch.load(os.path.join(out, f"rank{rank}.pt")) for rank in range(2)]
                for result in results:
                    for kind, into in (("step_ends", times), ("step_cpu_ends", cpu)):
                        ends = result[kind][args.warmup:]
                        into.setdefault((job, backend), []).extend(b - a for a, b in itertools.pairwise(ends))
                prints.setdefault((job, backend), set()).add(tuple(fingerprint(results)))
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"{args.launcher}, 2 ranks, torch {torch.__version__}, width {args.width}, {args.steps} steps "
          f"({args.warmup} left out) x {args.rounds} rounds per backend; load average {load}")
    for job in args.jobs:
        medians = {backend: statistics.median(times[(job, backend)]) for backend in BACKENDS}
        cpu_medians = {backend: statistics.median(cpu[(job, backend)]) for backend in BACKENDS}
        same = prints[(job, "tensorcomm")] == prints[(job, "gloo")] and len(prints[(job, "gloo")]) == 1
        for backend in BACKENDS:
            q = statistics.quantiles(times[(job, backend)], n=4)
            cpu_ms, cpu_ratio = 1e3 * cpu_medians[backend], cpu_medians[backend] / cpu_medians["gloo"]
            bits = f"  bits as gloo's: {'yes' if same else 'NO'}" if backend == "tensorcomm" else ""
            print(f"  {job:16s} {backend:10s} {1e3 * medians[backend]:8.2f} ms (p25-p75 {1e3 * q[0]:.2f}-"
                  f"{1e3 * q[2]:.2f})  / gloo {medians[backend] / medians['gloo']:.2f}"
                  f"  CPU {cpu_ms:.2f} ms / gloo {cpu_ratio:.2f}{bits}")


if __name__ == "__main__":
    main()
