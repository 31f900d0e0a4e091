"""A plain numpy script calling ``tensorcomm.init()`` runs under torchrun, meeting on torchrun's
own store (which holds MASTER_PORT) rather than trying to serve one there."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tensorcomm.testing import free_port

pytest.importorskip("torch")

SCRIPT = textwrap.dedent("""
    import numpy as np, tensorcomm as tc
    tc.init()
    x = np.full(4, tc.get_rank() + 1, np.float32)
    tc.all_reduce(x)
    print(f"rank {tc.get_rank()} of {tc.get_world_size()} got {x[0]:g}", flush=True)
    tc.destroy()
""")


def test_numpy_script_under_torchrun(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    # torchrun hands "--master-port 0" to its workers as is, so a free port is picked here.
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3",
                           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(3):
        assert f"rank {rank} of 3 got 6" in done.stdout, done.stdout + done.stderr
