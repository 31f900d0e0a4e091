"""Same-host barrier: one post and one wait for every member's post. Must not import ``core``."""

from __future__ import annotations

from .base import Ctx
from .shm_common import no_domain


def barrier(ctx: Ctx) -> None:
    """Return once every member of the group has entered the barrier (and made the same call)."""
    d = ctx.team.shm
    if d is None:
        raise no_domain(ctx)
    d.start(ctx)
