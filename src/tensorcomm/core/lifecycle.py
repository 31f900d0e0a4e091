"""The process's place in a job: ``init()`` makes the current ``World``, ``destroy()`` ends it.

Process-wide state lives here: the current world, the count of worlds this process joined, and a
fork hook; everything a world owns (groups and their plans, transports, shared memory) goes with
it at ``destroy()``. Other modules keep state for the life of the process: the ``init_method``
scheme registry (``rendezvous.init_method``), the adapter found for plain ndarrays
(``frontends.arrays``), the MPI backend's failure note and exit hook (``transports.mpi.comm``)
and, once imported, ``tensorcomm.torch``'s registrations with torch (its backend and ``env://``
handler) and the world it started for torch.

Generations: a job may ``destroy()`` and ``init()`` again. When rank 0 hosts the store
(``env://`` or ``tcp://`` without a launcher) each world has a fresh store on the same port; the
other ranks then check that the store they reached is not the previous world's (rank 0 marks each
store with its generation) and retry until the new one is up.

A process forked from a rank after ``init()`` shares its sockets and shared memory: its copies
of every group refuse calls (``RuntimeError``), so it can never answer a peer in the parent's
place; it may ``init()`` a world of its own.
"""

from __future__ import annotations

import datetime
import os
import sys
import threading
import time
from collections.abc import Hashable

from .. import config, trace
from ..algorithms.base import Plan
from ..errors import AuthenticationError, RendezvousError
from ..rendezvous.init_method import Rendezvous, from_store, meets_through_mpi, rendezvous
from ..rendezvous.store import Store
from .collectives import barrier
from .group import Group, Inside
from .world import World

SERVER_KEY = "tensorcomm/server"  # on a store rank 0 hosts: the generation it was made for

_current: World | None = None
_current_lock = threading.Lock()
_worlds_made = 0  # worlds this process joined; rank 0 marks its stores with it


def _backend(backend: str | None, default: str) -> str:
    if backend is None:
        return default
    if not isinstance(backend, str) or backend.lower() not in config.BACKENDS:
        raise ValueError(f"init: backend must be one of {', '.join(map(repr, config.BACKENDS))}, "
                         f"got {backend!r}")
    return backend.lower()


def _seconds(timeout: float | datetime.timedelta | None, default: float) -> float:
    if timeout is None:
        return min(default, config.MAX_TIMEOUT)
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout: expected seconds (a number) or a datetime.timedelta, "
                        f"got {type(timeout).__name__}")
    if not timeout > 0:  # also NaN
        raise ValueError(f"timeout: must be positive, got {timeout}")
    # Longer ones (``timedelta.max`` meaning "never") are cut to what every wait accepts.
    return min(float(timeout), config.MAX_TIMEOUT)


def _after_fork_in_child() -> None:
    global _current
    world, _current = _current, None
    if world is not None:
        world._inherited()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _stale_store(rdzv: Rendezvous, generation: int) -> bool:
    """Whether the store rank 0 hosts is still the previous world's (about to close)."""
    store = rdzv.store
    if rdzv.server is not None:
        store.set(SERVER_KEY, str(generation).encode())
        return False
    if not store.check([SERVER_KEY]):  # a launcher's or torch's store, or rank 0's, not marked yet
        return False
    return int(store.get(SERVER_KEY)) < generation


def _meet(init_method: str | None, rank: int | None, world_size: int | None,
          seconds: float) -> Rendezvous:
    """``rendezvous``, retried while the store reached is the one of an earlier world.

    After an earlier world, a connection that broke is retried too: it met the previous world's
    store as it closed (which looks like a rejection: a server rejects by closing).
    """
    deadline = time.monotonic() + seconds
    while True:
        try:
            rdzv = rendezvous(init_method, rank, world_size, max(0.1, deadline - time.monotonic()))
            try:
                if not _stale_store(rdzv, _worlds_made):
                    return rdzv
            except BaseException:
                rdzv.close()
                raise
            rdzv.close()
        except (AuthenticationError, RendezvousError) as exc:
            broke = isinstance(exc.__cause__ or exc.__context__, OSError)
            if not _worlds_made or not broke or time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise RendezvousError("init: rank 0's store still belongs to the previous world (did "
                                  "rank 0 call destroy() and init() again?)")
        time.sleep(0.05)


def init(init_method: str | None = None, rank: int | None = None, world_size: int | None = None,
         timeout: float | datetime.timedelta | None = None, *, store: Store | None = None,
         secret: str | bytes | None = None, backend: str | None = None,
         keep_going: bool | None = None) -> None:
    """Join the job: rendezvous, connect to every rank, create the world group.

    Args:
        init_method: ``env://`` (default: read the launcher's environment), ``tcp://host:port``
            or ``file:///path``. Under mpirun/mpiexec (or srun with PMI/PMIx) without
            ``MASTER_ADDR``, the ranks meet through MPI when mpi4py is installed; under srun
            alone at the first host of the node list; with no launcher at all, the world is
            this one process (docs/env.md).
        rank: this process's global rank (default: from the environment).
        world_size: number of ranks (default: from the environment).
        timeout: seconds (or a ``timedelta``) that bounds every blocking call once the job has
            assembled. Assembling (meeting at the store, every rank's join, the links made at
            init) waits up to ``TENSORCOMM_JOIN_TIMEOUT`` seconds instead, by default the longer
            of this and 900 s, since the ranks of a large job may start minutes apart.
        store: meet on this ``tensorcomm.rendezvous.Store`` instead of an ``init_method``, as
            torch's ``init_process_group(store=...)`` does; ``rank`` and ``world_size`` are then
            required.
        secret: the job secret (default: ``TENSORCOMM_SECRET``, else one generated and handed
            to the ranks of this host in a private file); with ``store`` only.
        backend: ``"tensorcomm"`` (its own TCP mesh between hosts) or ``"mpi"`` (MPI through
            mpi4py; the ranks are MPI's, and without ``init_method`` or ``store`` rank 0 serves
            the store and MPI hands its address and the secret to the others); default
            ``TENSORCOMM_BACKEND``, else ``"tensorcomm"``. See docs/mpi.md.
        keep_going: a failed call leaves each in-place array untouched or complete
            (docs/semantics.md says what that costs), for jobs that shrink and go on after a failure
            (docs/elastic.md); default ``TENSORCOMM_KEEP_GOING``, which ``tensorcomm run
            --keep-going`` sets, else False: the arrays of a failed call are unspecified.

    Raises:
        RuntimeError: already initialised.
        RendezvousError: the job could not assemble within the join timeout.
        AuthenticationError: a connection failed the job-secret challenge.
        ImportError: ``backend="mpi"`` without mpi4py (the message says how to install it).
    """
    global _current, _worlds_made
    with _current_lock:
        if _current is not None:
            raise RuntimeError("tensorcomm is already initialized; call destroy() first")
        from ..rendezvous.discovery import discover

        info = discover()
        if info.msrun_scheduler:
            # msrun runs the script in its scheduler process too; it is no rank, and its work
            # (MindSpore's scheduler, for a script that calls MindSpore's init() first) is done.
            print("tensorcomm: msrun's scheduler process (MS_ROLE=MS_SCHED) is not a rank; it ends "
                  "here", file=sys.stderr, flush=True)
            raise SystemExit(0)
        seconds = _seconds(timeout, info.timeout or config.DEFAULT_TIMEOUT)
        joining = info.join_timeout or max(seconds, config.DEFAULT_JOIN_TIMEOUT)
        chosen = _backend(backend, info.backend)
        if keep_going is not None and not isinstance(keep_going, bool):
            raise TypeError(f"init: keep_going must be a bool or None, got {type(keep_going).__name__}")
        if store is not None:
            if init_method is not None:
                raise ValueError("init: pass either init_method or store, not both")
            rdzv = from_store(store, rank, world_size, joining, secret)
        elif secret is not None:
            raise ValueError("init: secret= goes with store=; otherwise set TENSORCOMM_SECRET")
        elif ((chosen == "mpi" and init_method is None)
              or (init_method in (None, "env://") and meets_through_mpi(info))):
            # Under mpirun without MASTER_ADDR: rank 0 serves the store, MPI hands out where.
            from ..transports.mpi.join import rendezvous as mpi_rendezvous

            rdzv = mpi_rendezvous(rank, world_size, joining)
        else:
            rdzv = _meet(init_method, rank, world_size, joining)
        try:
            _current = World(rdzv, seconds, info.transport, chosen, info.hierarchy, info.algorithms,
                             info.keep_going if keep_going is None else keep_going, info.cma, joining,
                             info.learn)
        except BaseException:
            rdzv.close()
            raise
        _worlds_made += 1
    world = _current
    trace.on_init(world.rank, world.size, lambda: barrier(world.world_group, False))  # collective


def destroy(group: Group | None = None) -> None:
    """Leave the job: fail pending calls, close every connection. A no-op if not initialised.

    With a ``group`` other than the world, destroy only that group (``Group.destroy``), as
    ``torch.distributed.destroy_process_group(group)`` does.
    """
    global _current
    if group is not None:
        if not isinstance(group, Group):
            raise TypeError(f"destroy: group must be a tensorcomm.Group or None, got {type(group).__name__}")
        world = _current
        if world is not None and group._target() is not world.world_group:
            group.destroy()
            return
    trace.on_destroy()
    with _current_lock:
        world, _current = _current, None
    if world is not None:
        world.close()


def is_initialized() -> bool:
    """Whether ``init()`` has been called and ``destroy()`` not yet."""
    return _current is not None


def current_world() -> World:
    """The current world.

    Raises:
        RuntimeError: ``init()`` has not been called.
    """
    world = _current
    if world is None:
        raise RuntimeError("tensorcomm is not initialized: call tensorcomm.init() first")
    return world


class _WorldHandle(Group):
    """``tensorcomm.WORLD``: the world group of whichever ``init()`` is current, so it can be
    imported before ``init()``."""

    def __init__(self) -> None:  # no state of its own
        pass

    def _target(self) -> Group:
        return current_world().world_group

    # Group._plans is a plain attribute (read on every call) that is never reassigned; the
    # handle reads the current world group's.
    @property
    def _plans(self) -> dict[Hashable, Plan]:  # type: ignore[override]
        return self._target()._plans

    @property
    def _world(self) -> World:  # type: ignore[override]
        return current_world()  # the world group's world

    @property
    def _inside(self) -> Inside:  # type: ignore[override]
        return self._target()._inside

    @property
    def _group_id(self) -> int:  # type: ignore[override]
        return self._target()._group_id

    def __repr__(self) -> str:
        return "tensorcomm.WORLD"


WORLD: Group = _WorldHandle()
