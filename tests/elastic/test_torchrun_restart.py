"""torchrun ``--max-restarts``: a job whose rank dies in the first attempt restarts and finishes.

The script meets with ``tensorcomm.init()`` (on the agent's store) and trains a small DDP model on
the ``tensorcomm`` torch backend. In attempt 0 rank 1 dies before it reaches ``init``, while rank
0 is already waiting there; the agent then stops rank 0 and starts both again. The new attempt
must not meet on the keys the failed one left in the agent's store (which outlives attempts):
before tensorcomm keyed each attempt on ``TORCHELASTIC_RESTART_COUNT``, rank 0 of attempt 1
counted itself into attempt 0's generation and waited there for a rank that was gone.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tensorcomm.testing import free_port

pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(180)

SCRIPT = textwrap.dedent("""
    import os, pathlib, sys, time

    shared = pathlib.Path(sys.argv[1])
    attempt, rank = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), int(os.environ["RANK"])
    if attempt == 0 and rank == 1:  # dies while rank 0 waits in init()
        deadline = time.monotonic() + 60
        while not (shared / "arriving0").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2.0)
        os._exit(7)
    import numpy as np
    import torch, torch.distributed as dist
    import tensorcomm as tc
    import tensorcomm.torch  # registers the torch backend "tensorcomm"

    (shared / f"arriving{rank}").write_text("")
    tc.init(timeout=30)
    x = np.full(4, rank + 1.0)
    tc.all_reduce(x)
    dist.init_process_group("tensorcomm")  # joins the running tensorcomm world
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        optimizer.zero_grad()
        model(torch.full((3, 4), float(rank + step))).sum().backward()
        optimizer.step()
    weights = model.module.weight.detach().numpy().copy()
    everyone = np.stack([weights] * tc.get_world_size())
    tc.all_gather(list(everyone), weights)
    assert all(np.array_equal(w, weights) for w in everyone), "DDP replicas differ"
    print(f"attempt {attempt} rank {rank} sum {x[0]:g} weights equal", flush=True)
    dist.destroy_process_group()
    tc.destroy()
""")


def test_a_failed_attempt_restarts_and_finishes(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    # torchrun hands "--master-port 0" to its workers as is, so a free port is picked here.
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--max-restarts", "1", "--monitor-interval", "0.1",
                           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                           str(script), str(tmp_path)],
                          capture_output=True, text=True, timeout=150)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "exitcode: 7" in output or "exitcode  : 7" in output, output  # attempt 0 failed as planned
    for rank in range(2):
        assert f"attempt 1 rank {rank} sum 3 weights equal" in done.stdout, output
