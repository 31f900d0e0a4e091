"""Ranks that meet on a store tensorcomm does not own move to one of their own (issue 21).

Ranks are threads; the foreign store is a HashStore marked ``foreign`` that records what is
written to it. A stranger writing to it is played by the test. Processes and a real stranger
on torch's store: tests/fault/test_foreign_store.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from tensorcomm.errors import AuthenticationError, RendezvousError
from tensorcomm.rendezvous import HashStore, PrefixStore, Rendezvous, TCPStore
from tensorcomm.rendezvous.init_method import from_store
from tensorcomm.rendezvous.own_store import ADDRESS_KEY, REFUSED_KEY, own_store

SECRET = b"own-store-test-secret"


class ForeignStore(HashStore):
    """A store others may write to; ``rewrite(key, value)`` plays the stranger on each set."""

    foreign = True

    def __init__(self, rewrite: Callable[[str, bytes], bytes] | None = None) -> None:
        super().__init__(timeout=30)
        self.rewrite = rewrite
        self.written: list[str] = []

    def set(self, key: str, value: bytes) -> None:
        self.written.append(key)
        super().set(key, value if self.rewrite is None else self.rewrite(key, value))

    def add(self, key: str, amount: int) -> int:
        self.written.append(key)
        return super().add(key, amount)


def as_ranks(count: int, fn: Callable[[int], Any]) -> list[Any]:
    results: list[Any] = [None] * count

    def run(rank: int) -> None:
        try:
            results[rank] = fn(rank)
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            results[rank] = exc

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(25)  # well under the 30 s the ranks would wait for each other
    assert not any(thread.is_alive() for thread in threads), "a rank waited out its timeout"
    return results


def close_all(results: list[Any]) -> None:
    for result in reversed(results):
        if isinstance(result, Rendezvous):
            result.close()


def test_ranks_meet_in_their_own_store_and_leave_only_its_address_in_the_foreign_one() -> None:
    foreign = ForeignStore()
    rdvs = as_ranks(3, lambda rank: from_store(foreign, rank, 3, 30.0, secret=SECRET))
    try:
        assert all(isinstance(rdv, Rendezvous) and isinstance(rdv.store, TCPStore) for rdv in rdvs), rdvs
        assert rdvs[0].server is not None and rdvs[1].server is None
        rdvs[1].store.set("join/1", b"here")
        assert rdvs[2].store.get("join/1") == b"here"
        assert not foreign.check(["tensorcomm/0/join/1"])
        assert set(foreign.written) == {"tensorcomm/joins", f"tensorcomm/0/{ADDRESS_KEY}"}
    finally:
        close_all(rdvs)


def test_a_tampered_address_stops_every_rank_with_an_error_saying_so() -> None:
    def stranger(key: str, value: bytes) -> bytes:
        return b"127.0.0.1:9" + value[value.index(b"\n"):] if key.endswith(ADDRESS_KEY) else value

    foreign = ForeignStore(stranger)
    results = as_ranks(3, lambda rank: from_store(foreign, rank, 3, 30.0, secret=SECRET))
    close_all(results)
    assert all(isinstance(result, AuthenticationError) for result in results), results
    assert all("tampered with" in str(result) for result in results), results


def test_a_rank_with_another_secret_refuses_and_every_rank_stops() -> None:
    foreign = ForeignStore()
    results = as_ranks(2, lambda rank: from_store(foreign, rank, 2, 30.0,
                                                  secret=SECRET if rank == 0 else b"another-secret-entirely"))
    close_all(results)
    assert all(isinstance(result, AuthenticationError) for result in results), results
    assert "rank 1 refused" in str(results[0]), results


@pytest.mark.parametrize("where", ["generation", "namespace"])
def test_an_announcement_replayed_elsewhere_is_refused(where: str) -> None:
    recorded = ForeignStore()
    scoped = PrefixStore("tensorcomm/0", recorded)
    own, server = own_store("store", scoped, "attempt_0/tensorcomm/0", 0, 0, 1, SECRET, 10.0)
    own.close()
    assert server is not None
    try:
        replay = ForeignStore()
        replay.set(f"tensorcomm/0/{ADDRESS_KEY}", recorded.get(f"tensorcomm/0/{ADDRESS_KEY}"))
        generation, prefix = ((1, "attempt_0/tensorcomm/1") if where == "generation"
                              else (0, "attempt_1/tensorcomm/0"))
        with pytest.raises(AuthenticationError, match="tampered with"):
            own_store("store", PrefixStore("tensorcomm/0", replay), prefix, generation, 1, 2, SECRET, 10.0)
    finally:
        server.close()


def test_rank_0_that_never_announces_is_a_rendezvous_error() -> None:
    with pytest.raises(RendezvousError, match="did not announce"):
        own_store("store", ForeignStore(), "tensorcomm/0", 0, 1, 2, SECRET, 0.2)


def test_a_rank_that_cannot_reach_the_own_store_stops_the_others_too() -> None:
    recorded = ForeignStore()
    scoped = PrefixStore("tensorcomm/0", recorded)
    own, server = own_store("store", scoped, "tensorcomm/0", 0, 0, 1, SECRET, 10.0)
    own.close()
    assert server is not None
    server.close()  # the announcement is genuine, but nobody serves there any more
    with pytest.raises(RendezvousError):
        own_store("store", scoped, "tensorcomm/0", 0, 1, 2, SECRET, 0.5)
    assert scoped.check([REFUSED_KEY]) and b"rank 1 cannot use" in scoped.get(REFUSED_KEY)
