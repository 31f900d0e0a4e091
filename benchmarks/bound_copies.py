"""Persistent small calls with their bound copies made two ways, in one job, batch by batch.

    python benchmarks/bound_copies.py [--batches 15] [--calls 2000] [--json FILE]

Starts itself under ``tensorcomm run -n 2``. Each rank makes every persistent request twice:
once with its bound copies as ``np.copyto`` calls (what bound rounds held before
``shm_common.bound_copy``), once as ``bound_copy`` makes them (a memoryview's slice assignment
for small contiguous arrays of one dtype). Then, for 8-byte all_gather, broadcast, all_reduce and
reduce_scatter, it runs the two requests ``--batches`` times each, alternating which goes first,
``--calls`` runs a batch after a barrier, and prints rank 0's thread CPU time per run (waits
included), the medians and their ratio. Both forms run on the same processes, memory and
scheduler state, so the host's drift, which moves whole jobs by 20-40 % on the 2-core VM, does
not enter the ratio. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

BINDERS = ("shm_allgather", "shm_broadcast", "shm_reduce_scatter", "shm_allreduce")


def _requests(copy_maker: Any) -> dict[str, Any]:
    """The four persistent requests, their rounds bound with ``copy_maker`` for their copies."""
    import importlib

    import numpy as np

    import tensorcomm as tc
    from tensorcomm.algorithms import shm_common

    modules = [importlib.import_module(f"tensorcomm.algorithms.{name}") for name in BINDERS]
    for module in modules:
        module.bound_copy = copy_maker
    try:
        two, all_two = np.zeros(2, np.float32), np.zeros(2 * tc.get_world_size(), np.float32)
        return {
            "all_gather": tc.all_gather_into_tensor_init(all_two.copy(), two.copy()),
            "broadcast": tc.broadcast_init(two.copy(), src=0),
            "all_reduce": tc.all_reduce_init(two.copy()),
            "reduce_scatter": tc.reduce_scatter_tensor_init(two.copy(), all_two.copy()),
        }
    finally:
        for module in modules:
            module.bound_copy = shm_common.bound_copy


def rank_job(batches: int, calls: int, out: Path) -> None:
    """One rank: time both forms of each request; rank 0 writes the figures to ``out``."""
    import numpy as np

    import tensorcomm as tc
    from tensorcomm.algorithms import shm_common

    tc.init()

    def copyto(dst: Any, src: Any) -> Any:  # the bound copy before ``bound_copy``
        if dst.nbytes <= shm_common.PIECE_BYTES:
            return partial(np.copyto, dst, src)
        return partial(shm_common.copy, dst, src)

    forms = {"np.copyto": _requests(copyto), "bound_copy": _requests(shm_common.bound_copy)}
    times: dict[str, dict[str, list[float]]] = {name: {form: [] for form in forms}
                                                for name in forms["bound_copy"]}
    for batch in range(batches):
        order = list(forms) if batch % 2 == 0 else list(forms)[::-1]
        for name in times:
            for form in order:
                run = forms[form][name]
                tc.barrier()
                start = time.thread_time()
                for _ in range(calls):
                    run()
                times[name][form].append((time.thread_time() - start) / calls * 1e6)
    if tc.get_rank() == 0:
        out.write_text(json.dumps(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--rank-job", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_job:
        rank_job(args.batches, args.calls, args.rank_job)
        return
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "times.json"
        me = [str(Path(__file__).resolve()), "--batches", str(args.batches), "--calls", str(args.calls)]
        subprocess.run([sys.executable, "-m", "tensorcomm", "run", "-n", "2", *me, "--rank-job", str(out)],
                       check=True, timeout=900, stdout=subprocess.DEVNULL)
        times = json.loads(out.read_text())
    print(f"load after: {os.getloadavg()}")
    print("us CPU per run on rank 0, medians over the batches")
    print(f"{'8-byte persistent':18} {'np.copyto':>10} {'bound_copy':>11} {'ratio':>6}")
    table = {}
    for name, by_form in times.items():
        before, after = statistics.median(by_form["np.copyto"]), statistics.median(by_form["bound_copy"])
        table.update({f"{name} np.copyto us": before, f"{name} bound_copy us": after,
                      f"{name} ratio": before / after})
        print(f"{name:18} {before:10.2f} {after:11.2f} {before / after:6.2f}")
    if args.json is not None:
        args.json.write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
