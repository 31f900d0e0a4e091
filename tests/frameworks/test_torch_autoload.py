"""``import torch`` knows the "tensorcomm" backend through torch's plug-in entry points, with no
``import tensorcomm.torch`` in the script (what Lightning, DeepSpeed or a config file naming the
backend need), under torchrun and ``tensorcomm run``; and torch's own conventions for a non-Gloo
backend hold there: integer and bool AVG as NCCL computes them (Lightning all-reduces an int64
counter with AVG in its first step)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tensorcomm.testing import free_port

pytest.importorskip("torch")

PROBE = ("import sys, torch, torch.distributed as d; "
         "print('tensorcomm' in d.Backend.backend_list, "
         "sorted(m for m in sys.modules if m.split('.')[0].startswith('tensorcomm')))")

# No tensorcomm import: the plug-in registers the backend when torch is imported.
SCRIPT = textwrap.dedent("""
    import torch, torch.distributed as dist
    dist.init_process_group("tensorcomm")
    rank, size = dist.get_rank(), dist.get_world_size()
    steps = torch.tensor([rank * rank + 2, -(rank * rank + 2)], dtype=torch.int64)
    dist.all_reduce(steps, op=dist.ReduceOp.AVG)
    flags = torch.tensor([True, rank == 0, False])
    dist.all_reduce(flags, op=dist.ReduceOp.AVG)
    small = torch.tensor([5 * rank + 2] * size, dtype=torch.int32)
    out = torch.zeros(1, dtype=torch.int32)
    dist.reduce_scatter_tensor(out, small, op=dist.ReduceOp.AVG)
    print(f"rank {rank}: {steps.tolist()} {flags.tolist()} {out.tolist()} "
          f"{type(dist.group.WORLD).__name__}", flush=True)
    dist.destroy_process_group()
""")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TENSORCOMM_", "TORCH_DEVICE"))}
    env.update(extra)
    return env


def _probe(**extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROBE], env=_env(**extra), capture_output=True,
                          text=True, timeout=120)


def test_import_torch_registers_the_backend_without_importing_tensorcomm():
    done = _probe()
    assert done.returncode == 0, done.stderr
    # Fails where the installed metadata lacks the entry point: reinstall (pip install -e .).
    assert done.stdout.split() == ["True", "['tensorcomm_autoload']"], done.stdout + done.stderr


def test_autoload_off_leaves_torch_alone():
    done = _probe(TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "[]"], done.stdout + done.stderr


def test_a_broken_tensorcomm_cannot_fail_import_torch(tmp_path):
    broken = tmp_path / "tensorcomm"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('broken on purpose')\n")
    # Under tensorcomm run the plug-in imports tensorcomm.torch at once: here that import fails.
    done = _probe(TENSORCOMM_STORE_HOSTED="1", PYTHONPATH=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "could not register the torch backend (ImportError: broken on purpose)" in done.stderr


def _check(stdout: str, size: int) -> None:
    total = sum(r * r + 2 for r in range(size))  # divides by neither 2 nor 3
    mean = total // size  # positive: floor is toward zero; -mean is the negative sum rounded so
    for rank in range(size):
        flags = [True, size == 1, False]
        line = (f"rank {rank}: {[mean, -mean]} {flags} "
                f"[{sum(5 * r + 2 for r in range(size)) // size}] ProcessGroupTensorcomm")
        assert line in stdout, stdout


def test_backend_by_name_under_torchrun(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script)],
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    _check(done.stdout, 2)


def test_backend_by_name_under_tensorcomm_run(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, "-m", "tensorcomm", "run", "-n", "3", str(script)],
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    _check(done.stdout, 3)
