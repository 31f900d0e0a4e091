"""tensorcomm over MPI (``backend="mpi"``) in real mpiexec jobs: every collective against numpy on
1-4 ranks with MPI carrying every message, groups split between shared memory and MPI, errors
that name the call (mismatch, a stopped rank, a late rank, an abort), re-init, and a rank that
dies ending the job instead of hanging it."""

from __future__ import annotations

import pytest

from helpers import BODY_OF
from mpi_jobs import check, missing, mpirun

pytestmark = [pytest.mark.multiprocess,
              pytest.mark.skipif(missing() is not None, reason=f"MPI tests: {missing()}")]

MPI_ONLY = {"TENSORCOMM_TRANSPORT": "tcp"}  # no shared memory: MPI carries every message
COLLECTIVES = "multiprocess/test_collectives"
# test_collectives' body of every collective (``helpers.BODY_OF``), then those that mix them.
BODIES = [f"{COLLECTIVES}:{name}" for name in dict.fromkeys(
    [*BODY_OF.values(), "body_scan_async_groups_and_objects", "body_async"])] + [
    "multiprocess/test_uneven:body_uneven", "multiprocess/test_object_collectives:body_objects:1000",
    "multiprocess/test_ops:body_reductions", "multiprocess/test_ops:body_alltoall",
    "multiprocess/test_cross_device:body_strategies"]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_every_collective(ranks):
    check(mpirun(ranks, "bodies", *BODIES, timeout=380, env=MPI_ONLY), ranks)


@pytest.mark.timeout(200)
def test_groups_on_shared_memory_and_mpi():
    """Two pretend hosts of two ranks: groups within one use shared memory, the rest MPI."""
    env = {"FAKE_HOSTS": "2"}
    results = check(mpirun(4, "transports", env=env), 4)
    assert all(r["world"] == "TCP" and r["local"] == "SHM" for r in results), results
    assert sorted(r.get("across") for r in results if "across" in r) == ["TCP", "TCP"], results
    check(mpirun(4, "bodies", f"{COLLECTIVES}:body_groups", f"{COLLECTIVES}:body_all_to_all",
                 timeout=180, env=env), 4)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["collective", "shape", "root", "skipped_call"])
def test_mismatch_is_caught_by_every_rank(kind):
    for message in check(mpirun(2, "mismatch", kind, env=MPI_ONLY), 2):
        assert "rank" in message and "called" in message, message


@pytest.mark.timeout(120)
def test_mismatched_sizes_above_the_eager_limit():
    for message in check(mpirun(2, "bulk_mismatch", env=MPI_ONLY), 2):
        assert "byte message where a" in message or "called" in message, message


@pytest.mark.timeout(120)
def test_bad_arguments_raise_on_the_calling_rank():
    check(mpirun(2, "bad_arguments", env=MPI_ONLY), 2)


@pytest.mark.timeout(120)
def test_stopped_rank_is_a_timeout_naming_the_call():
    job = mpirun(2, "stopped", "3", timeout=100, env=MPI_ONLY)
    assert job.returncode is not None, f"the job hung:\n{job.output[-4000:]}"
    (message,) = job.results()  # rank 0's; rank 1 is stopped
    assert "CommTimeoutError" not in message  # the message itself, not a traceback
    assert "all_reduce" in message and "timed out after 3 s" in message, message
    assert "rank 1" in message, message
    assert "ending the MPI job with MPI_Abort" in job.output, job.output[-4000:]


@pytest.mark.timeout(120)
def test_late_rank_is_a_rendezvous_error():
    job = mpirun(2, "late", "3", timeout=100)
    assert job.returncode is not None, f"the job hung:\n{job.output[-4000:]}"
    (message,) = job.results()
    assert "did not complete within 3 s" in message, message


@pytest.mark.timeout(120)
def test_abort_reaches_every_rank():
    for message in check(mpirun(3, "abort", env=MPI_ONLY), 3):
        assert "aborted by rank 0: test abort" in message, message


@pytest.mark.timeout(120)
def test_dead_rank_ends_the_job():
    job = mpirun(3, "dies", timeout=100, env=MPI_ONLY)
    assert job.returncode not in (None, 0), job.output[-4000:]


@pytest.mark.timeout(200)
def test_destroy_and_init_again():
    results = check(mpirun(2, "reinit", timeout=180, env=MPI_ONLY), 2)
    assert results == [[1, 3, 5]] * 2, results


@pytest.mark.timeout(300)
def test_split_over_mpi():
    check(mpirun(3, "bodies", "multiprocess/test_split:body_split", timeout=280, env=MPI_ONLY), 3)
