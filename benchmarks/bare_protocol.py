"""Small calls of the five collectives beside their bare Python protocol and MPICH, in one run.

Usage: python benchmarks/bare_protocol.py [--bytes 8] [--calls 5000] [--batches 15]
       [--collectives all_reduce,all_gather,broadcast,all_to_all,reduce_scatter] [--ranks 2]
       [--no-mpi] [--busy N] [--json FILE]

For each collective, four ways to make the same call on the same arrays alternate batch by batch
in the same processes (so a machine whose speed swings affects them alike):

- ``bare``: the least Python that does it through shared memory: each rank writes what its
  peers need into its slot (two slots, alternating from call to call, so no closing barrier is
  needed), posts a counter, spins until every peer has posted the same round, then reads or sums
  the peers' slots with numpy (all_reduce: one sum over the ranks' slots; all_gather, all_to_all:
  a copy per block; broadcast: the root's slot; reduce_scatter: one sum of its block). No
  validation, no plan, no signature check, no timeout, no failure handling.
- ``ordinary``: tensorcomm's call through the public API (``all_reduce(x)``,
  ``all_gather_into_tensor``, ``broadcast``, ``all_to_all_single``, ``reduce_scatter_tensor``);
- ``persistent``: the same call made once with its ``*_init`` form, run as ``request()``;
- ``start/wait``: the same request run as MPI programs run one, ``start()`` then ``wait()``;
- ``MPICH``: mpi4py's buffer calls (``Allreduce`` in place, ``Allgather``, ``Bcast``,
  ``Alltoall``, ``Reduce_scatter_block``) and, beside them, ``MPICH persistent``
  (``Allreduce_init`` and kin, MPI 4) where the library has them.

The ranks are started by MPICH's ``mpiexec`` (as ``tensorcomm bench`` starts them) when mpi4py
is installed, and ``tc.init()`` meets through MPI, keeping tensorcomm's own shared memory;
``--no-mpi`` (or no mpi4py) starts them with ``tensorcomm.testing.run_ranks`` and drops the MPICH
columns. The flight recorder is on (its default). A batch's time is its slowest rank's; the
median over batches is printed with the ratio to the bare protocol, and the load. ``--busy N``
keeps N other processes spinning on the CPUs meanwhile (a data loader, another job on a shared
node): how each way's waits (spin, yield, sleep) fare when the ranks compete for the cores.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np

import tensorcomm as tc

COLLECTIVES = ("all_reduce", "all_gather", "broadcast", "all_to_all", "reduce_scatter")
WAYS = ("bare", "ordinary", "persistent", "start/wait", "MPICH", "MPICH persistent")
_SLOT = 4096  # bytes of one slot (a page): up to 4 KiB buffers
_WARM = 2000  # calls of each way before the batches


class _Bare:
    """One rank's bare protocol of each collective over a shared block: ``counters`` (one int64
    per rank), then every rank's two slots; ``rows[p]`` is every rank's slot ``p`` as one strided
    ``(ranks, elements)`` float32 view, ``rows[p][q]`` rank ``q``'s."""

    def __init__(self, buf: memoryview, me: int, n: int) -> None:
        self.counters = buf[:8 * n].cast("q")
        base = 64 * ((8 * n + 63) // 64)
        self.rows = [np.ndarray((n, _SLOT // 4), np.float32, buf, base + p * _SLOT, (2 * _SLOT, 4))
                     for p in (0, 1)]
        self.me, self.n = me, n
        self.peers = [q for q in range(n) if q != me]
        self.round = 0

    def calls(self, name: str, a: dict[str, np.ndarray]) -> Callable[[int], None]:
        """A function running ``k`` bare calls of ``name`` on the arrays ``a``."""
        counters, peers, me, n = self.counters, self.peers, self.me, self.n
        x, out, block = a["x"], a["out"], a["block"]
        c, b = x.size, block.size
        rows = [r[:, :c] for r in self.rows]
        mine = [r[me] for r in rows]
        lo, hi = me * b, (me + 1) * b
        add, copyto = np.add, np.copyto
        pair = [(r[0], r[1]) for r in rows] if n == 2 else None
        peer_blocks = [[(r[q, :b], out[q * b:(q + 1) * b]) for q in peers] for r in rows]  # all_gather
        for_me = [[(r[q, lo:hi], out[q * b:(q + 1) * b]) for q in peers] for r in rows]  # all_to_all
        others = [[r[q, lo:hi] for q in peers] for r in rows]  # reduce_scatter
        own_out = out[lo:hi]

        def post(r: int) -> None:
            counters[me] = r + 1
            for q in peers:
                while counters[q] <= r:
                    pass

        def all_reduce(r: int, p: int) -> None:
            mine[p][...] = x
            post(r)
            if pair is not None:
                add(pair[p][0], pair[p][1], x)
            else:
                add.reduce(rows[p], axis=0, out=x)

        def all_gather(r: int, p: int) -> None:
            mine[p][:b] = block
            post(r)
            own_out[...] = block
            for src, dst in peer_blocks[p]:
                copyto(dst, src)

        def broadcast(r: int, p: int) -> None:
            if me == 0:
                mine[p][...] = x
            post(r)
            if me != 0:
                x[...] = rows[p][0]

        def all_to_all(r: int, p: int) -> None:
            mine[p][...] = x
            post(r)
            own_out[...] = x[lo:hi]
            for src, dst in for_me[p]:
                copyto(dst, src)

        def reduce_scatter(r: int, p: int) -> None:
            mine[p][...] = x
            post(r)
            add(x[lo:hi], others[p][0], block)
            for more in others[p][1:]:
                add(block, more, block)

        one = {"all_reduce": all_reduce, "all_gather": all_gather, "broadcast": broadcast,
               "all_to_all": all_to_all, "reduce_scatter": reduce_scatter}[name]

        def run(k: int) -> None:
            first = self.round
            for r in range(first, first + k):
                one(r, r & 1)
            self.round = first + k

        return run


def _arrays(nbytes: int, n: int) -> dict[str, np.ndarray]:
    count = max(n, nbytes // 4) // n * n
    return {"x": np.zeros(count, np.float32), "out": np.zeros(count, np.float32),  # zeros: sums stay finite
            "block": np.zeros(count // n, np.float32)}


def _repeat(call: Callable[[], object]) -> Callable[[int], None]:
    def run(k: int) -> None:
        for _ in range(k):
            call()

    return run


def _ordinary(name: str, a: dict[str, np.ndarray]) -> Callable[[], object]:
    x, out, block = a["x"], a["out"], a["block"]
    return {"all_reduce": lambda: tc.all_reduce(x),
            "all_gather": lambda: tc.all_gather_into_tensor(out, block),
            "broadcast": lambda: tc.broadcast(x, src=0),
            "all_to_all": lambda: tc.all_to_all_single(out, x),
            "reduce_scatter": lambda: tc.reduce_scatter_tensor(block, x)}[name]


def _persistent(name: str, a: dict[str, np.ndarray]) -> tc.Prequest:
    x, out, block = a["x"], a["out"], a["block"]
    return {"all_reduce": lambda: tc.all_reduce_init(x),
            "all_gather": lambda: tc.all_gather_into_tensor_init(out, block),
            "broadcast": lambda: tc.broadcast_init(x, src=0),
            "all_to_all": lambda: tc.all_to_all_single_init(out, x),
            "reduce_scatter": lambda: tc.reduce_scatter_tensor_init(block, x)}[name]()


def _start_wait(request: tc.Prequest) -> Callable[[], object]:
    start, wait = request.start, request.wait

    def run() -> None:
        start()
        wait()

    return run


def _mpich(name: str, a: dict[str, np.ndarray]) -> dict[str, Callable[[], object]]:
    """mpi4py's call of ``name`` and, where MPI 4's persistent form exists, a request's run."""
    from mpi4py import MPI

    comm, x, out, block = MPI.COMM_WORLD, a["x"], a["out"], a["block"]
    calls: dict[str, Callable[[], object]] = {
        "MPICH": {"all_reduce": lambda: comm.Allreduce(MPI.IN_PLACE, x),
                  "all_gather": lambda: comm.Allgather(block, out),
                  "broadcast": lambda: comm.Bcast(x, root=0),
                  "all_to_all": lambda: comm.Alltoall(x, out),
                  "reduce_scatter": lambda: comm.Reduce_scatter_block(x, block)}[name]}
    try:
        request = {"all_reduce": lambda: comm.Allreduce_init(MPI.IN_PLACE, x),
                   "all_gather": lambda: comm.Allgather_init(block, out),
                   "broadcast": lambda: comm.Bcast_init(x, root=0),
                   "all_to_all": lambda: comm.Alltoall_init(x, out),
                   "reduce_scatter": lambda: comm.Reduce_scatter_block_init(x, block)}[name]()
    except (AttributeError, NotImplementedError, MPI.Exception):
        return calls
    start, wait = request.Start, request.Wait

    def run() -> None:
        start()
        wait()

    calls["MPICH persistent"] = run
    return calls


def _body(nbytes: int, calls: int, batches: int, names: list[str],
          mpi: bool) -> dict[str, dict[str, list[float]]]:
    """Every rank: per collective and way, the batches' µs per call (slowest rank's)."""
    me, n = tc.get_rank(), tc.get_world_size()
    size = 64 + 8 * n + 2 * n * _SLOT
    path = [f"/dev/shm/tensorcomm-bare-{os.getpid()}" if me == 0 else ""]
    if me == 0:
        with open(path[0], "wb") as file:
            file.truncate(size)
    tc.broadcast_object_list(path, src=0)
    with open(path[0], "r+b") as file:
        block = mmap.mmap(file.fileno(), size)  # lives as long as the views made of it
    tc.barrier()
    if me == 0:
        os.unlink(path[0])  # every rank has it mapped: nothing is left behind
    bare = _Bare(memoryview(block), me, n)
    found: dict[str, dict[str, list[float]]] = {}
    for name in names:
        a = _arrays(nbytes, n)
        request = _persistent(name, a) if hasattr(tc, "all_reduce_init") else None  # ab.py: older trees
        ways: dict[str, Callable[[int], None]] = {"bare": bare.calls(name, a)}
        mine = (("persistent", request), ("start/wait", _start_wait(request))) if request else ()
        for way, call in (("ordinary", _ordinary(name, a)), *mine,
                          *(_mpich(name, a).items() if mpi else ())):
            ways[way] = _repeat(call)
        for run in ways.values():
            tc.barrier()
            run(_WARM)
        times = {way: np.zeros(batches) for way in ways}
        for b in range(batches):
            for way, run in ways.items():
                tc.barrier()
                began = time.perf_counter()
                run(calls)
                times[way][b] = (time.perf_counter() - began) / calls * 1e6
        for t in times.values():
            tc.all_reduce(t, op=tc.ReduceOp.MAX)
        found[name] = {way: t.tolist() for way, t in times.items()}
        if request is not None:
            request.free()
    return found


def _under_mpi() -> bool:
    return "PMI_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ


def _report(args: argparse.Namespace, found: dict[str, dict[str, list[float]]]) -> None:
    load = os.getloadavg()
    print(f"{args.ranks} ranks, {args.bytes} B float32, shared memory, us per call (slowest rank, median of "
          f"{args.batches} interleaved batches of {args.calls}; flight recorder on; "
          f"{args.busy} busy processes beside them); "
          f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    ways = [w for w in WAYS if any(w in f for f in found.values())]
    print(f"{'collective':<16}" + "".join(f"{w:>18}" for w in ways) + f"{'persistent/bare':>17}"
          f"{'ordinary/bare':>15}")
    figures = {}
    for name, times in found.items():
        med = {w: statistics.median(times[w]) for w in ways if w in times}
        figures.update({f"{name} {w}": m for w, m in med.items()})
        ratios = [med[w] / med["bare"] if w in med else float("nan") for w in ("persistent", "ordinary")]
        print(f"{name:<16}" + "".join(f"{med[w]:>18.2f}" if w in med else f"{'-':>18}" for w in ways)
              + f"{ratios[0]:>17.2f}{ratios[1]:>15.2f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(figures, file)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bytes", type=int, default=8)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--calls", type=int, default=5000, help="calls per batch")
    parser.add_argument("--batches", type=int, default=15)
    parser.add_argument("--collectives", default=",".join(COLLECTIVES))
    parser.add_argument("--no-mpi", action="store_true", help="no MPICH columns; ranks by run_ranks")
    parser.add_argument("--busy", type=int, default=0, metavar="N", help="N processes spinning meanwhile")
    parser.add_argument("--json", metavar="FILE", help="also write the medians as JSON (benchmarks/ab.py)")
    args = parser.parse_args()
    names = args.collectives.split(",")
    if not args.ranks * 4 <= args.bytes <= _SLOT:
        parser.error(f"--bytes: expected {args.ranks * 4} .. {_SLOT}")
    if _under_mpi():  # a rank started by mpiexec (below)
        tc.init()
        found = _body(args.bytes, args.calls, args.batches, names, True)
        if tc.get_rank() == 0:
            _report(args, found)
        tc.destroy()
        return
    try:
        import mpi4py  # noqa: F401

        from tensorcomm.bench.peers.mpi4py_ import launcher
    except ImportError:
        args.no_mpi = True
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        if args.no_mpi:
            from tensorcomm.testing import run_ranks

            _report(args, run_ranks(_body, args.ranks, args.bytes, args.calls, args.batches, names, False,
                                    timeout=1800)[0])
            return
        env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
        command = launcher().argv(args.ranks, [sys.executable, *sys.argv])
        code = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, check=False).returncode
    finally:
        for process in busy:
            process.kill()
            process.wait()
    sys.exit(code)


if __name__ == "__main__":
    main()
