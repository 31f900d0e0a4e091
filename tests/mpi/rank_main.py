"""One rank of an MPI test job: ``mpiexec -n N python tests/mpi/rank_main.py SCENARIO [ARGS...]``.

Every scenario runs tensorcomm with ``backend="mpi"`` and writes its result as JSON to
``$RESULTS_DIR/rank<N>.json`` (ranks' output lines may interleave); a failure prints its
traceback and exits 1. ``FAKE_HOSTS=k`` (a variable of these tests
only) splits the ranks over k pretend hosts through ``TENSORCOMM_HOST_ID``, so groups within a
"host" use shared memory and the others MPI.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType

import numpy as np

import tensorcomm as tc

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))  # tests/helpers.py, which test modules import, as under pytest


def _module(relative: str) -> ModuleType:
    """A test module by path (tests/ is not a package), e.g. ``multiprocess/test_collectives``."""
    path = TESTS / f"{relative}.py"
    spec = importlib.util.spec_from_file_location(relative.replace("/", "_"), path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _mpi_rank() -> tuple[int, int]:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def _init(timeout: float = 60.0) -> None:
    hosts = int(os.environ.get("FAKE_HOSTS", "0"))
    if hosts:
        rank, size = _mpi_rank()
        os.environ["TENSORCOMM_HOST_ID"] = f"pretend-host-{rank * hosts // size}"
    tc.init(backend="mpi", timeout=timeout)


def bodies(*specs: str) -> dict:
    """Run test bodies ``module:function[:int argument]``, e.g.
    ``multiprocess/test_collectives:body_async``."""
    _init()
    seconds = {}
    for spec in specs:
        relative, name, *arguments = spec.split(":")
        started = time.monotonic()
        getattr(_module(relative), name)(*map(int, arguments))
        seconds[name] = round(time.monotonic() - started, 2)
        print(f"rank {tc.get_rank()}: {name} took {seconds[name]} s", flush=True)
    tc.destroy()
    return seconds


def mismatch(kind: str) -> str:
    """Odd and even ranks make different calls: every rank must raise CollectiveMismatchError."""
    _init(timeout=30)
    message = _module("fault/test_mismatch").body_mismatch(kind)
    tc.destroy()
    return message


def bulk_mismatch() -> str:
    """Ranks all_reduce arrays of different sizes, both above the eager limit (payloads on their
    own MPI tags): both raise CollectiveMismatchError, the unmatched payloads are drained, and
    after destroy() MPI finalizes normally."""
    _init(timeout=30)
    count = 100_000 * (1 + tc.get_rank() % 2)
    try:
        tc.all_reduce(np.ones(count, np.float32))
    except tc.CollectiveMismatchError as exc:
        tc.destroy()
        return str(exc)
    raise AssertionError("no CollectiveMismatchError for all_reduce of different sizes")


def bad_arguments() -> None:
    _init()
    _module("multiprocess/test_errors").body_bad_arguments()
    tc.destroy()


def transports() -> dict:
    """Which groups use shared memory and which MPI, with FAKE_HOSTS=2."""
    _init()
    rank, size = tc.get_rank(), tc.get_world_size()
    half = size // 2
    local = [tc.new_group(list(range(half))), tc.new_group(list(range(half, size)))][rank >= half]
    across = tc.new_group([0, size - 1])
    kinds = {"world": tc.WORLD.transport_kind.name, "local": local.transport_kind.name}
    x = np.full(1000, rank, np.int64)
    tc.all_reduce(x, group=local)
    assert (x == sum(local.ranks)).all()
    if rank in (0, size - 1):
        kinds["across"] = across.transport_kind.name
        y = np.full(3, rank, np.float64)
        tc.all_reduce(y, group=across)
        assert (y == size - 1).all()
    tc.destroy()
    return kinds


def stopped(timeout: str) -> str:
    """Rank 1 stops (SIGSTOP) after init; rank 0's all_reduce must end with CommTimeoutError."""
    _init(timeout=float(timeout))
    x = np.ones(4, np.float32)
    tc.all_reduce(x)
    if tc.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    started = time.monotonic()
    try:
        tc.all_reduce(x)
    except tc.CommTimeoutError as exc:
        return f"after {time.monotonic() - started:.1f} s: {exc}"
    raise AssertionError("all_reduce returned with rank 1 stopped")


def late(timeout: str) -> str:
    """Rank 1 calls init long after the others' join timeout: they get RendezvousError in time."""
    if _mpi_rank()[0] == 1:
        time.sleep(60)
    os.environ["TENSORCOMM_JOIN_TIMEOUT"] = timeout  # joining has a deadline of its own
    started = time.monotonic()
    try:
        _init(timeout=float(timeout))
    except tc.RendezvousError as exc:
        return f"after {time.monotonic() - started:.1f} s: {exc}"
    raise AssertionError("init returned without rank 1")


def abort() -> str:
    """Rank 0 aborts the world group while the others wait in an all_reduce; all then destroy."""
    _init(timeout=30)
    if tc.get_rank() == 0:
        time.sleep(0.5)
        tc.WORLD.abort("test abort")
    try:
        tc.all_reduce(np.ones(3, np.float32))
    except tc.GroupAbortedError as exc:
        tc.destroy()  # every rank says goodbye: MPI then finalizes normally
        return str(exc)
    raise AssertionError("all_reduce returned after the group was aborted")


def dies() -> None:
    """Rank 1 dies in the middle of the job; the launcher must end the job (no hang)."""
    _init(timeout=60)
    tc.all_reduce(np.ones(4, np.float32))
    if tc.get_rank() == 1:
        os._exit(3)
    while True:
        tc.all_reduce(np.ones(4, np.float32))


def reinit() -> list:
    """destroy() then init() again on the MPI backend, twice; a user tag send/recv in between."""
    sums = []
    for round_ in range(3):
        _init()
        rank, size = tc.get_rank(), tc.get_world_size()
        x = np.full(5, rank + round_, np.int64)
        tc.all_reduce(x)
        sums.append(int(x[0]))
        if size > 1:
            if rank == 0:
                tc.send(np.arange(3.0), 1, tag=11)
            elif rank == 1:
                got = np.zeros(3)
                tc.recv(got, 0, tag=11)
                assert (got == np.arange(3.0)).all()
        tc.destroy()
    return sums


SCENARIOS = {f.__name__: f for f in (bodies, mismatch, bulk_mismatch, bad_arguments, transports,
                                     stopped, late, abort, dies, reinit)}


def main() -> None:
    name, *args = sys.argv[1:]
    try:
        result = SCENARIOS[name](*args)
    except BaseException:  # noqa: BLE001 (any failure, SystemExit too, ends the rank with its traceback)
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    rank = _mpi_rank()[0]
    Path(os.environ["RESULTS_DIR"], f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
