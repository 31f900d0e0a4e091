"""init_method URLs: scheme errors, env:// / tcp:// / file:// with threads as ranks, the secret rule.

What a stranger can do to a job without a secret is tested in tests/fault/test_security.py.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tensorcomm.errors import AuthenticationError, RendezvousError
from tensorcomm.rendezvous import Rendezvous, TCPStoreServer, register_scheme, rendezvous, secret_bytes
from tensorcomm.rendezvous.private import SecretDir, default_dir
from tensorcomm.testing import free_port


@pytest.fixture
def private_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose generated secrets go to a private directory of this test's own."""
    directory = tmp_path / "secrets"
    directory.mkdir(mode=0o700)
    return {"TENSORCOMM_SECRET_DIR": str(directory)}


def as_ranks(world_size: int, join: Callable[[int], Rendezvous]) -> list[Rendezvous]:
    """Run ``join(rank)`` in one thread per rank; return the Rendezvous objects by rank."""
    results: list = [None] * world_size

    def run(rank: int) -> None:
        try:
            results[rank] = join(rank)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            results[rank] = exc

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def exchange_and_close(rdvs: list[Rendezvous]) -> None:
    """Every rank publishes a key and reads every other rank's, then all close (rank 0 last)."""
    for rdv in rdvs:
        rdv.store.set(f"addr/{rdv.rank}", f"rank{rdv.rank}")
    for rdv in rdvs:
        assert [rdv.store.get(f"addr/{r}", timeout=2) for r in range(len(rdvs))] == \
            [f"rank{r}".encode() for r in range(len(rdvs))]
    for rdv in reversed(rdvs):
        rdv.close()
        rdv.close()  # idempotent


def test_unknown_scheme_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"init_method: unknown scheme 'x://'; "
                                         r"expected one of env://, tcp://, file://"):
        rendezvous("x://y", 0, 1, 1.0, environ={})
    with pytest.raises(ValueError, match="init_method: unknown scheme in 'localhost:29500'"):
        rendezvous("localhost:29500", 0, 1, 1.0, environ={})
    with pytest.raises(TypeError, match="init_method"):
        rendezvous(29500, 0, 1, 1.0, environ={})  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout, error", [(0, ValueError), (-1, ValueError), (float("inf"), ValueError),
                                            (1e10, ValueError), ("5", TypeError), (True, TypeError)])
def test_timeout_must_be_positive_seconds(timeout: object, error: type) -> None:
    with pytest.raises(error, match="timeout"):
        rendezvous("tcp://127.0.0.1:1", 0, 1, timeout, environ={})  # type: ignore[arg-type]


@pytest.mark.parametrize("env, rank, world_size, named", [
    ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}, 0, None, "set WORLD_SIZE"),
    ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "WORLD_SIZE": "2"}, None, None, "set RANK"),
    ({"MASTER_PORT": "1"}, 0, 2, "MASTER_ADDR is not set"),
    ({"MASTER_ADDR": "127.0.0.1"}, 0, 2, "MASTER_PORT is not set"),
])
def test_env_names_the_variable_to_set(env: dict, rank: int | None, world_size: int | None,
                                       named: str) -> None:
    with pytest.raises(ValueError, match=f"env://: .*{named}"):
        rendezvous(None, rank, world_size, 1.0, environ=env)


@pytest.mark.parametrize("rank, world_size, error", [
    (2, 2, ValueError), (-1, 2, ValueError), (0, 0, ValueError), (True, 2, TypeError), (0, 2.0, TypeError),
])
def test_bad_rank_arguments(rank: object, world_size: object, error: type) -> None:
    with pytest.raises(error, match="tcp://: "):
        rendezvous("tcp://127.0.0.1:1", rank, world_size, 1.0, environ={})  # type: ignore[arg-type]


@pytest.mark.parametrize("url", ["tcp://127.0.0.1", "tcp://:29500", "tcp://127.0.0.1:notaport",
                                 "tcp://127.0.0.1:1?rank=0", "tcp://127.0.0.1:1/path"])
def test_malformed_tcp_urls(url: str) -> None:
    with pytest.raises(ValueError, match="tcp://: expected tcp://host:port"):
        rendezvous(url, 0, 1, 1.0, environ={})


@pytest.mark.parametrize("url", ["file://relative/path", "file://otherhost/tmp/x"])
def test_malformed_file_urls(url: str) -> None:
    with pytest.raises(ValueError, match="file://: expected file:///absolute/path"):
        rendezvous(url, 0, 1, 1.0, environ={})


def test_env_rejects_an_address_in_the_url() -> None:
    with pytest.raises(ValueError, match="env://: takes no address"):
        rendezvous("env://127.0.0.1:1", 0, 1, 1.0, environ={})


def test_tcp_with_two_thread_ranks(private_env: dict[str, str]) -> None:
    url = f"tcp://127.0.0.1:{free_port()}"
    rdvs = as_ranks(2, lambda rank: rendezvous(url, rank, 2, 5.0, environ=private_env))
    assert [r.rank for r in rdvs] == [0, 1] and {r.world_size for r in rdvs} == {2}
    assert rdvs[0].server is not None and rdvs[1].server is None
    assert rdvs[0].secret == rdvs[1].secret and rdvs[0].secret.startswith(b"generated:")
    assert rdvs[0].secret_file is not None and rdvs[1].secret_file is None
    exchange_and_close(rdvs)


def test_env_with_three_ranks_reads_everything_from_the_environment() -> None:
    base = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "3",
            "TENSORCOMM_SECRET": "three-ranks-secret", "TENSORCOMM_HOST_ID": "hostA"}

    def join(rank: int) -> Rendezvous:
        return rendezvous("env://", None, None, 5.0,
                          environ={**base, "RANK": str(rank), "LOCAL_RANK": str(rank)})

    rdvs = as_ranks(3, join)
    assert [(r.rank, r.local_rank, r.host_id) for r in rdvs] == [(0, 0, "hostA"), (1, 1, "hostA"),
                                                                 (2, 2, "hostA")]
    assert {r.secret for r in rdvs} == {secret_bytes("three-ranks-secret")}
    exchange_and_close(rdvs)


def test_arguments_override_the_environment() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}
    rdv = rendezvous(None, 0, 1, 5.0, environ=env)  # port 0 is fine for a lone process
    try:
        assert (rdv.rank, rdv.world_size) == (0, 1)
        assert rdv.server is not None and rdv.server.port != 0
        rdv.store.set("k", b"v")
    finally:
        rdv.close()


def test_port_zero_needs_a_lone_hosting_process() -> None:
    with pytest.raises(ValueError, match="port 0"):
        rendezvous("tcp://127.0.0.1:0", 0, 2, 1.0, environ={})


def test_store_hosted_by_the_launcher() -> None:
    with TCPStoreServer("127.0.0.1", 0, "the-launcher-secret") as server:
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port), "WORLD_SIZE": "2",
               "TENSORCOMM_SECRET": "the-launcher-secret", "TENSORCOMM_STORE_HOSTED": "1"}
        rdvs = as_ranks(2, lambda rank: rendezvous(None, rank, None, 5.0, environ={**env, "RANK": str(rank)}))
        assert rdvs[0].server is None and rdvs[1].server is None
        exchange_and_close(rdvs)


def test_non_loopback_store_needs_a_secret() -> None:
    env = {"MASTER_ADDR": "192.0.2.1", "MASTER_PORT": "29500"}  # TEST-NET-1: never contacted
    with pytest.raises(RendezvousError, match="TENSORCOMM_SECRET is not set"):
        rendezvous(None, 1, 2, 1.0, environ=env)


@pytest.mark.parametrize("host", ["localhost", "127.0.0.2", "[::1]"])
def test_loopback_hosts_generate_a_fresh_secret(host: str, private_env: dict[str, str]) -> None:
    port = free_port()
    try:
        rdv = rendezvous(f"tcp://{host}:{port}", 0, 1, 2.0, environ=private_env)
    except RendezvousError as exc:  # e.g. no IPv6 loopback in this sandbox
        pytest.skip(f"cannot serve on {host}: {exc}")
    with rdv:
        assert bytes.fromhex(rdv.secret.decode().removeprefix("generated:"))
        assert rdv.secret_file is None  # a lone process shares it with nobody


def test_the_default_secret_directory_is_private_to_this_user() -> None:
    directory = SecretDir(None)
    assert directory.path == default_dir()  # ~/.cache/tensorcomm, else /tmp/tensorcomm-<uid>
    info = os.lstat(directory.path)
    assert stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()
    assert stat.S_IMODE(info.st_mode) & 0o077 == 0


def test_a_member_without_rank_0_names_the_file_it_waited_for(private_env: dict[str, str]) -> None:
    port = free_port()
    with pytest.raises(RendezvousError, match=f"no secret appeared in .*127.0.0.1-{port}.key within 0.3 s"):
        rendezvous(f"tcp://127.0.0.1:{port}", 1, 2, 0.3, environ=private_env)


def test_ranks_with_different_secrets_fail_authentication() -> None:
    port = free_port()
    host = rendezvous(f"tcp://127.0.0.1:{port}", 0, 2, 5.0, environ={"TENSORCOMM_SECRET": "the-first-secret"})
    try:
        with pytest.raises(AuthenticationError):
            rendezvous(f"tcp://127.0.0.1:{port}", 1, 2, 5.0,
                       environ={"TENSORCOMM_SECRET": "the-second-secret"})
    finally:
        host.close()


def test_unreachable_store_names_the_address() -> None:
    port = free_port()
    with pytest.raises(RendezvousError, match=f"127.0.0.1:{port}"):
        rendezvous(f"tcp://127.0.0.1:{port}", 1, 2, 0.2, environ={"TENSORCOMM_SECRET": "a-secret-for-tests"})


def test_file_with_two_thread_ranks_shares_a_generated_secret(tmp_path) -> None:
    url = f"file://{tmp_path}/rdv%20store"
    rdvs = as_ranks(2, lambda rank: rendezvous(url, rank, 2, 5.0, environ={}))
    assert rdvs[0].server is None and rdvs[0].secret.startswith(b"generated:")
    assert rdvs[0].secret == rdvs[1].secret
    assert (tmp_path / "rdv store").exists()
    exchange_and_close(rdvs)
    assert not (tmp_path / "rdv store").exists()


def test_file_uses_the_environment_secret(tmp_path: object) -> None:
    rdv = rendezvous(f"file://{tmp_path}/s", None, None, 1.0,
                     environ={"RANK": "0", "WORLD_SIZE": "1",
                              "TENSORCOMM_SECRET": "the-file-rendezvous-secret"})
    with rdv:
        assert rdv.secret == secret_bytes("the-file-rendezvous-secret") and rdv.server is None


def test_register_scheme() -> None:
    seen: list[tuple] = []

    def handler(url: str, rank: int | None, world_size: int | None, timeout: float,
                info: object) -> Rendezvous:
        seen.append((url, rank, world_size, timeout))
        raise RuntimeError("handled")

    register_scheme("testscheme", handler)
    with pytest.raises(RuntimeError, match="handled"):
        rendezvous("testscheme://anything", 3, 4, 1.5, environ={})
    assert seen == [("testscheme://anything", 3, 4, 1.5)]
    with pytest.raises(ValueError, match="already registered"):
        register_scheme("testscheme", handler)
    with pytest.raises(ValueError, match="scheme"):
        register_scheme("tcp://", handler)
    with pytest.raises(TypeError, match="handler"):
        register_scheme("othertestscheme", "not callable")  # type: ignore[arg-type]


def test_scheme_is_case_insensitive() -> None:
    with pytest.raises(ValueError, match="tcp://: expected"):
        rendezvous("TCP://nohost", 0, 1, 1.0, environ={})

