"""torch's plug-in hook (entry point group ``torch.backends``): ``import torch`` calls ``autoload``.

It makes ``init_process_group(backend="tensorcomm")`` work without ``import tensorcomm.torch``, so
a config file or a command line naming the backend is enough (Lightning, DeepSpeed, torchrun
scripts). Outside ``tensorcomm run`` it only registers the name, with a creator that imports
tensorcomm when torch first builds such a group: this module imports nothing, so ``import torch``
costs no more. Under ``tensorcomm run`` (``TENSORCOMM_STORE_HOSTED=1``) it imports
``tensorcomm.torch`` at once, since torch's ``env://`` rendezvous must reach the launcher's store
before any backend is built (for Gloo too). ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns every
plug-in off, this one included.

It lives outside the ``tensorcomm`` package so that loading it does not import that package, and
it never raises: a plug-in that raises fails ``import torch``.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

BACKEND_NAME = "tensorcomm"


def _create(opts: Any, backend_options: Any) -> Any:
    """torch's backend creator: import tensorcomm's backend, then build the group with it."""
    from tensorcomm.torch import create_backend

    return create_backend(opts, backend_options)


def autoload() -> None:
    """Register the ``"tensorcomm"`` backend with the torch being imported; never raises."""
    try:
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available():
            return
        if os.environ.get("TENSORCOMM_STORE_HOSTED") == "1":
            import tensorcomm.torch  # noqa: F401 (registers the backend and torch's env:// hook)
        elif BACKEND_NAME not in dist.Backend.backend_list:
            dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu"])
    except Exception as exc:  # noqa: BLE001 (a plug-in that raises fails `import torch`)
        warnings.warn(f"tensorcomm: could not register the torch backend ({type(exc).__name__}: "
                      f"{exc}); `import tensorcomm.torch` says more", RuntimeWarning, stacklevel=2)
