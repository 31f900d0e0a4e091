"""A plain ``tc.init()`` script under ``mpiexec -n 2`` (no variable exported: the ranks meet through
MPI) and as ``python script.py`` with no launcher (a world of one, as mpi4py gives)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mpi_jobs import missing

pytestmark = pytest.mark.multiprocess
SCRIPT = Path(__file__).resolve().parent / "plain_init.py"
# Variables of launchers: none may leak into the job from the environment running the tests.
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "TENSORCOMM_SECRET", "TENSORCOMM_STORE_HOSTED")


def _run(argv: list[str], timeout: float, **extra: str) -> tuple[int | None, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_VARS and not k.startswith(("PMI_", "OMPI_", "PMIX_", "SLURM_"))}
    env.update(extra)
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True, text=True)
    try:
        output, _ = process.communicate(timeout=timeout)
        return process.returncode, output
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return None, process.communicate()[0]


def _lines(output: str) -> list[dict]:
    """The ranks' JSON objects, by rank (mpiexec may interleave the ranks' lines)."""
    return sorted((json.loads(found) for found in re.findall(r'\{"rank"[^{}]*\}', output)),
                  key=lambda line: line["rank"])


@pytest.mark.timeout(120)
@pytest.mark.skipif(missing() is not None, reason=f"MPI tests: {missing()}")
def test_plain_init_under_mpiexec() -> None:
    from tensorcomm.bench.peers.mpi4py_ import launcher

    code, output = _run(launcher().argv(2, [sys.executable, str(SCRIPT)]), timeout=100)
    assert code == 0, output
    assert _lines(output) == [{"rank": 0, "size": 2, "sum": 3.0}, {"rank": 1, "size": 2, "sum": 3.0}], output


@pytest.mark.timeout(120)
def test_plain_init_without_a_launcher_is_a_world_of_one() -> None:
    code, output = _run([sys.executable, str(SCRIPT)], timeout=100)
    assert code == 0, output
    assert _lines(output) == [{"rank": 0, "size": 1, "sum": 1.0}], output


@pytest.mark.timeout(120)
@pytest.mark.skipif(missing() is not None, reason=f"MPI tests: {missing()}")
def test_an_mpi_that_is_not_the_launchers_is_named() -> None:
    """A launcher's rank and size that MPI does not share (here: no mpiexec at all, so MPI makes a
    world of one) fail at once, naming both, instead of running as separate worlds."""
    code, output = _run([sys.executable, str(SCRIPT)], timeout=100, PMI_RANK="1", PMI_SIZE="2")
    assert code not in (0, None), output
    assert "the launcher (pmi) says rank 1 of 2, but mpi4py's MPI_COMM_WORLD says rank 0 of 1" in output
