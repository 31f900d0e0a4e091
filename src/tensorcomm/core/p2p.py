"""Point-to-point send/recv on a group.

These bypass the group's issue-order engine on purpose: an ``irecv`` waiting for its message
must not hold back the ``isend`` issued after it (both ranks would wait forever). Messages are
tagged with the group id and the user's tag, disjoint from every collective's tags.
"""

from __future__ import annotations

import numpy as np

from ..transports.base import ANY_SOURCE, Request, as_bytes, p2p_tag
from .group import Group, inside
from .work import Work


class P2PWork(Work):
    """A ``Work`` over one transport request; ``result()`` is the peer's global rank."""

    def __init__(self, description: str, request: Request, timeout: float,
                 scratch: np.ndarray | None = None, target: np.ndarray | None = None) -> None:
        super().__init__(description)
        self._request = request
        self._timeout = timeout
        self._scratch = scratch
        self._target = target

    def wait(self, timeout: float | None = None) -> bool:
        if not self._completed:
            try:
                source = self._request.wait(self._timeout if timeout is None else timeout)
            except BaseException as exc:
                if self._request.done():  # failed for good, not merely a short wait
                    self._complete(error=exc)
                raise
            if self._scratch is not None and self._target is not None:
                self._target[...] = self._scratch
            self._complete(result=source)
        return super().wait(0)

    def is_completed(self) -> bool:
        return self._completed or self._request.done()


def isend(group: Group, array: np.ndarray, dst: int, tag: int, channel: int = 0) -> P2PWork:
    """Start sending ``array`` to global rank ``dst`` (``channel``: see ``transports.base.p2p_tag``)."""
    group.group_rank(dst)
    its = inside(group)
    world = its.world
    if world.forked is not None:
        raise world.forked
    request = world.transport.isend(dst, as_bytes(np.ascontiguousarray(array)),
                                      p2p_tag(its.group_id, tag, channel))
    return P2PWork(f"send to rank {dst}", request, world.timeout)


def irecv(group: Group, array: np.ndarray, src: int | None, tag: int, channel: int = 0) -> P2PWork:
    """Post a receive into ``array`` from global rank ``src`` (``None``: any member)."""
    peer = ANY_SOURCE if src is None else src
    if src is not None:
        group.group_rank(src)
    its = inside(group)
    world = its.world
    if world.forked is not None:
        raise world.forked
    # Receive into scratch: a failed or partial message never touches the caller's array.
    scratch = np.empty_like(array, order="C")
    request = world.transport.irecv(peer, as_bytes(scratch), p2p_tag(its.group_id, tag, channel))
    source = "any rank" if src is None else f"rank {src}"
    return P2PWork(f"recv from {source}", request, world.timeout, scratch, array)
