"""The rank script of the elastic tests: a data-parallel loop that shrinks its group when a rank
is lost and goes on with the survivors (run by ``tensorcomm run --keep-going``).

    python -m tensorcomm run -n 4 --keep-going elastic_job.py OUT_DIR PLAN_JSON

PLAN_JSON says ``steps``, the ranks' ``timeout``, the shrink's ``shrink_timeout`` and who fails
how: ``kill`` {rank: step} SIGKILLs the rank as it starts that step, ``stop`` {rank: step}
SIGSTOPs it there (the first survivor to finish shrinking SIGCONTs it), and ``die_acknowledging``
[ranks] SIGKILLs those ranks inside their first shrink, after the proposal and before their
acknowledgement (a second failure during the agreement).

Each step every member adds its gradient (integers, so sums are exact in any order) with one
all_reduce and applies the mean. After a failure the survivors shrink, agree on the last step
all of them completed (one may have completed the failed step: its all_reduce can finish before
a peer's fails), restore the parameters of that step and go on. Every rank writes
``OUT_DIR/rank<N>.json``: its shrinks, its parameters, or the ``ExcludedError`` it got.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np

import tensorcomm as tc
from tensorcomm.core import elastic

SIZE = 1000
LEARNING_RATE = 0.01


def gradient(rank: int, step: int) -> np.ndarray:
    return (rank + 1) * (step % 5 + 1) * np.arange(SIZE, dtype=np.float64)


def main(out: str, plan: dict) -> None:
    tc.init(timeout=plan["timeout"])
    rank = tc.get_rank()
    pids: list = [None] * tc.get_world_size()
    tc.all_gather_object(pids, os.getpid())
    if rank in plan.get("die_acknowledging", []):
        def conclude(*args: object) -> None:
            os.kill(os.getpid(), signal.SIGKILL)
        elastic._Shrink.conclude = conclude  # type: ignore[method-assign]
    kill = {int(r): s for r, s in plan.get("kill", {}).items()}
    stop = {int(r): s for r, s in plan.get("stop", {}).items()}
    group = tc.WORLD
    params = np.zeros(SIZE)
    history = {0: params.copy()}  # parameters after each of the last two completed steps
    shrinks = []
    step = 0
    while step < plan["steps"]:
        if kill.get(rank) == step:
            os.kill(os.getpid(), signal.SIGKILL)
        if stop.get(rank) == step:
            os.kill(os.getpid(), signal.SIGSTOP)
        grad = gradient(rank, step)
        try:
            tc.all_reduce(grad, group=group)
        except tc.CommError as exc:
            started = time.monotonic()
            try:
                group = group.shrink(timeout=plan["shrink_timeout"])
            except tc.ExcludedError as excluded:
                record = {"rank": rank, "failed": type(exc).__name__, "excluded": str(excluded)}
                break
            seconds = time.monotonic() - started
            if group.ranks[0] == rank:  # a stopped rank comes back once the others have shrunk
                for stopped in stop:
                    os.kill(pids[stopped], signal.SIGCONT)
            done = np.array([step], np.int64)
            tc.all_reduce(done, op=tc.ReduceOp.MIN, group=group)
            step = int(done[0])
            params = history[step].copy()
            shrinks.append({"failed": type(exc).__name__, "resume": step, "ranks": list(group.ranks),
                            "transport": group.transport_kind.name, "seconds": seconds,
                            "hierarchical": group._member_team().hier is not None})
            continue
        params -= LEARNING_RATE * (grad / group.size)
        step += 1
        history[step] = params.copy()
        history.pop(step - 2, None)
    else:
        record = {"rank": rank, "shrinks": shrinks, "params": params.tolist()}
    with open(os.path.join(out, f".rank{rank}.json"), "w") as f:
        json.dump(record, f)
    os.replace(os.path.join(out, f".rank{rank}.json"), os.path.join(out, f"rank{rank}.json"))
    tc.destroy()


def reference(steps: int, world_size: int, shrinks: list[dict]) -> np.ndarray:
    """The parameters the survivors must hold: each step on the members of its time."""
    params = np.zeros(SIZE)
    for step in range(steps):
        members = list(range(world_size))
        for shrink in shrinks:
            if step >= shrink["resume"]:
                members = shrink["ranks"]
        total = sum(gradient(r, step) for r in members)
        params -= LEARNING_RATE * (total / len(members))
    return params


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
