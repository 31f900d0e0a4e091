"""An authenticated peer whose TCP data frames claim more than they should: a claim larger than
this host's memory is a protocol error naming the peer and the size, raised before anything is
allocated; a claim longer than the receive it matches fails that receive, naming both sizes; a
claim that cannot be allocated (here: under an address-space limit) fails the link with an
error that says so, instead of a traceback on stderr and "connection closed".

Rank 0 plays the peer: it seals crafted frame headers with its own link keys (it is a member of
the job, so it knows them) and sends them without their payloads.
"""

from __future__ import annotations

import re
import resource
import time
from pathlib import Path

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.core.lifecycle import current_world
from tensorcomm.testing import spawn_ranks
from tensorcomm.transports.base import p2p_tag
from tensorcomm.transports.tcp import framing
from tensorcomm.transports.tcp.transport import TcpTransport

pytestmark = [pytest.mark.fault, pytest.mark.timeout(120)]

HUGE = 1 << 40  # 1 TiB: more than this host's memory
LONGER = 64  # against a posted receive of 16 bytes
UNALLOCATABLE = 4 << 30  # 4 GiB: under the host's memory, over rank 2's address-space headroom


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.01)


def _claim(peer: int, tag: int, nbytes: int, payload: bytes = b"") -> None:
    """Send ``peer`` a data frame header that claims ``nbytes``, and ``payload`` only."""
    transport = current_world().transport
    assert isinstance(transport, TcpTransport)
    transport._links[peer].send(framing.pack_header(framing.KIND_DATA, p2p_tag(0, tag), nbytes),
                                memoryview(payload), None)


def _error(fn: object) -> str:
    try:
        fn()  # type: ignore[operator]
    except tc.CommError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def body_claims(work: str) -> dict:
    workdir = Path(work)
    rank = tc.get_rank()
    if rank == 0:
        _claim(1, 5, HUGE)
        _wait_for(workdir / "posted")
        _claim(2, 6, LONGER, bytes(LONGER))
        _wait_for(workdir / "limited")
        _claim(2, 7, UNALLOCATABLE)
        return {}
    if rank == 1:
        time.sleep(0.5)  # the claim has arrived: nothing was posted for it
        return {"huge": _error(lambda: tc.recv(np.zeros(4, np.float32), src=0, tag=5))}
    short = tc.irecv(np.zeros(4, np.float32), src=0, tag=6)
    (workdir / "posted").touch()
    longer = _error(short.wait)
    with open("/proc/self/status") as status:
        used = int(re.search(r"VmSize:\s+(\d+) kB", status.read()).group(1)) * 1024  # type: ignore[union-attr]
    resource.setrlimit(resource.RLIMIT_AS, (used + (1 << 30), resource.RLIM_INFINITY))
    (workdir / "limited").touch()
    time.sleep(0.5)
    unallocatable = _error(lambda: tc.recv(np.zeros(4, np.float32), src=0, tag=7))
    return {"longer": longer, "unallocatable": unallocatable}


def test_oversized_claims_are_named_and_nothing_huge_is_allocated(tmp_path: Path) -> None:
    outcomes = spawn_ranks(body_claims, 3, str(tmp_path), timeout=90, comm_timeout=20,
                           env={"TENSORCOMM_TRANSPORT": "tcp"})
    assert all(o.ok for o in outcomes), [o.output for o in outcomes]
    huge = outcomes[1].result["huge"]
    assert huge.startswith("PeerLostError: peer rank 0 was lost: "), huge
    assert f"a frame of {HUGE} bytes, more than this host's memory" in huge, huge
    assert "refused before allocating" in huge, huge
    assert "MemoryError" not in outcomes[1].output, outcomes[1].output
    longer = outcomes[2].result["longer"]
    assert f"rank 0 sent a {LONGER}-byte message where a 16-byte one was expected" in longer, longer
    unallocatable = outcomes[2].result["unallocatable"]
    assert unallocatable.startswith("PeerLostError: peer rank 0 was lost: "), unallocatable
    assert f"cannot allocate {UNALLOCATABLE} bytes" in unallocatable, unallocatable
    assert "MemoryError" not in outcomes[2].output, outcomes[2].output
