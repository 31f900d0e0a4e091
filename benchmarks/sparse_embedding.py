"""Time the all-reduce of a sparse embedding gradient: tensorcomm's sparse_all_reduce (gather and
dense), the dense all_reduce of the whole table, and Gloo's sparse all-reduce, in the same ranks.

    python benchmarks/sparse_embedding.py                 # 2 ranks, 1M x 32 table, 1 % of rows
    python benchmarks/sparse_embedding.py --rows 1000000 --dim 64 --density 0.01 --rounds 3
    python benchmarks/sparse_embedding.py --crossover     # where densifying starts to win
    TENSORCOMM_TRANSPORT=tcp python benchmarks/sparse_embedding.py --crossover

Each rank holds the gradient an ``nn.Embedding(sparse=True)`` would give after touching
``density`` of the table's rows (distinct rows, chosen at random per rank, so ranks overlap by
chance): a COO tensor of ``rows x dim`` float32. The contenders, in the same rank processes
(torch's default group is tensorcomm's backend, Gloo a second group over the same ranks), run
interleaved: every round runs each once in a rotating order, ``--reps`` calls each. Printed: the
median of rank 0's per-call times, each one's ratio to tensorcomm's automatic choice, and
``uptime``. A benchmark, not a test: it asserts nothing about time.

``--crossover`` times only tensorcomm's two algorithms on a smaller table over a range of
densities and prints dense / gather per density: densifying wins where it drops below 1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist

import tensorcomm as tc
from tensorcomm.frontends import sparse
from tensorcomm.testing import run_ranks


def _gradient(rank: int, rows: int, dim: int, density: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(rank)
    touched = np.sort(rng.choice(rows, max(int(rows * density), 1), replace=False))
    return touched, rng.standard_normal((touched.size, dim), dtype=np.float32)


def _times(fn: Callable[[], object], reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def _contenders(rows: int, dim: int, density: float, gloo: object) -> dict[str, Callable[[], object]]:
    idx, vals = _gradient(dist.get_rank(), rows, dim, density)
    shape = (rows, dim)
    coo = torch.sparse_coo_tensor(torch.from_numpy(idx).reshape(1, -1), torch.from_numpy(vals), shape)
    dense = np.zeros(shape, np.float32)

    def gloo_sparse() -> None:
        dist.all_reduce(coo.clone(), group=gloo)

    def backend_sparse() -> None:
        dist.all_reduce(coo.clone())

    return {
        "tensorcomm auto": lambda: tc.sparse_all_reduce(idx, vals, shape),
        "tensorcomm gather": lambda: tc.sparse_all_reduce(idx, vals, shape, algorithm="gather"),
        "tensorcomm dense": lambda: tc.sparse_all_reduce(idx, vals, shape, algorithm="dense"),
        "tensorcomm torch backend": backend_sparse,
        "dense all_reduce": lambda: tc.all_reduce(dense),
        "gloo sparse": gloo_sparse,
    }


def _rank(rows: int, dim: int, density: float, reps: int, rounds: int, crossover: bool) -> object:
    import tensorcomm.torch  # noqa: F401  (registers the backend)

    torch.set_num_threads(1)
    dist.init_process_group(backend="tensorcomm")
    if crossover:
        table = {}
        for d in (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.8):
            idx, vals = _gradient(dist.get_rank(), rows, dim, d)
            calls = {a: (lambda a=a, i=idx, v=vals: tc.sparse_all_reduce(i, v, (rows, dim), algorithm=a))
                     for a in ("gather", "dense")}
            times: dict[str, list[float]] = {a: [] for a in calls}
            for r in range(rounds):
                for name in (list(calls) if r % 2 == 0 else list(calls)[::-1]):
                    times[name] += _times(calls[name], reps)
            table[d] = {a: statistics.median(t) for a, t in times.items()}
        dist.destroy_process_group()
        return table
    gloo = dist.new_group(backend="gloo")
    calls = _contenders(rows, dim, density, gloo)
    names = list(calls)
    for name in names:  # warm-up: plans, connections, pages
        calls[name]()
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            dist.barrier()
            samples[name] += _times(calls[name], reps)
    dist.barrier()
    dist.destroy_process_group()
    return {n: statistics.median(s) for n, s in samples.items()}


def main() -> None:
    """Parse the arguments, run the ranks, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="rank processes (default 2)")
    parser.add_argument("--rows", type=int, default=None,
                        help="table rows (default 1,000,000; 100,000 with --crossover)")
    parser.add_argument("--dim", type=int, default=32, help="embedding width (default 32)")
    parser.add_argument("--density", type=float, default=0.01,
                        help="fraction of rows each rank touches (default 0.01)")
    parser.add_argument("--reps", type=int, default=3, help="calls per contender and round (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--crossover", action="store_true",
                        help="time gather vs dense over densities instead")
    args = parser.parse_args()
    rows = args.rows or (100_000 if args.crossover else 1_000_000)
    result = run_ranks(_rank, args.ranks, rows, args.dim, args.density, args.reps, args.rounds,
                       args.crossover, init=False, timeout=1200)[0]
    transport = os.environ.get("TENSORCOMM_TRANSPORT", "shm (default)")
    table_mb = rows * args.dim * 4 / 1e6
    if args.crossover:
        print(f"sparse_all_reduce gather vs dense, {args.ranks} ranks, {rows:,} x {args.dim} float32 "
              f"({table_mb:.0f} MB dense), transport {transport}; median ms of rank 0")
        print(f"{'density':>8}{'gathered/dense bytes':>22}{'gather ms':>11}{'dense ms':>10}"
              f"{'dense/gather':>14}{'auto picks':>12}")
        for d, t in result.items():
            counts = [max(int(rows * d), 1)] * args.ranks
            ratio = sum(counts) * (8 + args.dim * 4) / (rows * args.dim * 4)
            kind = tc.TransportKind.TCP if transport == "tcp" else tc.TransportKind.SHM
            pick = sparse.choose(counts, (rows, args.dim), 1, 4, kind)
            print(f"{d:>8.2f}{ratio:>22.2f}{t['gather']:>11.2f}{t['dense']:>10.2f}"
                  f"{t['dense'] / t['gather']:>14.2f}{pick:>12}")
    else:
        print(f"sparse embedding gradient all-reduce, {args.ranks} ranks, {rows:,} x {args.dim} "
              f"float32 table ({table_mb:.0f} MB dense), {args.density:.1%} of rows per rank, "
              f"transport {transport} (Gloo: TCP), {args.rounds} interleaved rounds x {args.reps} calls")
        print(f"{'contender':<26}{'median ms':>11}{'/ tensorcomm auto':>19}")
        for name, ms in result.items():
            print(f"{name:<26}{ms:>11.2f}{ms / result['tensorcomm auto']:>19.2f}")
    print("uptime:", os.popen("uptime").read().strip())


if __name__ == "__main__":
    main()
