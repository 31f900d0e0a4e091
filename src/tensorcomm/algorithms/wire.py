"""How the transport algorithms move large buffers: in chunks, and optionally compressed.

Chunks: a block of a ring step (or a whole buffer of recursive doubling) goes out as several
messages of ``config.TCP_CHUNK_BYTES``, so the combine of one chunk overlaps the transfer of the
next and a partial sum moves on to the next rank before the whole block has arrived. Messages of
one step share a tag; the transport matches them in order.

Compression (``TENSORCOMM_WIRE_DTYPE``, off by default): float32 sums travel as bfloat16 or
float16, half the bytes, as torch DDP's ``bf16_compress_hook``/``fp16_compress_hook`` and
Horovod's ``Compression.fp16`` do. Every sum is still computed in float32; what is rounded is
what crosses the wire, and the result, which every rank rounds to the wire precision at the end,
stays bit-identical on every rank. The accuracy cost is in docs/multihost.md. Algorithms talk
through ``Ctx`` only; this module must not import ``core``.
"""

from __future__ import annotations

import numpy as np

from .. import config
from ..types import ReduceOp
from .base import Ctx

_FLOAT32 = np.dtype(np.float32)


# Halving-doubling's rounds travel in messages of this many chunks (4 MiB by default). Fewer,
# larger messages cost less CPU per byte: 4 ranks on 2 cores, TCP loopback, 16 MiB all-reduce,
# 1 MiB messages 18.8 ms of CPU per rank and call, 4 MiB 16.7 ms (64 MiB: 75 -> 68 ms), in
# three interleaved runs (benchmarks/tcp_cpu_vs_gloo.py). Where members share cores, other members'
# work overlaps each transfer anyway; between hosts, 1 and 4 MiB chunks were within noise
# (config.TCP_CHUNK_BYTES).
ROUND_CHUNKS = 4


def chunk_elements(itemsize: int, chunks: int = 1) -> int:
    """Elements per message (``chunks`` transport chunks of ``config.TCP_CHUNK_BYTES``) for a
    buffer of ``itemsize``-byte elements (at least one)."""
    return max(1, chunks * config.TCP_CHUNK_BYTES // max(1, itemsize))


def spans(lo: int, hi: int, chunk: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` cut into consecutive ``chunk``-element pieces (one empty piece if empty)."""
    if hi <= lo:
        return [(lo, lo)]
    return [(start, min(start + chunk, hi)) for start in range(lo, hi, chunk)]


def compressed(ctx: Ctx, dtype: np.dtype, op: ReduceOp) -> np.dtype | None:
    """The dtype a reduction of ``op`` over ``dtype`` travels as on this call, or None.

    Only float32 SUM is compressed (AVG and premul_sum arrive here as SUM on float32 buffers;
    half-precision inputs accumulate in float32 too): MIN, MAX and PROD, integers and float64 keep
    their bits.
    """
    wire = ctx.transport.wire_dtype
    if wire is None or op is not ReduceOp.SUM or dtype != _FLOAT32:
        return None
    return wire


def scratch(ctx: Ctx, purpose: str, count: int, dtype: np.dtype) -> np.ndarray:
    """``count`` elements of ``dtype`` that this group's calls reuse (``Team.scratch``): each
    ``purpose`` names one buffer of one call."""
    return ctx.team.scratch.take(purpose, count, np.dtype(dtype))


def round_to(wire: np.dtype, values: np.ndarray) -> None:
    """Round float32 ``values`` in place to what ``wire`` can hold (exact values stay)."""
    values[...] = values.astype(wire)


def send_chunked(ctx: Ctx, peer: int, buf: np.ndarray, step: int, wire: np.dtype | None = None) -> None:
    """Send ``buf`` to group rank ``peer`` in chunks (as ``wire`` if given) and wait."""
    outgoing = buf
    if wire is not None:
        outgoing = scratch(ctx, "outgoing", buf.size, wire)
        outgoing[...] = buf
    pieces = spans(0, buf.size, chunk_elements(outgoing.itemsize))
    for request in [ctx.isend(peer, outgoing[lo:hi], step) for lo, hi in pieces]:
        ctx.wait(request)


def recv_chunked(ctx: Ctx, peer: int, buf: np.ndarray, step: int, wire: np.dtype | None = None) -> None:
    """Receive ``buf`` from group rank ``peer`` as ``send_chunked`` sent it."""
    incoming = buf if wire is None else scratch(ctx, "packed", buf.size, wire)
    pieces = spans(0, buf.size, chunk_elements(incoming.itemsize))
    receiving = [ctx.irecv(peer, incoming[lo:hi], step) for lo, hi in pieces]
    for (lo, hi), request in zip(pieces, receiving, strict=True):
        ctx.wait(request)
        if wire is not None:
            buf[lo:hi] = incoming[lo:hi]
