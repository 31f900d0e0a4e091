"""Ray actors as tensorcomm ranks (``pip install 'tensorcomm[ray]'``).

From the driver, ``init_group(actors)`` makes the actors one tensorcomm job (actor ``i`` is rank
``i``); inside their methods the usual API works (``tc.all_reduce(x)``, groups, ``tc.torch``...).
The ranks meet through Ray itself: a store served by a Ray actor (``store.StoreServer``), so no
port has to be opened for the rendezvous, and the job secret travels only in Ray's actor calls
(never in a command line, an environment variable or a log). Data then moves as in any
tensorcomm job: shared memory between actors on one node, tensorcomm's TCP between nodes. An
actor that dies is a ``PeerLostError`` naming its rank on the others, as for any rank.

Also: ``register_collective_backend()`` makes tensorcomm a backend of ``ray.util.collective``
(``backend="tensorcomm"``), and ``setup_torch_backend`` is a ``worker_process_setup_hook`` that
registers the ``tensorcomm`` torch backend in Ray's workers. docs/ray.md says what each does and
what Ray Train's ``TorchTrainer`` does with it.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import ray

from .. import config
from ..core import lifecycle
from .store import RayStore, StoreServer

__all__ = ["init_group", "destroy_group", "register_collective_backend", "setup_torch_backend",
           "RayStore", "StoreServer"]


def _join(actor: object, store: RayStore, rank: int, size: int, timeout: float) -> None:
    lifecycle.init(store=store, rank=rank, world_size=size, timeout=timeout, secret=store.secret())


def _leave(actor: object) -> None:
    lifecycle.destroy()


def _check_actors(actors: Sequence[Any]) -> list[Any]:
    if isinstance(actors, (str, bytes)) or not isinstance(actors, Sequence) or not actors:
        raise TypeError(f"actors: expected a non-empty list of Ray actor handles, got "
                        f"{type(actors).__name__}" + ("" if actors else " (empty)"))
    for index, actor in enumerate(actors):
        if not isinstance(actor, ray.actor.ActorHandle):
            raise TypeError(f"actors[{index}]: expected a Ray actor handle, got {type(actor).__name__}")
    ids = [actor._ray_actor_id for actor in actors]
    if len(set(ids)) != len(ids):
        first = next(i for i, actor_id in enumerate(ids) if ids.count(actor_id) > 1)
        raise ValueError(f"actors: actor {first} appears more than once; each actor is one rank")
    return list(actors)


def init_group(actors: Sequence[Any], *, timeout: float | datetime.timedelta | None = None) -> None:
    """Make ``actors`` one tensorcomm job: actor ``i`` calls ``tensorcomm.init`` as rank ``i``.

    Call it from the driver (or any process holding the handles); it returns once every actor
    has joined. The store actor it starts lives as long as the actors' worlds.

    Args:
        actors: Ray actor handles, one per rank; each actor's process may be in one tensorcomm
            job at a time.
        timeout: bounds every tensorcomm call in the actors, joining included (seconds or a
            ``timedelta``; default ``TENSORCOMM_TIMEOUT``, else 300 s).

    Raises:
        TypeError / ValueError: ``actors`` is not a list of distinct actor handles, or a bad
            timeout.
        Exception: the first actor's failure to join (as Ray re-raises it, e.g.
            ``RendezvousError``, or ``RuntimeError`` when the actor already is in a job); the
            others then fail at once too.
    """
    members = _check_actors(actors)
    seconds = lifecycle._seconds(timeout, config.DEFAULT_TIMEOUT)
    store = RayStore.create(seconds)
    pending = [actor.__ray_call__.remote(_join, store, rank, len(members), seconds)
               for rank, actor in enumerate(members)]
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            ray.get(done[0])
    except BaseException:
        store.stop()  # the actors still waiting on it fail now, not at their timeout
        raise


def destroy_group(actors: Sequence[Any]) -> None:
    """Call ``tensorcomm.destroy()`` in every actor of ``actors`` that is still alive.

    Raises:
        TypeError / ValueError: as ``init_group``.
    """
    for ref in [actor.__ray_call__.remote(_leave) for actor in _check_actors(actors)]:
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError:
            pass  # a dead actor has nothing left to destroy


def register_collective_backend() -> None:
    """Register tensorcomm as the ``"tensorcomm"`` backend of ``ray.util.collective``.

    Ray needs it registered in every process that uses the backend: the driver and each actor
    (before ``init_collective_group``). Registering twice in a process is a no-op.
    """
    from .collective import register

    register()


def setup_torch_backend() -> None:
    """Register the ``tensorcomm`` torch.distributed backend in this process; meant as Ray's
    ``runtime_env={"worker_process_setup_hook": "tensorcomm.ray.setup_torch_backend"}``."""
    import tensorcomm.torch  # noqa: F401 - registers the backend on import
