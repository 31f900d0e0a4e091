"""Start the ranks of one node, relay their output, stop them all when one fails.

The process rules, in one place:

- Each rank runs in its own session (``start_new_session=True``), so the launcher can signal the
  rank *and everything it started* with ``os.killpg``, and a Ctrl-C at the terminal reaches only
  the launcher, which forwards it.
- On Linux each rank asks the kernel for ``SIGKILL`` when the launcher dies
  (``prctl(PR_SET_PDEATHSIG)``), so even a SIGKILLed launcher leaves no rank behind. The signal
  fires when the launcher *thread* that spawned the rank exits, so ``run_ranks`` must be called
  from a thread that outlives the job (the main thread, in the CLI).
- Fail fast: the first rank to exit non-zero (or die of a signal) decides the exit code; the others
  get ``SIGTERM``, then ``SIGKILL`` after a grace period. A signal to the launcher (SIGINT, SIGTERM,
  SIGHUP) is forwarded the same way and the launcher exits ``128 + signum``. A second signal
  skips the grace period.
- Or keep going (``keep_going``, ``tensorcomm run --keep-going``; Open MPI's ``--enable-recovery``
  and MPICH's ``-disable-auto-cleanup`` do the same): a rank that fails is reported and the others
  run on, for jobs whose survivors carry on without it (``Group.shrink``, docs/elastic.md). The
  job then succeeds if any rank succeeds; else the first failure decides the exit code. Node 0's
  launcher hosts the store, which the survivors need to agree: after its own ranks end it keeps
  serving while ranks of other nodes are still connected.
- Every child is reaped and the store closed before returning, whatever happened.
- Global rank 0 reads the launcher's stdin (the same file, inherited), as under mpiexec and
  srun, so a script that asks ``input()`` on rank 0 reads what the user types or pipes in; the
  other ranks read ``/dev/null``, since several ranks cannot share one input. Rank 0 runs in a
  session of its own, where the terminal is not its controlling terminal, so reading it raises
  no job-control stop; a launcher started without stdin gives rank 0 ``/dev/null`` too.
- Output (``Output``): each line of a rank goes to the launcher's stdout or stderr as the rank wrote
  it, prefixed ``[rank N] `` unless ``prefix`` is off, and only for the ranks in ``shown`` (all by
  default); with ``log_dir`` also, unprefixed, to ``<log_dir>/rank<N>.stdout`` and ``.stderr``.
  A rank's output is read to its end whether shown or not, so no rank blocks on a full pipe.

- Log files (``log_dir``): made before any rank starts, only in a directory this user owns and
  nobody else may write in (``rendezvous.private``; else the job fails naming the directory
  and why), each under a fresh name renamed into place, so a link planted at a log file's name
  is replaced, never written through. Mode 0600: a rank's output may hold secrets.

This module imports ``rendezvous`` lazily (to host the store, and ``private`` for the log
directory) and never ``core``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any, Protocol, TextIO

from tensorcomm.errors import RendezvousError
from tensorcomm.launch import env as launch_env

KILL_GRACE_SECONDS = 3.0  # between SIGTERM and SIGKILL when stopping ranks
POLL_INTERVAL = 0.02  # seconds between checks of the ranks' exit status
TIMEOUT_EXIT_CODE = 124  # as coreutils `timeout`
READER_JOIN_SECONDS = 1.0  # a grandchild may keep a pipe open; do not wait for it forever
REAP_SECONDS = 10.0  # after SIGKILL; only a process stuck in the kernel takes longer
_LINE_LIMIT = 1 << 16  # longer lines are relayed in pieces, so a binary dump cannot exhaust memory
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass(frozen=True)
class RankSpec:
    """One child to start: its global rank, command line and complete environment."""

    rank: int
    argv: list[str]
    env: dict[str, str]


@dataclass(frozen=True)
class Output:
    """Where the ranks' output goes (see the module docstring): ``shown`` holds global ranks."""

    prefix: bool = True
    shown: frozenset[int] | None = None  # None: every rank
    log_dir: str | None = None


@dataclass
class _Rank:
    spec: RankSpec
    process: subprocess.Popen[bytes]
    readers: list[threading.Thread] = field(default_factory=list)


def exit_code_of(returncode: int) -> int:
    """Shell-style exit code: a death by signal N (Popen's ``-N``) becomes ``128 + N``."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(rank: int, returncode: int) -> str:
    """A sentence saying how a rank ended, naming the signal if it was killed by one."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"rank {rank} was killed by {name} (exit code {exit_code_of(returncode)})"
    return f"rank {rank} exited with code {returncode}"


def _peek(process: subprocess.Popen[bytes]) -> int | None:
    """``process``'s return code in Popen's convention if it has exited, else ``None``.

    Unlike ``Popen.poll`` this leaves the process a zombie (``WNOWAIT``): until it is reaped its
    pid, which is also the id of its process group, stays reserved, so signalling that group can
    never hit a stranger's. ``Popen.wait`` in ``_Job._reap`` reaps it.
    """
    if process.returncode is not None:
        return process.returncode
    status = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    if status is None:
        return None
    return status.si_status if status.si_code == os.CLD_EXITED else -status.si_status


def _stdin(rank: int) -> int | None:
    """What a rank reads as stdin: the launcher's own (``None``: inherited) for global rank 0
    when the launcher has one open, else ``/dev/null``."""
    if rank == 0:
        try:
            os.fstat(0)
        except OSError:  # started without stdin (closed fd 0)
            return subprocess.DEVNULL
        return None
    return subprocess.DEVNULL


def _pdeathsig_preexec() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child die with the launcher, or ``None`` off Linux.

    ctypes is loaded here, before any fork, so the child only makes one foreign call between fork
    and exec (no imports or locks that another launcher thread might hold).
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    launcher_pid = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # The launcher may have died between fork and prctl; then no signal will come.
        if os.getppid() != launcher_pid:
            os._exit(1)

    return preexec


class _OutputSink:
    """A text stream shared by many reader threads; writes whole lines under a lock."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._broken = False
        self._encoding = getattr(stream, "encoding", None) or "utf-8"

    def write_line(self, text: str) -> None:
        # Round-trip through the sink's encoding so a character it cannot encode becomes "?"
        # instead of an exception that would stop relaying (and then block the child on a pipe).
        text = text.encode(self._encoding, "replace").decode(self._encoding)
        with self._lock:
            if self._broken:
                return
            try:
                self._stream.write(text)
                self._stream.flush()
            except (BrokenPipeError, ValueError):
                # Launcher output closed (e.g. piped into `head`): keep draining, stop writing.
                self._broken = True


def _relay(pipe: IO[bytes], prefix: str, sink: _OutputSink | None, copy: TextIO | None) -> None:
    """Copy ``pipe`` to ``sink`` (unless None) line by line, each line prefixed, and unprefixed to
    ``copy`` (unless None, closed at the end); runs until EOF."""
    try:
        with pipe:
            for raw in iter(lambda: pipe.readline(_LINE_LIMIT), b""):
                text = raw.decode("utf-8", errors="replace")
                if not text.endswith("\n"):
                    text += "\n"  # the last line had no newline (or was cut at _LINE_LIMIT)
                if copy is not None:
                    copy.write(text)
                    copy.flush()
                if sink is not None:
                    sink.write_line(prefix + text)
    finally:
        if copy is not None:
            copy.close()


class _SignalCatcher:
    """Records SIGINT/SIGTERM/SIGHUP sent to the launcher while a job runs."""

    def __init__(self) -> None:
        self.received: list[int] = []

    def _handle(self, signum: int, frame: Any) -> None:
        self.received.append(signum)

    @contextmanager
    def installed(self) -> Iterator[_SignalCatcher]:
        # Handlers can only be installed from the main thread; elsewhere the caller's own
        # handling stays in force.
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.signal(sig, self._handle) for sig in _FORWARDED_SIGNALS}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class _Job:
    """The ranks of one node while they run; see the module docstring for the rules."""

    def __init__(self, specs: Sequence[RankSpec], grace: float, stdout: TextIO,
                 stderr: TextIO, keep_going: bool = False,
                 store_users: Callable[[], int] | None = None, output: Output = Output()) -> None:
        self._specs = specs
        self._output = output
        self._grace = grace
        self._keep_going = keep_going
        self._store_users = store_users
        self._out = _OutputSink(stdout)
        self._err = _OutputSink(stderr)
        self._ranks: list[_Rank] = []
        self._signals = _SignalCatcher()

    def say(self, message: str) -> None:
        """Print a launcher message to the launcher's stderr."""
        self._err.write_line(f"tensorcomm: {message}\n")

    def run(self, timeout: float | None) -> int:
        succeeded = False
        with self._signals.installed():
            try:
                code = self._start_all() or self._supervise(timeout)
                succeeded = code == 0
                return code
            finally:
                # Any way out but success (failure, signal, timeout, an exception here) stops all.
                if not succeeded:
                    self._stop(self._signals.received[0] if self._signals.received
                               else signal.SIGTERM)
                self._reap()

    def _start_all(self) -> int | None:
        """Start every rank; on a command that cannot start, its shell-style code (1: the log
        directory cannot be used, and no rank was started)."""
        try:
            logs = self._open_logs()
        except OSError as exc:
            self.say(str(exc))
            return 1
        preexec = _pdeathsig_preexec()
        for spec in self._specs:
            try:
                process = subprocess.Popen(
                    spec.argv, env=spec.env, stdin=_stdin(spec.rank), stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, start_new_session=True, preexec_fn=preexec)
            except OSError as exc:
                self.say(f"cannot start rank {spec.rank} ({spec.argv[0]}): {exc.strerror}")
                for log in logs.values():  # the log files of the ranks not started
                    log.close()
                return 127 if isinstance(exc, FileNotFoundError) else 126
            rank = _Rank(spec, process)
            self._ranks.append(rank)
            out = self._output
            prefix = f"[rank {spec.rank}] " if out.prefix else ""
            shown = out.shown is None or spec.rank in out.shown
            assert process.stdout is not None and process.stderr is not None
            for pipe, sink, name in ((process.stdout, self._out, "stdout"),
                                     (process.stderr, self._err, "stderr")):
                copy = logs.pop((spec.rank, name), None)
                reader = threading.Thread(target=_relay, args=(pipe, prefix, sink if shown else None, copy),
                                          name=f"tensorcomm-relay-{spec.rank}", daemon=True)
                reader.start()
                rank.readers.append(reader)
        return None

    def _open_logs(self) -> dict[tuple[int, str], TextIO]:
        """Each rank's ``(rank, "stdout" | "stderr")`` log file, made afresh in ``log_dir``
        (made mode 0700 if missing), or none without one. The directory must be this user's and
        writable by nobody else (``private.trusted_dir``); a file's name is replaced, never
        followed, and the file is mode 0600.

        Raises:
            OSError: the directory cannot be made or used (``private.Untrusted``: someone else
                owns it or may write in it, or it is a link); the message names it and why.
        """
        directory = self._output.log_dir
        if directory is None:
            return {}
        from tensorcomm.rendezvous import private

        try:
            dir_fd = private.trusted_dir(directory, create=True, what="log directory")
        except private.Untrusted:
            raise
        except OSError as exc:
            raise OSError(exc.errno, f"cannot use the log directory {directory}: "
                                     f"{exc.strerror or exc}") from None
        logs: dict[tuple[int, str], TextIO] = {}
        try:
            for spec in self._specs:
                for name in ("stdout", "stderr"):
                    fd = private.create_replacing(dir_fd, f"rank{spec.rank}.{name}")
                    logs[spec.rank, name] = os.fdopen(fd, "w", encoding="utf-8", errors="replace")
        except OSError as exc:
            for log in logs.values():
                log.close()
            raise OSError(exc.errno, f"cannot write a log file in {directory}: "
                                     f"{exc.strerror or exc}") from None
        finally:
            os.close(dir_fd)
        return logs

    def _supervise(self, timeout: float | None) -> int:
        """Wait until all ranks end (or one fails, unless keep-going), a signal arrives or time
        runs out; with ``store_users``, also until nobody uses the store any more."""
        deadline = None if timeout is None else time.monotonic() + timeout
        running = list(self._ranks)
        failed: list[tuple[int, int]] = []  # (rank, return code) of the ranks that failed
        serving = False  # this node's ranks ended; other nodes' ranks still use the store
        while running or (self._store_users is not None and self._store_users()):
            if not running and not serving:
                serving = True
                self.say("this node's ranks ended; serving the store while ranks of other nodes "
                         "use it (--keep-going)")
            if self._signals.received:
                signum = self._signals.received[0]
                self.say(f"received {signal.Signals(signum).name}, stopping all ranks")
                return 128 + signum
            for rank in list(running):
                returncode = _peek(rank.process)
                if returncode is None:
                    continue
                running.remove(rank)
                if returncode != 0 and not self._keep_going:
                    self.say(describe_exit(rank.spec.rank, returncode)
                             + ("; stopping the other ranks" if running else ""))
                    return exit_code_of(returncode)
                if returncode != 0:
                    failed.append((rank.spec.rank, returncode))
                    self.say(describe_exit(rank.spec.rank, returncode)
                             + ("; the other ranks go on (--keep-going)" if running else ""))
            if deadline is not None and time.monotonic() >= deadline:
                self.say(f"job timed out after {timeout:g} s, stopping all ranks")
                return TIMEOUT_EXIT_CODE
            time.sleep(POLL_INTERVAL)
        if not failed:
            return 0
        if len(failed) < len(self._ranks):
            self.say(f"{len(failed)} of {len(self._ranks)} ranks failed "
                     f"({', '.join(f'rank {r}' for r, _ in failed)}); the others succeeded")
            return 0
        return exit_code_of(failed[0][1])

    def _signal_groups(self, signum: int) -> None:
        # Exited ranks too: a rank's own children may still be alive in its process group. Safe
        # because an exited rank is not reaped before _reap, so its pid (= the group's id) cannot
        # have been reused by an unrelated process group.
        for rank in self._ranks:
            try:
                os.killpg(rank.process.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass  # the group is gone (PermissionError: macOS reports a zombie-only group so)

    def _stop(self, signum: int) -> None:
        """Signal every rank's group; SIGKILL the groups once the ranks exit or grace runs out."""
        self._signal_groups(signum)
        handled = len(self._signals.received)
        deadline = time.monotonic() + self._grace
        while any(_peek(rank.process) is None for rank in self._ranks):
            # A further signal to the launcher means "now": skip the rest of the grace period.
            if time.monotonic() >= deadline or len(self._signals.received) > handled:
                break
            time.sleep(POLL_INTERVAL)
        # Also reaches what a rank started and left behind in its group.
        self._signal_groups(signal.SIGKILL)

    def _reap(self) -> None:
        """Wait for every started rank and for its output to be relayed."""
        for rank in self._ranks:
            try:
                rank.process.wait(REAP_SECONDS)
            except subprocess.TimeoutExpired:
                self.say(f"rank {rank.spec.rank} (pid {rank.process.pid}) did not die on SIGKILL")
        for rank in self._ranks:
            for reader in rank.readers:
                reader.join(READER_JOIN_SECONDS)


def run_ranks(specs: Sequence[RankSpec], *, timeout: float | None = None,
              grace: float = KILL_GRACE_SECONDS, cleanup: Callable[[], None] | None = None,
              stdout: TextIO | None = None, stderr: TextIO | None = None,
              keep_going: bool = False, store_users: Callable[[], int] | None = None,
              output: Output = Output()) -> int:
    """Run the given ranks to completion, relaying their output; return the job's exit code.

    Args:
        specs: the ranks of this node.
        timeout: wall-clock limit in seconds; on expiry every rank is stopped.
        grace: seconds between SIGTERM and SIGKILL when stopping ranks.
        cleanup: called once after every rank is reaped (e.g. to remove the job's shared memory);
            an exception from it is reported on stderr and does not change the exit code.
        stdout, stderr: where the ranks' output goes (default: the launcher's own).
        keep_going: a failing rank does not stop the others (see the module docstring).
        store_users: how many clients use the store this node hosts; the job lasts until it is 0
            too (node 0's launcher under ``keep_going``: ranks of other nodes still need it).
        output: prefix, the ranks shown and the log directory (which must exist).

    Returns:
        0 if every rank succeeded (with ``keep_going``: if any did); else the first failing rank's
        code (``128 + N`` for a death by signal N), ``128 + N`` for signal N sent to the launcher,
        124 on timeout, 127/126 if a command cannot be started.
    """
    job = _Job(specs, grace, stdout or sys.stdout, stderr or sys.stderr, keep_going, store_users, output)
    try:
        return job.run(timeout)
    finally:
        if cleanup is not None:
            try:
                cleanup()
            except Exception as exc:  # noqa: BLE001 - reported, the job's result stands
                job.say(f"cleanup after the job failed: {exc!r}")


class _StoreServer(Protocol):
    port: int

    def clients(self) -> int: ...

    def close(self) -> None: ...


def _host_store(host: str, port: int, secret: str) -> _StoreServer:
    """Start the job's store server; imported lazily so ``launch`` loads without ``rendezvous``."""
    from tensorcomm.rendezvous.tcp_store import TCPStoreServer

    return TCPStoreServer(host, port, secret)


def launch(settings: launch_env.LaunchSettings, argv: list[str], *,
           cleanup: Callable[[], None] | None = None, keep_going: bool = False,
           output: Output = Output()) -> int:
    """Run ``argv`` as this node's ranks of the job ``settings`` describes; return the exit code.

    Node 0's launcher hosts the store for the whole job and closes it after its ranks end (with
    ``keep_going`` and several nodes: once no rank of another node is connected to it either).
    ``output.log_dir`` is made (mode 0700) if missing, and refused before any rank starts if
    someone else owns it or may write in it.
    """
    server: _StoreServer | None = None
    if settings.hosts_store:
        host, port = launch_env.store_bind_address(settings)
        try:
            server = _host_store(host, port, settings.secret)
        except RendezvousError as exc:  # cannot bind: the message names the address
            print(f"tensorcomm: {exc}", file=sys.stderr)
            return 1
        except (OSError, ImportError) as exc:
            print(f"tensorcomm: cannot host the store at {host}:{port}: {exc}", file=sys.stderr)
            return 1
    try:
        store = launch_env.store_address(settings, None if server is None else server.port)
        if server is not None:
            print(f"tensorcomm: store at {store.host}:{store.port}", file=sys.stderr, flush=True)
        specs = [RankSpec(launch_env.global_rank(settings, local),
                          argv, launch_env.rank_env(os.environ, settings, store, local, keep_going))
                 for local in range(settings.nprocs)]
        users = server.clients if keep_going and server is not None and settings.nnodes > 1 else None
        return run_ranks(specs, timeout=settings.timeout, cleanup=cleanup, keep_going=keep_going,
                         store_users=users, output=output)
    finally:
        if server is not None:
            server.close()
