"""The benchmarked libraries: a registry of peer modules behind one small interface.

Each peer module (``tensorcomm_``, ``torch_gloo``, ``mpi4py_``, ``tensorcomm_mpi``,
``mindspore_``) provides, and is
imported without importing its library:

- ``commands(ranks, worker, env) -> list[Command]``: in the parent, the processes that make one
  job of ``ranks`` ranks, each running the ``worker`` command line (``python -m
  tensorcomm.bench.worker ...``) under the library's own launcher, on loopback only.
- ``open(init_method) -> base.Peer``: in a rank process, join the job.

``missing(name)`` says in one line why a peer cannot run here (and how to install it), or
``None``; the CLI prints it and goes on without that peer.
"""

from __future__ import annotations

import importlib
import importlib.util
import shutil
from dataclasses import dataclass
from types import ModuleType

LOOPBACK = "127.0.0.1"  # every peer job listens and connects here only


@dataclass(frozen=True)
class Command:
    """One process of a job: its command line and complete environment."""

    argv: list[str]
    env: dict[str, str]


@dataclass(frozen=True)
class PeerInfo:
    """How to find one library and what to tell the user when it is missing."""

    name: str  # as given to --compare, and the library column of the table
    module: str
    requires: tuple[str, ...]  # importable packages
    programs: tuple[str, ...]  # executables on PATH
    install: str


PEERS: dict[str, PeerInfo] = {p.name: p for p in (
    PeerInfo("tensorcomm", "tensorcomm_", (), (), "pip install tensorcomm"),
    PeerInfo("gloo", "torch_gloo", ("torch",), (),
             "pip install torch (the CPU wheel is enough)"),
    PeerInfo("mpi", "mpi4py_", ("mpi4py",), ("mpiexec",),
             "pip install --no-binary mpi4py mpi4py after apt-get install mpich libmpich-dev"),
    PeerInfo("tc-mpi", "tensorcomm_mpi", ("mpi4py",), ("mpiexec",),
             "pip install 'tensorcomm[mpi]' after apt-get install mpich libmpich-dev"),
    PeerInfo("mindspore", "mindspore_", ("mindspore",), (),
             "pip install mindspore"),
)}


def missing(name: str) -> str | None:
    """Why peer ``name`` cannot run on this machine, as one line naming the fix; else ``None``."""
    info = PEERS[name]
    for package in info.requires:
        if importlib.util.find_spec(package) is None:
            return f"skipped: {package} not installed ({info.install})"
    for program in info.programs:
        if shutil.which(program) is None:
            return f"skipped: {program} not found on PATH ({info.install})"
    return None


def load(name: str) -> ModuleType:
    """The peer module of ``name`` (cheap: libraries are imported by its ``open`` only)."""
    return importlib.import_module(f"{__name__}.{PEERS[name].module}")
