"""The training libraries people run on torch train over tensorcomm exactly as over Gloo.

Each job of library_jobs.py (a library's smallest 2-rank CPU example: Lightning DDP and FSDP2,
Accelerate, the Transformers Trainer, DeepSpeed ZeRO-1 and ZeRO-2, Ignite) runs twice under one
launcher, once with backend "gloo" and once with "tensorcomm", from the same seeds. Every rank's
losses and final parameters must be the same bits on both; the ranks' parameters must agree (the
library really synchronised them) and their losses differ (each rank had its own shard). The
scripts never import tensorcomm: torch loads the backend through its entry point.

Each library runs under one launcher here, torchrun for some and ``tensorcomm run`` for the
others, to keep the suite short; benchmarks/trainer_steps.py runs every job under either and
says whether the bits agree. A library that is not installed (the ``trainers`` extra) skips.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tensorcomm.testing import free_port

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(400)]  # two jobs, margins for a loaded host
torch = pytest.importorskip("torch")

JOBS = Path(__file__).with_name("library_jobs.py")
RUN_TIMEOUT = 180.0  # seconds for one job: imports dominate (Lightning's take 5 s a process)

# job: (the module it needs, the launcher it runs under here)
CASES = {
    "lightning_ddp": ("lightning", "torchrun"),
    "lightning_fsdp2": ("lightning", "tensorcomm"),
    "accelerate": ("accelerate", "tensorcomm"),
    "transformers": ("transformers", "torchrun"),
    "deepspeed_zero1": ("deepspeed", "torchrun"),
    "deepspeed_zero2": ("deepspeed", "tensorcomm"),
    "ignite": ("ignite", "tensorcomm"),
}


def launch(launcher: str, job: str, backend: str, out: Path) -> None:
    """Run ``job`` on 2 ranks under ``launcher``; fail with its output unless it exits 0 in time."""
    script = [str(JOBS), job, backend, str(out)]
    if launcher == "torchrun":
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *script]
    else:
        argv = [sys.executable, "-m", "tensorcomm", "run", "-n", "2", "--timeout", str(int(RUN_TIMEOUT) - 10),
                *script]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True, text=True)
    try:
        output, _ = process.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the launcher and both ranks
        output, _ = process.communicate()
        raise AssertionError(f"{job} on {backend} under {launcher} killed after {RUN_TIMEOUT:.0f} s:\n"
                             f"{output[-6000:]}") from None
    assert process.returncode == 0, \
        f"{job} on {backend} under {launcher} exited {process.returncode}:\n{output[-6000:]}"


def bits(tensor: torch.Tensor) -> tuple[str, tuple[int, ...], bytes]:
    """What must match bit for bit: dtype, shape and the bytes."""
    raw = tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    return str(tensor.dtype), tuple(tensor.shape), raw


@pytest.mark.parametrize("job", sorted(CASES))
def test_library_trains_as_on_gloo(job: str, tmp_path: Path) -> None:
    module, launcher = CASES[job]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install 'tensorcomm[trainers]')")
    runs = {}
    for backend in ("gloo", "tensorcomm"):
        out = tmp_path / backend
        out.mkdir()
        launch(launcher, job, backend, out)
        runs[backend] = [torch.load(out / f"rank{rank}.pt") for rank in range(2)]
    for rank in range(2):
        gloo, ours = runs["gloo"][rank], runs["tensorcomm"][rank]
        assert len(ours["losses"]) == 4, f"rank {rank} ran {len(ours['losses'])} steps, not 4"
        assert [bits(x) for x in ours["losses"]] == [bits(x) for x in gloo["losses"]], f"rank {rank}'s losses"
        assert sorted(ours["params"]) == sorted(gloo["params"])
        differ = [name for name in gloo["params"] if bits(ours["params"][name]) != bits(gloo["params"][name])]
        assert differ == [], f"rank {rank}'s parameters differ from Gloo's"
    first, second = runs["tensorcomm"]
    assert all(torch.equal(first["params"][name], second["params"][name]) for name in first["params"]), \
        "the ranks' parameters differ: the library did not synchronise them"
    assert [bits(x) for x in first["losses"]] != [bits(x) for x in second["losses"]], \
        "both ranks saw the same losses: the data was not sharded"
