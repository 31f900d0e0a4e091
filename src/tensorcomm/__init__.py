"""tensorcomm: collective communication for Python arrays, on shared memory and TCP.

    import numpy as np, tensorcomm as tc
    tc.init()
    x = np.ones(4, np.float32)
    tc.all_reduce(x)             # in place, every rank gets the sum
    tc.destroy()

The public surface is exactly ``__all__`` (pinned by tests/unit/test_exports.py).
"""

from . import config as _config
from .core.group import CallInfo, Group
from .core.lifecycle import WORLD
from .core.persistent import Prequest
from .core.work import Work
from .errors import (
    ArgumentMismatchError,
    AuthenticationError,
    CollectiveMismatchError,
    CommError,
    CommTimeoutError,
    ConcurrentUseError,
    ExcludedError,
    GroupAbortedError,
    LinkAuthenticationError,
    PeerLostError,
    RendezvousError,
)
from .frontends.functional import (
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    all_to_all,
    all_to_all_single,
    barrier,
    broadcast,
    exscan,
    gather,
    irecv,
    isend,
    recv,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    scan,
    scatter,
    send,
)
from .frontends.object_collectives import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    scatter_object_list,
)
from .frontends.object_p2p import irecv_object, isend_object, recv_object, send_object
from .frontends.persistent import (
    all_gather_init,
    all_gather_into_tensor_init,
    all_reduce_init,
    all_to_all_init,
    all_to_all_single_init,
    barrier_init,
    broadcast_init,
    exscan_init,
    gather_init,
    reduce_init,
    reduce_scatter_init,
    reduce_scatter_tensor_init,
    scan_init,
    scatter_init,
)
from .frontends.process_group import (
    create_group,
    destroy,
    destroy_process_group,
    get_global_rank,
    get_group_rank,
    get_local_rank,
    get_rank,
    get_world_size,
    init,
    init_process_group,
    is_initialized,
    new_group,
    new_subgroups_by_enumeration,
)
from .frontends.shared import empty, zeros
from .frontends.sparse import sparse_all_reduce
from .frontends.uneven import all_gather_v, all_to_all_v, gather_v, reduce_scatter_v, scatter_v
from .types import PremulSum, ReduceOp, TransportKind

premul_sum = ReduceOp.premul_sum

__version__ = _config.VERSION  # pyproject.toml's; config holds it for the layers below

__all__ = [
    # lifecycle and groups
    "init", "init_process_group", "destroy", "destroy_process_group", "is_initialized",
    "get_rank", "get_world_size", "get_local_rank", "new_group", "create_group",
    "new_subgroups_by_enumeration", "get_group_rank", "get_global_rank", "Group", "CallInfo",
    "WORLD",
    # shared arrays
    "empty", "zeros",
    # collectives and point-to-point
    "all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "gather",
    "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
    "barrier", "scan", "exscan", "send", "recv", "isend", "irecv",
    # persistent collectives (MPI 4's *_init): made once, run many times
    "all_reduce_init", "reduce_init", "broadcast_init", "all_gather_init", "all_gather_into_tensor_init",
    "gather_init", "scatter_init", "reduce_scatter_init", "reduce_scatter_tensor_init", "all_to_all_init",
    "all_to_all_single_init", "barrier_init", "scan_init", "exscan_init", "Prequest",
    # uneven ("v") and object collectives
    "all_to_all_v", "all_gather_v", "gather_v", "scatter_v", "reduce_scatter_v",
    "sparse_all_reduce",
    "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
    "send_object", "recv_object", "isend_object", "irecv_object",
    # values and handles
    "ReduceOp", "PremulSum", "premul_sum", "TransportKind", "Work",
    # errors
    "CommError", "CommTimeoutError", "PeerLostError", "CollectiveMismatchError",
    "GroupAbortedError", "ExcludedError", "ConcurrentUseError", "RendezvousError",
    "AuthenticationError", "LinkAuthenticationError", "ArgumentMismatchError",
]
