"""All-to-all time by world size over TCP on one host: tensorcomm beside Gloo, in one run.

For each world size, in one interleaved run, each library's ranks (N Python processes started by
this script) time ``--iters`` equal-split ``all_to_all_single`` calls of ``--block`` bytes per
peer (float32), after ``--warmup`` calls, the first checked against numpy; tensorcomm runs with
``TENSORCOMM_TRANSPORT=tcp`` (sockets, not shared memory, as between hosts). With
``--baseline-src DIR`` a third library, ``tc-base``, runs the tensorcomm found in DIR (an export
of an older commit's ``src``), so a change is measured before and after in the same run.

A row gives the median and largest per-call milliseconds over the ranks, the median's ratio to
Gloo's in the same round, the median rank's CPU per call (all its threads, user and system) and
its ratio to Gloo's, and the load average before the row: on a shared machine compare libraries
within one world size and round only. Where ranks outnumber cores the CPU column is the steadier
one: the wall time is then mostly every rank's CPU queued on the few cores.

Usage::

    python benchmarks/alltoall_scaling.py --sizes 8,16,32 [--block 65536] [--baseline-src DIR]

Times are never asserted; record a run with ``benchmarks/record.py``.
"""

from __future__ import annotations

import json
import os
import sys
import time

MARK = "alltoall_scaling: "  # heads a rank's report line


def _worker(library: str, block: int, warmup: int, iters: int) -> None:
    """One rank: join, check one all_to_all against numpy, time ``iters``; print a JSON line."""
    import numpy as np

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    count = block // 4
    send = (np.arange(size * count, dtype=np.float32) + rank * 1000.0)
    out = np.empty_like(send)
    mine = np.arange(rank * count, (rank + 1) * count, dtype=np.float32)
    expected = np.concatenate([mine + q * 1000.0 for q in range(size)])
    if library == "gloo":
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo", rank=rank, world_size=size)
        tsend, tout = torch.from_numpy(send), torch.from_numpy(out)

        def call() -> None:
            dist.all_to_all_single(tout, tsend)
        barrier, finish = dist.barrier, dist.destroy_process_group
    else:
        import tensorcomm as tc

        tc.init()

        def call() -> None:
            tc.all_to_all_single(out, send)
        barrier, finish = tc.barrier, tc.destroy
    for i in range(warmup):
        call()
        if i == 0:
            assert np.array_equal(out, expected), f"rank {rank}: wrong all_to_all result"
    barrier()
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(iters):
        call()
    per_call = (time.perf_counter() - started) / iters
    cpu = (time.process_time() - cpu) / iters
    barrier()
    finish()
    print(MARK + json.dumps({"rank": rank, "per_call": per_call, "cpu": cpu}), flush=True)


def _spawn(library: str, size: int, args: object) -> tuple[list[float], list[float]]:
    """Run ``size`` ranks of ``library``; their per-call seconds and CPU seconds, each sorted."""
    import secrets
    import socket
    import subprocess

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [sys.executable, os.path.abspath(__file__), "--worker", library.split("-")[0],
            str(args.block), str(args.warmup), str(args.iters)]  # type: ignore[attr-defined]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORCOMM_")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(size),
               TENSORCOMM_SECRET="generated:" + secrets.token_hex(32), TENSORCOMM_TRANSPORT="tcp",
               PYTHONUNBUFFERED="1")
    if library == "tc-base":
        env["PYTHONPATH"] = args.baseline_src  # type: ignore[attr-defined]
    procs = [subprocess.Popen(argv, env={**env, "RANK": str(r), "LOCAL_RANK": str(r),
                                         "LOCAL_WORLD_SIZE": str(size)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(size)]
    try:
        outs = [proc.communicate(timeout=args.job_timeout)[0] for proc in procs]  # type: ignore[attr-defined]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    reports = [json.loads(line.split(MARK, 1)[1]) for out in outs for line in out.splitlines()
               if MARK in line]
    if len(reports) != size:
        failed = next((out for proc, out in zip(procs, outs, strict=True) if proc.returncode), "")
        raise RuntimeError(f"{library} at {size} ranks: {len(reports)} reports; {failed[-1500:]}")
    return sorted(r["per_call"] for r in reports), sorted(r["cpu"] for r in reports)


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="TCP all_to_all time by world size, beside Gloo "
                                     "(see the module docstring)")
    parser.add_argument("--sizes", default="8,16,32", help="world sizes, comma-separated")
    parser.add_argument("--block", type=int, default=64 << 10, help="bytes each rank sends each peer")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=1, help="rounds per size (libraries alternate)")
    parser.add_argument("--baseline-src", help="a tensorcomm src directory to run as tc-base")
    parser.add_argument("--job-timeout", type=float, default=900.0, help="seconds one job may take")
    args = parser.parse_args(argv)
    libraries = ["gloo", "tensorcomm"] + (["tc-base"] if args.baseline_src else [])
    print(f"# cores: {os.cpu_count()}; block {args.block} bytes per peer, {args.iters} timed calls after "
          f"{args.warmup}; ms per call: median and largest over the ranks, and the median rank's CPU "
          "(user + system, all its threads); ratios: median / Gloo's median, CPU / Gloo's CPU")
    print(f"{'library':<11}{'ranks':>6}{'median':>10}{'max':>10}{'/ gloo':>8}{'cpu':>8}{'/ gloo':>8}")
    for size in (int(s) for s in args.sizes.split(",")):
        for _ in range(args.repeat):
            results: dict[str, tuple[float, float, float]] = {}  # median, largest, CPU
            for library in libraries:
                load = os.getloadavg()[0]
                try:
                    times, cpus = _spawn(library, size, args)
                    results[library] = (times[len(times) // 2], times[-1], cpus[len(cpus) // 2])
                except (RuntimeError, OSError) as exc:
                    print(f"{library:<11}{size:>6}  failed: {exc}    # load {load:.1f}", flush=True)
                    continue
                median, largest, cpu = results[library]
                gloo = results.get("gloo")
                ratios = f"{median / gloo[0]:>8.2f}" if gloo else f"{'-':>8}"
                ratios_cpu = f"{cpu / gloo[2]:>8.2f}" if gloo else f"{'-':>8}"
                print(f"{library:<11}{size:>6}{median * 1e3:>10.2f}{largest * 1e3:>10.2f}{ratios}"
                      f"{cpu * 1e3:>8.2f}{ratios_cpu}    # load {load:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        sys.exit(main(sys.argv[1:]))
