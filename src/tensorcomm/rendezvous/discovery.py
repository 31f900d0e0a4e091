"""Read who this process is in the job from the environment: the one module that reads os.environ.

Owns the environment contract below and turns it into a :class:`JobInfo`. Nothing else in
tensorcomm reads job information from the environment (the launcher writes it, for children).
Imports ``config`` only.

The first launcher whose variables are present names the rank and world size::

    source    detected by                          rank / world size / local rank / local size
    --------  -----------------------------------  ------------------------------------------------
    torchrun  WORLD_SIZE, or RANK without msrun's  RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE
              RANK_ID, RANK_SIZE, MS_WORKER_NUM    (tensorcomm's own launcher writes these too)
    openmpi   OMPI_COMM_WORLD_RANK or _SIZE        OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK
                                                   / _LOCAL_SIZE
    pmi       PMI_RANK or PMI_SIZE                 PMI_RANK / PMI_SIZE / MPI_LOCALRANKID
              (MPICH, Intel MPI: Hydra)            / MPI_LOCALNRANKS
    slurm     SLURM_PROCID or SLURM_NTASKS         SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID / -
    msrun     RANK_ID, RANK_SIZE, MS_NODE_ID       RANK_ID (else MS_NODE_ID) / RANK_SIZE (else
              or MS_WORKER_NUM (MindSpore)         MS_WORKER_NUM) / LOCAL_RANK / -
    none      none of the above                    - / - / 0 / -

Read whatever the source::

    MASTER_ADDR, MASTER_PORT   where the store listens; for msrun, when MASTER_* are unset,
                               MS_SCHED_HOST and the port after MS_SCHED_PORT (MindSpore's
                               scheduler holds MS_SCHED_PORT itself when the script calls its
                               init())
    MS_ROLE                    (msrun) "MS_SCHED" in msrun's scheduler process, which runs the
                               script too but is no rank: ``msrun_scheduler``
    TENSORCOMM_SECRET          the per-job HMAC key (hex); the launcher sets it
    TENSORCOMM_SECRET_DIR      the private directory for a generated secret when TENSORCOMM_SECRET
                               is unset (docs/security.md); else $XDG_RUNTIME_DIR/tensorcomm; else
                               None, which means ~/.cache/tensorcomm, else /tmp/tensorcomm-<uid>
    TENSORCOMM_STORE_HOSTED    "1": the launcher serves the store, rank 0 must not; "0" or unset: no
    TENSORCOMM_HOST_ID         which ranks share a host (default: the hostname)
    TENSORCOMM_TIMEOUT         seconds, default for init(timeout=None); at most config.MAX_TIMEOUT
    TENSORCOMM_JOIN_TIMEOUT    seconds init() waits for the job to assemble (default: the longer
                               of config.DEFAULT_JOIN_TIMEOUT and the collective timeout)
    TENSORCOMM_TRANSPORT       "tcp": sockets even between ranks on one host; "auto" or unset:
                               shared memory where every member of a group shares a host
    TENSORCOMM_BACKEND         "mpi": MPI carries messages between ranks (init(backend=...)
                               wins); "tensorcomm" or unset: tensorcomm's own TCP mesh
    TENSORCOMM_WIRE_DTYPE      "bfloat16" or "float16": float32 sums cross the TCP transport
                               compressed (docs/multihost.md); unset: full precision
    TENSORCOMM_HIERARCHY       "off": groups that span hosts run flat algorithms over the
                               network; "auto" or unset: hierarchical where hosts hold as many
                               members each (docs/algorithms.md)
    TENSORCOMM_ALGORITHMS      "collective=algorithm,...", e.g. "all_reduce=ring": run these
                               algorithms (names in docs/algorithms.md) instead of choosing
    TENSORCOMM_KEEP_GOING      "1": a failed call leaves each in-place array untouched or
                               complete, for jobs that shrink and go on (``tensorcomm run --keep-going`` sets
                               it; init(keep_going=...) wins); "0" or unset: arrays of a failed
                               call are unspecified
    TENSORCOMM_CMA             "off": ranks on one host never read each other's memory directly
                               (cross-memory attach); "auto" or unset: where the kernel allows
    TENSORCOMM_TUNING_FILE     the tuning file ``tensorcomm tune`` writes and selection reads, or
                               "off"; unset: one per host under $XDG_CACHE_HOME/tensorcomm, else
                               ~/.cache/tensorcomm (``tuning_location``)
    TORCHELASTIC_USE_AGENT_STORE  "True" (torchrun): torchrun's own store holds MASTER_PORT, so
                               tensorcomm meets there (through torch) instead of serving one
    TORCHELASTIC_RESTART_COUNT    (torchrun) how often the agent restarted the workers; each
                               attempt meets under keys of its own in the agent's store
    OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK (and the _SIZE ones): an MPI launcher started
                               this process (``mpi_launcher``: the first one set), so ``env://``
                               without MASTER_ADDR can meet through MPI
    SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST, SLURM_NODELIST), SLURM_JOB_ID (else
                               SLURM_JOBID): where ``env://`` under srun (SLURM_PROCID set) puts
                               the store when MASTER_ADDR is unset (``rendezvous.slurm``)

A ``TENSORCOMM_*`` variable not in ``config.KNOWN_ENV_VARS`` is a misspelling: a RuntimeWarning,
once per name and process, names the closest known one. A missing variable is ``None`` (local
rank: 0). A variable that is set but malformed (not an
integer, negative, rank not below world size, port outside 0..65535, empty) is a ValueError
naming the variable and its value. msrun exports ``RANK`` as the index *on the node*, which is
why a lone ``RANK`` next to msrun's variables does not count as torchrun. msrun also runs the
script in its scheduler process (``MS_ROLE=MS_SCHED``, ``RANK_ID=0``), which ``init()`` ends
(exit status 0) instead of making it a second rank 0.
"""

from __future__ import annotations

import difflib
import math
import os
import socket
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

from tensorcomm.config import (
    BACKENDS,
    ENV_ALGORITHMS,
    ENV_BACKEND,
    ENV_CMA,
    ENV_FLIGHT_CALLS,
    ENV_FLIGHT_DIR,
    ENV_HIERARCHY,
    ENV_HOST_ID,
    ENV_JOIN_TIMEOUT,
    ENV_KEEP_GOING,
    ENV_LEARN,
    ENV_LOCAL_RANK,
    ENV_LOCAL_WORLD_SIZE,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_RANK,
    ENV_SECRET,
    ENV_SECRET_DIR,
    ENV_STORE_HOSTED,
    ENV_TIMEOUT,
    ENV_TRACE,
    ENV_TRANSPORT,
    ENV_TUNING_FILE,
    ENV_WIRE_DTYPE,
    ENV_WORLD_SIZE,
    FLIGHT_CALLS,
    KNOWN_ENV_VARS,
    MAX_TIMEOUT,
    WIRE_DTYPES,
)

# Names of other launchers' variables (tensorcomm's own are in config.py).
OMPI_RANK, OMPI_SIZE = "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"
OMPI_LOCAL_RANK, OMPI_LOCAL_SIZE = "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"
PMI_RANK, PMI_SIZE = "PMI_RANK", "PMI_SIZE"
PMI_LOCAL_RANK, PMI_LOCAL_SIZE = "MPI_LOCALRANKID", "MPI_LOCALNRANKS"
SLURM_RANK, SLURM_SIZE, SLURM_LOCAL_RANK = "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"
MS_RANK, MS_SIZE = "RANK_ID", "RANK_SIZE"
MS_NODE_ID, MS_WORKER_NUM = "MS_NODE_ID", "MS_WORKER_NUM"
MS_SCHED_HOST, MS_SCHED_PORT = "MS_SCHED_HOST", "MS_SCHED_PORT"
MS_ROLE, MS_SCHEDULER_ROLE = "MS_ROLE", "MS_SCHED"
TORCH_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
TORCH_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
XDG_RUNTIME_DIR = "XDG_RUNTIME_DIR"
XDG_CACHE_HOME = "XDG_CACHE_HOME"
PMIX_RANK = "PMIX_RANK"
MPI_LAUNCHER_VARS = (OMPI_RANK, OMPI_SIZE, PMI_RANK, PMI_SIZE, PMIX_RANK)
SLURM_NODELISTS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
SLURM_JOB_IDS = ("SLURM_JOB_ID", "SLURM_JOBID")


@dataclass(frozen=True)
class JobInfo:
    """What the environment says about this process's place in the job (None: not said)."""

    rank: int | None
    world_size: int | None
    local_rank: int
    local_world_size: int | None
    master_addr: str | None
    master_port: int | None
    secret: str | None
    store_hosted: bool
    host_id: str
    timeout: float | None
    source: str
    join_timeout: float | None = None
    transport: str = "auto"  # "tcp" or "auto"
    torch_agent_store: bool = False  # torchrun serves a torch store at MASTER_ADDR:MASTER_PORT
    restart_count: int = 0  # torchrun's restarts of the workers so far (this is attempt n + 1)
    secret_dir: str | None = None  # where a generated secret is kept; None: private.default_dir()
    backend: str = "tensorcomm"  # a name in config.BACKENDS
    hierarchy: bool = True  # groups that span hosts get host sub-teams
    algorithms: tuple[tuple[str, str], ...] = ()  # (collective, algorithm) to run instead of choosing
    mpi_launcher: str | None = None  # the MPI launcher's variable that is set (PMI_RANK...), else None
    slurm_nodelist: str | None = None  # under srun: the step's (else job's) node list, compressed
    slurm_job_id: int | None = None  # under srun
    msrun_scheduler: bool = False  # msrun's scheduler process (MS_ROLE=MS_SCHED): not a rank
    keep_going: bool = False  # failed calls leave in-place arrays untouched or complete
    cma: bool = True  # ranks on one host may read each other's memory directly
    learn: bool = True  # shared-memory groups learn which algorithm runs each large call


@dataclass(frozen=True)
class _Source:
    """One launcher's variable names; ``None`` where it has no such variable."""

    name: str
    rank: tuple[str, ...]  # first one set wins
    size: tuple[str, ...]
    local_rank: str | None
    local_size: str | None


_TORCHRUN = _Source("torchrun", (ENV_RANK,), (ENV_WORLD_SIZE,), ENV_LOCAL_RANK, ENV_LOCAL_WORLD_SIZE)
_SOURCES = (
    _TORCHRUN,
    _Source("openmpi", (OMPI_RANK,), (OMPI_SIZE,), OMPI_LOCAL_RANK, OMPI_LOCAL_SIZE),
    _Source("pmi", (PMI_RANK,), (PMI_SIZE,), PMI_LOCAL_RANK, PMI_LOCAL_SIZE),
    _Source("slurm", (SLURM_RANK,), (SLURM_SIZE,), SLURM_LOCAL_RANK, None),
    _Source("msrun", (MS_RANK, MS_NODE_ID), (MS_SIZE, MS_WORKER_NUM), ENV_LOCAL_RANK, None),
)
_MSRUN_MARKERS = (MS_RANK, MS_SIZE, MS_WORKER_NUM)


def discover(environ: Mapping[str, str] | None = None) -> JobInfo:
    """Read the job's environment (see the module docstring for every variable).

    Args:
        environ: the variables to read; None reads ``os.environ``.

    Returns:
        The JobInfo; fields the environment does not give are None.

    Raises:
        ValueError: a variable is set but malformed; the message names it and its value.
    """
    env = os.environ if environ is None else environ
    _warn_unknown(env)
    source = _detect(env)
    rank = world_size = local_world_size = None
    local_rank = 0
    if source is not None:
        rank = _first_int(env, source.rank, minimum=0)
        world_size = _first_int(env, source.size, minimum=1)
        local_rank = (_int(env, source.local_rank, minimum=0) if source.local_rank else None) or 0
        local_world_size = _int(env, source.local_size, minimum=1) if source.local_size else None
        _check_below(env, source.rank, rank, source.size, world_size)
        if source.local_rank and source.local_size:
            _check_below(env, (source.local_rank,), local_rank, (source.local_size,), local_world_size)
    addr_var, port_var, port_offset = ENV_MASTER_ADDR, ENV_MASTER_PORT, 0
    if source is not None and source.name == "msrun":
        addr_var = ENV_MASTER_ADDR if ENV_MASTER_ADDR in env else MS_SCHED_HOST
        if ENV_MASTER_PORT not in env and MS_SCHED_PORT in env:
            # MindSpore's scheduler listens on MS_SCHED_PORT when the script calls its init().
            port_var, port_offset = MS_SCHED_PORT, 1
    master_port = _int(env, port_var, minimum=0)
    if master_port is not None:
        master_port += port_offset
        if master_port > 65535:
            raise ValueError(f"{port_var}={env[port_var]!r}: a port must be in 0..{65535 - port_offset}")
    return JobInfo(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        master_addr=_text(env, addr_var),
        master_port=master_port,
        secret=_text(env, ENV_SECRET),
        store_hosted=_flag(env, ENV_STORE_HOSTED),
        host_id=_text(env, ENV_HOST_ID) or socket.gethostname(),
        timeout=_seconds(env, ENV_TIMEOUT),
        join_timeout=_seconds(env, ENV_JOIN_TIMEOUT),
        source="none" if source is None else source.name,
        transport=_transport(env),
        torch_agent_store=env.get(TORCH_AGENT_STORE, "").lower() == "true",
        restart_count=_int(env, TORCH_RESTART_COUNT, minimum=0) or 0,
        secret_dir=_text(env, ENV_SECRET_DIR) or _runtime_dir(env),
        backend=_backend(env),
        hierarchy=_auto_or_off(env, ENV_HIERARCHY),
        algorithms=_algorithms(env),
        mpi_launcher=next((name for name in MPI_LAUNCHER_VARS if name in env), None),
        slurm_nodelist=(next((env[n] for n in SLURM_NODELISTS if env.get(n, "").strip()), None)
                        if SLURM_RANK in env else None),
        slurm_job_id=_first_int(env, SLURM_JOB_IDS, minimum=0) if SLURM_RANK in env else None,
        msrun_scheduler=env.get(MS_ROLE, "").strip() == MS_SCHEDULER_ROLE,
        keep_going=_flag(env, ENV_KEEP_GOING),
        cma=_auto_or_off(env, ENV_CMA),
        learn=_auto_or_off(env, ENV_LEARN),
    )


def _runtime_dir(env: Mapping[str, str]) -> str | None:
    """``$XDG_RUNTIME_DIR/tensorcomm`` if XDG_RUNTIME_DIR is set, else None."""
    runtime = env.get(XDG_RUNTIME_DIR)
    return os.path.join(runtime, "tensorcomm") if runtime else None


_warned: set[str] = set()  # the unknown TENSORCOMM_* names already warned about


def _warn_unknown(env: Mapping[str, str]) -> None:
    """Warn once per name about each ``TENSORCOMM_*`` variable tensorcomm does not know."""
    for name in sorted(env):
        if name.startswith("TENSORCOMM_") and name not in KNOWN_ENV_VARS and name not in _warned:
            _warned.add(name)
            close = difflib.get_close_matches(name, KNOWN_ENV_VARS, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            warnings.warn(f"{name} is not a variable tensorcomm reads, so it has no effect; {hint}"
                          f"(every variable: docs/env.md)", RuntimeWarning, stacklevel=3)


def _detect(env: Mapping[str, str]) -> _Source | None:
    if ENV_WORLD_SIZE in env or (ENV_RANK in env and not any(m in env for m in _MSRUN_MARKERS)):
        return _TORCHRUN
    for source in _SOURCES[1:]:
        if any(name in env for name in source.rank + source.size):
            return source
    return None


def _int(env: Mapping[str, str], name: str, minimum: int) -> int | None:
    raw = env.get(name)
    if raw is None:
        return None
    text = raw.strip()
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"{name}={raw!r}: expected a non-negative integer")
    value = int(text)
    if value < minimum:
        raise ValueError(f"{name}={raw!r}: must be at least {minimum}")
    return value


def _first_int(env: Mapping[str, str], names: tuple[str, ...], minimum: int) -> int | None:
    for name in names:
        if name in env:
            return _int(env, name, minimum)
    return None


def _check_below(env: Mapping[str, str], index_vars: tuple[str, ...], index: int | None,
                 count_vars: tuple[str, ...], count: int | None) -> None:
    if index is not None and count is not None and index >= count:
        index_var = next(n for n in index_vars if n in env)
        count_var = next(n for n in count_vars if n in env)
        raise ValueError(f"{index_var}={env[index_var]!r} must be below {count_var}={env[count_var]!r}")


def _text(env: Mapping[str, str], name: str) -> str | None:
    raw = env.get(name)
    if raw is None:
        return None
    if not raw.strip():
        raise ValueError(f"{name}={raw!r}: is set but empty; unset it or give a value")
    return raw.strip()


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name)
    if raw is None or raw.strip() == "0":
        return False
    if raw.strip() == "1":
        return True
    raise ValueError(f"{name}={raw!r}: expected '1' or '0'")


def _transport(env: Mapping[str, str]) -> str:
    raw = env.get(ENV_TRANSPORT)
    if raw is None:
        return "auto"
    value = raw.strip().lower()
    if value not in ("tcp", "auto"):
        raise ValueError(f"{ENV_TRANSPORT}={raw!r}: expected 'tcp' (sockets only) or 'auto'")
    return value


def _backend(env: Mapping[str, str]) -> str:
    raw = env.get(ENV_BACKEND)
    if raw is None:
        return BACKENDS[0]
    value = raw.strip().lower()
    if value not in BACKENDS:
        raise ValueError(f"{ENV_BACKEND}={raw!r}: expected one of {', '.join(map(repr, BACKENDS))}")
    return value


def _auto_or_off(env: Mapping[str, str], name: str) -> bool:
    """A variable that is ``auto`` (or unset: True) or ``off`` (False)."""
    raw = env.get(name)
    if raw is None or raw.strip().lower() == "auto":
        return True
    if raw.strip().lower() == "off":
        return False
    raise ValueError(f"{name}={raw!r}: expected 'auto' or 'off'")


def _algorithms(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    raw = env.get(ENV_ALGORITHMS)
    if raw is None or not raw.strip():
        return ()
    pairs = []
    for item in raw.split(","):
        collective, sep, name = item.strip().partition("=")
        if not sep or not collective.strip() or not name.strip():
            raise ValueError(f"{ENV_ALGORITHMS}={raw!r}: expected 'collective=algorithm' items separated "
                             f"by commas, such as 'all_reduce=ring'")
        pairs.append((collective.strip(), name.strip()))
    return tuple(pairs)


def wire_dtype(environ: Mapping[str, str] | None = None) -> str | None:
    """The dtype ``TENSORCOMM_WIRE_DTYPE`` names for compressed float32 sums, or None (unset).

    Raises:
        ValueError: it names something other than ``config.WIRE_DTYPES``.
    """
    raw = (os.environ if environ is None else environ).get(ENV_WIRE_DTYPE)
    if raw is None:
        return None
    value = raw.strip().lower()
    if value not in WIRE_DTYPES:
        raise ValueError(f"{ENV_WIRE_DTYPE}={raw!r}: expected one of {', '.join(map(repr, WIRE_DTYPES))}")
    return value


def tuning_location(environ: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """``(TENSORCOMM_TUNING_FILE stripped or None when unset or empty, the per-user cache
    directory)``: ``$XDG_CACHE_HOME/tensorcomm``, else ``~/.cache/tensorcomm``."""
    env = os.environ if environ is None else environ
    raw = (env.get(ENV_TUNING_FILE) or "").strip() or None
    cache = env.get(XDG_CACHE_HOME) or os.path.join(os.path.expanduser("~"), ".cache")
    return raw, os.path.join(cache, "tensorcomm")


def _seconds(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a number of seconds") from None
    if not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT:
        raise ValueError(f"{name}={raw!r}: expected a positive number of seconds, at most {MAX_TIMEOUT:g}")
    return value


def trace_settings(environ: Mapping[str, str] | None = None) -> tuple[str | None, int, str | None]:
    """``(TENSORCOMM_TRACE, TENSORCOMM_FLIGHT_CALLS, TENSORCOMM_FLIGHT_DIR)``: the directory
    that collects timelines (None: off), how many calls the flight recorder keeps (default
    ``config.FLIGHT_CALLS``; 0: off), where it dumps them (None: the default).

    Raises:
        ValueError: ``TENSORCOMM_FLIGHT_CALLS`` is not a whole number >= 0.
    """
    env = os.environ if environ is None else environ
    calls = _int(env, ENV_FLIGHT_CALLS, 0)
    return (env.get(ENV_TRACE) or None, FLIGHT_CALLS if calls is None else calls,
            env.get(ENV_FLIGHT_DIR) or None)
