"""``import tensorcomm`` does not import ml_dtypes (it costs more than all of tensorcomm); a
bfloat16 array made after ``init`` (ml_dtypes imported by the script then) still reduces, on
shared memory and over TCP, and the wire dtype asked for by name loads it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.multiprocess]

SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorcomm as tc
    import tensorcomm.ops

    assert "ml_dtypes" not in sys.modules, "import tensorcomm imported ml_dtypes"
    tc.init(timeout=60)
    x = np.arange(6, dtype=np.float32) + tc.get_rank()
    tc.all_reduce(x)
    wired = tc.get_world_size() > 1 and "ml_dtypes" in sys.modules
    import ml_dtypes

    y = (np.arange(6, dtype=np.float32) + tc.get_rank()).astype(ml_dtypes.bfloat16)
    tc.all_reduce(y)
    z = tensorcomm.ops.AllReduce(op="max")(y)
    print(f"rank {tc.get_rank()}: {y.dtype} {y.astype(np.float32).tolist()} {z.dtype} "
          f"{x.tolist()} wired={wired}", flush=True)
    tc.destroy()
""")


@pytest.mark.parametrize("env", [{}, {"TENSORCOMM_TRANSPORT": "tcp"},
                                 {"TENSORCOMM_TRANSPORT": "tcp", "TENSORCOMM_WIRE_DTYPE": "bfloat16"}],
                         ids=["shm", "tcp", "tcp-wire-bfloat16"])
def test_bfloat16_after_init_without_ml_dtypes_at_import(tmp_path, env: dict[str, str]) -> None:
    script = tmp_path / "rank.py"
    script.write_text(SCRIPT)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TENSORCOMM_")}
    done = subprocess.run([sys.executable, "-m", "tensorcomm", "run", "-n", "2", str(script)],
                          capture_output=True, text=True, timeout=120, env={**environ, **env})
    assert done.returncode == 0, done.stdout + done.stderr
    expected = [float(2 * i + 1) for i in range(6)]
    wired = "TENSORCOMM_WIRE_DTYPE" in env  # the transport asked for bfloat16 by name
    for rank in (0, 1):
        assert (f"rank {rank}: bfloat16 {expected} bfloat16 {expected} wired={wired}"
                in done.stdout), done.stdout + done.stderr
