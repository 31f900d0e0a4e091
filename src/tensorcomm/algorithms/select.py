"""Which algorithm runs a collective: an ordered table of candidates, each with a predicate.

``pick`` walks ``ROWS`` top to bottom and returns the first row of the collective whose
predicate holds for the group (its ``Team``) and the call's size; the last row of every
collective always holds. Before that, a tuning file measured on this host (``tuning``, written by
``tensorcomm tune``) may name the row, which is taken where it fits the call (``fits``). The
core picks once per call shape and keeps the row in the shape's ``Plan``. An override names a
row explicitly. This module must not import ``core``.
docs/algorithms.md and docs/transports.md explain the costs behind each choice.

Every algorithm of a collective takes the same arguments, after the call's ``Ctx``: the caller's
flat (1-D, C-contiguous) arrays, element counts per member, and the caller's op for reductions::

    all_reduce      x, op                       x: reduced in place on every member
    reduce          x, root, op                 x: the result on group rank root only
    broadcast       x, root                     x: root's copied to every member
    all_gather      send, out, counts           out: member q's send at block q
    gather          send, out, counts, root     out: None except on root
    scatter         send, out, counts, root     send: None except on root; out: block rank
    reduce_scatter  send, out, counts, op       out: block rank reduced across members
    all_to_all      send, send_counts, out, recv_counts
    barrier         (nothing)
    scan, exscan    x, op                       x: the prefix up to (scan) or before (exscan) rank

Blocks are laid out back to back in the order of group ranks (``counts[q]`` elements for member
q). The shared-memory algorithms (``shm_*.py``) work on these arrays directly; the transport
algorithms run on scratch copies through ``staging``.
"""

from __future__ import annotations

import functools
import os

from . import (
    allgather,
    allreduce,
    alltoall,
    barrier,
    broadcast,
    gather_scatter,
    hier,
    learning,
    reduce,
    reduce_scatter,
    scan,
    shm_allgather,
    shm_allreduce,
    shm_alltoall,
    shm_barrier,
    shm_broadcast,
    shm_cma,
    shm_reduce_scatter,
    staging,
    tuning,
)
from .base import Predicate, Row, Team

# Up to this many bytes a message costs about one latency, so algorithms with fewer rounds win;
# above it, moving fewer bytes per rank wins. A first guess for one host: the benchmark suite
# (busbw per size, per algorithm through ``override``) is where to tune it.
SMALL_MESSAGE_BYTES = 64 * 1024


def _always(team: Team, nbytes: int) -> bool:
    return True


def _small(team: Team, nbytes: int) -> bool:
    return nbytes <= SMALL_MESSAGE_BYTES


def _small_or_pair(team: Team, nbytes: int) -> bool:
    # With two ranks, recursive doubling moves the same bytes as ring in one round instead of two.
    return nbytes <= SMALL_MESSAGE_BYTES or len(team.ranks) <= 2


# All-reduce over the transport, on groups whose pairs of members are alike (one host, or one
# member per host): recursive doubling up to this size, halving-doubling above it. Measured on 2
# cores, TCP loopback, interleaved in the same ranks (python benchmarks/allreduce_ab.py; ms per
# call in benchmarks/results/allreduce_tcp_algorithms.txt), doubling / halving-doubling / ring:
# 8 ranks, 256 KiB 5.0 / 6.8 / 10.7, 512 KiB 7.5 / 7.9 / 12.3, 1 MiB 15.9 / 12.1 / 16.2,
# 16 MiB 229 / 121 / 124; 4 ranks, 512 KiB 1.9 / 3.4 / 4.4, 1 MiB 5.3 / 4.2 / 6.3.
ALLREDUCE_DOUBLING_BYTES = 512 << 10


def _alike(team: Team) -> bool:
    """Every pair of members is as far apart as any other: one host, or one member per host.
    Where several members share each of several hosts, ring keeps the traffic between hosts on
    each host's boundary links, which halving and doubling would cross with every member."""
    return len(set(team.host_of)) in (0, 1, len(team.ranks))


def _pair(team: Team, nbytes: int) -> bool:
    """Two members and no wire compression: one exchange of whole arrays, each combined straight
    into the caller's array (``allreduce.pair_in_place``); recursive doubling's only round, less its
    working copy."""
    return len(team.ranks) == 2 and team.transport.wire_dtype is None


def _doubling(team: Team, nbytes: int) -> bool:
    return _small_or_pair(team, nbytes) or (nbytes <= ALLREDUCE_DOUBLING_BYTES and _alike(team))


def _halving_doubling(team: Team, nbytes: int) -> bool:
    return len(team.ranks) > 2 and _alike(team)


def _large_and_three_or_more(team: Team, nbytes: int) -> bool:
    return nbytes > SMALL_MESSAGE_BYTES and len(team.ranks) > 2


def _shm(team: Team, nbytes: int) -> bool:
    return team.shm is not None


def _hierarchical(team: Team, nbytes: int) -> bool:
    return team.hier is not None


# Up to this many bytes every member reduces the whole message from the slots in one round
# (``shm_direct``); above it, up to one slot, each member reduces its own part (``shm_split``),
# which moves about as many bytes but does 1/n of the arithmetic, for one more wait. Larger
# messages go through the slots chunk by chunk (``shm_pipelined``). Measured on 2 cores
# (benchmarks/allreduce_ab.py --transport auto, interleaved): with two ranks the two are within noise from
# 64 KiB to 512 KiB and split wins clearly at 1 MiB; with three or more split wins above 128 KiB.
SHM_DIRECT_BYTES = {2: 256 << 10}
SHM_DIRECT_BYTES_MANY = 128 << 10  # three or more members
# Three or more members with a core each (``_own_cores``) wait for each other cheaply, and every
# member reading every peer's whole message costs more than split's extra wait from about 8 KiB:
# measured on a 16-core host (benchmarks/results/tune_shm_4_8_16_ranks_16cores.txt), shm_direct /
# shm_split us per call: 4 members 13 / 15 at 4 KiB, 22 / 18 at 16 KiB; 8 members 27 / 30 at
# 16 KiB, 108 / 42 at 64 KiB; 16 members 23 / 30 at 4 KiB, 61 / 34 at 16 KiB. Where members
# outnumber the cores (4 ranks on 2), each wait costs a time slice and 128 KiB holds.
SHM_DIRECT_BYTES_OWN_CORES = 8 << 10
HOST_CORES = os.cpu_count() or 1


def _own_cores(members: int) -> bool:
    """Three or more members, no more than this host's cores: each can have a core of its own."""
    return 2 < members <= HOST_CORES


def _shm_direct(team: Team, nbytes: int) -> bool:
    shm = team.shm
    if shm is None or nbytes > shm.slot_bytes:
        return False
    members = shm.size
    if _own_cores(members):
        return nbytes <= SHM_DIRECT_BYTES_OWN_CORES
    return nbytes <= SHM_DIRECT_BYTES.get(members, SHM_DIRECT_BYTES_MANY)


def _shm_one_slot(team: Team, nbytes: int) -> bool:
    shm = team.shm
    return shm is not None and nbytes <= shm.slot_bytes


# From these sizes up (``nbytes`` as ``pick`` counts them) members read each other's arrays where
# they lie (``shm_cma``: cross-memory attach, or in place in shared arrays) instead of passing
# them through the slots, where the kernel lets them (``ShmDomain.cma``). Below, two copies
# through the caches beat one kernel copy: process_vm_readv moves 10-15 GB/s from arrays in 4 KiB
# pages here, 35-55 GB/s from arrays numpy backs with 2 MiB pages (from 4 MiB up), a copy in the
# caches 40-60 GB/s (the slots copy in pieces that stay in them: ``shm_common.copy``); above, the
# slots' two copies cost more memory traffic than one direct read, and a broadcast's root and
# receivers copy at once instead of in turn. Measured on 2 cores, 2 members, the rows alternating
# batch by batch in the same ranks, slots / direct reads, us per call (load 1-2.5): broadcast
# 4 MiB 123 / 148, 8 MiB 279 / 188; all_gather 4 MiB 161 / 185, 8 MiB 336 / 304, 32 MiB 4235 /
# 3248; all_to_all 2 MiB 91 / 103, 4 MiB 176 / 155; reduce_scatter 16 MiB 861 / 1014, 32 MiB
# 2857 / 3163, 64 MiB 4177 / 3175; all_reduce 32 MiB 4144 / 5305, 48 MiB 6931 / 7443, 64 MiB
# 8657 / 6016. all_to_all, measured again with the sides in both orders (7 rounds each, load
# 0.5-1.2): 4 MiB 146 / 191, 8 MiB 373 / 417, 16 MiB 1148 / 1139 and 1162 / 1117; 4 members on
# the 2 cores (5 rounds each): 4 MiB 802 / 1012 and 774 / 1271, 8 MiB 1927 / 2152 and 1657 /
# 2193, 16 MiB 3907 / 3818 (both direct reads at 16 MiB). Where the
# crossover lies moves with where the arrays land (huge pages or not); ``tensorcomm tune``
# measures it on a host.
CMA_BYTES = {"all_reduce": 64 << 20, "reduce_scatter": 64 << 20, "all_gather": 8 << 20,
             "broadcast": 8 << 20, "all_to_all": 16 << 20}
# A group with shared arrays (``tensorcomm.empty``) reads from these sizes up: a shared array is
# copied once, through the caches, straight from its owner's block, which beats the slots' two
# copies from 1 MiB (2 members, us per call through the slots / directly, on shared arrays,
# alternating, load 1.5: all_gather 67 / 61, all_to_all 75 / 68, broadcast 49 / 42,
# reduce_scatter 66 / 63, all_reduce 97 / 70 at 1 MiB; at 256 KiB the slots' single wait wins:
# all_to_all 29 / 33, all_reduce 31 / 36).
SHARED_BYTES = dict.fromkeys(CMA_BYTES, 1 << 20)
# Three or more members with a core each (same 16-core host and file, slots / direct reads, us
# per call): reduce_scatter's direct reads win from 4 MiB (4 MiB: 2025 / 1084 at 4 members,
# 1998 / 1102 at 8, 2277 / 1880 at 16); many readers of one array slow each other, so all_gather
# keeps the slots to 16 MiB (2513 / 2447, 3665 / 4903, 5536 / 8491) and broadcast to 8 MiB
# (4 MiB: 692 / 599, 931 / 1321, 1101 / 3477; 16 MiB: 4016 / 1221, 6010 / 4634, 7641 / 7077);
# all_to_all reads directly from 4 MiB (4 MiB at 4 members: 1337 / 664).
CMA_BYTES_OWN_CORES = {**CMA_BYTES, "reduce_scatter": 4 << 20, "all_gather": 32 << 20,
                       "broadcast": 16 << 20, "all_to_all": 4 << 20}


def _can_read(team: Team, nbytes: int) -> bool:
    shm = team.shm
    return shm is not None and shm.cma


def _can_read_in_place(team: Team, nbytes: int) -> bool:
    """All-reduce's direct reads write the array as the parts come: not where a failed call must
    leave it untouched (``Team.keep_going``), which the slots' pipeline keeps for less than a
    copy of the result (measured: each rank's work per 16 MiB call 2.0-2.5 ms through the slots,
    3.7-4.0 ms reading directly into scratch and copying it into the array at the end)."""
    return _can_read(team, nbytes) and not team.keep_going


# What a ``shm_cma`` row needs of a call to run at all (``fits``); its predicate adds the size.
_FITS_CMA: dict[str, Predicate] = {**dict.fromkeys(CMA_BYTES, _can_read), "all_reduce": _can_read_in_place}


def _reads(collective: str) -> Predicate:
    """The predicate of ``collective``'s ``shm_cma`` row: CMA allowed (all_reduce: and in place),
    the call large enough (``SHARED_BYTES`` in a group with shared arrays, else
    ``CMA_BYTES_OWN_CORES`` for three or more members with a core each, else ``CMA_BYTES``)."""
    threshold, own_cores = CMA_BYTES[collective], CMA_BYTES_OWN_CORES[collective]
    shared, allowed = SHARED_BYTES[collective], _FITS_CMA[collective]

    def predicate(team: Team, nbytes: int) -> bool:
        if not allowed(team, nbytes):
            return False
        shm = team.shm
        if shm.shared:
            return nbytes >= shared
        return nbytes >= (own_cores if _own_cores(shm.size) else threshold)

    return predicate


# ``nbytes`` is the size of the largest buffer a rank passes: the buffer for all_reduce, broadcast
# and reduce (in the accumulation dtype for reductions); the gathered output for all_gather and
# gather; the input for reduce_scatter, scatter and all_to_all; 0 for barrier.
#
# Shared-memory rows go first in their collective, guarded by "the group has a shared-memory
# domain" (every member on this host, set up at group creation), so that they win whenever they
# apply and the rows below remain the fallback across hosts. Every collective of a group with a
# domain runs on it: the domain's per-call announcements are what detect mismatched calls there.
# Hierarchical rows come next: a group that spans hosts with as many members on each (set up at
# group creation, ``Team.hier``) runs shared memory inside hosts and the transport between them.
ROWS: tuple[Row, ...] = (
    Row("all_reduce", "shm_cma", _reads("all_reduce"), shm_cma.all_reduce, shm_cma.prepare_all_reduce),
    Row("all_reduce", "shm_direct", _shm_direct, shm_allreduce.direct, shm_allreduce.prepare_direct,
        shm_allreduce.bind_direct),
    Row("all_reduce", "shm_split", _shm_one_slot, shm_allreduce.split, shm_allreduce.prepare_split),
    Row("all_reduce", "shm_pipelined", _shm, shm_allreduce.pipelined, shm_allreduce.prepare_pipelined),
    Row("all_reduce", "hierarchical", _hierarchical, hier.all_reduce),
    Row("all_reduce", "pair_in_place", _pair, staging.pair(allreduce.pair_in_place)),
    Row("all_reduce", "recursive_doubling", _doubling, staging.all_reduce(allreduce.recursive_doubling)),
    Row("all_reduce", "halving_doubling", _halving_doubling, staging.all_reduce(allreduce.halving_doubling)),
    Row("all_reduce", "ring", _always, staging.all_reduce(allreduce.ring)),
    Row("all_gather", "shm_cma", _reads("all_gather"), shm_cma.all_gather, shm_cma.prepare_all_gather),
    Row("all_gather", "shm_rounds", _shm, shm_allgather.all_gather, shm_allgather.prepare,
        shm_allgather.bind_all_gather),
    Row("all_gather", "hierarchical", _hierarchical, hier.all_gather),
    Row("all_gather", "bruck", _small, staging.all_gather(allgather.bruck)),
    Row("all_gather", "ring", _always, staging.all_gather(allgather.ring)),
    Row("reduce_scatter", "shm_cma", _reads("reduce_scatter"), shm_cma.reduce_scatter,
        shm_cma.prepare_reduce_scatter),
    Row("reduce_scatter", "shm_rounds", _shm, shm_reduce_scatter.reduce_scatter,
        shm_reduce_scatter.prepare, shm_reduce_scatter.bind),
    Row("reduce_scatter", "hierarchical", _hierarchical, hier.reduce_scatter),
    Row("reduce_scatter", "ring", _always, staging.reduce_scatter(reduce_scatter.ring)),
    Row("broadcast", "shm_cma", _reads("broadcast"), shm_cma.broadcast, shm_cma.prepare_broadcast),
    Row("broadcast", "shm_rounds", _shm, shm_broadcast.broadcast, shm_broadcast.prepare_broadcast,
        shm_broadcast.bind_broadcast),
    Row("broadcast", "hierarchical", _hierarchical, hier.broadcast),
    Row("broadcast", "scatter_allgather", _large_and_three_or_more,
        staging.broadcast(broadcast.scatter_allgather)),
    Row("broadcast", "binomial_tree", _always, staging.broadcast(broadcast.binomial_tree)),
    Row("reduce", "shm_direct", _shm_direct, shm_allreduce.reduce_direct, shm_allreduce.prepare_direct),
    Row("reduce", "shm_split", _shm_one_slot, shm_allreduce.reduce_split, shm_allreduce.prepare_split),
    Row("reduce", "shm_pipelined", _shm, shm_allreduce.reduce_pipelined, shm_allreduce.prepare_pipelined),
    Row("reduce", "binomial_tree", _always, staging.reduce(reduce.binomial_tree)),
    Row("gather", "shm_rounds", _shm, shm_allgather.gather, shm_allgather.prepare),
    Row("gather", "linear", _always, staging.gather(gather_scatter.gather)),
    Row("scatter", "shm_rounds", _shm, shm_broadcast.scatter, shm_broadcast.prepare_scatter),
    Row("scatter", "linear", _always, staging.scatter(gather_scatter.scatter)),
    Row("all_to_all", "shm_cma", _reads("all_to_all"), shm_cma.all_to_all, shm_cma.prepare_all_to_all),
    Row("all_to_all", "shm_rounds", _shm, shm_alltoall.all_to_all, shm_alltoall.prepare,
        shm_alltoall.bind),
    Row("all_to_all", "pairwise_exchange", _always, staging.all_to_all(alltoall.pairwise_exchange)),
    Row("barrier", "shm_counters", _shm, shm_barrier.barrier),
    Row("barrier", "hierarchical", _hierarchical, hier.barrier),
    Row("barrier", "dissemination", _always, barrier.dissemination),
    Row("scan", "shm_prefix", _shm, scan.shm_prefix(inclusive=True), scan.prepare_prefix(inclusive=True)),
    Row("scan", "recursive_doubling", _always, scan.recursive_doubling(inclusive=True)),
    Row("exscan", "shm_prefix", _shm, scan.shm_prefix(inclusive=False), scan.prepare_prefix(inclusive=False)),
    Row("exscan", "recursive_doubling", _always, scan.recursive_doubling(inclusive=False)),
)
_BY_COLLECTIVE: dict[str, tuple[Row, ...]] = {}
for _row in ROWS:
    _BY_COLLECTIVE[_row.collective] = (*_BY_COLLECTIVE.get(_row.collective, ()), _row)
_BY_NAME = {(row.collective, row.name): row for row in ROWS}

# What a row needs of a call to run at all, where that is less than "always" (the predicates in
# ROWS add preference on top): a tuning file's choice is taken only where its row fits, and
# ``tensorcomm tune`` times a row only at sizes where it fits.
_FITS: dict[tuple[str, str], Predicate] = {
    ("all_reduce", "pair_in_place"): _pair,
    ("all_reduce", "shm_direct"): _shm_one_slot,
    ("all_reduce", "shm_split"): _shm_one_slot,
    ("reduce", "shm_direct"): _shm_one_slot,
    ("reduce", "shm_split"): _shm_one_slot,
    **{(collective, "shm_cma"): fits_cma for collective, fits_cma in _FITS_CMA.items()},
}
_CMA_NEED = ("members that may read each other's memory (cross-memory attach, which this group "
             "could not use; see TENSORCOMM_CMA in docs/env.md), and for all_reduce a job that "
             "does not keep failed calls' arrays untouched (keep_going)")


def collectives() -> list[str]:
    """Every collective ``pick`` knows, in table order."""
    return list(_BY_COLLECTIVE)


def fits(collective: str, name: str, team: Team, nbytes: int) -> bool:
    """Whether algorithm ``name`` of ``collective`` can run a call of ``nbytes`` on ``team``
    (shared-memory rows need ``team.shm``; see ``_FITS`` for the rest)."""
    if name.startswith("shm_") and team.shm is None:
        return False
    return _FITS.get((collective, name), _always)(team, nbytes)


def _rows(collective: str) -> tuple[Row, ...]:
    rows = _BY_COLLECTIVE.get(collective)
    if rows is None:
        known = ", ".join(_BY_COLLECTIVE)
        raise ValueError(f"collective: unknown collective {collective!r}; expected one of {known}")
    return rows


def names(collective: str) -> list[str]:
    """Names of the algorithms available for ``collective``, in the order ``pick`` tries them.

    Raises:
        ValueError: ``collective`` is unknown.
    """
    return [row.name for row in _rows(collective)]


def pick(collective: str, team: Team, nbytes: int, override: str | None = None) -> Row:
    """The row that runs ``collective`` on ``team`` with ``nbytes`` per rank.

    Args:
        collective: e.g. ``"all_reduce"``; see ``ROWS``.
        team: the group (its size, topology and shared-memory domain).
        nbytes: the size of the call's largest buffer (see the comment above ``ROWS``).
        override: an algorithm name from ``names(collective)``; skips the tuning file and the
            predicates.

    Raises:
        ValueError: ``collective`` is unknown, ``override`` names no algorithm of it, or one that
            cannot run a call of ``nbytes`` on the group's shared memory (a one-slot row).
    """
    rows = _rows(collective)
    if override is not None:
        for row in rows:
            if row.name == override:
                if team.shm is not None and not fits(collective, override, team, nbytes):
                    need = _CMA_NEED if override == "shm_cma" else \
                        f"the call to fit one shared-memory slot ({team.shm.slot_bytes} bytes)"
                    raise ValueError(
                        f"override: {collective} algorithm {override!r} cannot run a call of {nbytes} "
                        f"bytes per rank: it needs {need}; choose another or none (TENSORCOMM_ALGORITHMS)")
                return row
        raise ValueError(f"override: unknown {collective} algorithm {override!r}; expected one of "
                         f"{', '.join(row.name for row in rows)}")
    return choose(collective, team, nbytes, tuning.choice(tuned(), collective, team, nbytes))


@functools.cache
def tuned() -> tuning.Table | None:
    """This process's tuning table, read on first use (``tuning.read``); None: built-in rules."""
    return tuning.read({collective: names(collective) for collective in _BY_COLLECTIVE})


def learnable(collective: str, team: Team, nbytes: int, chosen: Row) -> list[Row]:
    """The rows a learning group chooses among for this call, ``chosen`` (``pick``'s) one of
    them, or none: the call keeps ``chosen`` (``learning.candidates``)."""
    return learning.candidates(collective, team, nbytes, chosen, fits, _rows(collective))


def choose(collective: str, team: Team, nbytes: int, tuned: str | None) -> Row:
    """``pick`` without an override, given the tuning file's choice ``tuned`` (None: none):
    that row where it fits the call, else the first row whose predicate holds.

    Raises:
        ValueError: ``collective`` is unknown.
    """
    rows = _rows(collective)
    if tuned is not None and fits(collective, tuned, team, nbytes):
        return _BY_NAME[(collective, tuned)]
    for row in rows:
        if row.predicate(team, nbytes):
            return row
    raise AssertionError(f"no {collective} row matched; the last row of each collective must always hold")
