"""``import tensorcomm.torch``: tensorcomm as a torch.distributed backend.

    import tensorcomm.torch
    torch.distributed.init_process_group(backend="tensorcomm")
    model = torch.nn.parallel.DistributedDataParallel(model)

Scripts need not import it: installing tensorcomm registers the backend name with torch through
torch's plug-in entry point (``tensorcomm_autoload``), which imports this module when torch builds
the first such group, or at ``import torch`` under ``tensorcomm run``.

Works under ``tensorcomm run`` and under torchrun (or with ``init_method``/``store`` given by
hand), on CPU tensors. Importing this module:

- registers the backend ``"tensorcomm"`` for CPU tensors, whose groups are
  ``ProcessGroupTensorcomm`` objects. The first one starts tensorcomm on the store torch hands
  the backend (``tensorcomm.init(store=...)``, so torchrun needs no second port), unless
  ``tensorcomm.init()`` was called already; destroying it ends what it started;
- teaches torch's ``env://`` rendezvous about ``tensorcomm run``: the launcher already serves
  tensorcomm's (authenticated) store at ``MASTER_ADDR:MASTER_PORT``, where torch would try to
  start its own, so when the environment says so (``TENSORCOMM_STORE_HOSTED=1``) torch gets a
  store that speaks to the launcher's. Any backend benefits, Gloo included; elsewhere torch's
  own ``env://`` runs unchanged. torch has no public way to extend a registered scheme, so this
  replaces its ``env`` entry (with one that calls the original in every other case).

The job secret is ``TENSORCOMM_SECRET`` when set (``tensorcomm run`` sets it). Otherwise rank 0
makes one and hands it to the other ranks through a private file on this host
(``rendezvous.init_method.secret_via_store``): never through torch's store, which any local user
can read (torch's TCPStore does not authenticate its clients). Ranks on several hosts need
``TENSORCOMM_SECRET``. For the same reason tensorcomm's rendezvous keys go to a store rank 0
serves, announced in torch's with a MAC (``rendezvous.own_store``).
"""

from __future__ import annotations

import datetime
import importlib
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist

from .config import MAX_TIMEOUT
from .core import lifecycle
from .frontends.torch_backend import BACKEND_NAME, ProcessGroupTensorcomm
from .frontends.torch_c10d import warn_if_untested
from .frontends.torch_work import TensorcommWork
from .rendezvous import PrefixStore, Store, TCPStore, discover, rendezvous, secret_bytes
from .rendezvous.torch_store import TorchStore

__all__ = ["BACKEND_NAME", "ProcessGroupTensorcomm", "TensorcommWork"]


def _bytes(value: bytes | str) -> bytes:
    """torch hands a store str or bytes; tensorcomm's stores keep bytes (str as UTF-8)."""
    return value.encode() if isinstance(value, str) else value


class _TorchOverTcStore(dist.Store):
    """A torch ``Store`` over tensorcomm's launcher-hosted store (``store``, a namespace of a
    ``TCPStore`` client of the store listening at ``host:port``; ``connect()`` makes another
    such client, for ``clone``)."""

    tensorcomm_owned = True  # authenticated: TorchStore may keep tensorcomm's keys here

    def __init__(self, store: Store, host: str, port: int,
                 connect: Callable[[], Store] | None = None) -> None:
        super().__init__()
        self._store = store
        self._connect = connect
        self.host, self.port = host, port

    def clone(self) -> _TorchOverTcStore:
        """The same namespace over a connection of its own, as torch's ``TCPStore.clone`` gives
        (Gloo's ``split_group`` asks for one).

        Raises:
            RuntimeError: made without ``connect``.
        """
        if self._connect is None:
            raise RuntimeError("this store cannot open another connection (made without connect)")
        twin = _TorchOverTcStore(self._connect(), self.host, self.port, self._connect)
        _env_stores.append(twin)  # torch keeps only the C++ half: see _env_handler
        return twin

    def set(self, key: str, value: bytes | str) -> None:
        self._store.set(key, _bytes(value))

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
        return self._store.compare_set(key, _bytes(expected), _bytes(desired))

    def num_keys(self) -> int:
        raise RuntimeError("tensorcomm's store does not count its keys")


# The torch global ranks of the tensorcomm world's members while a group made here started it
# (that group may be a torch subgroup); None when tensorcomm was started by the user.
_started_for: tuple[int, ...] | None = None


def create_backend(opts: Any, _backend_options: Any) -> ProcessGroupTensorcomm:
    """torch's backend creator (extended API): build the group torch asks for."""
    global _started_for
    warn_if_untested()
    size, rank = opts.group_size, opts.group_rank
    ranks = tuple(opts.global_ranks_in_group) or tuple(range(size))
    if not lifecycle.is_initialized():
        seconds = opts.timeout.total_seconds()
        seconds = MAX_TIMEOUT if seconds <= 0 else min(seconds, MAX_TIMEOUT)  # <= 0: no timeout
        lifecycle.init(store=TorchStore(opts.store, seconds, discover()), rank=rank,
                        world_size=size, timeout=seconds)
        _started_for = ranks

        def finish() -> None:
            global _started_for
            _started_for = None
            lifecycle.destroy()

        return ProcessGroupTensorcomm(lifecycle.current_world().world_group, finish)
    world = lifecycle.current_world()
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


_TORCH_INITS_KEY = "torch/inits"  # in the launcher's store: init_process_group calls, all ranks

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
    client = rdzv.store
    secret = discover().secret
    assert isinstance(client, TCPStore) and secret  # the launcher hosts it and sets the secret
    # The launcher's store outlives every init_process_group, but torch's backends expect a
    # fresh one each time: Gloo read the addresses an earlier init had left under the same
    # keys and waited for peers that had gone (benchmarks/ddp_step.py hung). Every rank's n-th
    # init gets namespace n - 1.
    generation = (client.add(_TORCH_INITS_KEY, 1) - 1) // rdzv.world_size
    namespace = f"torch/{generation}"

    def connect() -> Store:  # a connection of a clone's own
        return PrefixStore(namespace, TCPStore(client.host, client.port, secret_bytes(secret),
                                               client.timeout))

    store = _TorchOverTcStore(PrefixStore(namespace, client), client.host, client.port, connect)
    # torch keeps only the C++ half of a Python store; without this reference the Python half is
    # collected and torch's calls into it fail ("pure virtual function").
    _env_stores.append(store)
    yield store, rdzv.rank, rdzv.world_size
    raise RuntimeError("env:// under tensorcomm run cannot re-rendezvous")


def _install() -> None:
    # Registering again is allowed: it replaces the creator ``tensorcomm_autoload`` registered.
    dist.Backend.register_backend(BACKEND_NAME, create_backend, extended_api=True, devices=["cpu"])
    # torch offers no public way to extend a registered scheme; replacing its entry keeps the
    # original handler for every case but a tensorcomm-hosted store.
    _torch_rendezvous._rendezvous_handlers["env"] = _env_handler


_install()
