"""The demo job: every collective on real data, checked against numpy, timed, as a table.

Run through ``tensorcomm demo -n 4`` (which starts the ranks) or ``tensorcomm run -n 4 -m
tensorcomm.demo``. Rank 0 prints the table; the exit code is 1 if any result was wrong anywhere.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import numpy as np

import tensorcomm as tc
from tensorcomm.testing.reference import rank_data, reduce_reference

Check = Callable[[], bool]  # runs the collective once and says whether the result is right


def _cases(rank: int, size: int, count: int) -> dict[str, Check]:
    """One closure per collective; each builds fresh inputs and compares with numpy."""
    everyone = [rank_data(r, count, np.float32) for r in range(size)]
    mine = everyone[rank]
    total = reduce_reference(tc.ReduceOp.SUM, everyone)
    peak = reduce_reference(tc.ReduceOp.MAX, everyone)
    right, left = (rank + 1) % size, (rank - 1) % size

    def all_reduce() -> bool:
        x = mine.copy()
        tc.all_reduce(x)
        return np.array_equal(x, total)

    def all_reduce_max_async() -> bool:
        x = mine.copy()
        tc.all_reduce(x, op=tc.ReduceOp.MAX, async_op=True).wait()
        return np.array_equal(x, peak)

    def reduce() -> bool:
        x = mine.copy()
        tc.reduce(x, dst=0)
        return np.array_equal(x, total if rank == 0 else mine)

    def broadcast() -> bool:
        x = mine.copy()
        tc.broadcast(x, src=size - 1)
        return np.array_equal(x, everyone[-1])

    def all_gather() -> bool:
        out = [np.empty_like(mine) for _ in range(size)]
        tc.all_gather(out, mine)
        return all(np.array_equal(o, e) for o, e in zip(out, everyone))

    def all_gather_into_tensor() -> bool:
        out = np.empty(size * count, np.float32)
        tc.all_gather_into_tensor(out, mine)
        return np.array_equal(out, np.concatenate(everyone))

    def gather() -> bool:
        out = [np.zeros_like(mine) for _ in range(size)]
        tc.gather(mine, out if rank == 0 else None, dst=0)
        return rank != 0 or all(np.array_equal(o, e) for o, e in zip(out, everyone))

    def scatter() -> bool:
        out = np.empty_like(mine)
        tc.scatter(out, everyone if rank == 0 else None, src=0)
        return np.array_equal(out, mine)

    def reduce_scatter_tensor() -> bool:
        block = count // size
        out = np.empty(block, np.float32)
        tc.reduce_scatter_tensor(out, np.ascontiguousarray(mine[:block * size]))
        return np.array_equal(out, total[rank * block:(rank + 1) * block])

    def all_to_all_single() -> bool:
        block = count // size
        out = np.empty(block * size, np.float32)
        tc.all_to_all_single(out, np.ascontiguousarray(mine[:block * size]))
        expected = np.concatenate([e[rank * block:(rank + 1) * block] for e in everyone])
        return np.array_equal(out, expected)

    def send_recv() -> bool:
        got = np.empty_like(mine)
        receiving = tc.irecv(got, src=left)
        tc.send(mine, dst=right)
        receiving.wait()
        return np.array_equal(got, everyone[left])

    def barrier() -> bool:
        tc.barrier()
        return True

    cases: dict[str, Check] = {
        "all_reduce(sum)": all_reduce, "all_reduce(max, async)": all_reduce_max_async,
        "reduce": reduce, "broadcast": broadcast, "all_gather": all_gather,
        "all_gather_into_tensor": all_gather_into_tensor, "gather": gather, "scatter": scatter,
        "reduce_scatter_tensor": reduce_scatter_tensor, "all_to_all_single": all_to_all_single,
        "barrier": barrier,
    }
    if size > 1:
        cases["send/recv ring"] = send_recv
    return cases


def _measure(check: Check, iterations: int) -> tuple[bool, float]:
    """Correctness of the first call, then the mean time of ``iterations`` more, in seconds."""
    ok = check()
    tc.barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        ok = check() and ok
    return ok, (time.perf_counter() - start) / iterations


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
        for name, check in _cases(rank, size, count).items():
            ok, seconds = _measure(check, args.iterations)
            wrong = np.array([0 if ok else 1], np.int64)
            tc.all_reduce(wrong)  # a result is only "ok" if it is right on every rank
            slowest = np.array([seconds])
            tc.all_reduce(slowest, op=tc.ReduceOp.MAX)
            rows.append((name, count * 4, int(wrong[0]), float(slowest[0])))
    tc.destroy()
    if rank == 0:
        print(f"tensorcomm demo: {size} ranks over {transport}, float32, {args.iterations} timed "
              "calls per row")
        print(f"{'collective':<24} {'bytes':>10} {'result':>12} {'time/call':>12}")
        for name, nbytes, wrong_ranks, seconds in rows:
            result = "ok" if wrong_ranks == 0 else f"WRONG on {wrong_ranks}"
            print(f"{name:<24} {nbytes:>10} {result:>12} {seconds * 1e6:>9.1f} µs")
        print("all results match numpy" if all(r[2] == 0 for r in rows) else "SOME RESULTS WERE WRONG")
    return 0 if all(r[2] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
