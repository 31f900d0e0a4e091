"""The launcher's environment contract, written down in one place (also in ``docs/env.md``).

Variables the launcher *reads*; each is the fallback of a ``tensorcomm run`` flag (the flag wins):

- ``TENSORCOMM_NPROCS`` (``-n``): ranks to start on this node; default 1.
- ``TENSORCOMM_NNODES`` (``--nnodes``): nodes in the job, one launcher each; default 1.
- ``TENSORCOMM_NODE_RANK`` (``--node-rank``): this node's index, ``0..nnodes-1``; default 0.
- ``TENSORCOMM_MASTER`` (``--master``): ``host:port`` where node 0's launcher hosts the store;
  required (with a non-zero port) for nnodes > 1; default on one node: ``127.0.0.1``, free port.
- ``MASTER_ADDR``, ``MASTER_PORT`` (``--master-addr``, ``--master-port``, as torchrun): the same
  address in two parts, read when neither ``--master`` nor ``TENSORCOMM_MASTER`` is given; an
  address without a port means a free port (one node only).
- ``TENSORCOMM_JOB_TIMEOUT`` (``--timeout``): wall-clock limit of the job in seconds; on expiry
  all ranks are stopped and the launcher exits 124. Default: none.
- ``TENSORCOMM_SECRET`` (no flag): the job secret, at least 16 bytes. Unset on one node: a fresh
  one (``rendezvous.auth.generate_secret``). For nnodes > 1 it is required, the same on every node.

Variables the launcher *writes*, for each child only (the launcher's own ``os.environ`` is never
modified); every other variable of the launcher's environment is inherited unchanged:

- ``RANK``: ``node_rank * nprocs + local_rank``.
- ``WORLD_SIZE``: ``nprocs * nnodes``.
- ``LOCAL_RANK``: index of the rank on its node, ``0..nprocs-1``.
- ``LOCAL_WORLD_SIZE``: ``nprocs``.
- ``RANK_ID``, ``RANK_SIZE``, ``DEVICE_ID``: ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` again,
  under the names msrun exports and MindSpore programs read.
- ``MASTER_ADDR``, ``MASTER_PORT``: where the job's store listens.
- ``TENSORCOMM_SECRET``: the job secret, identical for every rank of the job.
- ``TENSORCOMM_STORE_HOSTED``: ``1``: a launcher of this job serves the store; ranks only connect.
- ``PYTHONUNBUFFERED``: ``1``, so output reaches the rank-prefixed stream as it is printed.

Everything here is a pure function of its arguments (the environment is passed in as a mapping; the
one impurity is drawing a fresh secret), so the contract is unit-tested without processes. Reading
``os.environ`` is the caller's job (``launch.run``); ``config.py`` holds the names ranks read, this
module adds the launcher's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tensorcomm import config

# Launcher inputs (fallbacks of the ``tensorcomm run`` flags); not defined in config.py because
# only the launcher reads them.
ENV_NPROCS = "TENSORCOMM_NPROCS"
ENV_NNODES = "TENSORCOMM_NNODES"
ENV_NODE_RANK = "TENSORCOMM_NODE_RANK"
ENV_MASTER = "TENSORCOMM_MASTER"
ENV_JOB_TIMEOUT = "TENSORCOMM_JOB_TIMEOUT"
ENV_PYTHONUNBUFFERED = "PYTHONUNBUFFERED"
# msrun's names for the rank, the world size and the local rank, which MindSpore programs read.
ENV_MS_RANK_ID, ENV_MS_RANK_SIZE, ENV_MS_DEVICE_ID = "RANK_ID", "RANK_SIZE", "DEVICE_ID"

LOCAL_STORE_HOST = "127.0.0.1"  # one node: the store is reachable on loopback only


class LaunchConfigError(ValueError):
    """A flag or environment variable of the launcher has a bad or missing value."""


@dataclass(frozen=True)
class LaunchSettings:
    """What ``tensorcomm run`` was asked to do, flags and environment merged.

    ``master`` is ``None`` on a single node without ``--master``: the launcher then hosts the
    store on ``127.0.0.1`` at a free port.
    """

    nprocs: int
    nnodes: int
    node_rank: int
    master: tuple[str, int] | None
    secret: str
    timeout: float | None

    @property
    def world_size(self) -> int:
        """Ranks in the whole job."""
        return self.nprocs * self.nnodes

    @property
    def hosts_store(self) -> bool:
        """Whether this node's launcher serves the store (node 0 does, other nodes connect)."""
        return self.node_rank == 0


@dataclass(frozen=True)
class StoreAddress:
    """Where the job's store listens, as ranks should dial it."""

    host: str
    port: int


def parse_master(text: str) -> tuple[str, int]:
    """Split ``host:port`` (``[v6addr]:port`` for IPv6) into its parts.

    Raises:
        LaunchConfigError: no port, a port outside 0..65535, or an empty host.
    """
    host, sep, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise LaunchConfigError(f"--master: expected host:port, got {text!r}")
    return host, int(port_text)


def resolve_master(environ: Mapping[str, str], master: str | None, master_addr: str | None,
                   master_port: int | None) -> tuple[str, int] | None:
    """Where node 0 hosts the store: ``--master``, else ``--master-addr``/``--master-port``, else
    ``TENSORCOMM_MASTER``, else ``MASTER_ADDR``/``MASTER_PORT``; None if none is given.

    A missing address is ``127.0.0.1``, a missing port 0 (any free port).

    Raises:
        LaunchConfigError: ``--master`` beside ``--master-addr``/``--master-port``, or a
            malformed address or port.
    """
    flags = master_addr is not None or master_port is not None
    if master is not None:
        if flags:
            raise LaunchConfigError("--master: give either --master HOST:PORT or --master-addr and "
                                    "--master-port, not both")
        return parse_master(master)
    port_name = "--master-port"
    if not flags:
        if environ.get(ENV_MASTER):
            return parse_master(environ[ENV_MASTER])
        master_addr = environ.get(config.ENV_MASTER_ADDR) or None
        raw = environ.get(config.ENV_MASTER_PORT) or None
        if master_addr is None and raw is None:
            return None
        port_name = f"{config.ENV_MASTER_PORT}={raw!r}"
        if raw is not None and not (raw.strip().isascii() and raw.strip().isdigit()):
            raise LaunchConfigError(f"{port_name}: expected a port number 0..65535")
        master_port = None if raw is None else int(raw)
    if master_port is not None and not 0 <= master_port <= 65535:
        raise LaunchConfigError(f"{port_name}: expected a port number 0..65535, got {master_port}")
    if master_addr is not None and not master_addr.strip():
        raise LaunchConfigError("--master-addr: expected a host name or address, got ''")
    host = LOCAL_STORE_HOST if master_addr is None else master_addr.strip().strip("[]")
    return host, master_port or 0


def _int_setting(flag: str, value: int | None, environ: Mapping[str, str], name: str,
                 default: int) -> int:
    """The flag's value, else the environment variable's, else ``default``."""
    if value is not None:
        return value
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise LaunchConfigError(f"{name} (fallback of {flag}): expected an integer, "
                                f"got {raw!r}") from None


def resolve_secret(environ: Mapping[str, str], nnodes: int) -> str:
    """The job secret: ``TENSORCOMM_SECRET`` if set, else a fresh one (single node only).

    Several nodes cannot agree on a generated secret, so then it must come from the environment.

    Raises:
        LaunchConfigError: missing with ``nnodes > 1``, or too short to be safe.
    """
    # Imported here: the rest of the launcher's contract needs nothing of the rendezvous layer.
    from tensorcomm.rendezvous.auth import check_secret, generate_secret

    secret = environ.get(config.ENV_SECRET, "")
    if not secret:
        if nnodes > 1:
            raise LaunchConfigError(
                f"--nnodes {nnodes} needs {config.ENV_SECRET} set to the same value on "
                "every node, e.g. export "
                f"{config.ENV_SECRET}=$(python -c 'import secrets; print(secrets.token_hex(32))')")
        return generate_secret()
    try:
        check_secret(secret, config.ENV_SECRET)
    except ValueError as exc:
        raise LaunchConfigError(str(exc)) from None
    return secret


def resolve_settings(environ: Mapping[str, str], *, nprocs: int | None = None,
                     nnodes: int | None = None, node_rank: int | None = None,
                     master: str | None = None, master_addr: str | None = None,
                     master_port: int | None = None, timeout: float | None = None) -> LaunchSettings:
    """Merge the flags given (``None`` = not given) with their environment fallbacks and check them.

    Raises:
        LaunchConfigError: naming the flag or variable, what was expected and what was given.
    """
    n = _int_setting("-n", nprocs, environ, ENV_NPROCS, 1)
    nodes = _int_setting("--nnodes", nnodes, environ, ENV_NNODES, 1)
    node = _int_setting("--node-rank", node_rank, environ, ENV_NODE_RANK, 0)
    if n < 1:
        raise LaunchConfigError(f"-n: expected at least 1 rank per node, got {n}")
    if nodes < 1:
        raise LaunchConfigError(f"--nnodes: expected at least 1, got {nodes}")
    if not 0 <= node < nodes:
        raise LaunchConfigError(f"--node-rank: expected 0..{nodes - 1}, got {node}")

    address = resolve_master(environ, master, master_addr, master_port)
    if nodes > 1 and (address is None or address[1] == 0):
        # Other nodes must know where to dial before node 0 has bound anything.
        raise LaunchConfigError(f"--nnodes {nodes} needs --master host:port (or --master-addr and "
                                f"--master-port, or {ENV_MASTER}) with a fixed, non-zero port")

    if timeout is None and environ.get(ENV_JOB_TIMEOUT):
        try:
            timeout = float(environ[ENV_JOB_TIMEOUT])
        except ValueError:
            raise LaunchConfigError(f"{ENV_JOB_TIMEOUT} (fallback of --timeout): expected "
                                    f"seconds, got {environ[ENV_JOB_TIMEOUT]!r}") from None
    if timeout is not None and not timeout > 0:
        raise LaunchConfigError(f"--timeout: expected a positive number of seconds, got {timeout}")

    return LaunchSettings(nprocs=n, nnodes=nodes, node_rank=node, master=address,
                          secret=resolve_secret(environ, nodes), timeout=timeout)


def store_bind_address(settings: LaunchSettings) -> tuple[str, int]:
    """The ``(host, port)`` node 0's launcher binds its store to; port 0 = any free port."""
    if settings.master is None:
        return LOCAL_STORE_HOST, 0
    host, port = settings.master
    if settings.nnodes > 1:
        # Listen on every interface: a host name given for the other nodes often resolves to a
        # loopback alias on the master itself (Debian's 127.0.1.1), which they could not reach.
        # The job secret, not the interface, keeps strangers out.
        return ("::" if ":" in host else "0.0.0.0"), port
    return host, port


def store_address(settings: LaunchSettings, bound_port: int | None) -> StoreAddress:
    """Where ranks dial the store, given the port this node's store bound (``None``: not hosted).

    Raises:
        ValueError: this node neither hosts the store nor knows where it is.
    """
    if bound_port is not None:
        host = LOCAL_STORE_HOST if settings.master is None else settings.master[0]
        return StoreAddress(host, bound_port)  # the port actually bound, even for --master h:0
    if settings.master is None:
        raise ValueError("settings: a node that does not host the store needs its master address")
    return StoreAddress(*settings.master)


def global_rank(settings: LaunchSettings, local_rank: int) -> int:
    """The job-wide rank of this node's ``local_rank``."""
    return settings.node_rank * settings.nprocs + local_rank


def rank_env(base: Mapping[str, str], settings: LaunchSettings, store: StoreAddress,
             local_rank: int, keep_going: bool = False) -> dict[str, str]:
    """The full environment of one child: ``base`` plus the contract variables; with
    ``keep_going`` (``--keep-going``) also ``TENSORCOMM_KEEP_GOING=1``, so that a failed call
    leaves the survivors' arrays untouched or complete.

    Raises:
        ValueError: ``local_rank`` outside ``0..nprocs-1``.
    """
    if not 0 <= local_rank < settings.nprocs:
        raise ValueError(f"local_rank: expected 0..{settings.nprocs - 1}, got {local_rank}")
    env = dict(base)
    rank, size = str(global_rank(settings, local_rank)), str(settings.world_size)
    env.update({
        config.ENV_RANK: rank,
        config.ENV_WORLD_SIZE: size,
        config.ENV_LOCAL_RANK: str(local_rank),
        ENV_MS_RANK_ID: rank,
        ENV_MS_RANK_SIZE: size,
        ENV_MS_DEVICE_ID: str(local_rank),
        config.ENV_LOCAL_WORLD_SIZE: str(settings.nprocs),
        config.ENV_MASTER_ADDR: store.host,
        config.ENV_MASTER_PORT: str(store.port),
        config.ENV_SECRET: settings.secret,
        # Every `tensorcomm run` job has a launcher-hosted store (node 0's), so no rank hosts one.
        config.ENV_STORE_HOSTED: "1",
        ENV_PYTHONUNBUFFERED: "1",
    })
    if keep_going:
        env[config.ENV_KEEP_GOING] = "1"
    return env
