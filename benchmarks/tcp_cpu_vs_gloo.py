"""CPU time and bytes on the loopback per TCP all_reduce, beside Gloo in the same ranks.

Usage: python benchmarks/tcp_cpu_vs_gloo.py [--ranks 4] [--sizes 1M,4M,16M,64M] [--rounds 3]
       [--algorithm halving_doubling] [--no-gloo]

Where members outnumber cores (4 ranks on this 2-core machine) a call's time is the CPU all of
them spend divided by the cores, and on a shared machine wall time mostly measures the other
jobs; CPU time per call (``resource.getrusage``: every thread of the rank, user and system) moves
with what each library itself does. Per size, tensorcomm (``TENSORCOMM_TRANSPORT=tcp``; the row
``select`` picks, or ``--algorithm``) and torch's Gloo alternate round by round in the same
ranks; printed: CPU milliseconds per call and rank (mean over ranks, median over rounds), user
and system parts, MiB through the loopback interface per call (all ranks, from /proc/net/dev, so
other jobs' loopback traffic adds to it) and Gloo's CPU over tensorcomm's (above 1: tensorcomm
spends less). Compare trees by running it with each tree on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import statistics
from collections.abc import Callable

import numpy as np

import tensorcomm as tc
from tensorcomm.bench.options import parse_size
from tensorcomm.testing import free_port, run_ranks


def _loopback_bytes() -> int:
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, fields = line.partition(":")
            if name.strip() == "lo":
                return int(fields.split()[0])
    return 0


def _measure(call: Callable[[], object], calls: int) -> tuple[float, float, float]:
    """(user ms, system ms, loopback MiB) per call of ``call``."""
    call()
    tc.barrier()
    before, moved = resource.getrusage(resource.RUSAGE_SELF), _loopback_bytes()
    for _ in range(calls):
        call()
    after, moved = resource.getrusage(resource.RUSAGE_SELF), _loopback_bytes() - moved
    tc.barrier()
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    return user * 1e3 / calls, system * 1e3 / calls, moved / calls / 2**20


def _body(sizes: list[int], rounds: int, algorithm: str | None, gloo: bool, port: int) -> dict:
    from tensorcomm.core.lifecycle import current_world

    if algorithm is not None:
        current_world().algorithms["all_reduce"] = algorithm
    if gloo:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=tc.get_rank(),
                                world_size=tc.get_world_size())
    results: dict = {}
    for nbytes in sizes:
        x = np.ones(nbytes // 4, np.float32)
        calls = max(3, min(200, (256 << 20) // nbytes))
        libraries: dict[str, Callable[[], object]] = {"tensorcomm": functools.partial(tc.all_reduce, x)}
        if gloo:
            import torch
            import torch.distributed as dist

            libraries["gloo"] = functools.partial(dist.all_reduce, torch.from_numpy(x))
        for _ in range(rounds):
            for name, call in libraries.items():
                results.setdefault((name, nbytes), []).append(_measure(call, calls))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--sizes", default="1M,4M,16M,64M")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--algorithm", default=None, help="force this all_reduce row (default: select's)")
    parser.add_argument("--no-gloo", dest="gloo", action="store_false")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON (benchmarks/ab.py)")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    ranks = run_ranks(_body, args.ranks, sizes, args.rounds, args.algorithm, args.gloo, free_port(),
                      env={"TENSORCOMM_TRANSPORT": "tcp", "OPENBLAS_NUM_THREADS": "1"}, timeout=1800)
    print(f"{args.ranks} ranks, float32 all_reduce over TCP loopback; CPU ms per call and rank "
          f"(mean of ranks, median of {args.rounds} rounds)")
    print(f"{'bytes':>10} {'library':>10} {'cpu':>8} {'user':>8} {'sys':>8} {'lo MiB':>8} {'gloo/tc':>8}")
    figures = {}
    for nbytes in sizes:
        cpu = {}
        for name in ("tensorcomm", "gloo") if args.gloo else ("tensorcomm",):
            per_round = [[rank[(name, nbytes)][i] for rank in ranks] for i in range(args.rounds)]
            user = statistics.median(statistics.fmean(r[0] for r in rnd) for rnd in per_round)
            system = statistics.median(statistics.fmean(r[1] for r in rnd) for rnd in per_round)
            moved = statistics.median(statistics.fmean(r[2] for r in rnd) for rnd in per_round)
            cpu[name] = statistics.median(statistics.fmean(r[0] + r[1] for r in rnd) for rnd in per_round)
            figures[f"{nbytes} {name} cpu ms"] = cpu[name]
            ratio = f"{cpu['gloo'] / cpu['tensorcomm']:8.2f}" if name == "gloo" else ""
            print(f"{nbytes:>10} {name:>10} {cpu[name]:8.2f} {user:8.2f} {system:8.2f} {moved:8.1f} {ratio}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(figures, file)


if __name__ == "__main__":
    main()
