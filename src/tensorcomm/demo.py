"""The demo job: every collective on real data, checked against numpy, timed, as a table.

Run through ``tensorcomm demo -n 4`` (which starts the ranks) or ``tensorcomm run -n 4 -m
tensorcomm.demo``. Rank 0 prints the table; the exit code is 1 if any result was wrong anywhere.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

import tensorcomm as tc
from tensorcomm.testing.reference import rank_data, reduce_reference

Case = tuple[Callable[[], object], Callable[[], bool]]  # (run the collective once, is the result right)
WARMUP = 5  # untimed calls first: the first call of a shape plans it, the next ones warm caches


def _cases(rank: int, size: int, count: int) -> dict[str, Case]:
    """Per collective: ``run`` (its input reset, then one call) and ``check`` (against numpy)."""
    everyone = [rank_data(r, count, np.float32) for r in range(size)]
    mine = everyone[rank]
    total = reduce_reference(tc.ReduceOp.SUM, everyone)
    peak = reduce_reference(tc.ReduceOp.MAX, everyone)
    right, left = (rank + 1) % size, (rank - 1) % size
    block = count // size
    x = np.empty_like(mine)
    outs = [np.empty_like(mine) for _ in range(size)]
    gathered = np.empty(size * count, np.float32)
    part = np.empty(block, np.float32)
    swapped = np.empty(block * size, np.float32)
    head = np.ascontiguousarray(mine[:block * size])

    def reset_then(call: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            x[...] = mine
            call()
        return run

    def max_async() -> None:
        work = tc.all_reduce(x, op=tc.ReduceOp.MAX, async_op=True)
        assert work is not None  # async_op=True returns a Work
        work.wait()

    def receive() -> None:
        receiving = tc.irecv(x, src=left)
        tc.send(mine, dst=right)
        receiving.wait()

    cases: dict[str, Case] = {
        "all_reduce(sum)": (reset_then(lambda: tc.all_reduce(x)), lambda: np.array_equal(x, total)),
        "all_reduce(max, async)": (reset_then(max_async), lambda: np.array_equal(x, peak)),
        "reduce": (reset_then(lambda: tc.reduce(x, dst=0)),
                   lambda: np.array_equal(x, total if rank == 0 else mine)),
        "broadcast": (reset_then(lambda: tc.broadcast(x, src=size - 1)),
                      lambda: np.array_equal(x, everyone[-1])),
        "all_gather": (lambda: tc.all_gather(outs, mine),
                       lambda: all(np.array_equal(o, e) for o, e in zip(outs, everyone, strict=True))),
        "all_gather_into_tensor": (lambda: tc.all_gather_into_tensor(gathered, mine),
                                   lambda: np.array_equal(gathered, np.concatenate(everyone))),
        "gather": (lambda: tc.gather(mine, outs if rank == 0 else None, dst=0),
                   lambda: rank != 0 or all(np.array_equal(o, e)
                                            for o, e in zip(outs, everyone, strict=True))),
        "scatter": (lambda: tc.scatter(x, everyone if rank == 0 else None, src=0),
                    lambda: np.array_equal(x, mine)),
        "reduce_scatter_tensor": (lambda: tc.reduce_scatter_tensor(part, head),
                                  lambda: np.array_equal(part, total[rank * block:(rank + 1) * block])),
        "all_to_all_single": (lambda: tc.all_to_all_single(swapped, head), lambda: np.array_equal(
            swapped, np.concatenate([e[rank * block:(rank + 1) * block] for e in everyone]))),
        "barrier": (tc.barrier, lambda: True),
    }
    if size > 1:
        cases["send/recv ring"] = (receive, lambda: np.array_equal(x, everyone[left]))
    return cases


def _measure(case: Case, iterations: int) -> tuple[bool, float]:
    """Whether the result is right, and the mean time of ``iterations`` calls after ``WARMUP``."""
    run, check = case
    run()
    ok = check()
    for _ in range(WARMUP):
        run()
    tc.barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        run()
    seconds = (time.perf_counter() - start) / iterations
    return ok and check(), seconds


def main(argv: list[str] | None = None) -> int:
    """Run the demo on this rank; return the exit code (0: every result correct on every rank)."""
    parser = argparse.ArgumentParser(prog="python -m tensorcomm.demo")
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 262_144],
                        help="float32 element counts to run each collective with")
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args(argv)
    tc.init()
    rank, size = tc.get_rank(), tc.get_world_size()
    transport = tc.WORLD.transport_kind.value
    rows = []
    for count in args.sizes:
        for name, case in _cases(rank, size, count).items():
            ok, seconds = _measure(case, args.iterations)
            wrong = np.array([0 if ok else 1], np.int64)
            tc.all_reduce(wrong)  # a result is only "ok" if it is right on every rank
            slowest = np.array([seconds])
            tc.all_reduce(slowest, op=tc.ReduceOp.MAX)
            rows.append((name, count * 4, int(wrong[0]), float(slowest[0])))
    tc.destroy()
    if rank == 0:
        print(f"tensorcomm demo: {size} ranks over {transport}, float32, {args.iterations} timed "
              f"calls per row after {WARMUP} untimed ones")
        print(f"{'collective':<24} {'bytes':>10} {'result':>12} {'time/call':>12}")
        for name, nbytes, wrong_ranks, seconds in rows:
            result = "ok" if wrong_ranks == 0 else f"WRONG on {wrong_ranks}"
            print(f"{name:<24} {nbytes:>10} {result:>12} {seconds * 1e6:>9.1f} µs")
        print("all results match numpy" if all(r[2] == 0 for r in rows) else "SOME RESULTS WERE WRONG")
    return 0 if all(r[2] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
