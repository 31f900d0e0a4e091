"""A stranger at the shared-memory door: another user watches ``/proc/net/unix`` for a group
leader's abstract socket (``@tensorcomm-...``) and floods it with connections from the moment its
name appears, to fill the listen backlog before the members connect. The leader refuses every
connection of another user at once and the members retry a full backlog until their deadline,
so no group gives up shared memory.

The stranger is a standard-library script run as ``nobody`` (needs root, else this test skips).
"""

from __future__ import annotations

import subprocess
import textwrap
from typing import Any

import pytest

import tensorcomm as tc
from tensorcomm.testing import run_ranks

pytestmark = [pytest.mark.fault, pytest.mark.timeout(300)]

NOBODY = 65534
GROUPS = 100  # groups each job makes; every one is a new socket name to flood

# Standard library only, as ``nobody``: one thread reads /proc/net/unix for new leader sockets,
# the main loop keeps connecting to the newest ones and holds the connections it gets.
FLOOD = textwrap.dedent("""
    import errno, socket, sys, threading
    names, held, counts = [], [], {}
    done = threading.Event()

    def watch():
        seen = set()
        while not done.is_set():
            with open("/proc/net/unix") as table:
                for line in table:
                    path = line.split()[-1]
                    if path.startswith("@tensorcomm-") and path not in seen:
                        seen.add(path)
                        names.append(path[1:])

    def until_told():
        sys.stdin.read()  # the test closes stdin when the job is over
        done.set()

    threading.Thread(target=watch, daemon=True).start()
    threading.Thread(target=until_told, daemon=True).start()
    print("watching", flush=True)
    while not done.is_set():
        for name in names[-3:]:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.connect("\\0" + name)
                outcome = "connected"
                held.append(sock)
            except OSError as exc:
                outcome = errno.errorcode.get(exc.errno, str(exc.errno))
                sock.close()
            counts[outcome] = counts.get(outcome, 0) + 1
            if len(held) > 800:
                held.pop(0).close()
    print(len(names), "sockets seen", counts, flush=True)
""")


def body_many_groups(count: int) -> list[str]:
    """Make ``count`` groups of every rank, one after another; return how each one talks."""
    kinds = []
    for _ in range(count):
        group = tc.new_group(list(range(tc.get_world_size())))
        kinds.append(group.transport_kind.name)
        group.destroy()
    return kinds


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_flood_at_the_leaders_socket_makes_no_group_fall_back(world_size: int, nobody_python: str) -> None:
    stranger = subprocess.Popen([nobody_python, "-c", FLOOD], user=NOBODY, cwd="/", stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert stranger.stdout is not None and stranger.stdout.readline().strip() == "watching"
        results: list[Any] = run_ranks(body_many_groups, world_size, GROUPS, timeout=240)
    finally:
        report = stranger.communicate(timeout=60)[0]  # closes its stdin: it reports and ends
    seen = int(report.split()[0])
    assert seen >= GROUPS // 3 and "'connected'" in report, report  # it found sockets and got in
    for rank, kinds in enumerate(results):
        assert kinds == ["SHM"] * GROUPS, (rank, kinds, report)
