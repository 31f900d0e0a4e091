"""``env://`` without MASTER_ADDR: a world of one with no launcher, the store at the first host of
srun's node list, MPI launchers without mpi4py named with the ways out; the node-list parser; the
known ``TENSORCOMM_*`` names (docs/env.md) and the warning about any other."""

from __future__ import annotations

import importlib.util
import re
import warnings
from pathlib import Path

import pytest

import tensorcomm
from tensorcomm import config
from tensorcomm.errors import RendezvousError
from tensorcomm.rendezvous import discover, discovery, init_method, rendezvous, slurm
from tensorcomm.testing import free_port


@pytest.fixture
def private_env(tmp_path: Path) -> dict[str, str]:
    directory = tmp_path / "secrets"
    directory.mkdir(mode=0o700)
    return {"TENSORCOMM_SECRET_DIR": str(directory)}


@pytest.mark.parametrize("text, hosts", [
    ("node01", ["node01"]),
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("a[8-10],b7", ["a8", "a9", "a10", "b7"]),
    ("gpu[009-011]x", ["gpu009x", "gpu010x", "gpu011x"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    (" n1 , n2 ", ["n1", "n2"]),
])
def test_expand_nodelist(text: str, hosts: list[str]) -> None:
    assert slurm.expand_nodelist(text) == hosts


@pytest.mark.parametrize("text", ["n[1-3", "n1-3]", "n[3-1]", "n[a-b]", "n1,,n2", "n[[1]]", ""])
def test_expand_nodelist_refuses_malformed_lists(text: str) -> None:
    with pytest.raises(ValueError, match="node list"):
        slurm.expand_nodelist(text)


def test_store_port_is_below_the_ephemeral_range() -> None:
    assert {slurm.store_port(j) for j in (0, 14999, 15000, 10**9 + 7)} <= set(range(15000, 30000))
    assert slurm.store_port(12345) == slurm.store_port(12345)


def test_no_launcher_is_a_world_of_one(private_env: dict[str, str]) -> None:
    rdv = rendezvous(None, None, None, 5.0, environ=private_env)
    try:
        assert (rdv.rank, rdv.world_size) == (0, 1) and rdv.server is not None
        rdv.store.set("k", b"v")
        assert rdv.store.get("k") == b"v"
    finally:
        rdv.close()


def test_a_partial_rank_is_not_taken_for_a_world_of_one() -> None:
    with pytest.raises(ValueError, match="set WORLD_SIZE"):
        rendezvous(None, 0, None, 1.0, environ={})


def test_mpi_launcher_without_mpi4py_names_both_ways_out(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(init_method.importlib.util, "find_spec",
                        lambda name, *a: None if name == "mpi4py" else real(name, *a))
    for env in ({"PMI_RANK": "0", "PMI_SIZE": "2"}, {"PMIX_RANK": "0"},
                {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}):
        assert not init_method.meets_through_mpi(discover(env))
        with pytest.raises(ValueError, match=r"(?s)mpi4py is not installed.*backend='mpi'.*MASTER_ADDR "
                                             r"and MASTER_PORT") as info:
            rendezvous(None, None, None, 1.0, environ=env)
        assert next(iter(env)) in str(info.value)


def test_init_meets_through_mpi_only_under_an_mpi_launcher_without_master() -> None:
    mpi4py = importlib.util.find_spec("mpi4py") is not None
    assert init_method.meets_through_mpi(discover({"PMI_RANK": "0", "PMI_SIZE": "2"})) == mpi4py
    assert not init_method.meets_through_mpi(discover({"PMI_RANK": "0", "PMI_SIZE": "2",
                                                       "MASTER_ADDR": "h", "MASTER_PORT": "1"}))
    assert not init_method.meets_through_mpi(discover({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}))


def test_discover_names_the_mpi_launcher_and_srun_node_list() -> None:
    assert discover({"PMI_RANK": "0", "PMI_SIZE": "1"}).mpi_launcher == "PMI_RANK"
    assert discover({}).mpi_launcher is None
    srun = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n[1-2]",
            "SLURM_STEP_NODELIST": "n2", "SLURM_JOB_ID": "77"}
    info = discover(srun)
    assert (info.slurm_nodelist, info.slurm_job_id) == ("n2", 77)
    # salloc's shell (no srun): the allocation's variables alone say nothing about this process
    assert discover({"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_ID": "77"}).slurm_nodelist is None


def test_srun_on_several_hosts_puts_the_store_on_the_first(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_STEP_NODELIST": "cn[07-08]",
           "SLURM_JOB_ID": "4242"}
    with pytest.raises(RendezvousError, match="store address 'cn07' is not loopback"):
        rendezvous(None, None, None, 1.0, environ=env)


def test_srun_on_one_host_meets_on_loopback(monkeypatch: pytest.MonkeyPatch,
                                            private_env: dict[str, str]) -> None:
    port = free_port()
    monkeypatch.setattr(slurm, "store_port", lambda job_id: port)
    env = {**private_env, "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_STEP_NODELIST": "cn07",
           "SLURM_JOB_ID": "4242"}
    rdv = rendezvous(None, None, None, 5.0, environ=env)
    try:
        assert (rdv.rank, rdv.world_size) == (0, 1)
        assert rdv.server is not None and rdv.server.port == port
    finally:
        rdv.close()


def test_known_variables_are_the_documented_ones() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "env.md"
    documented = set(re.findall(r"TENSORCOMM_[A-Z0-9_]+", docs.read_text()))
    assert documented == set(config.KNOWN_ENV_VARS)
    source = Path(tensorcomm.__file__).parent
    used = {name for path in source.rglob("*.py")
            for name in re.findall(r"TENSORCOMM_[A-Z0-9_]*[A-Z0-9]", path.read_text())}
    assert used <= set(config.KNOWN_ENV_VARS), used - set(config.KNOWN_ENV_VARS)


def test_an_unknown_variable_is_warned_about_once_with_the_closest_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(discovery, "_warned", set())
    env = {"TENSORCOMM_TRANSPROT": "tcp", "TENSORCOMM_SECRET": "s"}
    with pytest.warns(RuntimeWarning, match="TENSORCOMM_TRANSPROT .*no effect; did you mean "
                                            "TENSORCOMM_TRANSPORT"):
        assert discover(env).transport == "auto"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        discover(env)  # once per name
        discovery._warn_unknown(dict.fromkeys(config.KNOWN_ENV_VARS, "x"))  # known: no warning


def test_rank_0_dials_its_store_by_a_name_other_hosts_can_reach() -> None:
    from tensorcomm.transports.mpi.join import _routable

    assert _routable("10.1.2.3") and not _routable("127.0.0.1") and not _routable("no-such-host.invalid")
