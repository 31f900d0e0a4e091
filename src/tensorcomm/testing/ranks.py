"""Spawn real rank processes for a test body, with a hard timeout and every rank's output.

The parent hosts the rendezvous store; children start from a forkserver (fast, and safe even
though the parent runs threads), redirect their output to a file each, call ``tensorcomm.init``,
run the body and report its return value. A hang or a failure kills every rank and raises
``RanksFailed`` carrying what each rank printed.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..rendezvous.auth import generate_secret, secret_bytes
from ..rendezvous.tcp_store import TCPStoreServer

_OUTPUT_TAIL = 4000  # characters of each rank's output shown in a failure
# What the forkserver imports once, so that no rank imports it again: tensorcomm and its
# dependencies (ml_dtypes alone takes 0.6 s to import, which tensorcomm itself puts off), and the
# test runner where the parent has it (test modules, which children import to find the body).
_PRELOAD = ["numpy", "ml_dtypes", "tensorcomm"]
_PRELOAD_IF_LOADED = ["pytest", "hypothesis"]


@dataclass
class RankOutcome:
    """How one rank ended: its ``rank``, ``exitcode`` (None: killed at the timeout), ``output``
    (stdout and stderr) and ``result`` (the function's return value)."""

    rank: int
    exitcode: int | None
    output: str
    result: Any = None

    @property
    def ok(self) -> bool:
        """Whether the rank exited with code 0."""
        return self.exitcode == 0


class RanksFailed(AssertionError):
    """At least one rank failed or the job timed out; the message holds every rank's output,
    ``outcomes`` every rank's ``RankOutcome``."""

    def __init__(self, summary: str, outcomes: list[RankOutcome]) -> None:
        self.outcomes = outcomes
        parts = [summary]
        for o in outcomes:
            state = "killed at timeout" if o.exitcode is None else f"exit code {o.exitcode}"
            parts.append(f"----- rank {o.rank} ({state}) -----\n{o.output[-_OUTPUT_TAIL:]}")
        super().__init__("\n".join(parts))


def _child(fn: Callable[..., Any], args: tuple[Any, ...], rank: int, world_size: int, port: int, secret: str,
           workdir: str, env: Mapping[str, str], timeout: float, init: bool) -> None:
    out = os.open(os.path.join(workdir, f"rank{rank}.out"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.environ.update(env)
    os.environ.update({"TENSORCOMM_SECRET": secret, "TENSORCOMM_STORE_HOSTED": "1",
                       "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    import tensorcomm

    try:
        if init:
            tensorcomm.init(rank=rank, world_size=world_size, timeout=timeout)
        result = fn(*args)
        if init:
            tensorcomm.destroy()
    except BaseException:  # noqa: BLE001 - printed; the parent reads the exit code
        traceback.print_exc()
        os._exit(1)
    with open(os.path.join(workdir, f"rank{rank}.result"), "wb") as f:
        pickle.dump(result, f)
    os._exit(0)


def spawn_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 60.0,
                env: Mapping[str, str] | None = None, init: bool = True,
                comm_timeout: float | None = None) -> list[RankOutcome]:
    """Run ``fn(*args)`` on ``world_size`` fresh processes; return each rank's outcome.

    Args:
        fn: a module-level function (it is pickled by reference).
        timeout: hard limit for the whole job; ranks still alive then are killed.
        env: extra environment variables for the children only.
        init: call ``tensorcomm.init()`` before ``fn`` and ``destroy()`` after it.
        comm_timeout: the ranks' own ``init(timeout=...)`` (default: ``timeout``).
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD + [name for name in _PRELOAD_IF_LOADED if name in sys.modules])
    secret = generate_secret()
    server = TCPStoreServer("127.0.0.1", 0, secret_bytes(secret))
    with tempfile.TemporaryDirectory(prefix="tensorcomm-test-") as workdir:
        procs = [context.Process(target=_child, daemon=True, args=(
            fn, args, rank, world_size, server.port, secret, workdir, dict(env or {}),
            comm_timeout or timeout, init)) for rank in range(world_size)]
        killed: set[int] = set()
        try:
            for proc in procs:
                proc.start()
            _join(procs, time.monotonic() + timeout)
        finally:
            for rank, proc in enumerate(procs):
                if proc.is_alive():
                    killed.add(rank)
                    proc.kill()  # SIGKILL
                proc.join()
            server.close()
        return [_outcome(rank, proc, Path(workdir), rank in killed) for rank, proc in enumerate(procs)]


def _join(procs: Sequence[multiprocessing.process.BaseProcess], deadline: float) -> None:
    """Wait for every rank; once one fails, give the others a moment to fail too, then stop."""
    grace_end: float | None = None
    while time.monotonic() < deadline:
        if all(p.exitcode is not None for p in procs):
            return
        if grace_end is None and any(p.exitcode not in (None, 0) for p in procs):
            grace_end = time.monotonic() + 10.0
        if grace_end is not None and time.monotonic() > grace_end:
            return
        time.sleep(0.01)


def _outcome(rank: int, proc: multiprocessing.process.BaseProcess, workdir: Path,
             killed: bool) -> RankOutcome:
    output_file = workdir / f"rank{rank}.out"
    output = output_file.read_text(errors="replace") if output_file.exists() else ""
    exitcode = None if killed else proc.exitcode
    result_file = workdir / f"rank{rank}.result"
    result = pickle.loads(result_file.read_bytes()) if exitcode == 0 and result_file.exists() else None
    return RankOutcome(rank, exitcode, output, result)


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 60.0,
              env: Mapping[str, str] | None = None, init: bool = True) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` ranks; return their results in rank order.

    Raises:
        RanksFailed: a rank raised, crashed, or the job outlived ``timeout`` seconds.
    """
    outcomes = spawn_ranks(fn, world_size, *args, timeout=timeout, env=env, init=init)
    failed = [o.rank for o in outcomes if not o.ok]
    if failed:
        hung = [o.rank for o in outcomes if o.exitcode is None]
        summary = (f"ranks {hung} did not finish within {timeout:g} s" if hung
                   else f"ranks {failed} failed")
        raise RanksFailed(summary, outcomes)
    return [o.result for o in outcomes]


def free_port() -> int:
    """A TCP port free on loopback right now, for a program that must be told its port.

    Another process may take it before the program binds it; that is rare enough for tests and
    benchmarks not to retry.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
