"""``Store.compare_set`` on every store: first writer wins, an unset key counts as ``b""``, and
concurrent proposers all read back the one value that won (what ``Group.shrink`` agrees through)."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Iterator

import pytest

from tensorcomm.rendezvous import FileStore, HashStore, PrefixStore, Store, TCPStore, TCPStoreServer

SECRET = b"compare-set-secret"
Handles = Callable[[], Store]


@pytest.fixture(params=["hash", "file", "tcp", "prefix", "torch"])
def handles(request: pytest.FixtureRequest, tmp_path) -> Iterator[Handles]:
    """``make()`` returns a new handle onto the one store under test."""
    made: list[Store] = []
    closers: list[Callable[[], None]] = []
    kind = request.param
    if kind == "hash":
        shared = HashStore(timeout=5)

        def make() -> Store:
            return shared
    elif kind == "file":
        def make() -> Store:
            made.append(FileStore(str(tmp_path / "store"), timeout=5))
            return made[-1]
    elif kind in ("tcp", "prefix"):
        server = TCPStoreServer("127.0.0.1", 0, SECRET)
        closers.append(server.close)

        def make() -> Store:
            made.append(TCPStore("127.0.0.1", server.port, SECRET, timeout=5))
            return PrefixStore("ns", made[-1]) if kind == "prefix" else made[-1]
    else:
        dist = pytest.importorskip("torch.distributed")
        from tensorcomm.rendezvous import discover
        from tensorcomm.rendezvous.torch_store import TorchStore

        master = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=datetime.timedelta(seconds=5))

        def make() -> Store:
            client = dist.TCPStore("127.0.0.1", master.port, 1, is_master=False,
                                   timeout=datetime.timedelta(seconds=5))
            return TorchStore(client, 5, discover({}))
    yield make
    for store in made:
        store.close()
    for close in closers:
        close()


def test_unset_key_counts_as_empty(handles: Handles) -> None:
    store = handles()
    assert store.compare_set("k", b"other", b"v") == b""  # unset, expected differs: nothing set
    assert not store.check(["k"])
    assert store.compare_set("k", b"", b"first") == b"first"
    assert store.get("k") == b"first"


def test_only_the_expected_value_is_replaced(handles: Handles) -> None:
    store = handles()
    store.set("k", b"a")
    assert store.compare_set("k", b"b", b"c") == b"a"
    assert store.compare_set("k", b"", b"c") == b"a"
    assert store.compare_set("k", b"a", b"c") == b"c"
    assert handles().get("k") == b"c"


def test_concurrent_proposers_agree_on_one_winner(handles: Handles) -> None:
    stores = [handles() for _ in range(6)]
    results: list[bytes] = [b""] * len(stores)
    start = threading.Barrier(len(stores))

    def propose(i: int) -> None:
        start.wait()
        results[i] = stores[i].compare_set("decision", b"", f"proposal {i}".encode())

    threads = [threading.Thread(target=propose, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(set(results)) == 1 and results[0].startswith(b"proposal "), results
    assert handles().get("decision") == results[0]


def test_a_store_without_it_says_so() -> None:
    class Minimal(HashStore):
        compare_set = Store.compare_set

    with pytest.raises(NotImplementedError, match=r"Minimal has no compare_set; Group\.shrink"):
        Minimal().compare_set("k", b"", b"v")


def test_torch_store_over_tensorcomm_store_forwards_it() -> None:
    pytest.importorskip("torch")
    from tensorcomm.torch import _TorchOverTcStore

    store = _TorchOverTcStore(PrefixStore("torch/0", HashStore(timeout=5)), "127.0.0.1", 1)
    assert store.compare_set("k", "", "first") == b"first"
    assert store.compare_set("k", "", "second") == b"first"
    assert store.compare_set("k", b"first", b"third") == b"third"
