"""What a functional collective's arguments become for the core, checked: one place per collective.

Each function here validates one call's arguments on the calling rank (types, lengths, shapes,
writability, roots, memory shared between inputs and outputs) and stages them (``Staged``) into
the flat numpy arrays ``core.collectives`` takes. Its ``Call`` serves both forms of the call:
the ordinary one (``functional``) commits ``outputs`` after it, and the persistent one
(``persistent``) also checks ``staged`` before each run and refreshes ``copies``, the inputs the
core reads from copies rather than from the caller's memory. Ranks are global ranks, as in torch;
the rooted calls also take a group rank (``group_src``/``group_dst``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ..core.group import Group
from ..errors import ArgumentMismatchError
from . import validate
from .arrays import Staged


class Call(NamedTuple):
    """A collective's arguments, staged.

    Attributes:
        args: what the core collective takes after the group (flat arrays, counts, root).
        outputs: the arrays whose results are written back (``Staged.commit``) after a call.
        staged: every array argument, as the caller gave it.
        copies: ``(buffer, source)``: a copy of the caller's ``source`` the core reads instead
            of it (a strided array made contiguous, a list joined, an input that overlaps the
            output); a persistent call copies each in again before every run. (Outputs the call
            writes whole need none.)
    """

    args: tuple[Any, ...]
    outputs: Sequence[Staged]
    staged: Sequence[Staged]
    copies: Sequence[tuple[np.ndarray, np.ndarray]]


def _own(*staged: Staged) -> list[tuple[np.ndarray, np.ndarray]]:
    """The copies among ``staged``: those whose contiguous buffer is not their array."""
    return [(s.buf, s.array) for s in staged if s.buf is not s.array]


def _rank(g: Group) -> int:
    """``g.rank`` of a resolved group, without its calls."""
    return g._index[g._world.rank]


def _joined(inputs: Sequence[Staged]) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """A list of inputs as one flat array, blocks back to back (a copy), with each block's copy."""
    flat = np.concatenate([i.buf for i in inputs], axis=None)
    copies, offset = [], 0
    for i in inputs:
        copies.append((flat[offset:offset + i.array.size].reshape(i.array.shape), i.array))
        offset += i.array.size
    return flat, copies


def _gathered(outputs: Sequence[Staged], dtype: np.dtype) -> np.ndarray:
    """One flat scratch array for a list of outputs: each output's ``buf`` becomes its block of
    it, so committing an output copies its block into the caller's array."""
    flat = np.empty(sum(o.array.size for o in outputs), dtype=dtype)
    offset = 0
    for output in outputs:
        size = output.array.size
        output.buf = flat[offset:offset + size].reshape(output.array.shape)
        output.needs_commit = True
        offset += size
    return flat


def _unaliased(source: Staged, target: Staged) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """``source``'s buffer, or a private copy of it where it may share memory with ``target``'s
    (``validate.unaliased``: in place, the input is this rank's block of the output)."""
    send = validate.unaliased(source.buf, target.buf)
    return send, [(send, source.array)] if send is not source.buf else _own(source)


def in_place(tensor: Any, g: Group, fn: str) -> Call:
    """``all_reduce``, ``scan``, ``exscan``: ``tensor`` is read and written."""
    staged = Staged(tensor, (fn, "tensor"), True)
    return Call((staged.buf,), [staged], [staged], _own(staged))


def reduce(tensor: Any, dst: Any, group_dst: Any, g: Group, fn: str) -> Call:
    """``reduce`` onto global rank ``dst`` (or group rank ``group_dst``)."""
    root = validate.root(dst, group_dst, "dst", fn, g)
    mine = _rank(g) == root
    staged = validate.array(tensor, "tensor", fn, writable=mine)
    return Call((staged.buf, root), [staged] if mine else [], [staged], _own(staged))


def broadcast(tensor: Any, root: int, g: Group, fn: str) -> Call:
    """``broadcast`` from group rank ``root``: only the receivers write ``tensor``."""
    receives = _rank(g) != root
    staged = Staged(tensor, (fn, "tensor"), receives)
    return Call((staged.buf, root), [staged] if receives else [], [staged], _own(staged))


def all_gather(tensor_list: Any, tensor: Any, g: Group, fn: str) -> Call:
    """``all_gather`` into a list: the list's arrays must all have ``tensor``'s dtype; their shapes
    may differ per member."""
    size, rank = len(g._ranks), _rank(g)
    staged = Staged(tensor, (fn, "tensor"), False)
    outputs = validate.array_list(tensor_list, "tensor_list", fn, size, writable=True)
    validate.same_dtype(outputs, staged, "tensor_list", fn)
    if outputs[rank].array.size != staged.array.size:
        raise ValueError(f"{fn}: tensor_list[{rank}] ({outputs[rank].signature}) must hold as many "
                         f"elements as this rank's tensor ({staged.signature})")
    validate.distinct(outputs, "tensor_list", fn)
    counts = [o.array.size for o in outputs]
    out = _gathered(outputs, staged.buf.dtype)
    return Call((staged.buf, out, counts), outputs, [staged, *outputs], _own(staged))


def _check_blocks(whole: Staged, whole_name: str, block: Staged, block_name: str, size: int,
                  fn: str) -> None:
    """Check that ``whole`` holds ``size`` blocks like ``block`` (its dtype, size blocks of its
    element count): the one-tensor forms of all_gather and reduce_scatter.

    Raises:
        ArgumentMismatchError: the dtypes differ.
        ValueError: the element counts do not fit.
    """
    if whole.array.dtype != block.array.dtype:
        validate.same_dtype([whole], block, whole_name, fn)
    if whole.array.size != block.array.size * size:
        raise ValueError(f"{fn}: {whole_name} ({whole.signature}) must hold group size ({size}) x "
                         f"{block_name} ({block.signature}) elements")


def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, g: Group, fn: str) -> Call:
    """``all_gather`` into one tensor, blocks in rank order along dim 0."""
    staged = Staged(input_tensor, (fn, "input_tensor"), False)
    output = Staged(output_tensor, (fn, "output_tensor"), True)
    size = len(g._ranks)
    _check_blocks(output, "output_tensor", staged, "input_tensor", size, fn)
    send, copies = _unaliased(staged, output)
    return Call((send, output.buf, (staged.buf.size,) * size), [output], [staged, output], copies)


def gather(tensor: Any, gather_list: Any, dst: Any, group_dst: Any, g: Group, fn: str) -> Call:
    """``gather`` into ``gather_list`` on the root only (others may pass None or a list, left
    untouched)."""
    root = validate.root(dst, group_dst, "dst", fn, g)
    staged = validate.array(tensor, "tensor", fn)
    outputs: list[Staged] = []
    out = None
    if _rank(g) == root:
        if gather_list is None:
            raise ValueError(f"{fn}: gather_list is required on the destination rank "
                             f"{g.global_rank(root)}")
        outputs = validate.array_list(gather_list, "gather_list", fn, g.size, writable=True)
        validate.same_layout(outputs, staged, "gather_list", fn)
        validate.distinct(outputs, "gather_list", fn)
        out = _gathered(outputs, staged.buf.dtype)
    counts = [staged.array.size] * g.size
    return Call((staged.buf, out, counts, root), outputs, [staged, *outputs], _own(staged))


def scatter(tensor: Any, scatter_list: Any, src: Any, group_src: Any, g: Group, fn: str) -> Call:
    """``scatter`` of the root's ``scatter_list`` into every member's ``tensor``."""
    root = validate.root(src, group_src, "src", fn, g)
    output = validate.array(tensor, "tensor", fn, writable=True)
    send: np.ndarray | None = None
    inputs: list[Staged] = []
    copies: list[tuple[np.ndarray, np.ndarray]] = []
    if _rank(g) == root:
        if scatter_list is None:
            raise ValueError(f"{fn}: scatter_list is required on the source rank "
                             f"{g.global_rank(root)}")
        inputs = validate.array_list(scatter_list, "scatter_list", fn, g.size)
        validate.same_layout(inputs, output, "scatter_list", fn)
        send, copies = _joined(inputs)
    counts = [output.array.size] * g.size
    return Call((send, output.buf, counts, root), [output], [output, *inputs], copies)


def reduce_scatter(output: Any, input_list: Any, g: Group, fn: str) -> Call:
    """``reduce_scatter`` of a list: ``input_list[i]`` holds as many elements as member ``i``'s
    ``output`` (the blocks may differ in size)."""
    size, rank = len(g._ranks), _rank(g)
    out = Staged(output, (fn, "output"), True)
    inputs = validate.array_list(input_list, "input_list", fn, size)
    validate.same_dtype(inputs, out, "input_list", fn)
    counts = [i.array.size for i in inputs]
    if counts[rank] != out.array.size:
        raise ArgumentMismatchError(f"{fn}: input_list[{rank}] ({inputs[rank].signature}) must hold as "
                                    f"many elements as this rank's output ({out.signature})")
    send, copies = _joined(inputs)
    return Call((send, out.buf, counts), [out], [out, *inputs], copies)


def reduce_scatter_tensor(output: Any, input: Any, g: Group, fn: str) -> Call:  # noqa: A002
    """``reduce_scatter`` of one tensor in ``size`` equal dim-0 blocks."""
    out = Staged(output, (fn, "output"), True)
    source = Staged(input, (fn, "input"), False)
    size = len(g._ranks)
    _check_blocks(source, "input", out, "output", size, fn)
    send, copies = _unaliased(source, out)
    return Call((send, out.buf, (out.array.size,) * size), [out], [out, source], copies)


def all_to_all(output_tensor_list: Any, input_tensor_list: Any, g: Group, fn: str) -> Call:
    """``all_to_all`` of lists: member ``i``'s ``input_tensor_list[j]`` lands in member ``j``'s
    ``output_tensor_list[i]``."""
    size, rank = len(g._ranks), _rank(g)
    inputs = validate.array_list(input_tensor_list, "input_tensor_list", fn, size)
    outputs = validate.array_list(output_tensor_list, "output_tensor_list", fn, size, writable=True)
    validate.same_dtype(inputs, inputs[0], "input_tensor_list", fn)
    validate.same_dtype(outputs, inputs[0], "output_tensor_list", fn)
    mine, kept = inputs[rank], outputs[rank]
    if mine.array.size != kept.array.size:
        raise ValueError(f"{fn}: input_tensor_list[{rank}] ({mine.signature}) and output_tensor_list"
                         f"[{rank}] ({kept.signature}) must hold as many elements: it is the block "
                         f"this rank (group rank {rank}) sends itself")
    validate.distinct(outputs, "output_tensor_list", fn)
    send, copies = _joined(inputs)
    out = _gathered(outputs, send.dtype)
    return Call((send, [i.array.size for i in inputs], out, [o.array.size for o in outputs]), outputs,
                [*inputs, *outputs], copies)


def all_to_all_single(output: Any, input: Any, output_split_sizes: Sequence[int] | None,  # noqa: A002
                      input_split_sizes: Sequence[int] | None, g: Group, fn: str) -> Call:
    """``all_to_all`` of one tensor split along dim 0 (equally, or by the split sizes)."""
    size = len(g._ranks)
    source = Staged(input, (fn, "input"), False)
    out = Staged(output, (fn, "output"), True)
    if out.array.dtype != source.array.dtype:
        validate.same_dtype([out], source, "output", fn)
    in_shape, out_shape = source.array.shape, out.array.shape
    if not in_shape or not out_shape:
        raise ValueError(f"{fn}: input and output need at least one dimension")
    if in_shape[1:] != out_shape[1:]:
        raise ValueError(f"{fn}: input ({source.signature}) and output ({out.signature}) must agree "
                         "beyond dim 0")
    in_rows, out_rows = in_shape[0], out_shape[0]
    row = source.array.size // in_rows if in_rows else out.array.size // max(out_rows, 1)
    if input_split_sizes is None and output_split_sizes is None and in_rows == out_rows \
            and not in_rows % size:  # equal splits, as the checks below would find them
        send_counts: Sequence[int] = (in_rows // size * row,) * size
        recv_counts: Sequence[int] = send_counts
    else:
        send_counts, recv_counts = _split_counts(input_split_sizes, output_split_sizes, in_rows, out_rows,
                                                 row, g, fn)
    send, copies = _unaliased(source, out)
    return Call((send, send_counts, out.buf, recv_counts), [out], [out, source], copies)


def _split_counts(input_split_sizes: Any, output_split_sizes: Any, in_rows: int, out_rows: int, row: int,
                  g: Group, fn: str) -> tuple[list[int], list[int]]:
    """``all_to_all_single``'s elements sent to and received from each member, checked."""
    send_rows = validate.split_sizes(input_split_sizes, "input_split_sizes", fn, g.size, in_rows)
    recv_rows = validate.split_sizes(output_split_sizes, "output_split_sizes", fn, g.size, out_rows)
    if send_rows[g.rank] != recv_rows[g.rank]:
        raise ValueError(f"{fn}: input_split_sizes[{g.rank}] ({send_rows[g.rank]}) and output_split_sizes"
                         f"[{g.rank}] ({recv_rows[g.rank]}) must be equal: it is the block this rank "
                         f"(group rank {g.rank}) sends itself")
    return [r * row for r in send_rows], [r * row for r in recv_rows]
