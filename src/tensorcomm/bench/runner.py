"""Running the sweep: peer jobs in their own processes (``-n``), or this process's ranks.

With ``-n`` every library runs as its own job (tensorcomm and Gloo under ``tensorcomm run``, MPI
under ``mpiexec``, MindSpore as a dynamic cluster), all started at once and kept for the whole
sweep, each rank waiting on its control connection while another library runs, so it uses no
CPU. Per size, every library runs in turn, ``--rounds`` times with the order rotated: this
machine's memory bandwidth drifts by tens of percent from second to second, and only measurements
taken side by side can be compared. A library that fails is reported with the tail of its output
and left out from then on; the others go on.

Under an existing launcher (no ``-n``) tensorcomm runs in this process, one rank of that job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

from . import check, peers
from .control import TOKEN_ENV, JobChannel, JobFailed
from .formulas import element_count
from .options import BenchOptions
from .peers.base import Task, Unsupported
from .results import TENSORCOMM, Row, make_row
from .timing import Plan, measure

Run = Callable[[Task], dict[str, Any]]  # one task on one library -> its final control message
STOP_SECONDS = 10.0  # for a job to exit after "exit", before it is killed
LOG_TAIL_LINES = 15


class PeerJob:
    """One library's rank processes, started at construction, driven over a ``JobChannel``."""

    def __init__(self, name: str, ranks: int, env: Mapping[str, str], timeout: float) -> None:
        self.name, self.ranks, self.timeout = name, ranks, timeout
        self.version = ""
        self._stopped = False
        self._tail = ""
        self.channel = JobChannel()
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - the job's output; closed by stop()
        worker = [sys.executable, "-m", "tensorcomm.bench.worker", "--peer", name,
                  "--control", f"{peers.LOOPBACK}:{self.channel.port}"]
        commands = peers.load(name).commands(ranks, worker, {**env, TOKEN_ENV: self.channel.token})
        # Own sessions: the job is stopped by process group, and a Ctrl-C reaches the parent only.
        self._processes = [subprocess.Popen(c.argv, env=c.env, stdin=subprocess.DEVNULL,
                                            stdout=self._log, stderr=subprocess.STDOUT,
                                            start_new_session=True) for c in commands]

    def _alive(self) -> None:
        for process in self._processes:
            if process.poll() is not None:
                raise JobFailed(f"a process of the job exited with code {process.returncode}")

    def ready(self) -> str:
        """Wait for every rank's hello; return the library's version.

        Raises:
            JobFailed: the job did not come up within the timeout.
        """
        hellos = self.channel.accept(self.ranks, time.monotonic() + self.timeout, self._alive)
        self.version = str(hellos[0]["version"])
        return self.version

    def run(self, task: Task, plan: Plan) -> dict[str, Any]:
        """Run one task on every rank; return the final message (``done`` or ``unsupported``).

        Raises:
            JobFailed: with the tail of the job's output; the job is stopped.
        """
        try:
            return self.channel.run({"task": task.to_json(), "plan": asdict(plan)},
                                    time.monotonic() + self.timeout, self._alive)
        except JobFailed as exc:
            raise JobFailed(f"{exc}\n{self.stop()}".rstrip()) from None

    def stop(self) -> str:
        """Ask the ranks to exit, stop what is left of the job's process groups; idempotent.

        Returns:
            The last lines the job printed (launcher messages included), to show why it failed.
        """
        if self._stopped:
            return self._tail
        self._stopped = True
        try:
            self.channel.send_all({"exit": True})
        except OSError:
            pass  # a rank already gone; the process groups are stopped below
        self.channel.close()
        deadline = time.monotonic() + STOP_SECONDS
        for process in self._processes:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for process in self._processes:
                try:
                    os.killpg(process.pid, sig)  # also what a launcher left in its group
                except (ProcessLookupError, PermissionError):
                    pass
            if sig == signal.SIGTERM:
                time.sleep(0.2 if any(p.poll() is None for p in self._processes) else 0)
        for process in self._processes:
            process.wait()
        self._log.seek(0)
        lines = self._log.read().decode("utf-8", "replace").splitlines()
        self._log.close()
        self._tail = "\n".join(lines[-LOG_TAIL_LINES:])
        return self._tail


def tasks(options: BenchOptions, ranks: int) -> list[Task]:
    """Every (collective, size) of the sweep as a task; sizes that round alike are run once."""
    itemsize = check.DTYPES[options.dtype].itemsize
    out: list[Task] = []
    for collective in options.collectives:
        counts = dict.fromkeys(element_count(collective, size, itemsize, ranks)
                               for size in options.sizes)
        out += [Task(collective, count, options.dtype, options.op, options.shared)
                for count in counts]
    return out


def sweep(options: BenchOptions, ranks: int, runs: dict[str, Run],
          say: Callable[[str], None], advance: Callable[[str], None],
          emit: Callable[[list[Row]], None],
          beside: Callable[[Task], None] | None = None) -> list[Row]:
    """Run every task on every library, interleaved; ``emit`` each size's rows as they finish.

    ``beside``, when given, runs after the libraries in each round of each task that tensorcomm
    ran (the copy bound, timed next to the rows it bounds). A library whose run raises JobFailed is reported
    through ``say`` and dropped.
    """
    itemsize = check.DTYPES[options.dtype].itemsize
    live = dict(runs)
    failed: dict[str, str] = {}
    rows: list[Row] = []
    for task in tasks(options, ranks):
        label = f"{task.collective} {task.count * itemsize} B"
        done: dict[str, list[dict[str, Any]]] = {name: [] for name in runs}
        notes: dict[str, str] = {}
        for round_index in range(options.rounds):
            names = list(live)
            shift = round_index % max(1, len(names))
            for name in names[shift:] + names[:shift]:
                advance(f"{label} {name}")
                try:
                    reply = live[name](task)
                except JobFailed as exc:
                    say(f"{name}: failed at {label}: {exc}")
                    failed[name] = f"failed at {label}"
                    del live[name]
                    continue
                if "unsupported" in reply:
                    notes[name] = f"n/a: {reply['unsupported']}"
                else:
                    done[name].append(reply["done"])
            if beside is not None and TENSORCOMM in live and TENSORCOMM not in notes:
                beside(task)
        size_rows = [make_row(task, name, ranks, itemsize, done[name],
                              notes.get(name) or failed.get(name, "")) for name in runs]
        rows += size_rows
        emit(size_rows)
    return rows


def local_run(peer: Any, plan: Plan) -> Run:
    """A ``Run`` on the library of this process (in-process mode): no parent, no control."""
    def run(task: Task) -> dict[str, Any]:
        try:
            case = peer.case(task)
        except Unsupported as exc:
            return {"unsupported": str(exc)}
        done = asdict(measure(case, peer.barrier, peer, plan))
        return {"done": {**done, "algorithm": case.algorithm()}}
    return run


def start_jobs(names: list[str], ranks: int, env: Mapping[str, str], timeout: float,
               say: Callable[[str], None]) -> dict[str, PeerJob]:
    """Start every library's job at once, then wait for each; report and drop those that fail."""
    jobs = {name: PeerJob(name, ranks, env, timeout) for name in names}
    for name, job in list(jobs.items()):
        try:
            job.ready()
        except JobFailed as exc:
            say(f"{name}: could not start: {exc}\n{job.stop()}".rstrip())
            del jobs[name]
    return jobs
