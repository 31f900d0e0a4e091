"""A one-off ``Ctx`` for tests that call an algorithm directly, without a group (the core makes
its contexts with ``Ctx.of`` from a group's ``Team`` and the call's ``Plan``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tensorcomm.algorithms import kernels, select
from tensorcomm.algorithms.base import Ctx, Plan, Team
from tensorcomm.signature import NO_SIGNATURE, Signature


def _no_algorithm(ctx: Ctx, *args: Any) -> None:
    raise RuntimeError(f"{ctx.name}: a test's one-off Ctx has no algorithm to run")


def one_off_ctx(transport: Any, ranks: Sequence[int], rank: int, group_id: int, seq: int,
                timeout: float, name: str = "collective", signature: Signature = NO_SIGNATURE,
                group_name: str = "", shm: Any = None, keep_going: bool = False) -> Ctx:
    """The context of call ``seq`` on a team of its own; its deadline starts now."""
    team = Team(transport, ranks, rank, group_id, timeout, group_name=group_name, shm=shm,
                keep_going=keep_going)
    return Ctx.of(team, seq, Plan(name, signature, "", _no_algorithm))


REDUCTIONS = ("all_reduce", "reduce", "reduce_scatter", "scan", "exscan")  # their last argument is the op


def run(ctx: Ctx, fn: Any, *args: Any) -> Any:
    """Run algorithm ``fn`` (a row's of ``select.ROWS``) on ``args`` in a one-off ``ctx``, its
    plan completed first as ``make_plan`` completes it: the reduction descriptor, the state
    (``Row.prepare``)."""
    row = next(row for row in select.ROWS if row.fn is fn)
    if row.collective in REDUCTIONS:
        ctx.plan.reduction = kernels.reduction(args[-1], args[0].dtype)
    if row.prepare is not None:
        ctx.plan.state = row.prepare(ctx.team, ctx.plan, *args)
    return fn(ctx, *args)
