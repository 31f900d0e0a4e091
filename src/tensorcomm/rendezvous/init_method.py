"""Turn an ``init_method`` URL into a connected store: the URL-scheme registry.

Owns :func:`rendezvous`, the registry of schemes (``env://``, ``tcp://host:port``,
``file:///path``; more via :func:`register_scheme`) and the choice of job secret. It connects
every rank to one store and starts the store server on rank 0 when nobody else serves it; it does
no barrier or rank counting, which belongs to the core. Errors name their scheme, as
``"tcp://: ..."``. Imports the rest of ``rendezvous``, ``config`` and ``errors``.

Secret: ``TENSORCOMM_SECRET`` when set. Otherwise, for a store on a loopback address, a fixed
well-known key (any local user could join such a job: set the variable to prevent it); for
``file://``, rank 0 generates one and shares it through the file (created mode 0600); for any
other address a RendezvousError, since a network store must not accept strangers.
"""

from __future__ import annotations

import importlib

import ipaddress
import logging
import math
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tensorcomm.errors import RendezvousError
from tensorcomm.rendezvous.auth import generate_secret, secret_bytes
from tensorcomm.rendezvous.discovery import JobInfo, discover
from tensorcomm.rendezvous.store import FileStore, Store
from tensorcomm.rendezvous.tcp_store import TCPStore, TCPStoreServer

logger = logging.getLogger("tensorcomm.rendezvous")

# Used only when no secret is set and the store is on loopback; it keeps the handshake uniform
# but protects nothing against other local users.
LOOPBACK_SECRET = b"tensorcomm-loopback-default-secret-not-private"
TORCHRUN_SCHEME = "torchrun"  # registered by tensorcomm.torch: meet on torchrun's agent store
FILE_SECRET_KEY = "tensorcomm/job_secret"  # where file:// rendezvous shares a generated secret


@dataclass
class Rendezvous:
    """A connected store and this process's place in the job.

    ``server`` is the store server this process hosts (rank 0 of a TCP rendezvous), else None.
    """

    store: Store
    rank: int
    world_size: int
    local_rank: int
    host_id: str
    secret: bytes
    server: TCPStoreServer | None = None

    def close(self) -> None:
        """Close the store client, then the server if this process hosts it; idempotent.

        Closing the server ends the store for every rank, so the core calls this last.
        """
        self.store.close()
        if self.server is not None:
            self.server.close()

    def __enter__(self) -> "Rendezvous":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


SchemeHandler = Callable[[str, "int | None", "int | None", float, JobInfo], Rendezvous]
"""``handler(url, rank, world_size, timeout, info) -> Rendezvous``; rank/world_size as passed."""

_HANDLERS: dict[str, SchemeHandler] = {}


def register_scheme(scheme: str, handler: SchemeHandler) -> None:
    """Make ``rendezvous`` send ``scheme://...`` URLs to ``handler``.

    Args:
        scheme: the scheme name without ``://``, e.g. ``"etcd"``.
        handler: called as ``handler(url, rank, world_size, timeout, info)``.

    Raises:
        TypeError: ``handler`` is not callable.
        ValueError: ``scheme`` is malformed or already registered.
    """
    if not isinstance(scheme, str) or not scheme.isascii() or not scheme.isidentifier() or not scheme.islower():
        raise ValueError(f"scheme: expected a lower-case name such as 'etcd', got {scheme!r}")
    if not callable(handler):
        raise TypeError(f"handler: expected a callable, got {type(handler).__name__}")
    if scheme in _HANDLERS:
        raise ValueError(f"scheme: {scheme}:// is already registered")
    _HANDLERS[scheme] = handler


def rendezvous(init_method: str | None, rank: int | None, world_size: int | None, timeout: float,
               environ: Mapping[str, str] | None = None) -> Rendezvous:
    """Connect this process to the job's store as ``init_method`` says.

    Args:
        init_method: ``env://`` (the default for None), ``tcp://host:port``, ``file:///path``
            or a registered scheme.
        rank, world_size: override what the environment says; None keeps it.
        timeout: seconds to wait for the store (and the default for its blocking calls).
        environ: the environment to read; None reads ``os.environ``.

    Returns:
        The Rendezvous; close it when the job ends.

    Raises:
        TypeError / ValueError: a bad argument, an unknown scheme, or a variable to set (named).
        RendezvousError: the store cannot be reached or served, or no secret is set for a
            non-loopback store.
        AuthenticationError: the store does not know this job's secret.
    """
    url = "env://" if init_method is None else init_method
    if not isinstance(url, str):
        raise TypeError(f"init_method: expected a URL string such as 'env://', got {type(url).__name__}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout: expected seconds as a number, got {type(timeout).__name__}")
    if not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"timeout: expected a positive, finite number of seconds, got {timeout!r}")
    scheme, sep, _ = url.partition("://")
    handler = _HANDLERS.get(scheme.lower()) if sep else None
    if handler is None:
        expected = ", ".join(f"{name}://" for name in _HANDLERS)
        shown = f"'{scheme}://'" if sep else f"in {url!r}"
        raise ValueError(f"init_method: unknown scheme {shown}; expected one of {expected}")
    return handler(url, rank, world_size, float(timeout), discover(environ))


def resolve_ranks(scheme: str, rank: int | None, world_size: int | None, info: JobInfo) -> tuple[int, int]:
    """Return (rank, world_size): the arguments where given, else the environment's.

    Raises:
        TypeError: an argument is not an int.
        ValueError: either is unknown, out of range, or rank is not below world_size.
    """
    for name, value in (("rank", rank), ("world_size", world_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{scheme}: {name} must be an int, got {type(value).__name__}")
    rank = info.rank if rank is None else rank
    world_size = info.world_size if world_size is None else world_size
    if world_size is None:
        raise ValueError(f"{scheme}: the world size is unknown; pass world_size= or set WORLD_SIZE")
    if rank is None:
        raise ValueError(f"{scheme}: this process's rank is unknown; pass rank= or set RANK")
    if world_size < 1:
        raise ValueError(f"{scheme}: world_size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"{scheme}: rank must be in 0..{world_size - 1} for world_size {world_size}, got {rank}")
    return rank, world_size


def is_loopback(host: str) -> bool:
    """Return whether ``host`` is ``localhost`` or a loopback IP literal (no name lookup)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _network_secret(scheme: str, info: JobInfo, host: str) -> bytes:
    if info.secret is not None:
        return secret_bytes(info.secret)
    if is_loopback(host):
        logger.debug("%s: TENSORCOMM_SECRET is not set; using the fixed loopback key for %s", scheme, host)
        return LOOPBACK_SECRET
    raise RendezvousError(
        f"{scheme}: TENSORCOMM_SECRET is not set and the store address {host!r} is not loopback; set "
        f"TENSORCOMM_SECRET to the same value on every rank (tensorcomm.rendezvous.generate_secret() "
        f"makes one; `tensorcomm run` sets it for you)")


def _tcp_rendezvous(scheme: str, host: str, port: int, rank: int, world_size: int, timeout: float,
                    info: JobInfo) -> Rendezvous:
    """Serve the store here if rank 0 and nobody else serves it, then connect to it."""
    hosting = rank == 0 and not info.store_hosted
    if port == 0 and not (hosting and world_size == 1):
        raise ValueError(f"{scheme}: port 0 (any free port) only works for a single process "
                         f"that hosts the store; give the store's port")
    secret = _network_secret(scheme, info, host)
    server = TCPStoreServer(host, port, secret) if hosting else None
    try:
        store = TCPStore(host, server.port if server else port, secret, timeout)
    except BaseException:
        if server is not None:
            server.close()
        raise
    return Rendezvous(store, rank, world_size, info.local_rank, info.host_id, secret, server)


def _env_handler(url: str, rank: int | None, world_size: int | None, timeout: float,
                 info: JobInfo) -> Rendezvous:
    if url != "env://":
        raise ValueError(f"env://: takes no address or options, got {url!r}; "
                         f"the address comes from MASTER_ADDR and MASTER_PORT")
    rank, world_size = resolve_ranks("env://", rank, world_size, info)
    if info.master_addr is None:
        raise ValueError("env://: MASTER_ADDR is not set; set it to the address of the host that "
                         "serves the store (rank 0's), or use init_method='tcp://host:port'")
    if info.master_port is None:
        raise ValueError("env://: MASTER_PORT is not set; set it to the store's port, e.g. 29500")
    if info.torch_agent_store and not info.store_hosted:
        # torchrun's agent already serves a (torch) store on MASTER_PORT: meet there, through
        # torch, which torchrun implies is installed. Imported by name: the core needs no torch.
        importlib.import_module("tensorcomm.torch")
        return _HANDLERS[TORCHRUN_SCHEME](url, rank, world_size, timeout, info)
    return _tcp_rendezvous("env://", info.master_addr, info.master_port, rank, world_size, timeout, info)


def _tcp_handler(url: str, rank: int | None, world_size: int | None, timeout: float,
                 info: JobInfo) -> Rendezvous:
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"tcp://: expected tcp://host:port, got {url!r}; "
                         f"pass rank= and world_size= as arguments, not in the URL")
    rank, world_size = resolve_ranks("tcp://", rank, world_size, info)
    return _tcp_rendezvous("tcp://", parts.hostname, port, rank, world_size, timeout, info)


def shared_secret(store: Store, rank: int, info: JobInfo, key: str) -> bytes:
    """The job secret: ``TENSORCOMM_SECRET`` if set, else one rank 0 makes and shares at ``key``.

    Only for stores that are themselves private to the job (a 0600 file, a store the caller
    already trusts): the secret is exactly as safe as the store it travels through.
    """
    if info.secret is not None:
        return secret_bytes(info.secret)
    if rank == 0:
        secret = secret_bytes(generate_secret())
        store.set(key, secret)
        return secret
    return store.get(key)


def _file_handler(url: str, rank: int | None, world_size: int | None, timeout: float,
                  info: JobInfo) -> Rendezvous:
    parts = urllib.parse.urlsplit(url)
    if parts.netloc not in ("", "localhost") or not parts.path.startswith("/") or parts.query:
        raise ValueError(f"file://: expected file:///absolute/path, got {url!r}")
    rank, world_size = resolve_ranks("file://", rank, world_size, info)
    store = FileStore(urllib.parse.unquote(parts.path), timeout)
    try:
        secret = shared_secret(store, rank, info, FILE_SECRET_KEY)
    except BaseException:
        store.close()
        raise
    return Rendezvous(store, rank, world_size, info.local_rank, info.host_id, secret, None)


register_scheme("env", _env_handler)
register_scheme("tcp", _tcp_handler)
register_scheme("file", _file_handler)
