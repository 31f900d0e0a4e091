"""The c10d backend object of a tensorcomm group, and the untested-torch warning."""

from __future__ import annotations

import pytest

from tensorcomm.testing import run_ranks

pytestmark = pytest.mark.multiprocess
torch = pytest.importorskip("torch")


def _backend_object_body() -> str:
    import warnings

    import torch.distributed as dist
    from torch._C import _distributed_c10d as c10d

    import tensorcomm.torch  # noqa: F401 (registers the backend)
    from tensorcomm.frontends.torch_c10d import TESTED_TORCH

    real_version = torch.__version__
    torch.__version__ = "9.1.0"  # a release newer than every tested one
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dist.init_process_group(backend="tensorcomm")
    finally:
        torch.__version__ = real_version
    untested = [w for w in caught if issubclass(w.category, RuntimeWarning)
                and "9.1.0" in str(w.message)]
    assert len(untested) == 1 and all(v in str(untested[0].message) for v in TESTED_TORCH), caught

    pg = dist.group.WORLD
    assert pg is not None and dist.get_backend() == "tensorcomm"
    backend = pg._get_backend(torch.device("cpu"))
    assert backend.name() == "tensorcomm"
    if torch.__version__.startswith("2.13."):  # 2.13's Backend cannot be subclassed in Python
        assert not isinstance(backend, c10d.Backend)
    else:
        assert isinstance(backend, c10d.Backend) and backend.supports_splitting
        assert backend._get_backend_name() == "tensorcomm"
        x = torch.ones(2) * (dist.get_rank() + 1)
        backend.allreduce([x]).wait()  # a call routed through the backend object: the group's
        assert torch.equal(x, torch.full((2,), 3.0))
    dist.destroy_process_group()
    return "ok"


def test_group_has_a_named_c10d_backend_and_warns_on_an_untested_torch() -> None:
    assert run_ranks(_backend_object_body, 2, timeout=90, init=False) == ["ok"] * 2
