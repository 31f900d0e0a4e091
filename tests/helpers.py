"""What the test modules share, so that no test module imports another.

Imported by bare name (``from helpers import ...``): pytest puts ``tests/`` on ``sys.path`` for the
conftest there. Every runner here runs ranks as threads of the test process; the runner that
spawns rank processes is the public ``tensorcomm.testing.run_ranks``.

- The collectives every shared table must cover: ``COLLECTIVES`` (``signature.COLLECTIVES`` less
  "none" and "split"); ``BODY_OF`` (the spawned-rank body of each).
- A call's context without a group: ``one_off_ctx``, and ``run_algorithm`` to run a row's algorithm
  in it as the core would.
- Reductions: ``reduction_cases`` (every op x dtype that reduces, x count), ``assert_reduced``
  (exact, or within rounding for AVG and PREMUL_SUM); prefix reductions' expected results:
  ``expected_prefixes``, ``assert_prefix``.
- Thread ranks: ``run_each_rank`` (``fn(rank)``), ``run_calls_on_threads`` (``body(next_ctx)``
  over a loopback transport that records every message and checks no two of a call share a
  tag); both on ``tensorcomm.testing.run_threads`` (``fn(transport)``).
- Shared memory on threads: ``open_domains``, ``ctx_for``, ``close_all``, ``ShmGroup`` (tiny slots,
  one call at a time), ``fast_thread_switches``.
- A world of one in the test process (``world_of_one``), a TCP mesh rank on a thread
  (``mesh_thread``), the secret they use (``SECRET``).
- Another local user: ``NOBODY``, ``stranger`` (run a command as that user), ``victim`` (a file a
  planted link points at).
"""

from __future__ import annotations

import contextlib
import itertools
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from tensorcomm.algorithms import kernels, select
from tensorcomm.algorithms.base import Ctx, Plan, Team
from tensorcomm.rendezvous.store import HashStore
from tensorcomm.signature import COLLECTIVES as SIGNED
from tensorcomm.signature import NO_SIGNATURE, Signature, signature
from tensorcomm.testing import run_threads
from tensorcomm.transports.base import Transport
from tensorcomm.transports.loopback import LoopbackTransport
from tensorcomm.types import PremulSum, ReduceOp

SECRET = b"unit-test-secret"  # the job secret of every thread-rank set-up here

# Every collective a signature names that runs an algorithm ("none" is no call; "split" makes a
# group): the shared test tables are checked against it, so that a collective added to
# ``signature.COLLECTIVES`` and left out of one fails that table's test by name.
COLLECTIVES = tuple(name for name in SIGNED if name not in ("none", "split"))
# The body of tests/multiprocess/test_collectives.py that runs each collective on spawned ranks;
# tests/mpi/test_mpi_backend.py runs the same bodies over MPI.
BODY_OF = {"all_reduce": "body_all_reduce", "reduce": "body_reduce", "broadcast": "body_broadcast",
           "all_gather": "body_all_gather", "gather": "body_gather_scatter", "scatter": "body_gather_scatter",
           "reduce_scatter": "body_reduce_scatter", "all_to_all": "body_all_to_all",
           "barrier": "body_barrier_and_p2p", "scan": "body_scan", "exscan": "body_scan"}

# -- a call's context without a group ---------------------------------------------------------


def _no_algorithm(ctx: Ctx, *args: Any) -> None:
    raise RuntimeError(f"{ctx.name}: a test's one-off Ctx has no algorithm to run")


def one_off_ctx(transport: Any, ranks: Sequence[int], rank: int, group_id: int, seq: int,
                timeout: float, name: str = "collective", signature: Signature = NO_SIGNATURE,
                group_name: str = "", shm: Any = None, keep_going: bool = False) -> Ctx:
    """The context of call ``seq`` on a team of its own; its deadline starts now. (The core makes
    its contexts with ``Ctx.of`` from a group's ``Team`` and the call's ``Plan``.)"""
    team = Team(transport, ranks, rank, group_id, timeout, group_name=group_name, shm=shm,
                keep_going=keep_going)
    return Ctx.of(team, seq, Plan(name, signature, "", _no_algorithm))


REDUCTIONS = ("all_reduce", "reduce", "reduce_scatter", "scan", "exscan")  # their last argument is the op


def run_algorithm(ctx: Ctx, fn: Any, *args: Any) -> Any:
    """Run algorithm ``fn`` (a row's of ``select.ROWS``) on ``args`` in a one-off ``ctx``, its
    plan completed first as ``make_plan`` completes it: the reduction descriptor, the state
    (``Row.prepare``)."""
    row = next(row for row in select.ROWS if row.fn is fn)
    if row.collective in REDUCTIONS:
        ctx.plan.reduction = kernels.reduction(args[-1], args[0].dtype)
    if row.prepare is not None:
        ctx.plan.state = row.prepare(ctx.team, ctx.plan, *args)
    return fn(ctx, *args)


def row_fn(collective: str, name: str) -> Any:
    """The algorithm of row ``name`` of ``collective`` in ``select.ROWS``."""
    return next(row.fn for row in select.ROWS if row.collective == collective and row.name == name)


# -- prefix reductions ------------------------------------------------------------------------

PREFIX_DTYPES = [np.dtype(d) for d in (np.bool_, np.int32, np.uint8, np.float16, ml_dtypes.bfloat16,
                                       np.float32, np.float64, np.complex64)]
CUMULATIVE = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply, ReduceOp.MIN: np.minimum,
              ReduceOp.MAX: np.maximum, ReduceOp.BAND: np.bitwise_and, ReduceOp.BOR: np.bitwise_or,
              ReduceOp.BXOR: np.bitwise_xor}


def reduction_cases(ops: Sequence[Any], dtypes: Sequence[Any],
                    counts: Sequence[int]) -> Iterator[tuple[Any, Any, int]]:
    """``(op, dtype, count)`` for every op and dtype that reduce together, and every count."""
    from tensorcomm.testing import reduces

    for op, dtype in itertools.product(ops, dtypes):
        if reduces(op, dtype):
            yield from ((op, dtype, count) for count in counts)


def assert_reduced(got: np.ndarray, expected: np.ndarray, op: Any, what: str) -> None:
    """``got`` is the reduction ``expected``: bit for bit, or within rounding where the op divides
    or multiplies (AVG, PREMUL_SUM; half precision rounds to 1e-2)."""
    if op is ReduceOp.AVG or isinstance(op, PremulSum):
        tolerance = 1e-2 if got.dtype in (np.float16, ml_dtypes.bfloat16) else 1e-6
        np.testing.assert_allclose(got.astype(np.complex128), expected.astype(np.complex128),
                                   rtol=tolerance, err_msg=what)
    else:
        np.testing.assert_array_equal(got, expected, err_msg=what)


def expected_prefixes(op: Any, inputs: list[np.ndarray], inclusive: bool) -> list[np.ndarray | None]:
    """What each rank of a scan (``inclusive``) or exscan should hold: numpy's cumulative op over
    the ranks, computed in the accumulation dtype as tensorcomm's kernels do, rounded once; None
    for exscan's rank 0 (its array is left as it was)."""
    dtype = inputs[0].dtype
    acc = kernels.accumulation_dtype(op, dtype)
    stack = np.stack([a.astype(acc) for a in inputs])
    if isinstance(op, PremulSum):
        stack = stack * np.asarray(op.factor, acc)
    if op is ReduceOp.AVG and not kernels.floating(dtype):
        from tensorcomm.testing.reference import reduce_reference

        running = np.stack([reduce_reference(op, inputs[:r + 1]) for r in range(len(inputs))])
    elif op is ReduceOp.AVG or isinstance(op, PremulSum):
        running = np.cumsum(stack, axis=0, dtype=acc)
        if op is ReduceOp.AVG:
            running = running / np.arange(1, len(inputs) + 1, dtype=acc.type(0).real.dtype)[:, None]
    else:
        running = CUMULATIVE[op].accumulate(stack, axis=0, dtype=acc)
    prefixes: list[np.ndarray | None] = [row.astype(dtype) for row in running]
    return prefixes if inclusive else [None, *prefixes[:-1]]


def assert_prefix(got: np.ndarray, expected: np.ndarray | None, first: np.ndarray, op: Any,
                  what: str) -> None:
    """``got`` is ``expected`` (exactly for integers, bool, MIN and MAX); with no expectation
    (exscan's rank 0), it is ``first``, the array as it was."""
    if expected is None:
        np.testing.assert_array_equal(got, first, err_msg=what + " (left as it was)")
    elif got.dtype.kind in "biu" or op in (ReduceOp.MIN, ReduceOp.MAX):
        np.testing.assert_array_equal(got, expected, err_msg=what)
    else:
        tolerance = 1e-2 if got.dtype in (np.float16, ml_dtypes.bfloat16) else 1e-5
        np.testing.assert_allclose(got.astype(np.complex128), expected.astype(np.complex128),
                                   rtol=tolerance, err_msg=what)


# -- thread ranks ------------------------------------------------------------------------------


def run_each_rank(size: int, fn: Callable[[int], Any], timeout: float = 60.0) -> list[Any]:
    """Run ``fn(rank)`` on ``size`` thread-ranks (``run_threads``, its transports unused); the
    results in rank order, or the first error once every thread stopped."""
    return run_threads(size, lambda transport: fn(transport.rank), timeout)


class RecordingTransport(Transport):
    """Passes everything to a loopback transport and records (src, dst, tag) of each send."""

    def __init__(self, inner: LoopbackTransport, log: list[tuple[int, int, int]]) -> None:
        self.inner, self.log = inner, log
        self.rank, self.size = inner.rank, inner.size

    def isend(self, peer: int, data: memoryview, tag: int, signature: Signature | None = None) -> Any:
        self.log.append((self.rank, peer, tag))
        return self.inner.isend(peer, data, tag, signature)

    def irecv(self, peer: int, out: memoryview, tag: int, signature: Signature | None = None) -> Any:
        return self.inner.irecv(peer, out, tag, signature)

    def abort_group(self, group_id: int, error: BaseException, tell_peers: bool = True) -> None:
        self.inner.abort_group(group_id, error, tell_peers)

    def abort(self, error: BaseException) -> None:
        self.inner.abort(error)

    def close(self) -> None:
        self.inner.close()


def run_calls_on_threads(size: int, body: Callable[[Callable[[], Ctx]], Any]) -> list[Any]:
    """Run ``body(next_ctx)`` on ``size`` thread-ranks over the loopback transport;
    ``next_ctx()`` makes the Ctx of the rank's next call. Every message is recorded, and no two
    may share (source, destination, tag)."""
    log: list[tuple[int, int, int]] = []

    def rank_main(transport: LoopbackTransport) -> Any:
        recording = RecordingTransport(transport, log)
        seqs = itertools.count()
        return body(lambda: one_off_ctx(recording, range(size), transport.rank, group_id=1,
                                        seq=next(seqs), timeout=15.0))

    results = run_threads(size, rank_main, timeout=60)
    repeated = [key for key, times in Counter(log).items() if times > 1]
    assert not repeated, f"messages sharing (src, dst, tag): {repeated[:5]}"
    return results


# -- shared memory on threads ------------------------------------------------------------------


@contextlib.contextmanager
def fast_thread_switches() -> Iterator[None]:
    """Ranks are threads: let a yielding waiter hand the GIL over quickly."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


def describe(codes: Sequence[int]) -> str:
    """A signature's codes as text, as the core describes them to a domain."""
    return Signature(*codes).describe()


def open_domains(size: int, slot_bytes: int | None = None, out_bytes: int | None = None,
                 secret: bytes = SECRET, store: HashStore | None = None,
                 prefix: str = "shm/") -> list[Any]:
    """Set up one group's ``ShmDomain`` for ``size`` thread-ranks (default slot and OUT sizes
    unless given); domain ``r`` belongs to rank ``r``."""
    from tensorcomm.transports.shm import domain

    store = store or HashStore(timeout=30)
    sizes = {"slot_bytes": slot_bytes or domain.SLOT_BYTES, "out_bytes": out_bytes or domain.OUT_BYTES}

    def setup(rank: int) -> Any:
        return domain.open_domain(
            rank, list(range(size)), "test", secret,
            publish=lambda address: store.set(prefix + "address", address.encode()),
            lookup=lambda s: (store.get(prefix + "address").decode() if store.check([prefix + "address"])
                              else None),
            failed=lambda: None, timeout=20, describe=describe,
            **sizes)

    return run_each_rank(size, setup)


BARRIER = signature("barrier")  # a call that moves no data: the default of ctx_for and ShmGroup.call


def ctx_for(domain: Any, seq: int, sig: Signature = BARRIER, timeout: float = 20.0) -> Ctx:
    """The context of call ``seq`` on ``domain``'s rank."""
    return one_off_ctx(None, range(domain.size), domain.rank, group_id=0, seq=seq, timeout=timeout,
                       name="test call", signature=sig, group_name="test", shm=domain)


def close_all(domains: Sequence[Any]) -> None:
    for d in domains:
        d.close()


TINY_SLOT = 256  # bytes: 64 float32 per slot, so small arrays take the multi-round paths
TINY_OUT = 512


class ShmGroup:
    """``size`` thread-ranks sharing one domain of tiny slots; ``call`` runs one collective on all.

    As in the core, a call's signature must describe it (algorithms key caches on it).
    ``keep_going``: failed calls must leave in-place arrays untouched or complete (``Team``).
    """

    def __init__(self, size: int, slot: int = TINY_SLOT, out: int = TINY_OUT,
                 keep_going: bool = False) -> None:
        self.size = size
        self.keep_going = keep_going
        self.domains = open_domains(size, slot, out)
        self.seq = 0

    def call(self, fn: Callable[[Ctx], Any], sig: Signature = BARRIER) -> list[Any]:
        seq = self.seq
        self.seq += 1

        def body(rank: int) -> Any:
            d = self.domains[rank]
            ctx = one_off_ctx(None, range(self.size), rank, group_id=0, seq=seq, timeout=30, name="test",
                              signature=sig, group_name="test", shm=d, keep_going=self.keep_going)
            try:
                return fn(ctx)
            except BaseException as exc:
                d.fail(exc, ctx)  # as Group._run does
                raise

        return run_each_rank(self.size, body)

    def close(self) -> None:
        close_all(self.domains)


# -- a world, a mesh ---------------------------------------------------------------------------


@contextlib.contextmanager
def world_of_one() -> Iterator[Any]:
    """A world of one in this process, met on an in-memory store; destroyed on exit. Yields
    ``tensorcomm``."""
    import tensorcomm as tc

    tc.init(store=HashStore(), rank=0, world_size=1, timeout=30)
    try:
        yield tc
    finally:
        tc.destroy()


def close_at_once(transports: Sequence[Transport], linger: float = 10.0) -> None:
    """Close ``transports`` (the ends of one mesh) at the same time, as their ranks would: each
    waits for the others' goodbyes, which come at once, instead of out its ``linger``."""
    threads = [threading.Thread(target=transport.close, args=(linger,)) for transport in transports]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(linger + 5)


def mesh_thread(rank: int, size: int, store: HashStore, results: dict[int, Any], secret: bytes = SECRET,
                timeout: float = 10.0, **options: Any) -> threading.Thread:
    """Start a thread that connects ``rank``'s TCP mesh (``connect_mesh`` on loopback, through
    ``store``); ``results[rank]`` becomes its links, or the exception it raised."""
    from tensorcomm.transports.tcp.mesh import connect_mesh

    def main() -> None:
        try:
            results[rank] = connect_mesh(rank, size, store, secret, "127.0.0.1", timeout, **options)
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            results[rank] = exc

    thread = threading.Thread(target=main, name=f"mesh-rank-{rank}")
    thread.start()
    return thread


# -- another local user ------------------------------------------------------------------------

NOBODY = 65534  # the uid strangers run as (tests that need another user run as root)
PRECIOUS = "precious\n"


def stranger(*argv: str, stdin: str | None = None) -> None:
    """Run ``argv`` as ``nobody``, with no groups."""
    subprocess.run(list(argv), input=stdin, text=True, user=NOBODY, group=NOBODY, extra_groups=[],
                   check=True, timeout=30, capture_output=True)


def victim(where: Path) -> Path:
    """A file of this user's that a planted link points at."""
    path = where / "victim"
    path.write_text(PRECIOUS)
    return path
