"""Real ``mpiexec`` jobs for the MPI tests.

``mpirun(ranks, scenario, *args)`` starts ``tests/mpi/rank_main.py`` under this host's
``mpiexec`` (MPICH or Open MPI, started as ``tensorcomm bench`` starts it), with a hard timeout
after which the whole job is killed, and returns every line it printed. ``missing()`` says why
MPI tests cannot run here, if they cannot.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

RANK_MAIN = Path(__file__).resolve().parent / "rank_main.py"


def missing() -> str | None:
    """Why MPI jobs cannot run on this machine, or None."""
    if importlib.util.find_spec("mpi4py") is None:
        return ("mpi4py is not installed "
                "(pip install 'tensorcomm[mpi]' after apt-get install mpich libmpich-dev)")
    if shutil.which("mpiexec") is None:
        return "mpiexec is not on PATH (apt-get install mpich)"
    return None


@dataclass
class Job:
    """How an mpiexec job ended: exit code (None: killed at the timeout), its output and the
    result of every rank that finished its scenario, by rank."""

    returncode: int | None
    output: str
    by_rank: dict[int, object]

    def results(self) -> list:
        """The ranks' results in rank order (ranks that did not finish left out)."""
        return [self.by_rank[rank] for rank in sorted(self.by_rank)]


def mpirun(ranks: int, scenario: str, *args: str, timeout: float = 100.0,
           env: dict[str, str] | None = None) -> Job:
    """Run ``scenario`` on ``ranks`` MPI ranks; kill the job after ``timeout`` seconds."""
    from tensorcomm.bench.peers.mpi4py_ import launcher

    argv = launcher().argv(ranks, [sys.executable, str(RANK_MAIN), scenario, *args])
    with tempfile.TemporaryDirectory(prefix="tensorcomm-mpi-test-") as results:
        child_env = {**os.environ, "PYTHONUNBUFFERED": "1", "RESULTS_DIR": results, **(env or {})}
        process = subprocess.Popen(argv, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True, text=True)
        try:
            output, _ = process.communicate(timeout=timeout)
            returncode: int | None = process.returncode
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            returncode = None
        by_rank = {int(path.stem.removeprefix("rank")): json.loads(path.read_text())
                   for path in Path(results).glob("rank*.json")}
    return Job(returncode, output, by_rank)


def check(job: Job, ranks: int) -> list:
    """Every rank's result; fail with the job's output unless all ranks finished cleanly."""
    results = job.results()
    if job.returncode != 0 or len(results) != ranks:
        state = "killed at the timeout" if job.returncode is None else f"exit code {job.returncode}"
        raise AssertionError(f"mpiexec job {state}, {len(results)} of {ranks} results:\n{job.output[-6000:]}")
    return results
