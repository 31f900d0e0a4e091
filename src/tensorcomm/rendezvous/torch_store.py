"""Meet on a torch ``Store``: the store torch hands a process-group backend, or torchrun's.

``TorchStore`` gives a torch ``Store`` tensorcomm's ``Store`` interface, so ``init(store=...)``
can meet on it (``rendezvous.init_method.from_store``: generations, and a generated secret that
never enters the store). The torch backend wraps the store torch passes it; ``env://`` under
torchrun meets on ``torchrun_store``, a client of the agent store that holds ``MASTER_PORT``, so
a plain numpy script calling ``tensorcomm.init()`` runs under torchrun too.

The agent's store outlives the workers: when torchrun restarts them (``--max-restarts``) the new
attempt finds the keys of the one that failed. Each attempt therefore meets under a namespace of
its own, ``tensorcomm/attempt_<TORCHELASTIC_RESTART_COUNT>``, as torch's own ``env://`` does
(counting arrivals alone would put the first rank of a new attempt into the old generation
whenever a rank of the failed attempt had died before it arrived).

Imports torch, which only this module of the rendezvous layer does; ``init_method`` imports it
only under torchrun, which implies torch is installed. Imports ``store``, ``discovery`` and
``errors``.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import torch.distributed as dist

from tensorcomm.errors import CommTimeoutError
from tensorcomm.rendezvous.discovery import JobInfo
from tensorcomm.rendezvous.store import Store, check_key, check_keys, check_value

ATTEMPT_PREFIX = "tensorcomm/attempt_"  # + TORCHELASTIC_RESTART_COUNT: one namespace per attempt


class TorchStore(Store):
    """tensorcomm's Store interface on a torch ``Store``, which keeps belonging to torch.

    ``host``/``port`` say where the underlying TCP store listens (the core binds its own
    sockets on the interface that reaches it); for a store that is not TCP, ``info``'s
    ``MASTER_ADDR``/``MASTER_PORT``, else loopback. The store is ``foreign`` (anyone who can
    connect may read and write torch's), unless torch's store is one over tensorcomm's own
    (it has ``tensorcomm_owned``, as ``tensorcomm.torch`` makes under ``tensorcomm run``);
    ``namespace`` names where in torch's store ``store`` keeps its keys, when known (torch does
    not tell a ``PrefixStore``'s prefix).

    Args:
        store: the torch store.
        timeout: default seconds for ``get``/``wait``.
        info: the job's environment (for the address of a store that is not TCP).
        namespace: see above.
    """

    def __init__(self, store: dist.Store, timeout: float, info: JobInfo, namespace: str = "") -> None:
        super().__init__(timeout)
        self._store = store
        self.host, self.port = _address_of(store, info)
        self.namespace = namespace
        self.foreign = not getattr(_innermost(store), "tensorcomm_owned", False)

    def set(self, key: str, value: bytes) -> None:
        # torch's stub says str; the binding takes bytes (a std::string) as well.
        self._store.set(check_key(key), check_value(value))  # type: ignore[arg-type]

    def get(self, key: str, timeout: float | None = None) -> bytes:
        self.wait([key], timeout)
        return self._store.get(key)

    def add(self, key: str, amount: int) -> int:
        return self._store.add(check_key(key), amount)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        key, expected, desired = check_key(key), check_value(expected), check_value(desired)
        if expected and not self._store.check([key]):
            # torch answers ``expected`` for an unset key, tensorcomm's rule b"". A key seen set
            # here stays set: tensorcomm never deletes the keys it compare-sets.
            return b""
        return bytes(self._store.compare_set(key, expected, desired))  # type: ignore[arg-type]  # as in set

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        seconds = self._timeout(timeout)
        try:
            self._store.wait(list(check_keys(keys)), datetime.timedelta(seconds=seconds))
        except dist.DistStoreError as exc:
            raise CommTimeoutError(f"store wait for {list(keys)} did not complete within "
                                   f"{seconds:g} s: {exc}") from exc

    def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        self.wait(keys, timeout)
        return [bytes(value) for value in self._store.multi_get(list(keys))]

    def check(self, keys: Sequence[str]) -> bool:
        return self._store.check(list(check_keys(keys)))

    def delete(self, key: str) -> bool:
        return self._store.delete_key(check_key(key))

    def close(self) -> None:
        pass  # torch owns the store


def _innermost(store: dist.Store) -> dist.Store:
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store


def _address_of(store: dist.Store, info: JobInfo) -> tuple[str, int]:
    store = _innermost(store)
    host, port = getattr(store, "host", None), getattr(store, "port", None)
    if host is None:
        host, port = info.master_addr or "127.0.0.1", info.master_port
    return host, port or 1


def torchrun_store(world_size: int, timeout: float, info: JobInfo) -> TorchStore:
    """A client of torchrun's agent store at ``MASTER_ADDR:MASTER_PORT``, in the namespace of
    this attempt (``TORCHELASTIC_RESTART_COUNT``)."""
    assert info.master_addr is not None and info.master_port is not None  # checked by env://
    client = dist.TCPStore(info.master_addr, info.master_port, world_size, is_master=False,
                           timeout=datetime.timedelta(seconds=timeout))
    namespace = f"{ATTEMPT_PREFIX}{info.restart_count}"
    return TorchStore(dist.PrefixStore(namespace, client), timeout, info, namespace)
