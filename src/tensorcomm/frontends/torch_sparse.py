"""Sparse COO tensors in the torch backend's ``allreduce``, as Gloo takes them.

Several tensors per process are summed locally first; the sum across the group
(``frontends/sparse.py``) replaces every tensor's contents, coalesced, on every member. SUM and
AVG; the tensors must share one size and dtype. The call runs inline on the calling thread
(several core calls whose sizes come from the first), so its Work is complete when returned.

Imports torch; only the torch backend imports this module.
"""

from __future__ import annotations

import torch

from ..core.group import Group
from ..types import ReduceOpLike
from .sparse import sparse_all_reduce


def is_sparse(tensors: object) -> bool:
    """Whether ``tensors`` (a tensor or a list of them) holds a sparse COO tensor."""
    if isinstance(tensors, torch.Tensor):
        return tensors.is_sparse
    return isinstance(tensors, (list, tuple)) and any(
        isinstance(t, torch.Tensor) and t.is_sparse for t in tensors)


def sparse_allreduce(tensors: list[torch.Tensor], op: ReduceOpLike, group: Group) -> None:
    """Reduce sparse COO ``tensors`` across ``group``, in place.

    Raises:
        ValueError: dense and sparse tensors mixed, or tensors of different sizes or dtypes; an op
            other than SUM/AVG.
    """
    what = "tensorcomm backend: sparse allreduce"
    if not all(t.is_sparse for t in tensors):
        raise ValueError(f"{what}: invalid tensor layout: every tensor must be sparse COO, got "
                         f"{[str(t.layout) for t in tensors]}")
    if len({(tuple(t.shape), t.dtype) for t in tensors}) != 1:
        raise ValueError(f"{what}: invalid tensor size or dtype: the tensors must share one, got "
                         f"{[(list(t.shape), str(t.dtype)) for t in tensors]}")
    local = tensors[0].detach()
    for tensor in tensors[1:]:
        local = local + tensor.detach()
    indices, values = sparse_all_reduce(local._indices(), local._values(), tuple(local.shape),
                                        op=op, group=group)
    result = torch.sparse_coo_tensor(torch.from_numpy(indices), values, local.shape,
                                     is_coalesced=True)
    with torch.no_grad():
        for tensor in tensors:
            tensor.copy_(result)
