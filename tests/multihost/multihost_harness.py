"""Several "hosts" on one machine: each is a network namespace, all joined by one bridge.

Topology of one ``Cluster`` (``<tag>`` is random per cluster, so concurrent runs never collide)::

    netns tc-<tag>-h0   10.77.0.1/24 on tc<tag>h0 ─┐
    netns tc-<tag>-h1   10.77.0.2/24 on tc<tag>h1 ─┼─ veth ─ tc<tag>p<i> ─ bridge tc<tag>br
    ...                                            ┘          (all in netns tc-<tag>-sw)

Every interface is created directly inside the cluster's own namespaces, so the machine's own
network namespace never holds an address, route or link of ours, and traffic can only flow
between our namespaces (or on each namespace's own loopback). Processes run with ``ip netns exec``
and ``TENSORCOMM_HOST_ID`` set to their namespace: namespaces share ``/dev/shm`` and the hostname,
so without it tensorcomm would take every "host" for the same one.

``clusters(workdir)`` hands out clusters and, on exit, kills every process in their namespaces,
deletes the namespaces (which destroys their veths and bridge) and fails if anything is left.
This module does not import tensorcomm; it runs ``python -m tensorcomm run`` as a user would.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

SUBNET = "10.77.0"  # /24; exists only inside the namespaces a Cluster creates
MASTER_PORT = 29500  # each namespace has its own ports, so a fixed one is always free
IP_TIMEOUT = 10.0  # seconds for one `ip` or `tc` command
KILL_WAIT = 5.0  # seconds for SIGKILLed processes to disappear
# Variables a launcher or rank could inherit from whoever runs pytest and mistake for its job's.
_JOB_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                  "MASTER_PORT")


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one iproute2 command with a timeout; raise with its stderr if it fails and ``check``."""
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=IP_TIMEOUT)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie counts as dead (it holds no socket, memory or namespace)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(") ", 1)[1][0] != "Z"


def _namespace_names() -> set[str]:
    listing = _run(["ip", "netns", "list"]).stdout
    return {line.split()[0] for line in listing.splitlines() if line.strip()}


@functools.cache
def unsupported_reason() -> str | None:
    """Why namespaces, veths and a bridge cannot be made here, or None if they can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    probe = f"tc-probe-{secrets.token_hex(3)}"
    try:
        _run(["ip", "netns", "add", probe])
        _run(["ip", "-n", probe, "link", "add", "probe0", "type", "veth", "peer", "name", "probe1"])
        _run(["ip", "-n", probe, "link", "add", "probebr", "type", "bridge"])
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot create a network namespace with a veth pair and a bridge: {exc}"
    finally:
        _run(["ip", "netns", "del", probe], check=False)
    return None


@dataclass(frozen=True)
class Host:
    """One "host": a namespace with one veth to the bridge."""

    index: int
    netns: str
    address: str
    ifname: str  # its end of the veth, inside ``netns``
    port: str  # the bridge's end of the same veth, inside the switch namespace


@dataclass(frozen=True)
class Finished:
    """How a process started in a namespace ended."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float  # from start to exit


class Process:
    """A process started in a namespace; output goes to files, so nothing blocks on a pipe."""

    def __init__(self, popen: subprocess.Popen[bytes], stdout: Path, stderr: Path,
                 label: str) -> None:
        self.popen = popen
        self.label = label
        self._stdout = stdout
        self._stderr = stderr
        self._started = time.monotonic()

    def output(self) -> tuple[str, str]:
        """What it has written so far (stdout, stderr)."""
        return (self._stdout.read_text(errors="replace"), self._stderr.read_text(errors="replace"))

    def finish(self, timeout: float) -> Finished:
        """Wait for the exit; a process still running after ``timeout`` s is a hang: fail.

        Raises:
            AssertionError: it did not exit in time (it is killed first), with its output.
        """
        try:
            returncode = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(KILL_WAIT)
            stdout, stderr = self.output()
            raise AssertionError(f"{self.label} still ran after {timeout:g} s (a hang); "
                                 f"stdout:\n{stdout}\nstderr:\n{stderr}") from None
        seconds = time.monotonic() - self._started
        return Finished(returncode, *self.output(), seconds)


class Cluster:
    """``count`` hosts on a bridge; ``create`` builds them, ``close`` removes every trace."""

    def __init__(self, count: int, workdir: Path) -> None:
        tag = secrets.token_hex(3)
        self.tag = tag
        self.switch = f"tc-{tag}-sw"
        self.bridge = f"tc{tag}br"
        self.hosts = [Host(i, f"tc-{tag}-h{i}", f"{SUBNET}.{i + 1}", f"tc{tag}h{i}", f"tc{tag}p{i}")
                      for i in range(count)]
        self._workdir = workdir
        self._processes: list[Process] = []
        self._pids: set[int] = set()  # every pid ever seen in our namespaces, to check it died

    @property
    def namespaces(self) -> list[str]:
        return [self.switch, *(host.netns for host in self.hosts)]

    @property
    def master(self) -> str:
        """``host:port`` of node 0's store."""
        return f"{self.hosts[0].address}:{MASTER_PORT}"

    def create(self) -> None:
        """Make the namespaces, the bridge and one veth per host; bring every link up."""
        for netns in self.namespaces:
            _run(["ip", "netns", "add", netns])
            _run(["ip", "-n", netns, "link", "set", "lo", "up"])
        _run(["ip", "-n", self.switch, "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "-n", self.switch, "link", "set", self.bridge, "up"])
        for host in self.hosts:
            # Both ends are born inside our namespaces: nothing ever appears in the machine's own.
            _run(["ip", "link", "add", host.ifname, "netns", host.netns, "type", "veth",
                  "peer", "name", host.port, "netns", self.switch])
            _run(["ip", "-n", self.switch, "link", "set", host.port, "master", self.bridge])
            _run(["ip", "-n", self.switch, "link", "set", host.port, "up"])
            _run(["ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", host.ifname])
            _run(["ip", "-n", host.netns, "link", "set", host.ifname, "up"])

    def spawn(self, host: Host, argv: Sequence[str], env: dict[str, str] | None = None,
              label: str | None = None) -> Process:
        """Start ``argv`` in ``host``'s namespace, in a session of its own (to kill it whole)."""
        label = label or f"{host.netns}:{Path(argv[0]).name}"
        child_env = {k: v for k, v in os.environ.items()
                     if k not in _JOB_VARIABLES and not k.startswith("TENSORCOMM_")}
        child_env["TENSORCOMM_HOST_ID"] = host.netns
        child_env.update(env or {})
        name = f"{label.replace(':', '-').replace('/', '-')}-{len(self._processes)}"
        stdout, stderr = self._workdir / f"{name}.out", self._workdir / f"{name}.err"
        with stdout.open("wb") as out, stderr.open("wb") as err:
            popen = subprocess.Popen(["ip", "netns", "exec", host.netns, *argv], env=child_env,
                                     stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                     start_new_session=True)
        process = Process(popen, stdout, stderr, label)
        self._processes.append(process)
        self._pids.add(popen.pid)
        return process

    def launch(self, host: Host, script: Path, *args: str, nprocs: int, secret: str,
               timeout: float, env: dict[str, str] | None = None) -> Process:
        """``tensorcomm run`` of ``script`` on ``host`` as node ``host.index`` of this cluster.

        ``timeout`` is the launcher's own job limit (``--timeout``), a backstop behind the
        ranks' collective timeouts.
        """
        argv = [sys.executable, "-m", "tensorcomm", "run", "--nnodes", str(len(self.hosts)),
                "--node-rank", str(host.index), "--master", self.master, "-n", str(nprocs),
                "--timeout", str(timeout), str(script), *args]
        return self.spawn(host, argv, {"TENSORCOMM_SECRET": secret, **(env or {})},
                          label=f"node {host.index}")

    def tc(self, netns: str, *args: str) -> str:
        """Run ``tc -n netns args``; return its output."""
        return _run(["tc", "-n", netns, *args]).stdout

    def shape(self, host: Host, rate: str) -> None:
        """Limit ``host``'s link to ``rate`` in both directions with a token bucket (tbf)."""
        for netns, ifname in ((host.netns, host.ifname), (self.switch, host.port)):
            self.tc(netns, "qdisc", "add", "dev", ifname, "root", "tbf", "rate", rate,
                    "burst", "32kbit", "latency", "400ms")

    def unplug(self, host: Host) -> None:
        """Take ``host``'s link down at the bridge: its packets vanish, nobody gets a RST or FIN."""
        _run(["ip", "-n", self.switch, "link", "set", host.port, "down"])

    def _pids_in(self, netns: str) -> set[int]:
        listing = _run(["ip", "netns", "pids", netns], check=False).stdout
        return {int(pid) for pid in listing.split()}

    def close(self) -> list[str]:
        """Kill every process in our namespaces, delete the namespaces; return what is left."""
        for process in self._processes:
            if process.popen.poll() is None:
                try:
                    os.killpg(process.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        names = _namespace_names()
        existing = [netns for netns in self.namespaces if netns in names]
        deadline = time.monotonic() + KILL_WAIT
        while True:
            # Ranks run in sessions of their own, out of reach of the launcher's group; and a
            # namespace whose name is deleted lives on while any process is in it, so repeat
            # until none is left.
            pids = {pid for netns in existing for pid in self._pids_in(netns)}
            self._pids |= pids
            live = [pid for pid in pids if _alive(pid)]
            if not live or time.monotonic() > deadline:
                break
            for pid in live:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        for process in self._processes:
            try:
                process.popen.wait(KILL_WAIT)
            except subprocess.TimeoutExpired:
                pass
        for netns in existing:
            _run(["ip", "netns", "del", netns], check=False)
        return self.leftovers()

    def leftovers(self) -> list[str]:
        """Namespaces, processes or links of this cluster that still exist."""
        found = [f"namespace {n}" for n in sorted(_namespace_names() & set(self.namespaces))]
        found += [f"process {pid}" for pid in sorted(self._pids) if _alive(pid)]
        links = _run(["ip", "-o", "link", "show"]).stdout
        found += [f"link {line.split(':')[1].strip()}" for line in links.splitlines()
                  if f"tc{self.tag}" in line]
        return found


MakeCluster = Callable[[int], Cluster]
"""``make(n)``: builds a cluster of n hosts (what the fixtures hand to tests)."""


@contextlib.contextmanager
def clusters(workdir: Path) -> Iterator[MakeCluster]:
    """Yield ``make(n)``, which builds a cluster of n hosts; on exit tear every one down.

    Call only where ``unsupported_reason()`` is None.

    Raises:
        AssertionError: a namespace, process or link of a cluster outlived the teardown.
    """
    made: list[Cluster] = []

    def make(count: int) -> Cluster:
        path = workdir / f"cluster{len(made)}"
        path.mkdir()
        cluster = Cluster(count, path)
        made.append(cluster)  # before create(): a half-built cluster is torn down too
        cluster.create()
        return cluster

    try:
        yield make
    finally:
        leftovers = [item for cluster in made for item in cluster.close()]
        assert not leftovers, f"left behind after the test: {leftovers}"
