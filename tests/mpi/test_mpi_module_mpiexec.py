"""``from tensorcomm import MPI`` in a program started by ``mpiexec -n 2`` (nothing exported):
tensorcomm meets through the real MPI, then moves every byte itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from mpi_jobs import missing

pytestmark = pytest.mark.multiprocess

PROGRAM = """
import numpy as np
from tensorcomm import MPI
comm = MPI.COMM_WORLD
x = np.arange(3.0) + comm.rank
comm.Allreduce(MPI.IN_PLACE, x)
status = MPI.Status()
comm.send(comm.rank, dest=(comm.rank + 1) % comm.size, tag=comm.rank + 10)
got = comm.recv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status)
line = f"rank {comm.rank} {comm.size} {x.tolist()} {got} {status.Get_tag()}"
lines = comm.gather(line, root=0)  # one writer: mpiexec may interleave two ranks' output mid-line
if comm.rank == 0:
    print("\\n".join(lines), flush=True)
"""


@pytest.mark.skipif(missing() is not None, reason=f"MPI tests: {missing()}")
def test_program_under_mpiexec():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "OMPI_", "PMIX_", "SLURM_", "MASTER_", "TENSORCOMM_SECRET"))}
    job = subprocess.Popen(["mpiexec", "-n", "2", sys.executable, "-c", PROGRAM], env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                           start_new_session=True)
    try:
        output, _ = job.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        pytest.fail(f"mpiexec job hung:\n{job.communicate()[0]}")
    assert job.returncode == 0, output
    lines = sorted(line for line in output.splitlines() if line.startswith("rank "))
    assert lines == ["rank 0 2 [1.0, 3.0, 5.0] 1 11", "rank 1 2 [1.0, 3.0, 5.0] 0 10"], output
