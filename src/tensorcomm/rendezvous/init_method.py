"""Turn an ``init_method`` URL into a connected store: the URL-scheme registry.

Owns :func:`rendezvous`, the registry of schemes (``env://``, ``tcp://host:port``,
``file:///path``; more via :func:`register_scheme`) and the choice of job secret. It connects
every rank to one store and starts the store server on rank 0 when nobody else serves it; it does
no barrier or rank counting, which belongs to the core, except that on a store tensorcomm does
not own (torch's) the ranks move to one rank 0 serves (``own_store``) before they return.
Errors name their scheme, as ``"tcp://: ..."``. Imports the rest of ``rendezvous``, ``config`` and ``errors``.

The job secret (what it protects: docs/security.md) is ``TENSORCOMM_SECRET`` when set. Otherwise
each job makes a fresh one; no job ever runs on a key a stranger can know:

- a store on a loopback address (``tcp://``, ``env://`` under mpirun, srun or by hand): rank 0,
  which hosts the store, generates the secret and writes it to a private file
  (``rendezvous.private``) named after the store's address; the other ranks read it there. A
  file left by an earlier job on the same port is replaced by rank 0 and outwaited by the others
  (they retry while the store refuses the secret they read);
- ``file://``: rank 0 generates it and shares it through the store file, which is private to
  this user (``FileStore`` refuses any other);
- a store strangers can read (torch's, under torchrun: :func:`secret_via_store`): rank 0 writes
  the secret to a private file with a random name and puts only that name, a fingerprint and its
  host in the store; a rank on another host, which cannot read the file, is refused at once (and
  so is every rank: ``own_store.refuse``);
- any other store address: a RendezvousError that says how to set a secret.
"""

from __future__ import annotations

import hashlib
import importlib.util
import ipaddress
import math
import os
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tensorcomm.config import ENV_SECRET, ENV_SECRET_DIR, ENV_STORE_HOSTED, MAX_TIMEOUT
from tensorcomm.errors import AuthenticationError, CommError, RendezvousError
from tensorcomm.rendezvous import slurm
from tensorcomm.rendezvous.auth import JobKey, generate_secret, secret_bytes
from tensorcomm.rendezvous.discovery import JobInfo, discover
from tensorcomm.rendezvous.own_store import own_store, refuse
from tensorcomm.rendezvous.private import (
    SecretDir,
    SecretFile,
    job_secret_name,
    store_secret_name,
    valid_job_secret_name,
)
from tensorcomm.rendezvous.store import FileStore, PrefixStore, Store
from tensorcomm.rendezvous.tcp_store import TCPStore, TCPStoreServer

FILE_SECRET_KEY = "tensorcomm/job_secret"  # where file:// rendezvous shares a generated secret
ANNOUNCE_KEY = "tensorcomm/secret_file"  # where secret_via_store announces the secret's file
JOINS_KEY = "tensorcomm/joins"  # counts inits on a store handed to init(store=...)
SECRET_HINT = (f"set {ENV_SECRET} to the same value on every rank (tensorcomm.rendezvous."
               f"generate_secret() makes one; `tensorcomm run` sets it for you)")
SECRET_POLL = 0.05  # seconds between looks at a secret file that is not there (or stale) yet
STALE_RETRY = 1.0  # seconds before the store is offered a secret it refused once again


@dataclass
class Rendezvous:
    """A connected store and this process's place in the job.

    ``server`` is the store server this process hosts (rank 0 of a TCP rendezvous), else None;
    ``secret_file`` the private file this process wrote the generated secret to, else None.
    """

    store: Store
    rank: int
    world_size: int
    local_rank: int
    host_id: str
    secret: bytes
    server: TCPStoreServer | None = None
    secret_file: SecretFile | None = None

    def close(self) -> None:
        """Close the store client, remove the secret file, then close the server; idempotent.

        Closing the server ends the store for every rank, so the core calls this last. The
        file goes first: while the server holds the port, no later job can have replaced it.
        """
        self.store.close()
        if self.secret_file is not None:
            self.secret_file.remove()
        if self.server is not None:
            self.server.close()

    def __enter__(self) -> Rendezvous:
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
    if (not isinstance(scheme, str) or not scheme.isascii() or not scheme.isidentifier()
            or not scheme.islower()):
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
        RendezvousError: the store cannot be reached or served, or no secret is set and none
            can be generated safely (a non-loopback store, an unsafe secret directory).
        AuthenticationError: the store does not know this job's secret.
    """
    url = "env://" if init_method is None else init_method
    if not isinstance(url, str):
        raise TypeError(f"init_method: expected a URL string such as 'env://', got {type(url).__name__}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout: expected seconds as a number, got {type(timeout).__name__}")
    if not math.isfinite(timeout) or not 0 < timeout <= MAX_TIMEOUT:
        raise ValueError(f"timeout: expected a positive number of seconds, at most {MAX_TIMEOUT:g} "
                         f"(about 31 years), got {timeout!r}")
    scheme, sep, _ = url.partition("://")
    handler = _HANDLERS.get(scheme.lower()) if sep else None
    if handler is None:
        expected = ", ".join(f"{name}://" for name in _HANDLERS)
        shown = f"'{scheme}://'" if sep else f"in {url!r}"
        raise ValueError(f"init_method: unknown scheme {shown}; expected one of {expected}")
    return handler(url, rank, world_size, float(timeout), discover(environ))


def from_store(store: Store, rank: int | None, world_size: int | None, timeout: float,
               secret: str | bytes | None = None, environ: Mapping[str, str] | None = None) -> Rendezvous:
    """Meet on a store the caller already holds (``init(store=...)``), as torch's
    ``init_process_group(store=...)`` does.

    Every init on one store counts itself there, so a later world (destroy, then init again)
    keeps its keys apart under ``tensorcomm/<generation>/``. The secret is ``secret``, else
    ``TENSORCOMM_SECRET``, else generated and handed over in a private file on this host
    (``secret_via_store``): never through the store itself, which may be readable by others.
    On a store tensorcomm does not own (``store.foreign``: torch's), the ranks then move to a
    store rank 0 serves (``own_store``): the returned Rendezvous holds that one.

    Raises:
        TypeError / ValueError: a bad argument.
        RendezvousError: no secret can be had (ranks on several hosts need one), or the own
            store cannot be served or reached.
        AuthenticationError: the own store's announcement was tampered with.
    """
    if not isinstance(store, Store):
        raise TypeError(f"store: expected a tensorcomm.rendezvous.Store, got {type(store).__name__}")
    info = discover(environ)
    if rank is None or world_size is None:
        raise ValueError("store: rank= and world_size= must be given with a store")
    rank, world_size = resolve_ranks("store", rank, world_size, info)
    given = None if secret is None else secret_bytes(secret)  # refused before the store counts us
    generation = (store.add(JOINS_KEY, 1) - 1) // world_size
    scoped = PrefixStore(f"tensorcomm/{generation}", store)
    if given is not None:
        key, secret_file = given, None
    else:
        host = getattr(store, "host", "127.0.0.1")
        try:
            key, secret_file = secret_via_store("store", scoped, host, rank, info, timeout)
        except RendezvousError as exc:
            if store.foreign and rank != 0:  # so that rank 0 stops at once too
                refuse(scoped, f"rank {rank}: {exc}", tampered=False)
            raise
    if not store.foreign:
        return Rendezvous(scoped, rank, world_size, info.local_rank, info.host_id, key,
                          secret_file=secret_file)
    namespace = "/".join(part for part in (getattr(store, "namespace", ""), scoped.prefix) if part)
    try:
        own, server = own_store("store", scoped, namespace, generation, rank, world_size, key, timeout)
    except BaseException as exc:
        if secret_file is not None:
            secret_file.remove()
        if isinstance(exc, RendezvousError):
            joins = _count(store)
            if joins % world_size:  # counted into different generations
                raise RendezvousError(
                    f"{exc}; the store's count of inits {JOINS_KEY!r} reads {joins}, not a multiple of "
                    f"the world size {world_size}: a rank did not start, or someone else (anyone who can "
                    f"connect may write to this store) changed it and the ranks look for each other "
                    f"in different generations") from exc
        raise
    return Rendezvous(own, rank, world_size, info.local_rank, info.host_id, key, server, secret_file)


def _count(store: Store) -> int:
    """The count of inits on ``store`` (0 if it cannot be read)."""
    try:
        return int(store.get(JOINS_KEY, 1.0))
    except (CommError, ValueError):
        return 0


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
        raise ValueError(f"{scheme}: rank must be in 0..{world_size - 1} for world_size {world_size}, "
                         f"got {rank}")
    return rank, world_size


def is_loopback(host: str) -> bool:
    """Return whether ``host`` is ``localhost`` or a loopback IP literal (no name lookup)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _check_local(scheme: str, host: str, info: JobInfo) -> None:
    """Refuse a generated secret where the other ranks could not read its private file.

    Raises:
        RendezvousError: the store address is not loopback, or a launcher hosts the store (it
            must then pass its secret on).
    """
    if not is_loopback(host):
        raise RendezvousError(
            f"{scheme}: {ENV_SECRET} is not set and the store address {host!r} is not loopback, so "
            f"ranks may be on other hosts, which a generated secret cannot reach; {SECRET_HINT}")
    if info.store_hosted:
        raise RendezvousError(f"{scheme}: {ENV_STORE_HOSTED}=1 but {ENV_SECRET} is not set: whoever "
                              f"hosts the store must give its ranks the secret it serves with")


def _secret_dir(scheme: str, info: JobInfo) -> SecretDir:
    try:
        return SecretDir(info.secret_dir, f"Point {ENV_SECRET_DIR} at such a directory, or {SECRET_HINT}")
    except RendezvousError as exc:
        raise RendezvousError(f"{scheme}: {exc}") from None


def _tcp_rendezvous(scheme: str, host: str, port: int, rank: int, world_size: int, timeout: float,
                    info: JobInfo) -> Rendezvous:
    """Serve the store here if rank 0 and nobody else serves it, then connect to it."""
    hosting = rank == 0 and not info.store_hosted
    if port == 0 and not (hosting and world_size == 1):
        raise ValueError(f"{scheme}: port 0 (any free port) only works for a single process "
                         f"that hosts the store; give the store's port")
    if info.secret is None:
        _check_local(scheme, host, info)
        directory = _secret_dir(scheme, info)
        if not hosting:
            store, secret = _join_with_secret_file(scheme, host, port, directory, timeout)
            return Rendezvous(store, rank, world_size, info.local_rank, info.host_id, secret)
        secret = secret_bytes(generate_secret())
    else:
        directory, secret = None, secret_bytes(info.secret, ENV_SECRET)
    server = TCPStoreServer(host, port, secret) if hosting else None
    secret_file = None
    try:
        if server is not None and directory is not None and world_size > 1:
            # Written once the port is ours: a file of that name is then a stale one to replace.
            secret_file = directory.write(store_secret_name(host, server.port), secret)
        store = TCPStore(host, server.port if server else port, secret, timeout)
    except BaseException:
        if secret_file is not None:
            secret_file.remove()
        if server is not None:
            server.close()
        raise
    return Rendezvous(store, rank, world_size, info.local_rank, info.host_id, secret, server, secret_file)


def _join_with_secret_file(scheme: str, host: str, port: int, directory: SecretDir,
                           timeout: float) -> tuple[TCPStore, bytes]:
    """Read the secret rank 0 wrote for the store at ``host:port`` and connect with it.

    A secret the store refuses is a stale file of an earlier job: wait for rank 0 to replace it.
    """
    name = store_secret_name(host, port)
    deadline = time.monotonic() + timeout
    refused: bytes | None = None
    retry_at = 0.0
    while True:
        found = directory.read(name)
        secret = None if found is None else JobKey(found)
        now = time.monotonic()
        if secret is not None and (secret != refused or now >= retry_at):
            try:
                return TCPStore(host, port, secret, max(deadline - now, 0.01)), secret
            except AuthenticationError as exc:
                refused, retry_at = secret, time.monotonic() + STALE_RETRY
                if time.monotonic() >= deadline:
                    raise AuthenticationError(
                        f"{scheme}: the store at {host}:{port} refused the secret in "
                        f"{os.path.join(directory.path, name)} until the timeout ({timeout:g} s); "
                        f"is it a stale file of an earlier job? {exc}") from exc
        if time.monotonic() >= deadline:
            raise RendezvousError(
                f"{scheme}: {ENV_SECRET} is not set and no secret appeared in "
                f"{os.path.join(directory.path, name)} within {timeout:g} s; rank 0 writes it there "
                f"when it hosts the store on this host (do all ranks run on one host, as one user, "
                f"with the same {ENV_SECRET_DIR}?). Or {SECRET_HINT}")
        time.sleep(SECRET_POLL)


def secret_via_store(scheme: str, store: Store, host: str, rank: int, info: JobInfo,
                     timeout: float) -> tuple[JobKey, SecretFile | None]:
    """The job secret for ranks that meet on a store strangers may read (torch's TCPStore).

    ``TENSORCOMM_SECRET`` if set. Otherwise rank 0 writes a fresh secret to a private file and
    puts only the file's name, a fingerprint and its host in ``store``; the other ranks read the
    file. The secret itself never enters the store.

    Args:
        scheme: names the rendezvous in error messages.
        store: the store every rank shares.
        host: the store's address (a generated secret needs a loopback one).
        rank, info, timeout: this rank, its environment, seconds to wait for rank 0.

    Returns:
        The secret, and the file rank 0 wrote (remove it when the job ends), else None.

    Raises:
        RendezvousError: no secret is set and the store is not on loopback, the secret
            directory is not private, rank 0 is on another host, or its file did not appear.
    """
    if info.secret is not None:
        return secret_bytes(info.secret, ENV_SECRET), None
    _check_local(scheme, host, info)
    directory = _secret_dir(scheme, info)
    if rank == 0:
        secret = secret_bytes(generate_secret())
        secret_file = directory.write(job_secret_name(), secret)
        try:
            announcement = "\n".join([secret_file.name, _fingerprint(secret), info.host_id])
            store.set(ANNOUNCE_KEY, announcement.encode())
        except BaseException:
            secret_file.remove()
            raise
        return secret, secret_file
    deadline = time.monotonic() + timeout
    while True:  # the announcement is read again each time: a re-init replaces the previous one
        announced = store.get(ANNOUNCE_KEY, max(0.0, deadline - time.monotonic()))
        name, fingerprint, origin = [*announced.decode("utf-8", "replace").split("\n", 2), "", ""][:3]
        if not valid_job_secret_name(name):
            raise RendezvousError(f"{scheme}: the store announces the secret file {name[:80]!r}, not a "
                                  f"name rank 0 makes; refusing it")
        if origin != info.host_id:
            raise RendezvousError(f"{scheme}: {ENV_SECRET} is not set and rank 0 runs on host "
                                  f"{origin!r}, this rank on {info.host_id!r}: a generated secret "
                                  f"cannot leave its host; {SECRET_HINT}")
        found = directory.read(name)
        if found is not None and _fingerprint(found) == fingerprint:
            return JobKey(found), None
        if time.monotonic() >= deadline:
            raise RendezvousError(f"{scheme}: rank 0's secret did not appear in "
                                  f"{os.path.join(directory.path, name)} within {timeout:g} s (do all "
                                  f"ranks run as one user, with the same {ENV_SECRET_DIR}?); {SECRET_HINT}")
        time.sleep(SECRET_POLL)


def _fingerprint(secret: bytes) -> str:
    """A public digest of ``secret`` that tells its file from a stale one and reveals nothing."""
    return hashlib.sha256(b"tensorcomm secret fingerprint\0" + secret).hexdigest()


def _env_handler(url: str, rank: int | None, world_size: int | None, timeout: float,
                 info: JobInfo) -> Rendezvous:
    if url != "env://":
        raise ValueError(f"env://: takes no address or options, got {url!r}; "
                         f"the address comes from MASTER_ADDR and MASTER_PORT")
    if info.master_addr is None and info.master_port is None:
        unset = _without_master(rank, world_size, timeout, info)
        if unset is not None:
            return unset
    rank, world_size = resolve_ranks("env://", rank, world_size, info)
    if info.master_addr is None:
        raise ValueError("env://: MASTER_ADDR is not set; set it to the address of the host that "
                         "serves the store (rank 0's), or use init_method='tcp://host:port'")
    if info.master_port is None:
        raise ValueError("env://: MASTER_PORT is not set; set it to the store's port, e.g. 29500")
    if info.torch_agent_store and not info.store_hosted:
        # torchrun's agent already serves a (torch) store on MASTER_PORT: meet there, through
        # torch's client, which torchrun implies is installed (imported here, not at the top:
        # nothing else in the rendezvous layer needs torch).
        from tensorcomm.rendezvous.torch_store import torchrun_store

        return from_store(torchrun_store(world_size, timeout, info), rank, world_size, timeout)
    return _tcp_rendezvous("env://", info.master_addr, info.master_port, rank, world_size, timeout, info)


def _without_master(rank: int | None, world_size: int | None, timeout: float,
                    info: JobInfo) -> Rendezvous | None:
    """``env://`` with neither MASTER_ADDR nor MASTER_PORT: meet as the launcher allows.

    srun's ranks meet at the first host of the node list (``rendezvous.slurm``); a process no
    launcher started is a world of one, as with mpi4py. An MPI launcher's ranks meet through MPI
    (``meets_through_mpi``), which ``init()`` does before it comes here. None: nothing applies
    (the caller says what to set).

    Raises:
        ValueError: an MPI launcher without Slurm (the message names the ways out).
    """
    if info.slurm_nodelist is not None and info.slurm_job_id is not None:
        try:
            hosts = slurm.expand_nodelist(info.slurm_nodelist)
        except ValueError as exc:
            raise ValueError(f"env://: MASTER_ADDR is not set and the Slurm {exc}; set MASTER_ADDR "
                             f"and MASTER_PORT") from None
        rank, world_size = resolve_ranks("env://", rank, world_size, info)
        host = "127.0.0.1" if len(set(hosts)) == 1 else hosts[0]  # one host: a generated secret works
        port = slurm.store_port(info.slurm_job_id)
        return _tcp_rendezvous("env://", host, port, rank, world_size, timeout, info)
    if info.mpi_launcher is not None:
        if importlib.util.find_spec("mpi4py") is None:
            way = ("mpi4py is not installed, through which the ranks would meet. Install it (pip "
                   "install 'tensorcomm[mpi]'; then a plain init() meets through MPI, and "
                   "init(backend='mpi') also carries the messages over MPI)")
        else:
            way = ("tensorcomm.init() without init_method meets through MPI (mpi4py), this "
                   "rendezvous cannot: call that, or init(backend='mpi')")
        raise ValueError(f"env://: MASTER_ADDR is not set; an MPI launcher started this process "
                         f"({info.mpi_launcher} is set) and {way}, or set MASTER_ADDR and "
                         f"MASTER_PORT to where rank 0 serves the store")
    if info.source == "none" and rank is None and world_size is None:
        # No launcher: a world of one, on a store of its own (a free loopback port).
        return _tcp_rendezvous("env://", "127.0.0.1", 0, 0, 1, timeout, info)
    return None


def meets_through_mpi(info: JobInfo) -> bool:
    """Whether ``init()`` without ``init_method`` meets through MPI: an MPI launcher started this
    process, MASTER_ADDR and MASTER_PORT are unset and mpi4py is installed (``core`` then calls
    the MPI transport's rendezvous, which this layer cannot import)."""
    return (info.mpi_launcher is not None and info.master_addr is None and info.master_port is None
            and importlib.util.find_spec("mpi4py") is not None)


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


def _file_secret(store: Store, rank: int, info: JobInfo) -> bytes:
    """``TENSORCOMM_SECRET`` if set, else one rank 0 makes and shares through the store file.

    Safe only because the file is this user's alone (``FileStore`` refuses any other).
    """
    if info.secret is not None:
        return secret_bytes(info.secret, ENV_SECRET)
    if rank == 0:
        secret = secret_bytes(generate_secret())
        store.set(FILE_SECRET_KEY, secret)
        return secret
    return JobKey(store.get(FILE_SECRET_KEY))


def _file_handler(url: str, rank: int | None, world_size: int | None, timeout: float,
                  info: JobInfo) -> Rendezvous:
    parts = urllib.parse.urlsplit(url)
    if parts.netloc not in ("", "localhost") or not parts.path.startswith("/") or parts.query:
        raise ValueError(f"file://: expected file:///absolute/path, got {url!r}")
    rank, world_size = resolve_ranks("file://", rank, world_size, info)
    store = FileStore(urllib.parse.unquote(parts.path), timeout)
    try:
        secret = _file_secret(store, rank, info)
    except BaseException:
        store.close()
        raise
    return Rendezvous(store, rank, world_size, info.local_rank, info.host_id, secret, None)


register_scheme("env", _env_handler)
register_scheme("tcp", _tcp_handler)
register_scheme("file", _file_handler)
