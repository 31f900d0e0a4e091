"""Start-up cost by world size on one host: tensorcomm's ``init()`` beside Gloo and MPICH.

For each world size, in one interleaved run, every library's ranks are started the same way (N
Python processes from this script, or ``mpiexec`` for MPICH) and each rank reports:

- ``import``: seconds to import the library (tensorcomm; torch.distributed; mpi4py without MPI);
- ``init``: seconds from just before joining until it can communicate: tensorcomm ``init()``
  then a barrier; Gloo ``init_process_group("gloo")`` then a barrier; MPICH ``MPI_Init`` then a
  barrier. It includes the wait for the slowest rank, as a user's start-up does;
- ``fds``: descriptors the rank holds once ready (``/proc/self/fd``): the median over the ranks,
  and the largest (rank 0, which serves the store for tensorcomm and Gloo here: a connection per
  rank).

A row gives the smallest, median and largest ``init`` over the ranks (the smallest is the last
rank to arrive: the library's own work once everyone is there; the largest adds the spread of
the ranks' start), the job's wall time (first process started to last rank ready) and the
descriptor counts. Each library's ranks run
alone (one library at a time), libraries alternate within each world size, and the load average
is printed before every row: on a shared machine compare libraries within one world size only.

With ``--kill``, tensorcomm's ranks then loop over small all_reduces until the last rank
SIGKILLs itself, and the row ``tc-killed`` gives, over the survivors, the median and largest
seconds from the death to the ``PeerLostError`` that names it (every survivor must name it).

With ``--hosts H`` (needs root and iproute2) each job's ranks are spread over H "hosts", network
namespaces joined by a bridge (``tests/multihost/multihost_harness.py``), size / H ranks each,
rank 0's host serving the store; only tensorcomm and Gloo run there (MPICH's launcher does not
cross the namespaces), and the ``fds`` columns then count a rank's links to other hosts too.

Usage::

    python benchmarks/init_scaling.py --sizes 2,4,8,16,32,64 [--libraries tensorcomm,gloo,mpich]
    sudo python benchmarks/init_scaling.py --sizes 16 --hosts 4,8 --libraries tensorcomm,gloo

MPICH needs mpi4py built against it (skipped, with a note, when it is not importable). Times
are never asserted; record a run with ``benchmarks/record.py``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

MARK = "init_scaling: "  # heads a rank's report line


def _worker(library: str, started: float, kill: bool) -> None:
    """One rank: import, join, barrier; print one JSON line (run as ``--worker LIB STARTED``)."""
    rank = int(os.environ.get("RANK", os.environ.get("PMI_RANK", "0")))
    size = int(os.environ.get("WORLD_SIZE", os.environ.get("PMI_SIZE", "1")))
    before_import = time.time()
    if library == "tensorcomm":
        import numpy as np

        import tensorcomm as tc

        imported = time.time()
        tc.init()
        joined = time.time()
        tc.barrier()
        ready = time.time()
        fds = len(os.listdir("/proc/self/fd"))
        x = np.full(4, 1.0)
        tc.all_reduce(x)
        assert x[0] == size, x
        named = _killed(tc, rank, size) if kill else {}
        if not kill:
            tc.destroy()
    elif library == "gloo":
        import torch
        import torch.distributed as dist

        imported = time.time()
        dist.init_process_group("gloo", rank=rank, world_size=size)
        joined = time.time()
        dist.barrier()
        ready = time.time()
        fds = len(os.listdir("/proc/self/fd"))
        t = torch.ones(4)
        dist.all_reduce(t)
        assert t[0] == size, t
        dist.destroy_process_group()
    else:
        import mpi4py

        mpi4py.rc.initialize = False
        from mpi4py import MPI

        imported = time.time()
        MPI.Init()
        joined = time.time()
        MPI.COMM_WORLD.Barrier()
        ready = time.time()
        fds = len(os.listdir("/proc/self/fd"))
        assert MPI.COMM_WORLD.allreduce(1) == size
        MPI.Finalize()
    print(MARK + json.dumps({"rank": rank, "import": imported - before_import, "init": ready - imported,
                      "join": joined - imported, "fds": fds, "ready_at": ready - started,
                      **(named if kill else {})}), flush=True)


def _killed(tc: Any, rank: int, size: int) -> dict:
    """The last rank SIGKILLs itself amid small all_reduces; the others say who died, and when."""
    import signal

    import numpy as np

    x = np.ones(256, np.float32)
    deadline = time.time() + 1.0
    if rank == size - 1:
        while time.time() < deadline:
            tc.all_reduce(x)
        print(MARK + json.dumps({"rank": rank, "died": time.time()}), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        while True:
            tc.all_reduce(x)
    except tc.PeerLostError as exc:
        return {"named": exc.rank, "noticed": time.time()}


def _spawn(library: str, size: int, port: int, kill: bool = False, user_secret: bool = False) -> list[dict]:
    """Run ``size`` ranks of ``library``; their reports (with ``kill``: the last rank's is its
    death, and it exits by SIGKILL)."""
    import secrets
    import subprocess
    import threading

    # As ``tensorcomm run`` hands one host's ranks a secret (a generated one is used as it is; one
    # a user sets costs each rank a scrypt stretch, about 0.1 s of a core: --user-secret).
    secret = secrets.token_hex(32) if user_secret else "generated:" + secrets.token_hex(32)
    started = time.time()
    argv = [sys.executable, os.path.abspath(__file__), "--worker", library, repr(started), str(int(kill))]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TENSORCOMM_", "OMPI_", "PMI_"))}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(size),
               TENSORCOMM_SECRET=secret, PYTHONUNBUFFERED="1")
    if library == "mpich":
        procs = [subprocess.Popen(["mpiexec", "-n", str(size), *argv], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)]
    else:
        procs = [subprocess.Popen(argv, env={**env, "RANK": str(r), "LOCAL_RANK": str(r),
                                             "LOCAL_WORLD_SIZE": str(size)},
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(size)]
    outs: list[str] = [""] * len(procs)

    def read(i: int) -> None:
        outs[i] = procs[i].communicate()[0]

    readers = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(len(procs))]
    for reader in readers:
        reader.start()
    deadline = time.time() + 1800
    failures: list[str] = []
    while any(reader.is_alive() for reader in readers) and time.time() < deadline and not failures:
        time.sleep(0.5)  # a rank that failed ends the job at once, rather than its peers' timeouts
        failures = [f"rank {i} exited with {proc.returncode}: {outs[i][-2000:]}"
                    for i, proc in enumerate(procs) if proc.returncode and not readers[i].is_alive()
                    and not (kill and i == len(procs) - 1 and library != "mpich")]
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for reader in readers:
        reader.join(10)
    reports = [json.JSONDecoder().raw_decode(line.split(MARK, 1)[1])[0]
               for out in outs for line in out.splitlines() if MARK in line]
    if failures or len(reports) != size:  # with ``kill``, the last rank reports its death only
        raise RuntimeError(f"{library} at {size} ranks: {len(reports)} reports; "
                           f"{failures[0] if failures else ''}")
    return reports


def _spawn_hosts(make: Any, hosts: int, library: str, size: int, port: int, kill: bool = False) -> list[dict]:
    """``_spawn`` with the ranks spread over ``hosts`` namespaces of a new cluster (``make``,
    from ``multihost_harness.clusters``), ``size // hosts`` on each in rank order."""
    import secrets

    cluster = make(hosts)
    per_host = size // hosts
    started = time.time()
    argv = [sys.executable, os.path.abspath(__file__), "--worker", library, repr(started), str(int(kill))]
    env = {"MASTER_ADDR": cluster.hosts[0].address, "MASTER_PORT": str(port), "WORLD_SIZE": str(size),
           "TENSORCOMM_SECRET": "generated:" + secrets.token_hex(32), "PYTHONUNBUFFERED": "1",
           "LOCAL_WORLD_SIZE": str(per_host)}
    procs = [cluster.spawn(host, argv, {**env, "RANK": str(host.index * per_host + local),
                                        "LOCAL_RANK": str(local), "GLOO_SOCKET_IFNAME": host.ifname},
                           label=f"rank {host.index * per_host + local}")
             for host in cluster.hosts for local in range(per_host)]
    deadline, failures = time.time() + 1800, []
    while any(p.popen.poll() is None for p in procs) and time.time() < deadline and not failures:
        time.sleep(0.5)  # a rank that failed ends the job at once, rather than its peers' timeouts
        failures = [f"rank {i} exited with {p.popen.returncode}: {p.output()[1][-2000:]}"
                    for i, p in enumerate(procs) if p.popen.returncode and not (kill and i == size - 1)]
    outs = [p.output()[0] for p in procs]
    cluster.close()  # kills what still runs
    reports = [json.JSONDecoder().raw_decode(line.split(MARK, 1)[1])[0]
               for out in outs for line in out.splitlines() if MARK in line]
    if failures or len(reports) != size:
        raise RuntimeError(f"{library} at {size} ranks on {hosts} hosts: {len(reports)} reports; "
                           f"{failures[0] if failures else ''}")
    return reports


def _row(library: str, size: int, reports: list[dict]) -> str:
    inits = sorted(r["init"] for r in reports)
    imports = sorted(r["import"] for r in reports)
    wall, fds = max(r["ready_at"] for r in reports), sorted(r["fds"] for r in reports)
    return (f"{library:<11}{size:>6}{imports[len(imports) // 2]:>10.2f}{inits[0]:>10.2f}"
            f"{inits[len(inits) // 2]:>10.2f}{inits[-1]:>10.2f}{wall:>10.2f}{fds[len(fds) // 2]:>6}"
            f"{fds[-1]:>9}")


def _kill_row(size: int, reports: list[dict]) -> str:
    died = next(r["died"] for r in reports if "died" in r)
    survivors = [r for r in reports if "init" in r and r["rank"] != size - 1]
    wrong = [r["rank"] for r in survivors if r.get("named") != size - 1]
    after = sorted(r["noticed"] - died for r in survivors)
    return (f"{'tc-killed':<11}{size:>6}  named by {len(survivors) - len(wrong)} of {len(survivors)} "
            f"survivors{f' (not by {wrong})' if wrong else ''}: median {after[len(after) // 2]:.2f} s, "
            f"largest {after[-1]:.2f} s after the death")


def main(argv: list[str]) -> int:
    import argparse
    import importlib.util
    import tempfile
    from pathlib import Path

    parser = argparse.ArgumentParser(description="init() time by world size on one host, beside "
                                     "Gloo and MPICH (see the module docstring)")
    parser.add_argument("--sizes", default="2,4,8,16,32,64", help="world sizes, comma-separated")
    parser.add_argument("--libraries", default="tensorcomm,gloo,mpich",
                        help="which of tensorcomm, gloo, mpich to run, in this order per size")
    parser.add_argument("--repeat", type=int, default=1, help="rounds per size (libraries alternate)")
    parser.add_argument("--user-secret", action="store_true",
                        help="tensorcomm: a secret as a user sets one (stretched with scrypt by every rank) "
                        "instead of a generated one, as tensorcomm run gives")
    parser.add_argument("--kill", action="store_true",
                        help="tensorcomm: then kill the last rank and time the survivors' naming it")
    parser.add_argument("--hosts", default="1", help="hosts (network namespaces) to spread each job "
                        "over, comma-separated; 1: this host alone (see the module docstring)")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    hosts = [int(h) for h in args.hosts.split(",")]
    libraries = [name for name in args.libraries.split(",") if name]
    if "mpich" in libraries and importlib.util.find_spec("mpi4py") is None:
        print("# mpich: skipped, mpi4py is not installed")
        libraries.remove("mpich")
    if max(hosts) > 1:
        if "mpich" in libraries:
            print("# mpich: skipped on namespace hosts")
            libraries.remove("mpich")
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                        "multihost"))
        from multihost_harness import clusters, unsupported_reason

        if unsupported_reason() is not None:
            print(f"cannot build network namespaces here: {unsupported_reason()}", file=sys.stderr)
            return 2
        with tempfile.TemporaryDirectory(prefix="init-scaling-") as tmp, clusters(Path(tmp)) as make:
            return _sweep(args, sizes, hosts, libraries, make)
    return _sweep(args, sizes, hosts, libraries, None)


def _sweep(args: Any, sizes: list[int], hosts: list[int], libraries: list[str], make: Any) -> int:
    """Print the table: every size on every host count, libraries alternating."""
    import socket

    print(f"# cores: {os.cpu_count()}; times in seconds: import and init are medians over the ranks, "
          "init min/max the fastest/slowest rank's, wall from the first start to the last rank ready")
    print(f"{'library':<11}{'ranks':>6}{'import':>10}{'init min':>10}{'init':>10}{'init max':>10}"
          f"{'wall':>10}{'fds':>6}{'fds max':>9}")
    for size, spread in ((size, spread) for size in sizes for spread in hosts if not size % spread):
        if spread > 1:
            print(f"# {spread} hosts x {size // spread} ranks", flush=True)
        for _ in range(args.repeat):
            for library in libraries:
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", 0))
                    port = probe.getsockname()[1]
                load = os.getloadavg()[0]
                kill = args.kill and library == "tensorcomm"
                try:
                    reports = _spawn_hosts(make, spread, library, size, port, kill) if spread > 1 else \
                        _spawn(library, size, port, kill, args.user_secret)
                    line = _row(library, size, [r for r in reports if "init" in r])
                    if kill:
                        line += f"    # load {load:.1f}\n" + _kill_row(size, reports)
                except (RuntimeError, OSError) as exc:
                    line = f"{library:<11}{size:>6}  failed: {exc}"
                print(f"{line}    # load {load:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(sys.argv[2], float(sys.argv[3]), sys.argv[4] == "1")
    else:
        sys.exit(main(sys.argv[1:]))
