"""Admission for every listener of a job: connections authenticate concurrently, each within a
short deadline, and neither silent nor stalled connections can keep a real rank out.

Owns :class:`Gate`, used by the store server, the TCP mesh and the shared-memory descriptor
server, and :func:`describe_error`, which names the descriptor limit when ``accept`` or a
connect runs out of descriptors. Imports ``config`` only.

Why: a listener that authenticates one connection at a time lets one silent connection (anyone
on the host can open one) stall everybody behind it; one thread per connection without a cap
lets a flood exhaust threads and descriptors; a cap that refuses newcomers lets a flood that
keeps reopening its connections hold every slot, so a real rank never gets in. Here the client
always speaks first, so an accepted connection waits in one selector (one thread for all of
them, named ``tensorcomm-gate-...``) until it sends something; at most
``config.MAX_SILENT_CONNECTIONS`` wait there, and the oldest is closed to make room. A
connection that has spoken gets a handshake thread of its own (``tensorcomm-handshake-...``);
at most ``config.MAX_PENDING_HANDSHAKES`` run at once, and the oldest is cut off to make room
(unless it began less than ``GRACE`` ago: then the newcomer is closed, and retries).
A real rank speaks at once and finishes its handshake in milliseconds, so a flood delays it by
a retry or two, not by a handshake deadline. Every connection has ``config.HANDSHAKE_TIMEOUT``
seconds to wait silent and as long again to authenticate. Drops are logged at most once per
``LOG_INTERVAL`` with a count, so a flood cannot flood the log either.
"""

from __future__ import annotations

import errno
import logging
import resource
import select
import selectors
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from tensorcomm import config

LOG_INTERVAL = 5.0  # seconds between two warnings about refused connections of one listener
# A handshake younger than this is not cut off for a newcomer (which is closed, and retries):
# a real rank's handshake takes milliseconds, and cutting it off after the server's proof would
# fail it rather than make it retry.
GRACE = 0.25

Handshake = Callable[[socket.socket, str], Callable[[], None] | None]
"""``handshake(conn, peer)`` authenticates ``conn``; it may return the work to do afterwards
(serving the connection), which runs in the same thread once the pending slot is given back."""


def descriptor_limit() -> str:
    """This process's descriptor limit and how to raise it, for messages."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return (f"descriptor limit RLIMIT_NOFILE = {soft}, hard limit {hard}; raise it with `ulimit -n` "
            f"before starting the job, or with resource.setrlimit(resource.RLIMIT_NOFILE, ...) in it")


def describe_error(exc: OSError) -> str:
    """Describe a failed ``accept`` or connect, naming the descriptor limit when that is the cause."""
    if exc.errno == errno.EMFILE:
        return f"this process is out of file descriptors ({descriptor_limit()})"
    if exc.errno == errno.ENFILE:
        return "the system is out of file descriptors (descriptor limit fs.file-max reached)"
    return str(exc)


def out_of_descriptors(exc: OSError) -> bool:
    """Whether ``exc`` says a descriptor limit was reached (retrying will not help soon)."""
    return exc.errno in (errno.EMFILE, errno.ENFILE)


class Gate:
    """Admits one listener's connections: silent ones wait in a selector, speaking ones
    authenticate concurrently; both are bounded, and the oldest yields to a newcomer.

    Args:
        where: names the listener in log messages, e.g. ``"store 127.0.0.1:29500"``.
        log: where drops are reported.
        limit: most handshakes running at once (default ``config.MAX_PENDING_HANDSHAKES``).
        silent_limit: most connections waiting to speak (default
            ``config.MAX_SILENT_CONNECTIONS``).
        dropped: called with each connection the gate closes before its handshake started.
    """

    def __init__(self, where: str, log: logging.Logger, limit: int | None = None,
                 silent_limit: int | None = None,
                 dropped: Callable[[socket.socket], None] | None = None) -> None:
        self.where = where
        self._log = log
        self._limit = config.MAX_PENDING_HANDSHAKES if limit is None else limit
        self._silent_limit = config.MAX_SILENT_CONNECTIONS if silent_limit is None else silent_limit
        self._dropped = dropped
        self._lock = threading.Lock()
        # Accepted, not yet spoken, oldest first: socket -> (peer, handshake, deadline).
        self._silent: OrderedDict[socket.socket, tuple[str, Handshake, float]] = OrderedDict()
        self._selector: selectors.BaseSelector | None = None  # made at the first connection
        self._watcher: threading.Thread | None = None  # runs while anything is silent
        # Handshakes running, oldest first: socket -> when it started.
        self._talking: OrderedDict[socket.socket, float] = OrderedDict()
        self._threads: set[threading.Thread] = set()
        self._closed = False
        self._refused = 0  # since the last warning
        self.starved: str | None = None  # why the last refusal was for want of a descriptor
        self._last_warning = -LOG_INTERVAL

    def admit(self, conn: socket.socket, peer: str, handshake: Handshake) -> bool:
        """Hold ``conn`` until it speaks, then run ``handshake(conn, peer)`` in a thread of its own.

        Returns:
            Whether the connection was taken; one refused (the gate is closed) is closed.
        """
        refused: str | None = None
        with self._lock:
            self.starved = None
            if self._closed:  # set-up is over: nothing to report
                refused = ""
            elif self._selector is None:
                try:
                    self._selector = selectors.DefaultSelector()
                except OSError as exc:  # e.g. out of descriptors
                    refused = describe_error(exc)
                    self.starved = refused if out_of_descriptors(exc) else None
            oldest = None
            if refused is None:
                assert self._selector is not None
                try:
                    self._selector.register(conn, selectors.EVENT_READ)
                    if self._watcher is None:
                        watcher = threading.Thread(target=self._watch, daemon=True,
                                                   name=f"tensorcomm-gate-{self.where}")
                        watcher.start()
                        self._watcher = watcher
                except (OSError, ValueError, RuntimeError) as exc:  # no thread, or a dead socket
                    self._forget(conn)
                    refused = f"cannot watch it: {exc}"
                else:
                    self._silent[conn] = (peer, handshake,
                                          time.monotonic() + config.HANDSHAKE_TIMEOUT)
                    if len(self._silent) > self._silent_limit:
                        oldest = next(iter(self._silent))
        if refused is not None:
            if refused:
                self.refuse(conn, peer, refused)
            else:
                conn.close()
            return False
        if oldest is not None:
            self._release(oldest, f"{self._silent_limit} connections were waiting to speak; "
                                  f"the oldest was closed")
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

    def close(self) -> None:
        """Close every connection still silent and stop taking new ones."""
        with self._lock:
            self._closed = True
            silent = list(self._silent)
            self._silent.clear()
            for conn in silent:
                self._forget(conn)
            if self._selector is not None and self._watcher is None:
                self._selector.close()
                self._selector = None
        for conn in silent:
            self._drop(conn)

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds in all for the gate's threads (and their work)."""
        with self._lock:
            threads = list(self._threads)
            if self._watcher is not None:
                threads.append(self._watcher)
        _join(threads, timeout)

    def settle(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds in all for the handshakes under way (and the work they
        return) to end; connections still silent are not waited for."""
        with self._lock:
            threads = list(self._threads)
        _join(threads, timeout)

    def _forget(self, conn: socket.socket) -> None:
        """Stop watching ``conn`` (under the lock)."""
        try:
            assert self._selector is not None
            self._selector.unregister(conn)
        except (KeyError, ValueError, OSError):  # closed elsewhere meanwhile
            pass

    def _drop(self, conn: socket.socket) -> None:
        conn.close()
        if self._dropped is not None:
            self._dropped(conn)

    def _release(self, conn: socket.socket, why: str | None) -> None:
        """Start the handshake of silent ``conn`` if it has spoken, else close it (logging
        ``why`` unless None)."""
        with self._lock:
            entry = self._silent.pop(conn, None)
            if entry is None:
                return  # released by another thread meanwhile
            self._forget(conn)
        peer, handshake, _deadline = entry
        if _has_spoken(conn):
            self._start(conn, peer, handshake)
            return
        self._drop(conn)
        if why is not None:
            self.warn(f"dropped a silent connection from {peer}: {why}")

    def _watch(self) -> None:
        while True:
            with self._lock:
                selector = self._selector
                if not self._silent or selector is None:
                    self._watcher = None
                    if self._closed and selector is not None:
                        selector.close()
                        self._selector = None
                    return
                first_deadline = next(iter(self._silent.values()))[2]
            try:
                ready = selector.select(max(0.0, min(first_deadline - time.monotonic(), 1.0)))
            except (OSError, ValueError):  # a socket closed elsewhere during the call
                ready = []
            for key, _events in ready:
                conn = key.fileobj
                assert isinstance(conn, socket.socket)
                self._release(conn, None)  # spoke, or went away
            now = time.monotonic()
            with self._lock:
                expired = [conn for conn, (_, _, deadline) in self._silent.items() if deadline <= now]
            for conn in expired:
                self._release(conn, f"it stayed silent for {config.HANDSHAKE_TIMEOUT:g} s")

    def _start(self, conn: socket.socket, peer: str, handshake: Handshake) -> None:
        thread = threading.Thread(target=self._run, args=(conn, peer, handshake), daemon=True,
                                  name=f"tensorcomm-handshake-{peer}")
        now = time.monotonic()
        with self._lock:
            oldest = None
            if len(self._talking) >= self._limit:
                oldest, started = next(iter(self._talking.items()))
                if now - started < GRACE:  # all busy and young: the newcomer retries instead
                    oldest = None
                    full = True
                else:
                    del self._talking[oldest]
                    full = False
            else:
                full = False
            if not full:
                self._talking[conn] = now
                self._threads.add(thread)
        if full:
            if self._dropped is not None:
                self._dropped(conn)
            self.refuse(conn, peer, f"{self._limit} handshakes are pending, each for less than "
                                    f"{GRACE:g} s")
            return
        if oldest is not None:  # its handshake thread sees the connection fail and gives up
            try:
                oldest.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.warn(f"cut off the oldest handshake: {self._limit} handshakes were pending")
        try:
            thread.start()
        except RuntimeError as exc:  # no more threads
            with self._lock:
                self._talking.pop(conn, None)
                self._threads.discard(thread)
            if self._dropped is not None:
                self._dropped(conn)
            self.refuse(conn, peer, f"cannot start a thread: {exc}")

    def _run(self, conn: socket.socket, peer: str, handshake: Handshake) -> None:
        try:
            try:
                after = handshake(conn, peer)
            finally:
                with self._lock:
                    self._talking.pop(conn, None)
            if after is not None:
                after()
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())


def _has_spoken(conn: socket.socket) -> bool:
    """Whether bytes from the peer wait on ``conn`` (never blocks, whatever its timeout)."""
    poller = select.poll()
    try:
        poller.register(conn, select.POLLIN)
        if not poller.poll(0):
            return False
        return bool(conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except (OSError, ValueError):  # the connection failed, or was closed
        return False


def _join(threads: list[threading.Thread], timeout: float) -> None:
    """Join ``threads`` within ``timeout`` seconds in all."""
    deadline = time.monotonic() + timeout
    for thread in threads:
        if thread.ident is not None:  # one registered but not yet started has no work to wait for
            thread.join(max(0.0, deadline - time.monotonic()))
