"""The control channel between ``tensorcomm bench`` and the rank processes of one peer job.

JSON objects, one per line, over a loopback TCP connection from every rank to the parent. The
parent listens on ``127.0.0.1`` and accepts exactly the job's ranks, each of which must present the
job's token (given in ``TOKEN_ENV``, never on a command line), then stops listening. ::

    rank   -> parent   {"hello": {"rank", "size", "version", "token"}}
    parent -> ranks    {"task": Task, "plan": Plan}  |  {"exit": true}
    rank   -> parent   {"reduce": "max"|"sum", "values": [...]}   (parent answers {"values"})
    rank   -> parent   {"done": Measurement} | {"unsupported": why} | {"error": traceback}

Reductions go through the parent so the timing code needs no library collective of its own, and
so a library's lost rank shows up here (an ``error`` line or a closed socket) rather than as a
hang. A rank that reads end-of-file exits: if the parent dies, its jobs follow.
"""

from __future__ import annotations

import json
import secrets
import select
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from .peers import LOOPBACK

TOKEN_ENV = "TENSORCOMM_BENCH_TOKEN"  # the job's token, written by the parent for its children
POLL_SECONDS = 0.2  # how often a waiting parent checks that the job's processes still run


class JobFailed(Exception):
    """A peer job broke: a rank reported an error, left, died, or missed the deadline."""


def _encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


class ControlClient:
    """A rank's end: its messages to the parent, and the ``Coordinator`` of ``timing``."""

    def __init__(self, host: str, port: int) -> None:
        self._sock = socket.create_connection((host, port))
        self._file = self._sock.makefile("rb")

    def send(self, message: dict[str, Any]) -> None:
        """Send one message to the parent."""
        self._sock.sendall(_encode(message))

    def recv(self) -> dict[str, Any] | None:
        """The parent's next message, or ``None`` once the parent has gone."""
        line = self._file.readline()
        return json.loads(line) if line else None

    def reduce(self, values: Sequence[float], op: str) -> list[float]:
        """The element-wise ``op`` of every rank's ``values``, computed by the parent."""
        self.send({"reduce": op, "values": [float(v) for v in values]})
        reply = self.recv()
        if reply is None or "values" not in reply:
            raise ConnectionError(f"bench control: expected reduced values, got {reply!r}")
        return [float(v) for v in reply["values"]]

    def close(self) -> None:
        """Close the connection."""
        self._file.close()
        self._sock.close()


class _Rank:
    """The parent's view of one rank's connection: a line buffer."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def pop(self) -> dict[str, Any] | None:
        line, sep, rest = self.buffer.partition(b"\n")
        if not sep:
            return None
        self.buffer = rest
        return json.loads(line)


class JobChannel:
    """The parent's end for one job: accepts its ranks, then runs tasks in lock-step with them."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(16)
        self._listener = socket.create_server((LOOPBACK, 0))
        self.port = int(self._listener.getsockname()[1])
        self._ranks: list[_Rank] = []

    def accept(self, ranks: int, deadline: float, alive: Callable[[], None]) -> list[dict[str, Any]]:
        """Accept ``ranks`` connections with the right token; return their hellos in rank order.

        ``alive`` raises JobFailed when the job's processes have exited.

        Raises:
            JobFailed: the job died, a hello was wrong, or ``deadline`` passed.
        """
        pending: dict[int, tuple[_Rank, dict[str, Any]]] = {}
        try:
            while len(pending) < ranks:
                alive()
                self._check_deadline(deadline, f"{len(pending)} of {ranks} ranks connected")
                ready, _, _ = select.select([self._listener], [], [], POLL_SECONDS)
                if not ready:
                    continue
                sock, _ = self._listener.accept()
                rank = _Rank(sock)
                hello = self._step([rank], deadline, alive)[0].get("hello", {})
                if not secrets.compare_digest(str(hello.get("token", "")), self.token):
                    sock.close()  # not one of ours
                    continue
                if hello.get("size") != ranks or hello.get("rank") in pending:
                    raise JobFailed(f"unexpected hello {hello!r} for a job of {ranks} ranks")
                pending[int(hello["rank"])] = (rank, hello)
        finally:
            self._listener.close()
        self._ranks = [pending[r][0] for r in range(ranks)]
        return [pending[r][1] for r in range(ranks)]

    def send_all(self, message: dict[str, Any]) -> None:
        """Send ``message`` to every rank."""
        data = _encode(message)
        for rank in self._ranks:
            rank.sock.sendall(data)

    def run(self, message: dict[str, Any], deadline: float,
            alive: Callable[[], None]) -> dict[str, Any]:
        """Send a task and serve its reductions; return rank 0's final message.

        The final message is ``{"done": ...}`` or ``{"unsupported": ...}``, the same kind on
        every rank.

        Raises:
            JobFailed: a rank reported an error or left, ranks disagreed, or time ran out.
        """
        self.send_all(message)
        while True:
            replies = self._step(self._ranks, deadline, alive)
            kinds = {next(iter(reply)) for reply in replies}
            if kinds == {"reduce"}:
                op = max if replies[0]["reduce"] == "max" else sum
                self.send_all({"values": [op(column) for column in
                                          zip(*(reply["values"] for reply in replies), strict=True)]})
            elif len(kinds) == 1 and kinds <= {"done", "unsupported"}:
                return replies[0]
            else:
                raise JobFailed(f"ranks out of step: {sorted(kinds)}")

    def _step(self, ranks: list[_Rank], deadline: float,
              alive: Callable[[], None]) -> list[dict[str, Any]]:
        """The next message of each of ``ranks``; an error from any of them fails at once.

        The protocol is lock-step (a rank says nothing more until answered), so every rank is
        watched while some are still silent: one that failed may leave the others waiting.
        """
        replies: list[dict[str, Any] | None] = [None] * len(ranks)
        while True:
            for i, rank in enumerate(ranks):
                if replies[i] is None:
                    replies[i] = rank.pop()
                reply = replies[i]
                if reply is not None and "error" in reply:
                    raise JobFailed(str(reply["error"]))
            waiting = [rank.sock for rank, reply in zip(ranks, replies, strict=True) if reply is None]
            if not waiting:
                return [reply for reply in replies if reply is not None]
            ready, _, _ = select.select(waiting, [], [], POLL_SECONDS)
            for rank in ranks:
                if rank.sock in ready:
                    data = rank.sock.recv(1 << 16)
                    if not data:
                        raise JobFailed("a rank closed its control connection")
                    rank.buffer += data
            if not ready:
                alive()
                self._check_deadline(deadline, "no answer from the ranks")

    @staticmethod
    def _check_deadline(deadline: float, what: str) -> None:
        if time.monotonic() > deadline:
            raise JobFailed(f"timed out: {what}")

    def close(self) -> None:
        """Close every connection (ranks then read end-of-file and exit)."""
        self._listener.close()
        for rank in self._ranks:
            rank.sock.close()
