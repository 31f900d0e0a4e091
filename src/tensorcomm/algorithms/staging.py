"""Transport algorithms in the common calling convention: they run on scratch copies.

Every algorithm ``select`` offers for a collective takes the same arguments (see ``select``):
the caller's flat arrays, and the caller's op for reductions. The shared-memory algorithms work
on those directly. The transport algorithms (``allreduce``, ``broadcast``, ...) write buffers of
their own instead, where a failed call must leave the caller's arrays untouched
(``Team.keep_going``): reductions read the caller's array (a converted copy when the accumulation
dtype or a premultiplied factor needs one: ``kernels.prepare``) and write scratch, as broadcast
receivers and every output do, and the wrappers here write the caller's arrays only once the
algorithm has succeeded. Otherwise (the default) results are received straight into the caller's
arrays, as Gloo does, wherever their dtype allows: one copy less per call. The scratch is memory
the group's calls reuse (``wire.scratch``): fresh memory costs a page fault per page. Each
wrapper is applied once, in ``select.ROWS``. Must not import ``core``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..types import PremulSum, ReduceOp
from . import kernels
from .base import Ctx
from .wire import scratch

Op = ReduceOp | PremulSum
Algorithm = Callable[..., None]


def _named(run: Algorithm, algorithm: Algorithm) -> Algorithm:
    run.__name__ = run.__qualname__ = f"staged_{algorithm.__name__}"
    run.__doc__ = f"``{algorithm.__module__}.{algorithm.__name__}`` on scratch copies."
    run.__wrapped__ = algorithm  # type: ignore[attr-defined]
    return run


def _reduction(ctx: Ctx) -> kernels.Reduction:
    """The call's reduction descriptor (the core makes one per plan of a reduction)."""
    red = ctx.plan.reduction
    if red is None:
        raise TypeError(f"{ctx.name}: a reduction's plan has no reduction descriptor")
    return red


def _direct(ctx: Ctx) -> bool:
    """Whether results may be received straight into the caller's arrays (see the docstring)."""
    return not ctx.team.keep_going


def all_reduce(algorithm: Algorithm) -> Algorithm:
    """``algorithm(ctx, work, base_op, source)``: reads ``x`` (or its converted copy in ``work``),
    leaves the result in ``work``, which is ``x`` itself where the call may (``_direct``) and the
    accumulation dtype is ``x``'s."""
    def run(ctx: Ctx, x: np.ndarray, op: Op) -> None:
        red = _reduction(ctx)
        team = ctx.team
        if red.in_acc and _direct(ctx):
            if not red.raw:
                kernels.load(red, x, x)  # premultiplies in place
            algorithm(ctx, x, red.op, None)
            if red.average:
                kernels.divide(x, team.size)
            return
        work = team.scratch.take("staged work", x.size, red.acc)
        algorithm(ctx, work, red.op, x if red.raw else kernels.prepare(red, x, work))
        kernels.finish(red, work, x, team.size)
    return _named(run, algorithm)


def pair(exchange: Algorithm) -> Algorithm:
    """``exchange(ctx, buf, ufunc)`` (``allreduce.pair_in_place``: two members, the result left in
    ``buf`` only once both directions are done), straight on ``x`` when its terms are the caller's
    bytes (a failed call leaves it untouched), else on a converted copy that ``kernels.finish``
    rounds into ``x``."""
    def run(ctx: Ctx, x: np.ndarray, op: Op) -> None:
        red = _reduction(ctx)
        if red.raw:
            exchange(ctx, x, red.ufunc)
            if red.average:
                kernels.divide(x, 2)
            return
        work = kernels.prepare(red, x, ctx.team.scratch.take("staged work", x.size, red.acc))
        exchange(ctx, work, red.ufunc)
        kernels.finish(red, work, x, 2)
    return _named(run, exchange)


def reduce(algorithm: Algorithm) -> Algorithm:
    """``algorithm(ctx, source, out, root, base_op)``: reads ``x`` (or its converted copy);
    ``out`` scratch on the root only."""
    def run(ctx: Ctx, x: np.ndarray, root: int, op: Op) -> None:
        red = _reduction(ctx)
        source = kernels.prepare(red, x, scratch(ctx, "staged work", x.size, red.acc), copy=False)
        out = scratch(ctx, "staged out", source.size, red.acc) if ctx.rank == root else None
        algorithm(ctx, source, out, root, red.op)
        if out is not None:
            kernels.finish(red, out, x, ctx.size)
    return _named(run, algorithm)


def broadcast(algorithm: Algorithm) -> Algorithm:
    """``algorithm(ctx, buf, root)``; receivers get scratch."""
    def run(ctx: Ctx, x: np.ndarray, root: int) -> None:
        work = x if ctx.rank == root or _direct(ctx) else scratch(ctx, "staged out", x.size, x.dtype)
        algorithm(ctx, work, root)
        if work is not x:
            x[...] = work
    return _named(run, algorithm)


def all_gather(algorithm: Algorithm) -> Algorithm:
    """``algorithm(ctx, send, out, counts)`` with ``out`` scratch."""
    def run(ctx: Ctx, send: np.ndarray, out: np.ndarray, counts: Sequence[int]) -> None:
        staged = out if _direct(ctx) else scratch(ctx, "staged out", out.size, out.dtype)
        algorithm(ctx, send, staged, counts)
        if staged is not out:
            out[...] = staged
    return _named(run, algorithm)


def gather(algorithm: Algorithm) -> Algorithm:
    """``algorithm(ctx, send, out, counts, root)`` with ``out`` scratch on the root."""
    def run(ctx: Ctx, send: np.ndarray, out: np.ndarray | None, counts: Sequence[int], root: int) -> None:
        staged = out if out is None or _direct(ctx) else scratch(ctx, "staged out", out.size, out.dtype)
        algorithm(ctx, send, staged, counts, root)
        if staged is not out:
            assert out is not None
            out[...] = staged
    return _named(run, algorithm)


def scatter(algorithm: Algorithm) -> Algorithm:
    """``algorithm(ctx, send, out, counts, root)`` with ``out`` scratch."""
    def run(ctx: Ctx, send: np.ndarray | None, out: np.ndarray, counts: Sequence[int], root: int) -> None:
        staged = out if _direct(ctx) else scratch(ctx, "staged out", out.size, out.dtype)
        algorithm(ctx, send, staged, counts, root)
        if staged is not out:
            out[...] = staged
    return _named(run, algorithm)


def all_to_all(algorithm: Algorithm) -> Algorithm:
    """``algorithm(ctx, send, send_counts, out, recv_counts)`` with ``out`` scratch."""
    def run(ctx: Ctx, send: np.ndarray, send_counts: Sequence[int], out: np.ndarray,
            recv_counts: Sequence[int]) -> None:
        staged = out if _direct(ctx) else scratch(ctx, "staged out", out.size, out.dtype)
        algorithm(ctx, send, send_counts, staged, recv_counts)
        if staged is not out:
            out[...] = staged
    return _named(run, algorithm)


def reduce_scatter(algorithm: Algorithm) -> Algorithm:
    """``algorithm(ctx, source, out, counts, base_op)``: reads ``send`` (or its converted copy);
    ``out`` scratch."""
    def run(ctx: Ctx, send: np.ndarray, out: np.ndarray, counts: Sequence[int], op: Op) -> None:
        red = _reduction(ctx)
        source = kernels.prepare(red, send, scratch(ctx, "staged work", send.size, red.acc), copy=False)
        direct = red.in_acc and _direct(ctx)
        reduced = out if direct else scratch(ctx, "staged out", counts[ctx.rank], red.acc)
        algorithm(ctx, source, reduced, counts, red.op)
        if not direct:
            kernels.finish(red, reduced, out, ctx.size)
        elif red.average:
            kernels.divide(out, ctx.size)
    return _named(run, algorithm)
