"""What wire compression (``TENSORCOMM_WIRE_DTYPE``) costs in accuracy: float32 all_reduce sums
over TCP with bfloat16 and float16 on the wire, against the exact (float64) sum.

For each world size and wire dtype, ranks start a job over TCP with that dtype, all-reduce
normally distributed float32 values (the shape of gradients) and report, against the float64
sum: the largest error relative to the sum of magnitudes (the bound rounding gives), the RMS
error relative to the RMS of the sum, and whether every rank holds the same bits. The same
numbers for full float32 are the baseline. Run from the repository root::

    python benchmarks/wire_accuracy.py                      # 2, 4 and 8 ranks; ~1 minute
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from tensorcomm.testing import run_ranks


def body(count: int, seed: int) -> dict:
    """One rank: all_reduce its part, compare with the exact sum every rank can compute."""
    import hashlib

    import tensorcomm as tc

    rank, size = tc.get_rank(), tc.get_world_size()
    inputs = [np.random.default_rng([seed, r]).standard_normal(count).astype(np.float32)
              for r in range(size)]
    x = inputs[rank].copy()
    tc.all_reduce(x)
    exact = np.sum([a.astype(np.float64) for a in inputs], axis=0)
    magnitude = np.sum([np.abs(a.astype(np.float64)) for a in inputs], axis=0)
    error = x.astype(np.float64) - exact
    return {"digest": hashlib.sha256(x.tobytes()).hexdigest(),
            "max_relative": float(np.max(np.abs(error) / magnitude)),
            "rms_relative": float(np.sqrt(np.mean(error ** 2)) / np.sqrt(np.mean(exact ** 2)))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--count", type=int, default=1 << 20, help="float32 elements per rank")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    rows = []
    for ranks in args.ranks:
        for wire in ("", "bfloat16", "float16"):
            env = {"TENSORCOMM_TRANSPORT": "tcp", **({"TENSORCOMM_WIRE_DTYPE": wire} if wire else {})}
            results = run_ranks(body, ranks, args.count, 7, timeout=300, env=env)
            rows.append({"ranks": ranks, "wire": wire or "float32 (off)",
                         "identical": len({r["digest"] for r in results}) == 1,
                         "max_relative": max(r["max_relative"] for r in results),
                         "rms_relative": max(r["rms_relative"] for r in results)})
    lines = [("| ranks | on the wire | max error / sum of magnitudes | RMS error / RMS of sum | "
              "same bits on every rank |"), "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['ranks']} | {r['wire']} | {r['max_relative']:.2e} | {r['rms_relative']:.2e} | "
              f"{'yes' if r['identical'] else 'NO'} |" for r in rows]
    table = "\n".join(lines)
    print(table)
    if args.json:
        args.json.write_text(json.dumps({"count": args.count, "rows": rows}, indent=1))
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
