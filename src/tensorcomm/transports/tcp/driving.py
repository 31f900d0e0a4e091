"""Which thread drives the TCP transport: one at a time, a waiting caller first.

A caller that waits for a request takes the driver role (or sleeps until the current driver
completes its request); a background thread drives only once no caller has for ``LINGER``
seconds, and gives the role up as soon as a caller asks. The driver sleeps in ``poll``; ``poke``
wakes it through a pipe whose read end the transport polls (``wake_fd``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger("tensorcomm.tcp")

# How long the background thread leaves the sockets to a caller that stopped driving: longer
# than the gaps between one call's waits (so no hand-off within a call), short enough that a
# peer's sends stall only briefly while this rank's caller computes.
LINGER = 0.05
NO_DEADLINE = float("inf")

# drive(done, deadline) -> done(): the driver's loop, until done() or the deadline
Drive = Callable[[Callable[[], bool], float], bool]


class Driving:
    """The driver role of one transport; ``drive`` is its loop (see the module docstring)."""

    def __init__(self, drive: Drive, rank: int) -> None:
        self._drive = drive
        self._rank = rank
        # ``_cv`` wakes callers waiting for the role or for a request another thread completed;
        # ``_idle`` paces the background thread.
        state_lock = self._state_lock = threading.Lock()  # ``with`` it directly: no Python frames
        self._cv = threading.Condition(state_lock)
        self._idle = threading.Condition(state_lock)
        self.closing = False
        self._driving = False
        self.driver: int | None = None  # thread id of the driver
        self._background_driving = False
        self._yield = False  # a caller asked the background thread to stop driving
        self.sleepers = 0  # callers waiting in ``_cv``
        self._wanted = 0  # callers waiting for the driver role
        self._released_at = 0.0
        self.wake_fd, self._wake_write = os.pipe()
        os.set_blocking(self.wake_fd, False)
        os.set_blocking(self._wake_write, False)
        self._background = threading.Thread(target=self._drive_when_idle, daemon=True,
                                            name=f"tensorcomm-tcp-progress-{rank}")

    def start(self) -> None:
        """Start the background thread (once the transport can be driven)."""
        self._background.start()

    def run_until(self, done: Callable[[], bool], timeout: float | None) -> bool:
        """Drive (or let the current driver do it) until ``done()`` or ``timeout`` seconds;
        return ``done()``."""
        deadline = NO_DEADLINE if timeout is None else time.monotonic() + timeout
        if self.closing:  # nothing moves any more; close() failed what was pending
            return done()
        last_look = False
        with self._state_lock:  # ``_cv``'s lock
            self._wanted += 1
            try:
                while True:
                    # Free to drive: ``_drive`` asks ``done()`` before it polls (the caller
                    # asked it just now, before this call). Past the deadline too: drive (and
                    # poll) once more.
                    if not self._driving:
                        self._driving = True
                        self.driver = threading.get_ident()
                        break
                    if done():
                        return True
                    if self._background_driving and not self._yield:
                        self._yield = True
                        self.poke()
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        if last_look:
                            return done()
                        # Past the deadline: what arrived before it may still be unread (this
                        # process was descheduled, say). Give the driver ``LINGER`` to read it
                        # or to hand over the role for one more poll here.
                        last_look, remaining = True, LINGER
                    self.sleepers += 1
                    try:
                        self._cv.wait(None if deadline == NO_DEADLINE else remaining)
                    finally:
                        self.sleepers -= 1
            finally:
                self._wanted -= 1
        try:
            return self._drive(done, deadline)
        finally:
            with self._state_lock:
                self._driving = False
                self.driver = None
                self._released_at = time.monotonic()
                if self.sleepers:  # callers waiting for the role (the background thread polls)
                    self._cv.notify_all()

    def _drive_when_idle(self) -> None:
        """The background thread: drive whenever no caller has for ``LINGER`` seconds."""
        while True:
            with self._cv:
                while True:
                    if self.closing:
                        return
                    idle = time.monotonic() - self._released_at
                    if not self._driving and not self._wanted and idle >= LINGER:
                        break
                    self._idle.wait(LINGER - idle if 0 <= idle < LINGER else LINGER)
                self._driving = self._background_driving = True
                self.driver = threading.get_ident()
                self._yield = False
            try:
                self._drive(lambda: self._yield or self.closing, NO_DEADLINE)
            except BaseException:  # logged: a bug here must not end progress for good
                log.exception("rank %d: the TCP progress thread failed", self._rank)
            finally:
                with self._cv:
                    self._driving = self._background_driving = False
                    self.driver = None
                    self._yield = False
                    self._released_at = time.monotonic()
                    self._cv.notify_all()

    def poke(self) -> None:
        """Wake the driver from ``poll`` (it re-checks what it waits for and what to write)."""
        if self._wake_write < 0:
            return
        try:
            os.write(self._wake_write, b"!")
        except (BlockingIOError, OSError):
            pass  # the pipe is full (a wake-up is pending anyway) or closed

    def poke_elsewhere(self) -> None:
        """``poke`` unless the calling thread is the driver (or nobody drives)."""
        if self._driving and self.driver != threading.get_ident():
            self.poke()

    def completed(self) -> None:
        """A request finished: wake the callers waiting for theirs and, from another thread, a
        caller that drives (the background thread waits for no request: no wake-up for it)."""
        if self.sleepers:
            with self._state_lock:
                self._cv.notify_all()
        if self._driving and not self._background_driving and self.driver != threading.get_ident():
            self.poke()

    def drain_wake_ups(self) -> None:
        """Empty the wake-up pipe (driver only, when ``poll`` says it is readable)."""
        try:
            os.read(self.wake_fd, 4096)
        except BlockingIOError:
            pass

    def stop(self, timeout: float) -> None:
        """End the background thread (waiting up to ``timeout`` s) and refuse to drive again."""
        with self._cv:
            self.closing = True
            self._idle.notify_all()
        self.poke()
        self._background.join(timeout)

    def close(self) -> None:
        """Close the wake-up pipe (after ``stop``)."""
        os.close(self.wake_fd)
        os.close(self._wake_write)
        self._wake_write = -1  # the number may name another file from now on: never write it
