"""Algorithm selection: the rows of select.py, their order, and overrides."""

from __future__ import annotations

import numpy as np
import pytest

from tensorcomm.algorithms import select
from tensorcomm.algorithms.base import Team
from tensorcomm.transports.loopback import LoopbackHub

from helpers import COLLECTIVES, close_all, open_domains

SMALL = select.SMALL_MESSAGE_BYTES


DOUBLING = select.ALLREDUCE_DOUBLING_BYTES


def team_of(size: int, host_of: tuple[str, ...] = ()) -> Team:
    return Team(LoopbackHub(size).transport(0), range(size), 0, group_id=0, timeout=1.0, host_of=host_of)


@pytest.mark.parametrize("size, nbytes, expected", [
    (4, 0, "recursive_doubling"),
    (4, DOUBLING, "recursive_doubling"),
    (4, DOUBLING + 1, "halving_doubling"),
    (7, 10 << 20, "halving_doubling"),
    (2, 0, "pair_in_place"),
    (2, 10 << 20, "pair_in_place"),
    (1, 10 << 20, "recursive_doubling"),
])
def test_all_reduce_rows(size, nbytes, expected):
    assert select.pick("all_reduce", team_of(size), nbytes).name == expected
    assert select.pick("all_reduce", team_of(size, ("a",) * size), nbytes).name == expected
    assert select.pick("all_reduce", team_of(size, tuple("abcdefg"[:size])), nbytes).name == expected


def test_two_members_exchange_once_unless_the_wire_is_compressed():
    """The ``pair_in_place`` row is the one place that picks the two-member exchange: with wire
    compression the row does not hold (nor fit, for a tuning file) and recursive doubling runs."""
    team = team_of(2)
    assert select.pick("all_reduce", team, 8).name == "pair_in_place"
    assert select.fits("all_reduce", "pair_in_place", team, 8)
    team.transport.wire_dtype = np.dtype(np.float16)
    assert select.pick("all_reduce", team, 8).name == "recursive_doubling"
    assert not select.fits("all_reduce", "pair_in_place", team, 8)
    assert select.pick("all_reduce", team, 8, override="recursive_doubling").name == "recursive_doubling"


@pytest.mark.parametrize("size, nbytes, expected", [
    (4, SMALL, "recursive_doubling"),
    (4, SMALL + 1, "ring"),
    (6, 10 << 20, "ring"),
])
def test_all_reduce_keeps_ring_when_hosts_hold_several_members(size, nbytes, expected):
    hosts = tuple("ab"[r * 2 // size] for r in range(size))
    assert select.pick("all_reduce", team_of(size, hosts), nbytes).name == expected


@pytest.mark.parametrize("size, nbytes, expected", [
    (5, SMALL, "bruck"),
    (5, SMALL + 1, "ring"),
])
def test_all_gather_rows(size, nbytes, expected):
    assert select.pick("all_gather", team_of(size), nbytes).name == expected


@pytest.mark.parametrize("size, nbytes, expected", [
    (3, SMALL + 1, "scatter_allgather"),
    (3, SMALL, "binomial_tree"),
    (2, 10 << 20, "binomial_tree"),
])
def test_broadcast_rows(size, nbytes, expected):
    assert select.pick("broadcast", team_of(size), nbytes).name == expected


def test_the_table_covers_every_collective_a_signature_names():
    """A collective added to ``signature.COLLECTIVES`` needs rows here (docs/contributing.md,
    "Adding a collective"; ``helpers.COLLECTIVES``, less ``split``, which runs no algorithm):
    the tests below, one per collective, fail by its name without them."""
    assert set(select.collectives()) == set(COLLECTIVES)


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_every_collective_has_a_fallback_row_that_always_holds(collective):
    rows = [row for row in select.ROWS if row.collective == collective]
    assert [row.name for row in rows] == select.names(collective)
    assert len(set(select.names(collective))) == len(rows)
    for size in (1, 2, 3, 8):
        for nbytes in (0, SMALL + 1, 1 << 30):
            assert rows[-1].predicate(team_of(size), nbytes)


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_override_returns_the_named_row(collective):
    for row in select.ROWS:
        if row.collective == collective:
            assert select.pick(collective, team_of(4), 0, override=row.name) is row


def test_override_beats_the_predicates():
    assert select.pick("all_reduce", team_of(4), 0, override="ring").name == "ring"


def test_an_override_that_cannot_run_the_call_says_why():
    domains = open_domains(2, 4096, 8192)
    try:
        team = Team(LoopbackHub(2).transport(0), range(2), 0, group_id=0, timeout=1.0, shm=domains[0])
        for name in ("shm_direct", "shm_split"):
            assert select.pick("all_reduce", team, 4096, override=name).name == name
            assert select.pick("reduce", team, 4096, override=name).name == name
            expected = f"{name}' cannot run a call of 4097 bytes per rank: it needs the call to fit one "
            with pytest.raises(ValueError, match=expected + "shared-memory slot \\(4096 bytes\\)"):
                select.pick("all_reduce", team, 4097, override=name)
        assert select.pick("all_reduce", team, 1 << 20, override="shm_pipelined").name == "shm_pipelined"
        assert not domains[0].cma  # never settled: as where the kernel refuses cross-memory reads
        with pytest.raises(ValueError, match=r"'shm_cma' cannot run .* read each other's memory"):
            select.pick("broadcast", team, 1 << 20, override="shm_cma")
    finally:
        close_all(domains)


def test_unknown_override_lists_the_algorithms_of_the_collective():
    with pytest.raises(ValueError, match="recursive_doubling, halving_doubling, ring"):
        select.pick("all_reduce", team_of(4), 0, override="tree")


def test_unknown_collective_lists_the_known_ones():
    with pytest.raises(ValueError, match="all_reduce, all_gather"):
        select.pick("allreduse", team_of(2), 0)
    with pytest.raises(ValueError, match="all_reduce"):
        select.names("allreduse")


def test_transport_algorithms_are_wrapped_once_for_scratch_copies():
    for row in select.ROWS:
        if not row.name.startswith("shm_") and row.name != "hierarchical" and row.collective != "barrier":
            assert row.fn.__name__.startswith("staged_"), row


class _Domain:
    """What the predicates read of a shared-memory domain."""

    def __init__(self, cma: bool, shared: bool = False) -> None:
        self.size, self.slot_bytes, self.cma, self.shared = 2, 1 << 20, cma, shared


def _shm_team(cma: bool, shared: bool = False, keep_going: bool = False) -> Team:
    return Team(LoopbackHub(2).transport(0), range(2), 0, group_id=0, timeout=1.0,
                shm=_Domain(cma, shared), keep_going=keep_going)


@pytest.mark.parametrize("collective", sorted(select.CMA_BYTES))
def test_direct_reads_from_their_size_where_members_may_read_each_other(collective):
    at = select.CMA_BYTES[collective]
    assert select.pick(collective, _shm_team(True), at).name == "shm_cma"
    assert select.pick(collective, _shm_team(True), at - 1).name != "shm_cma"
    assert select.pick(collective, _shm_team(False), at).name != "shm_cma"
    # a group with shared arrays reads directly from SHARED_BYTES
    shared = select.SHARED_BYTES[collective]
    assert shared <= at
    assert select.pick(collective, _shm_team(True, shared=True), shared).name == "shm_cma"
    assert select.pick(collective, _shm_team(True, shared=True), shared - 1).name != "shm_cma"


def test_all_reduce_keeps_to_the_slots_where_failed_calls_keep_arrays():
    kept = _shm_team(True, keep_going=True)
    assert select.pick("all_reduce", kept, 64 << 20).name == "shm_pipelined"
    assert select.pick("broadcast", kept, 64 << 20).name == "shm_cma"  # builds its result in scratch
    with pytest.raises(ValueError, match="keep_going"):
        select.pick("all_reduce", kept, 64 << 20, override="shm_cma")


class _Members:
    """A shared-memory domain of ``size`` members, as the predicates read it."""

    def __init__(self, size: int, cma: bool = True) -> None:
        self.size, self.slot_bytes, self.cma, self.shared = size, 1 << 20, cma, False


def _members_team(size: int) -> Team:
    return Team(LoopbackHub(size).transport(0), range(size), 0, group_id=0, timeout=1.0,
                shm=_Members(size))


@pytest.mark.parametrize("cores, members, direct_up_to", [
    (16, 4, select.SHM_DIRECT_BYTES_OWN_CORES),  # a core each: split from about 8 KiB
    (16, 16, select.SHM_DIRECT_BYTES_OWN_CORES),
    (2, 4, select.SHM_DIRECT_BYTES_MANY),  # more members than cores: 128 KiB holds
    (16, 2, select.SHM_DIRECT_BYTES[2]),  # two members: as measured for two
])
def test_direct_all_reduce_up_to_a_size_that_depends_on_members_and_cores(monkeypatch, cores, members,
                                                                          direct_up_to):
    monkeypatch.setattr(select, "HOST_CORES", cores)
    team = _members_team(members)
    assert select.pick("all_reduce", team, direct_up_to).name == "shm_direct"
    assert select.pick("all_reduce", team, direct_up_to + 4).name == "shm_split"


@pytest.mark.parametrize("collective", sorted(select.CMA_BYTES))
def test_direct_reads_with_a_core_for_each_of_many_members(monkeypatch, collective):
    monkeypatch.setattr(select, "HOST_CORES", 16)
    at = select.CMA_BYTES_OWN_CORES[collective]
    for members in (3, 8, 16):
        assert select.pick(collective, _members_team(members), at).name == "shm_cma"
        assert select.pick(collective, _members_team(members), at - 1).name != "shm_cma"
    # more members than cores, or two: the two-member sizes
    monkeypatch.setattr(select, "HOST_CORES", 2)
    assert select.pick(collective, _members_team(4), select.CMA_BYTES[collective]).name == "shm_cma"
    assert select.pick(collective, _members_team(4), select.CMA_BYTES[collective] - 1).name != "shm_cma"
