"""``import tensorcomm.torch``: tensorcomm as a torch.distributed backend.

    import tensorcomm.torch
    torch.distributed.init_process_group(backend="tensorcomm")
    model = torch.nn.parallel.DistributedDataParallel(model)

Works under ``tensorcomm run`` and under torchrun (or with ``init_method``/``store`` given by
hand), on CPU tensors. Importing this module:

- registers the backend ``"tensorcomm"`` for CPU tensors, whose groups are
  ``ProcessGroupTensorcomm`` objects (the first one starts tensorcomm, on torch's store, unless
  ``tensorcomm.init()`` was called already; destroying it ends what it started);
- registers the tensorcomm rendezvous scheme ``torchstore://``, through which the backend starts
  tensorcomm on the store torch hands it (so no second port is needed under torchrun);
- teaches torch's ``env://`` rendezvous about ``tensorcomm run``: the launcher already serves
  tensorcomm's (authenticated) store at ``MASTER_ADDR:MASTER_PORT``, where torch would try to
  start its own, so when the environment says so (``TENSORCOMM_STORE_HOSTED=1``) torch gets a
  store that speaks to the launcher's. Any backend benefits, Gloo included; elsewhere torch's
  own ``env://`` runs unchanged.

The job secret is ``TENSORCOMM_SECRET`` when set (``tensorcomm run`` sets it). Otherwise rank 0
makes one and hands it to the other ranks through a private file on this host
(``rendezvous.init_method.secret_via_store``): never through torch's store, which any local user
can read (torch's TCPStore does not authenticate its clients). Ranks on several hosts need
``TENSORCOMM_SECRET``.
"""

from __future__ import annotations

import datetime
import importlib
import itertools
import threading
import urllib.parse
from typing import Any, Iterator, Sequence

import torch.distributed as dist

from .core import world as core_world
from .errors import CommTimeoutError
from .frontends.torch_backend import BACKEND_NAME, ProcessGroupTensorcomm, TensorcommWork
from .rendezvous import JobInfo, Rendezvous, Store, TCPStore, discover, register_scheme, rendezvous
from .rendezvous.init_method import TORCHRUN_SCHEME, resolve_ranks, secret_via_store
from .rendezvous.store import check_key, check_keys, check_value

__all__ = ["BACKEND_NAME", "ProcessGroupTensorcomm", "TensorcommWork"]

_SCHEME = "torchstore"
_JOINS_KEY = "tensorcomm/joins"


class _OverTorchStore(Store):
    """tensorcomm's Store interface on a torch ``Store`` (which keeps owning it)."""

    def __init__(self, store: dist.Store, prefix: str, timeout: float) -> None:
        super().__init__(timeout)
        self._store, self._prefix = store, prefix
        self.host, self.port = _address_of(store)  # read by the core to pick its listen address

    def set(self, key: str, value: bytes) -> None:
        self._store.set(self._prefix + check_key(key), check_value(value))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        self.wait([key], timeout)
        return self._store.get(self._prefix + key)

    def add(self, key: str, amount: int) -> int:
        return self._store.add(self._prefix + check_key(key), amount)

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        seconds = self._timeout(timeout)
        try:
            self._store.wait([self._prefix + k for k in check_keys(keys)],
                             datetime.timedelta(seconds=seconds))
        except dist.DistStoreError as exc:
            raise CommTimeoutError(f"store wait for {list(keys)} did not complete within "
                                   f"{seconds:g} s: {exc}") from exc

    def check(self, keys: Sequence[str]) -> bool:
        return self._store.check([self._prefix + k for k in check_keys(keys)])

    def delete(self, key: str) -> bool:
        return self._store.delete_key(self._prefix + check_key(key))

    def close(self) -> None:
        pass  # torch owns the store


class _TorchOverTcStore(dist.Store):
    """A torch ``Store`` that talks to tensorcomm's launcher-hosted store (a ``TCPStore`` client)."""

    def __init__(self, store: TCPStore) -> None:
        super().__init__()
        self._store = store
        self.host, self.port = store.host, store.port

    def set(self, key: str, value: bytes | str) -> None:
        self._store.set(key, value)

    def get(self, key: str) -> bytes:
        return self._store.get(key)

    def add(self, key: str, value: int) -> int:
        return self._store.add(key, value)

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        self._store.wait(keys, None if timeout is None else max(timeout.total_seconds(), 0.0))

    def check(self, keys: list[str]) -> bool:
        return self._store.check(keys)

    def delete_key(self, key: str) -> bool:
        return self._store.delete(key)

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        raise RuntimeError("tensorcomm's store has no compare-and-set; torch elastic features that "
                           "need it are not available under `tensorcomm run`")

    def num_keys(self) -> int:
        raise RuntimeError("tensorcomm's store does not count its keys")


def _address_of(store: dist.Store) -> tuple[str, int]:
    """Where the job's store listens: the underlying TCP store's address, else MASTER_ADDR."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    host, port = getattr(store, "host", None), getattr(store, "port", None)
    if host is None:
        info = discover()
        host, port = info.master_addr or "127.0.0.1", info.master_port
    return host, port or 1


# torchstore://<token>: the token names a torch store handed over by the backend's creator.
_handover: dict[str, tuple[dist.Store, int]] = {}
_tokens = itertools.count()
_handover_lock = threading.Lock()


def _torchstore_handler(url: str, rank: int | None, world_size: int | None, timeout: float,
                        info: JobInfo) -> Rendezvous:
    token = url.partition("://")[2]
    with _handover_lock:
        if token not in _handover:
            raise ValueError(f"{_SCHEME}://: {url!r} names no store; this scheme is used by the "
                             f"torch backend only")
        store, generation = _handover.pop(token)
    assert rank is not None and world_size is not None  # the creator always passes them
    bridge = _OverTorchStore(store, f"tensorcomm/{generation}/", timeout)
    secret, secret_file = secret_via_store(f"{_SCHEME}://", bridge, bridge.host, rank, info, timeout)
    return Rendezvous(bridge, rank, world_size, info.local_rank, info.host_id, secret,
                      secret_file=secret_file)


def _torchrun_handler(url: str, rank: int | None, world_size: int | None, timeout: float,
                      info: JobInfo) -> Rendezvous:
    """``env://`` under torchrun: tensorcomm's keys go in torchrun's agent store, as a client."""
    assert info.master_addr is not None and info.master_port is not None  # checked by env://
    rank, world_size = resolve_ranks("env://", rank, world_size, info)
    store = dist.TCPStore(info.master_addr, info.master_port, world_size, is_master=False,
                          timeout=datetime.timedelta(seconds=timeout))
    generation = (store.add(_JOINS_KEY, 1) - 1) // world_size
    with _handover_lock:
        token = str(next(_tokens))
        _handover[token] = (store, generation)
    return _torchstore_handler(f"{_SCHEME}://{token}", rank, world_size, timeout, info)


def _start_world(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> None:
    # Every init of a group on this store adds 1 per rank: the quotient tells this init apart
    # from earlier ones (destroy + init again), whose keys are still in the store.
    generation = (store.add(_JOINS_KEY, 1) - 1) // size
    with _handover_lock:
        token = str(next(_tokens))
        _handover[token] = (store, generation)
    try:
        core_world.init(f"{_SCHEME}://{token}", rank=rank, world_size=size, timeout=timeout)
    finally:
        with _handover_lock:
            _handover.pop(token, None)


# The torch global ranks of the tensorcomm world's members while a group made here started it
# (that group may be a torch subgroup); None when tensorcomm was started by the user.
_started_for: tuple[int, ...] | None = None


def _create(opts: Any, _backend_options: Any) -> ProcessGroupTensorcomm:
    """torch's backend creator (extended API): build the group torch asks for."""
    global _started_for
    size, rank = opts.group_size, opts.group_rank
    ranks = tuple(opts.global_ranks_in_group) or tuple(range(size))
    if not core_world.is_initialized():
        _start_world(opts.store, rank, size, opts.timeout)
        _started_for = ranks

        def finish() -> None:
            global _started_for
            _started_for = None
            core_world.destroy()

        return ProcessGroupTensorcomm(core_world.current_world().world_group, finish)
    world = core_world.current_world()
    members = _started_for or tuple(range(world.size))
    if ranks == members:
        if (world.size, world.rank) != (size, rank):
            raise ValueError(f"tensorcomm backend: torch's group (rank {rank} of {size}) does not "
                             f"match the running tensorcomm world (rank {world.rank} of {world.size})")
        return ProcessGroupTensorcomm(world.world_group)
    missing = [r for r in ranks if r not in members]
    if missing:
        raise ValueError(f"tensorcomm backend: ranks {missing} are outside the tensorcomm world "
                         f"(torch global ranks {list(members)})")
    return ProcessGroupTensorcomm(world.new_group([members.index(r) for r in ranks]))


# The module, not the function torch.distributed re-exports under the same name.
_torch_rendezvous = importlib.import_module("torch.distributed.rendezvous")
_torch_env_handler = _torch_rendezvous._rendezvous_handlers["env"]
_env_stores: list[dist.Store] = []  # one per init_process_group under tensorcomm run


def _env_handler(url: str, timeout: datetime.timedelta = dist.default_pg_timeout,
                 **kwargs: Any) -> Iterator[tuple[dist.Store, int, int]]:
    """torch's ``env://``, except under ``tensorcomm run``: then connect to the launcher's store."""
    if not discover().store_hosted:
        yield from _torch_env_handler(url, timeout=timeout, **kwargs)
        return
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
    rank = int(query["rank"]) if "rank" in query else None
    world_size = int(query["world_size"]) if "world_size" in query else None
    rdzv = rendezvous("env://", rank, world_size, timeout.total_seconds())
    assert isinstance(rdzv.store, TCPStore)  # the launcher hosts it: this process is a client
    store = _TorchOverTcStore(rdzv.store)
    # torch keeps only the C++ half of a Python store; without this reference the Python half is
    # collected and torch's calls into it fail ("pure virtual function").
    _env_stores.append(store)
    yield store, rdzv.rank, rdzv.world_size
    raise RuntimeError("env:// under tensorcomm run cannot re-rendezvous")


def _install() -> None:
    register_scheme(_SCHEME, _torchstore_handler)
    register_scheme(TORCHRUN_SCHEME, _torchrun_handler)
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu"])
    # torch offers no public way to extend a registered scheme; replacing its entry keeps the
    # original handler for every case but a tensorcomm-hosted store.
    _torch_rendezvous._rendezvous_handlers["env"] = _env_handler


_install()
