"""Shared memory that cannot leak: one anonymous segment per group, handed to the members by fd.

Owns creating the segment, passing it to the other members of a group, mapping it and learning
every member's pid (for liveness checks). Imports ``config``, ``errors``, ``rendezvous.auth`` and
``rendezvous.gate`` only.

Why this shape:

- The segment is a ``memfd_create`` file: it has no name in ``/dev/shm`` or anywhere else, so
  nothing can leak when ranks are killed (SIGKILL included). The kernel frees it when the last
  mapping or descriptor goes away. ``multiprocessing.shared_memory`` is not used: before Python
  3.13 it unlinks segments when any attached process exits (CPython issue 82300), and a named
  segment outlives a SIGKILL.
- Group rank 0 (the *leader*) creates the segment and serves it on an abstract-namespace Unix
  socket (again no file name: the name vanishes with the socket). Each other member connects,
  both sides run the job-secret HMAC handshake (``rendezvous/auth.py``, purpose ``b"shm"``,
  bound to the socket's name and both group ranks), and the leader sends the descriptor with ``SCM_RIGHTS``
  (``socket.send_fds``) together with every member's pid. A process that does not know the job
  secret never gets the descriptor.
- Abstract sockets have no file permissions (anyone on the host can connect, and read the name
  in ``/proc/net/unix``), so both sides also check the other's uid (``SO_PEERCRED``): the leader
  takes every waiting connection at once and closes another user's there and then, so a flood
  of them cannot keep its backlog (``SOMAXCONN``) full; a member whose connect finds the backlog
  full anyway (``EAGAIN``), or nobody listening yet, retries until its deadline. The leader
  authenticates its own user's connections concurrently, each within
  ``config.HANDSHAKE_TIMEOUT``, a bounded number at a time, so a silent local connection delays
  no member.
- A process short of file descriptors (each group holds a few per member) raises
  ``OutOfDescriptors``, naming ``RLIMIT_NOFILE``, before it starts: a limit to raise, not a
  reason to fall back quietly (the core fails the group's set-up on every member).
- Pids come from the kernel (``SO_PEERCRED``), not from what a peer claims. Members in another
  pid namespace (the pid the leader reports for itself differs from the one the kernel shows)
  refuse the segment, since liveness checks would watch the wrong processes.
- The segment is sealed against shrinking, so no member can truncate it under the others (which
  would turn their next access into SIGBUS).
- Descriptors are closed as soon as the segment is mapped; only the mapping remains (with the one
  duplicate descriptor CPython's ``mmap`` object keeps until Python 3.13), and both go with
  ``close()`` or the process.

Abstract Unix sockets belong to a network namespace. Members that claim one host identity but sit
in different network namespaces cannot connect; ``establish`` then fails with ``ShmUnavailable``
and the caller falls back to TCP.
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import resource
import secrets
import select
import socket
import struct
import threading
import time
from collections.abc import Callable

from ...config import HANDSHAKE_TIMEOUT
from ...errors import AuthenticationError
from ...rendezvous import auth
from ...rendezvous.gate import Gate, describe_error, descriptor_limit, out_of_descriptors

log = logging.getLogger("tensorcomm.shm")

PURPOSE = b"shm"
_OFFER = struct.Struct("<QQ")  # segment bytes, number of members; then one u64 pid per member
_MAX_MEMBERS = 1 << 16
_POLL = 0.05  # seconds between checks of the store while waiting for members
_RETRY_FIRST = 0.001  # seconds before a member connects again to a full backlog (then doubling)
_ACCEPT_BATCH = 256  # connections the leader takes in one turn before it looks at the store again
# Descriptors a set-up takes at most: the leader's segment, its mapping's copy, listener, wake-up
# pipe and selector, plus one per member; a member's socket, the segment received and its copy.
_LEADER_FDS, _MEMBER_FDS = 7, 4


class ShmUnavailable(RuntimeError):
    """Shared memory cannot be set up for this group; the caller should fall back to TCP."""


class OutOfDescriptors(ShmUnavailable):
    """This process has too few file descriptors left to set up a group's shared memory; the
    message names ``RLIMIT_NOFILE`` and how to raise it."""


class Arena:
    """One shared segment, mapped in this process.

    Attributes:
        mm: the mapping (``mmap.mmap``), ``nbytes`` long.
        nbytes: size of the segment.
        pids: pid of every member, in group-rank order (as this process's pid namespace sees them).
    """

    def __init__(self, mm: mmap.mmap, nbytes: int, pids: tuple[int, ...]) -> None:
        self.mm = mm
        self.nbytes = nbytes
        self.pids = pids

    def close(self) -> None:
        """Unmap the segment; idempotent.

        Views of the mapping that are still alive keep it mapped until they are garbage-collected
        (``mmap`` refuses to close under exported buffers); the memory is freed after that.
        """
        try:
            self.mm.close()
        except BufferError:
            log.debug("shared segment still has live views; it is unmapped when they are freed")


def _create_segment(nbytes: int) -> int:
    fd = os.memfd_create("tensorcomm-shm", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, nbytes)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _map(fd: int, nbytes: int) -> mmap.mmap:
    if os.fstat(fd).st_size < nbytes:
        raise ShmUnavailable(f"the shared segment is smaller than the {nbytes} bytes announced")
    return mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)


def _peer_credentials(sock: socket.socket) -> tuple[int, int]:
    """The (pid, uid) of the process at the other end of ``sock``, from the kernel."""
    pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                         struct.calcsize("3i")))
    return pid, uid


def _check_same_user(sock: socket.socket, role: str) -> int:
    """Refuse a peer that runs as another user; return its pid.

    Raises:
        AuthenticationError: the peer's uid is not this process's effective uid.
    """
    pid, uid = _peer_credentials(sock)
    if uid != os.geteuid():
        raise AuthenticationError(f"the {role} (pid {pid}) runs as uid {uid}, not as this user "
                                  f"(uid {os.geteuid()})")
    return pid


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    return auth.recv_exact(sock, n, max(0.01, deadline - time.monotonic()))


def establish(rank: int, size: int, nbytes: int, secret: bytes, publish: Callable[[str], None],
              lookup: Callable[[float], str | None], failed: Callable[[], str | None],
              timeout: float, initialize: Callable[[mmap.mmap], None] = lambda mm: None) -> Arena:
    """Create (group rank 0) or receive (the others) the group's segment and map it.

    Args:
        rank: this process's group rank; rank 0 creates the segment.
        size: number of members.
        nbytes: size of the segment.
        secret: the job's HMAC key.
        publish: the leader calls ``publish(address)`` so members can find its socket.
        lookup: members call ``lookup(seconds)`` for the leader's address (None: not yet).
        failed: returns a reason once any member gave up on shared memory, else None; waits
            stop early when it does.
        timeout: seconds the whole set-up may take.
        initialize: the leader calls ``initialize(mapping)`` before any member can see the segment.

    Raises:
        ShmUnavailable: the segment could not be created, reached or trusted.
    """
    if not 1 <= size <= _MAX_MEMBERS:
        raise ShmUnavailable(f"a shared segment serves 1..{_MAX_MEMBERS} members, not {size}")
    deadline = time.monotonic() + timeout
    try:
        if rank == 0:
            _check_descriptors(_LEADER_FDS + size)
            return _lead(size, nbytes, secret, publish, failed, deadline, initialize)
        _check_descriptors(_MEMBER_FDS)
        return _join(rank, size, nbytes, secret, lookup, failed, deadline)
    except ShmUnavailable:
        raise
    except OSError as exc:
        if out_of_descriptors(exc):
            raise OutOfDescriptors(describe_error(exc)) from exc
        raise ShmUnavailable(f"{type(exc).__name__}: {exc}") from exc
    except (ValueError, AuthenticationError) as exc:
        raise ShmUnavailable(f"{type(exc).__name__}: {exc}") from exc


def _check_descriptors(needed: int) -> None:
    """Raise OutOfDescriptors unless ``needed`` more descriptors fit under ``RLIMIT_NOFILE``."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return
    try:
        used = len(os.listdir("/proc/self/fd")) - 1  # less the one listing the directory
    except OSError:  # no /proc: the calls themselves will say (EMFILE)
        return
    if used + needed > soft:
        raise OutOfDescriptors(f"this process is out of file descriptors: {used} are open and setting "
                               f"up shared memory takes up to {needed} more ({descriptor_limit()})")


def _lead(size: int, nbytes: int, secret: bytes, publish: Callable[[str], None],
          failed: Callable[[], str | None], deadline: float,
          initialize: Callable[[mmap.mmap], None]) -> Arena:
    fd = _create_segment(nbytes)
    try:
        mm = _map(fd, nbytes)
        try:
            initialize(mm)
        except BaseException:
            mm.close()
            raise
        if size == 1:
            return Arena(mm, nbytes, (os.getpid(),))
        address = f"tensorcomm-{secrets.token_hex(16)}"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        members = _Members(size, secret, deadline, address)
        try:
            listener.bind("\0" + address)
            listener.listen(socket.SOMAXCONN)
            publish(address)
            socks = members.gather(listener, failed)
            pids = [os.getpid()] + [pid for _, pid in socks]
            offer = _OFFER.pack(nbytes, size) + struct.pack(f"<{size}Q", *pids)
            for sock, _ in socks:
                socket.send_fds(sock, [offer], [fd])
            # Wait until every member has mapped the segment: then the descriptor may go.
            for sock, _ in socks:
                if _recv_exact(sock, 1, deadline) != b"M":
                    raise ShmUnavailable("a member could not map the shared segment")
        except BaseException:
            mm.close()
            raise
        finally:
            listener.close()
            members.close()
        return Arena(mm, nbytes, tuple(pids))
    finally:
        os.close(fd)


class _Members:
    """The leader's side of set-up: accepts connections on its socket and authenticates them
    concurrently through a ``rendezvous.gate.Gate`` (each within ``config.HANDSHAKE_TIMEOUT``),
    so a silent or slow local stranger delays no member."""

    def __init__(self, size: int, secret: bytes, deadline: float, address: str) -> None:
        self._size, self._secret, self._deadline, self._address = size, secret, deadline, address
        self._lock = threading.Lock()
        self._joined: dict[int, tuple[socket.socket, int]] = {}
        self._error: str | None = None
        self._closed = False
        self._gate = Gate("shared-memory leader", log)
        # Handshake threads write a byte here when a member joins or fails, waking gather().
        self._wake_read, self._wake_write = os.pipe()

    def gather(self, listener: socket.socket,
               failed: Callable[[], str | None]) -> list[tuple[socket.socket, int]]:
        """Accept until every member is in; return (socket, pid) in group-rank order 1..size-1.

        Raises:
            ShmUnavailable: a member gave up (``failed``), one claimed a wrong rank, accepting
                failed (the message names a descriptor limit), or the deadline passed.
        """
        next_check = 0.0
        poller = select.poll()  # not select.select: descriptors may be numbered above 1024
        for fd in (listener.fileno(), self._wake_read):
            poller.register(fd, select.POLLIN)
        while True:
            with self._lock:
                if self._error is not None:
                    raise ShmUnavailable(self._error)
                if len(self._joined) == self._size - 1:
                    return [self._joined[r] for r in range(1, self._size)]
                missing = sorted(set(range(1, self._size)) - set(self._joined))
            now = time.monotonic()
            if now >= self._deadline:
                raise ShmUnavailable(f"group ranks {missing} did not connect to the shared-memory "
                                     f"leader in time")
            if now >= next_check:  # asks the store: not on every connection of a flood
                reason = failed()
                if reason is not None:
                    raise ShmUnavailable(reason)
                next_check = now + _POLL
            ready = {fd for fd, _ in poller.poll(1000 * min(_POLL, self._deadline - now))}
            if self._wake_read in ready:
                os.read(self._wake_read, 64)
            if listener.fileno() in ready:
                self._accept(listener)

    def _accept(self, listener: socket.socket) -> None:
        """Take the connections waiting (up to a batch): another user's is closed at once, so a
        flood of them cannot keep the backlog full; this user's goes to the gate.

        Raises:
            ShmUnavailable: accepting failed (OutOfDescriptors: for want of descriptors).
        """
        listener.setblocking(False)
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, _ = listener.accept()
            except BlockingIOError:  # none left (or one went away before we took it)
                return
            except OSError as exc:
                error = OutOfDescriptors if out_of_descriptors(exc) else ShmUnavailable
                raise error(f"cannot accept members: {describe_error(exc)}") from exc
            try:
                pid, uid = _peer_credentials(sock)
            except OSError:  # it went away meanwhile
                sock.close()
                continue
            if uid != os.geteuid():
                self._gate.refuse(sock, f"pid {pid}", f"it runs as uid {uid}, not as this user")
            else:
                self._gate.admit(sock, "a local process", self._handshake)

    def close(self) -> None:
        """Close every member's socket; connections still authenticating are closed when done."""
        with self._lock:
            self._closed = True
            joined, self._joined = list(self._joined.values()), {}
            os.close(self._wake_read)
            os.close(self._wake_write)
        self._gate.close()
        for sock, _ in joined:
            sock.close()

    def _handshake(self, sock: socket.socket, peer: str) -> None:
        limit = min(self._deadline, time.monotonic() + HANDSHAKE_TIMEOUT)
        try:
            pid = _check_same_user(sock, "connecting process")
            member = auth.handshake_server(sock, self._secret, max(0.01, limit - time.monotonic()), PURPOSE,
                                           addresses=(self._address,), rank=0).peer_rank
        except (AuthenticationError, OSError) as exc:
            # A stranger (or a broken client): refuse it and keep waiting for the real members.
            sock.close()
            log.warning("refused a shared-memory connection: %s", exc)
            return None
        with self._lock:
            if self._closed:
                sock.close()
            elif not 0 < member < self._size or member in self._joined or pid <= 0:
                sock.close()
                self._error = self._error or (f"unexpected shared-memory member claiming group rank "
                                              f"{member} (pid {pid})")
            else:
                self._joined[member] = (sock, pid)
            if not self._closed:
                os.write(self._wake_write, b"!")
        return None


def _join(rank: int, size: int, nbytes: int, secret: bytes, lookup: Callable[[float], str | None],
          failed: Callable[[], str | None], deadline: float) -> Arena:
    address = None
    while address is None:
        reason = failed()
        if reason is not None:
            raise ShmUnavailable(reason)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ShmUnavailable("the shared-memory leader did not publish its address in time")
        address = lookup(min(_POLL, remaining))
    sock = _connect_leader(address, rank, secret, failed, deadline)
    try:
        header_bytes = _OFFER.size + 8 * size
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        message, fds, _flags, _addr = socket.recv_fds(sock, header_bytes, 1)
        try:
            if len(message) < header_bytes:
                message += _recv_exact(sock, header_bytes - len(message), deadline)
            offered, members = _OFFER.unpack_from(message)
            if len(fds) != 1 or offered != nbytes or members != size:
                raise ShmUnavailable(f"the leader offered {len(fds)} descriptors for {offered} bytes and "
                                     f"{members} members; expected 1, {nbytes} and {size}")
            pids = struct.unpack_from(f"<{size}Q", message, _OFFER.size)
            if pids[0] != _peer_credentials(sock)[0] or pids[rank] != os.getpid():
                raise ShmUnavailable("members are in different pid namespaces; liveness checks "
                                     "could not see each other's processes")
            mm = _map(fds[0], nbytes)
        finally:
            for fd in fds:
                os.close(fd)
        try:
            sock.sendall(b"M")
        except BaseException:
            mm.close()
            raise
        return Arena(mm, nbytes, tuple(pids))
    finally:
        sock.close()


def _connect_leader(address: str, rank: int, secret: bytes, failed: Callable[[], str | None],
                    deadline: float) -> socket.socket:
    """Connect to the leader, check it runs as this user, authenticate and say our rank.

    Retries until ``deadline`` while the leader's backlog is full (``EAGAIN``: a flood of other
    connections), nobody listens on its name (``ECONNREFUSED``) or it closed the connection
    before its proof (too busy to take ours); gives up at once when ``failed()`` has a reason.

    Raises:
        ShmUnavailable: ``failed()`` gave a reason, or the deadline passed (naming why).
    """
    pause = _RETRY_FIRST
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            sock.connect("\0" + address)
            _check_same_user(sock, "shared-memory leader")
            auth.handshake_client(sock, secret, max(0.01, deadline - time.monotonic()), PURPOSE,
                                  address=address, rank=rank, target=0)
            return sock
        except (BlockingIOError, ConnectionRefusedError, auth.HandshakeRefused) as exc:
            sock.close()
            reason = failed()
            if reason is not None:
                raise ShmUnavailable(reason) from None
            if time.monotonic() + pause >= deadline:
                raise ShmUnavailable(f"could not reach the shared-memory leader in time: {exc}") from exc
            time.sleep(pause)
            pause = min(2 * pause, _POLL)
        except BaseException:
            sock.close()
            raise
