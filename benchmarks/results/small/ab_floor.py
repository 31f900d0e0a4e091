"""Interleaved A/B of ``benchmarks/shm_floor.py``'s public-API timings between source trees.

Usage (from the repository root): python benchmarks/results/small/ab_floor.py ROUNDS SRC_A SRC_B
e.g. ``... 5 /work/main/src src``. Each round runs ``shm_floor.public`` (2 ranks, 8 B and 64 KiB,
10000 calls) once per tree, alternating; printed: the median per tree (us) and A / B.
"""

import json
import os
import statistics
import subprocess
import sys

rounds, trees = int(sys.argv[1]), sys.argv[2:]
bench = os.path.abspath("benchmarks")
code = (f"import sys, json; sys.path.insert(0, {bench!r}); import shm_floor as f; "
        "from tensorcomm.testing import run_ranks; "
        "r = run_ranks(f.public, 2, list(f.COLLECTIVES), [8, 65536], 10000, timeout=600)[0]; "
        "print(json.dumps({f'{k[0]} {k[1]}': v * 1e6 for k, v in r.items()}))")
found: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
for _ in range(rounds):
    for tree in trees:
        env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                             check=True)
        found[tree].append(json.loads(out.stdout.strip().splitlines()[-1]))
print(f"{'call':<22}" + "".join(f"{t[-20:]:>22}" for t in trees) + f"{'A/B':>7}")
for k in found[trees[0]][0]:
    med = [statistics.median(run[k] for run in found[t]) for t in trees]
    print(f"{k:<22}" + "".join(f"{m:>22.2f}" for m in med) + f"{med[0] / med[1]:>7.2f}")
