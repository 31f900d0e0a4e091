"""Admission for every listener of a job: connections authenticate concurrently, each within a
short deadline, and pending ones never pile up.

Owns :class:`Gate`, used by the store server, the TCP mesh and the shared-memory descriptor
server, and :func:`describe_error`, which names the descriptor limit when ``accept`` or a
connect runs out of descriptors. Imports ``config`` only.

Why: a listener that authenticates one connection at a time, with the whole set-up timeout,
lets one silent connection (anyone on the host can open one) stall everybody behind it; one
thread per connection without a cap lets a flood of them exhaust threads and descriptors. Here
each accepted connection gets a thread of its own (named ``tensorcomm-handshake-...``) and
``config.HANDSHAKE_TIMEOUT`` seconds; at most ``config.MAX_PENDING_HANDSHAKES`` are pending at
once; a connection beyond that is closed at once, and refusals are logged at most once per
``LOG_INTERVAL`` with a count, so a flood cannot flood the log either.
"""

from __future__ import annotations

import errno
import logging
import resource
import socket
import threading
import time
from collections.abc import Callable

from tensorcomm import config

LOG_INTERVAL = 5.0  # seconds between two warnings about refused connections of one listener

Handshake = Callable[[socket.socket, str], Callable[[], None] | None]
"""``handshake(conn, peer)`` authenticates ``conn``; it may return the work to do afterwards
(serving the connection), which runs in the same thread once the pending slot is given back."""


def describe_error(exc: OSError) -> str:
    """Describe a failed ``accept`` or connect, naming the descriptor limit when that is the cause."""
    if exc.errno == errno.EMFILE:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        return (f"this process is out of file descriptors (descriptor limit RLIMIT_NOFILE = {soft}; "
                f"raise it with `ulimit -n`)")
    if exc.errno == errno.ENFILE:
        return "the system is out of file descriptors (descriptor limit fs.file-max reached)"
    return str(exc)


def out_of_descriptors(exc: OSError) -> bool:
    """Whether ``exc`` says a descriptor limit was reached (retrying will not help soon)."""
    return exc.errno in (errno.EMFILE, errno.ENFILE)


class Gate:
    """Runs handshakes of one listener's connections concurrently, a bounded number at a time.

    Args:
        where: names the listener in log messages, e.g. ``"store 127.0.0.1:29500"``.
        log: where refusals are reported.
        limit: most handshakes pending at once (default ``config.MAX_PENDING_HANDSHAKES``).
    """

    def __init__(self, where: str, log: logging.Logger, limit: int | None = None) -> None:
        self.where = where
        self._log = log
        self._limit = config.MAX_PENDING_HANDSHAKES if limit is None else limit
        self._lock = threading.Lock()
        self._pending = 0
        self._threads: set[threading.Thread] = set()
        self._refused = 0  # since the last warning
        self._last_warning = -LOG_INTERVAL

    def admit(self, conn: socket.socket, peer: str, handshake: Handshake) -> bool:
        """Start ``handshake(conn, peer)`` in a thread of its own, or close ``conn`` at once.

        Returns:
            Whether the connection was admitted; a refused one is closed and logged.
        """
        with self._lock:
            full = self._pending >= self._limit
            if not full:
                self._pending += 1
        if full:
            self.refuse(conn, peer, f"{self._limit} handshakes are already pending")
            return False
        thread = threading.Thread(target=self._run, args=(conn, peer, handshake), daemon=True,
                                  name=f"tensorcomm-handshake-{peer}")
        with self._lock:
            self._threads.add(thread)
        try:
            thread.start()
        except RuntimeError as exc:  # no more threads: as good as full
            with self._lock:
                self._pending -= 1
                self._threads.discard(thread)
            self.refuse(conn, peer, f"cannot start a thread: {exc}")
            return False
        return True

    def refuse(self, conn: socket.socket, peer: str, reason: str) -> None:
        """Close ``conn`` at once and log why (at most one warning per ``LOG_INTERVAL``)."""
        conn.close()
        self.warn(f"refused a connection from {peer}: {reason}")

    def warn(self, message: str) -> None:
        """Log ``message`` about this listener unless one was logged within ``LOG_INTERVAL``."""
        now = time.monotonic()
        with self._lock:
            self._refused += 1
            if now - self._last_warning < LOG_INTERVAL:
                return
            skipped, self._refused, self._last_warning = self._refused - 1, 0, now
        more = f" ({skipped} more since the last report)" if skipped else ""
        self._log.warning("%s: %s%s", self.where, message, more)

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds in all for the handshake threads (and their work)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self, conn: socket.socket, peer: str, handshake: Handshake) -> None:
        try:
            try:
                after = handshake(conn, peer)
            finally:
                with self._lock:
                    self._pending -= 1
            if after is not None:
                after()
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())
