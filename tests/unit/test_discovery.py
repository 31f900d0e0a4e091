"""Environment discovery: each launcher's variables, precedence, and malformed values."""

from __future__ import annotations

import socket

import pytest

from tensorcomm.rendezvous.discovery import JobInfo, discover


@pytest.mark.parametrize("env, expected", [
    pytest.param({"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"},
                 ("torchrun", 2, 4, 0, 2), id="torchrun"),
    pytest.param({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8",
                  "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
                 ("openmpi", 3, 8, 1, 2), id="openmpi"),
    pytest.param({"PMI_RANK": "5", "PMI_SIZE": "6", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "3"},
                 ("pmi", 5, 6, 2, 3), id="pmi"),
    pytest.param({"SLURM_PROCID": "7", "SLURM_NTASKS": "16", "SLURM_LOCALID": "3"},
                 ("slurm", 7, 16, 3, None), id="slurm"),
    pytest.param({"RANK_ID": "9", "RANK_SIZE": "16", "RANK": "1", "LOCAL_RANK": "1",
                  "MS_WORKER_NUM": "16", "MS_NODE_ID": "9", "MS_ROLE": "MS_WORKER"},
                 ("msrun", 9, 16, 1, None), id="msrun-rank-id"),
    pytest.param({"MS_NODE_ID": "3", "MS_WORKER_NUM": "4"}, ("msrun", 3, 4, 0, None), id="msrun-node-id"),
    pytest.param({}, ("none", None, None, 0, None), id="none"),
    pytest.param({"RANK": "1"}, ("torchrun", 1, None, 0, None), id="torchrun-rank-only"),
])
def test_sources(env: dict[str, str], expected: tuple) -> None:
    info = discover(env)
    assert (info.source, info.rank, info.world_size, info.local_rank, info.local_world_size) == expected


@pytest.mark.parametrize("env, source", [
    ({"RANK": "0", "WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"}, "torchrun"),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "PMI_RANK": "0", "PMI_SIZE": "2"}, "openmpi"),
    ({"PMI_RANK": "0", "PMI_SIZE": "2", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}, "pmi"),
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "RANK_ID": "0", "RANK_SIZE": "2"}, "slurm"),
])
def test_first_source_wins(env: dict[str, str], source: str) -> None:
    assert discover(env).source == source


def test_master_address_is_read_whatever_the_source() -> None:
    info = discover({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "MASTER_ADDR": "node1",
                     "MASTER_PORT": "29500"})
    assert (info.master_addr, info.master_port) == ("node1", 29500)


def test_msrun_scheduler_address_is_the_fallback() -> None:
    # the port after MindSpore's scheduler's own, which it holds when the script calls its init()
    env = {"RANK_ID": "0", "RANK_SIZE": "2", "MS_SCHED_HOST": "10.0.0.1", "MS_SCHED_PORT": "8118",
           "MS_ROLE": "MS_WORKER"}
    info = discover(env)
    assert (info.master_addr, info.master_port, info.msrun_scheduler) == ("10.0.0.1", 8119, False)
    info = discover({**env, "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "9000"})
    assert (info.master_addr, info.master_port) == ("10.0.0.2", 9000)
    assert discover({"MS_SCHED_HOST": "10.0.0.1"}).master_addr is None  # only under msrun
    with pytest.raises(ValueError, match=r"MS_SCHED_PORT='65535': a port must be in 0..65534"):
        discover({**env, "MS_SCHED_PORT": "65535"})


def test_msrun_scheduler_process_is_told_apart() -> None:
    env = {"RANK_ID": "0", "RANK_SIZE": "2", "MS_SCHED_HOST": "127.0.0.1", "MS_SCHED_PORT": "8118",
           "MS_WORKER_NUM": "2", "MS_ROLE": "MS_SCHED"}
    assert discover(env).msrun_scheduler
    assert not discover({**env, "MS_ROLE": "MS_WORKER"}).msrun_scheduler
    assert not discover({"RANK": "0", "WORLD_SIZE": "1"}).msrun_scheduler


def test_tensorcomm_variables() -> None:
    info = discover({"TENSORCOMM_SECRET": "ab12", "TENSORCOMM_STORE_HOSTED": "1",
                     "TENSORCOMM_HOST_ID": "box-a", "TENSORCOMM_TIMEOUT": "12.5"})
    assert (info.secret, info.store_hosted, info.host_id, info.timeout) == ("ab12", True, "box-a", 12.5)
    assert discover({"TENSORCOMM_STORE_HOSTED": "0"}).store_hosted is False


def test_secret_directory_prefers_tensorcomm_then_xdg() -> None:
    both = {"TENSORCOMM_SECRET_DIR": "/run/mine", "XDG_RUNTIME_DIR": "/run/user/7"}
    assert discover(both).secret_dir == "/run/mine"
    assert discover({"XDG_RUNTIME_DIR": "/run/user/7"}).secret_dir == "/run/user/7/tensorcomm"
    assert discover({"XDG_RUNTIME_DIR": ""}).secret_dir is None  # ~/.cache/tensorcomm, else /tmp
    with pytest.raises(ValueError, match="TENSORCOMM_SECRET_DIR"):
        discover({"TENSORCOMM_SECRET_DIR": " "})


def test_defaults() -> None:
    assert discover({}) == JobInfo(rank=None, world_size=None, local_rank=0, local_world_size=None,
                                   master_addr=None, master_port=None, secret=None, store_hosted=False,
                                   host_id=socket.gethostname(), timeout=None, source="none")


def test_reads_os_environ_when_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "RANK_ID", "RANK_SIZE", "MS_WORKER_NUM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    info = discover()
    assert (info.source, info.rank, info.world_size) == ("torchrun", 1, 3)


@pytest.mark.parametrize("env, named", [
    ({"RANK": "one", "WORLD_SIZE": "2"}, "RANK='one'"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK='-1'"),
    ({"RANK": "", "WORLD_SIZE": "2"}, "RANK=''"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE='0'"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK='2' must be below WORLD_SIZE='2'"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "x"}, "LOCAL_RANK='x'"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK='2'"),
    ({"OMPI_COMM_WORLD_RANK": "4", "OMPI_COMM_WORLD_SIZE": "4"}, "OMPI_COMM_WORLD_RANK='4'"),
    ({"PMI_RANK": "1.0", "PMI_SIZE": "4"}, "PMI_RANK='1.0'"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2(x3)"}, "SLURM_NTASKS='2(x3)'"),
    ({"RANK_ID": "5", "MS_WORKER_NUM": "4"}, "RANK_ID='5' must be below MS_WORKER_NUM='4'"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT='70000'"),
    ({"MASTER_PORT": "http"}, "MASTER_PORT='http'"),
    ({"MASTER_ADDR": "  "}, "MASTER_ADDR='  '"),
    ({"TENSORCOMM_STORE_HOSTED": "yes"}, "TENSORCOMM_STORE_HOSTED='yes'"),
    ({"TENSORCOMM_TIMEOUT": "soon"}, "TENSORCOMM_TIMEOUT='soon'"),
    ({"TENSORCOMM_TIMEOUT": "-3"}, "TENSORCOMM_TIMEOUT='-3'"),
    ({"TENSORCOMM_TIMEOUT": "inf"}, "TENSORCOMM_TIMEOUT='inf'"),
    ({"TENSORCOMM_TIMEOUT": "1e10"},
     "TENSORCOMM_TIMEOUT='1e10': expected a positive number of seconds, at most"),
    ({"TENSORCOMM_SECRET": ""}, "TENSORCOMM_SECRET=''"),
])
def test_malformed_values_name_variable_and_value(env: dict[str, str], named: str) -> None:
    with pytest.raises(ValueError) as info:
        discover(env)
    assert named in str(info.value)


def test_whitespace_around_integers_is_tolerated() -> None:
    info = discover({"RANK": " 1 ", "WORLD_SIZE": "2\n", "MASTER_PORT": " 29500"})
    assert (info.rank, info.world_size, info.master_port) == (1, 2, 29500)
