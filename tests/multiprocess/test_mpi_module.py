"""``tensorcomm.MPI`` (mpi4py's API over tensorcomm) on real ranks, checked against numpy.

Independent of any mpi4py checkout: these bodies use the module the way mpi4py programs do.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tensorcomm import MPI, CollectiveMismatchError, PeerLostError
from tensorcomm.testing import run_ranks, spawn_ranks

pytestmark = pytest.mark.multiprocess


def body_communicators() -> list[int]:
    """COMM_WORLD, COMM_SELF, groups, Dup, Split, Split_type, Create, Compare."""
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    assert (comm.rank, comm.size) == (rank, size)
    assert MPI.COMM_SELF.Get_size() == 1 and MPI.COMM_SELF.allgather(rank) == [rank]
    group = comm.Get_group()
    assert (group.Get_size(), group.Get_rank()) == (size, rank)
    evens = group.Incl(list(range(0, size, 2)))
    assert evens.Translate_ranks(list(range(evens.size)), group) == list(range(0, size, 2))
    assert group.Excl([0]).Get_rank() == (MPI.UNDEFINED if rank == 0 else rank - 1)
    dup = comm.Dup()
    assert MPI.Comm.Compare(dup, comm) == MPI.CONGRUENT and dup.Compare(dup) == MPI.IDENT
    half = comm.Split(rank % 2, key=-rank)
    assert half.Get_size() == len(range(rank % 2, size, 2))
    assert half.allgather(rank) == sorted(range(rank % 2, size, 2), reverse=True)
    assert comm.Split(MPI.UNDEFINED) == MPI.COMM_NULL
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED)
    assert shared.Get_size() == size  # one host
    made = comm.Create(evens)
    assert (made == MPI.COMM_NULL) == (rank % 2 == 1)
    if made != MPI.COMM_NULL:
        assert made.allreduce(1) == evens.size
        made.Free()
    for c in (dup, half, shared):
        c.Free()
    assert dup == MPI.COMM_NULL
    comm.Barrier()
    return [rank, size]


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_communicators(world_size):
    results = run_ranks(body_communicators, world_size, timeout=60)
    assert results == [[r, world_size] for r in range(world_size)]


def body_point_to_point() -> None:
    """Wildcards and the status, a larger receive buffer, truncation, probes, cancel,
    synchronous and persistent sends, objects small and large, request sets."""
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    # ANY_SOURCE/ANY_TAG: the status says who sent it and with which tag; a longer buffer
    data = np.arange(5, dtype=np.float64) + rank
    request = comm.Isend([data, MPI.DOUBLE], dest=right, tag=40 + rank)
    got = np.full(8, -1.0)
    status = MPI.Status()
    comm.Recv([got, MPI.DOUBLE], source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status)
    request.Wait()
    assert (status.Get_source(), status.Get_tag()) == (left, 40 + left)
    assert status.Get_count(MPI.DOUBLE) == 5 and status.Get_elements(MPI.DOUBLE) == 5
    np.testing.assert_array_equal(got[:5], np.arange(5) + left)
    assert (got[5:] == -1).all()
    # a message longer than the buffer: ERR_TRUNCATE here, and the communicator goes on
    comm.Send(np.arange(1000, dtype=np.int32), dest=right, tag=1)
    small = np.zeros(10, np.int32)
    with pytest.raises(MPI.Exception) as caught:
        comm.Recv(small, source=left, tag=1)
    assert caught.value.Get_error_class() == MPI.ERR_TRUNCATE
    # probes: the envelope says the size before the receive is posted
    comm.send({"from": rank, "blob": b"x" * 3000}, dest=right, tag=7)
    probed = MPI.Status()
    comm.Probe(source=left, tag=MPI.ANY_TAG, status=probed)
    assert probed.Get_tag() == 7 and probed.Get_count() > 3000
    assert comm.recv(source=left, tag=7) == {"from": left, "blob": b"x" * 3000}
    assert not comm.Iprobe(source=MPI.ANY_SOURCE, tag=999)
    # cancel a receive nothing will match
    pending = comm.Irecv(np.zeros(1), source=left, tag=12345)
    pending.Cancel()
    cancelled = MPI.Status()
    pending.Wait(cancelled)
    assert cancelled.Is_cancelled()
    # persistent point-to-point, started three times
    out, into = np.zeros(3), np.zeros(3)
    send = comm.Send_init(out, dest=right, tag=5)
    recv = comm.Recv_init(into, source=left, tag=5)
    for i in range(3):
        out[:] = i + rank
        MPI.Prequest.Startall([recv, send])
        MPI.Request.Waitall([send, recv])
        assert (into == i + left).all()
    send.Free()
    recv.Free()
    # synchronous send, sendrecv, object sizes from small to 1 MiB, waitany
    big = np.random.default_rng(rank).random(1 << 17)  # 1 MiB
    requests = [comm.issend(big, dest=right, tag=2), comm.irecv(source=left, tag=2)]
    index, value = MPI.Request.waitany(requests)
    others = MPI.Request.waitall(requests)
    received = value if index == 1 else others[1]
    np.testing.assert_array_equal(received, np.random.default_rng(left).random(1 << 17))
    assert comm.sendrecv(rank, dest=right, source=left) == left
    buf = np.full(4, rank, np.int64)
    comm.Sendrecv_replace(buf, dest=right, source=left)
    assert (buf == left).all()
    assert comm.recv(source=MPI.PROC_NULL) is None
    comm.Barrier()


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_point_to_point(world_size):
    run_ranks(body_point_to_point, world_size, timeout=90)


def body_blocking_object_order() -> None:
    """Blocking ``recv`` of objects waiting in the mailbox keeps MPI's matching order: a message
    whose tag does not fit waits for a later receive, a receive posted earlier gets the message
    first, a synchronous send is answered, and the status says what came."""
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    status = MPI.Status()
    if rank == 0:
        comm.send({"i": 0}, dest=1, tag=2)
        comm.send({"i": 1}, dest=1, tag=3)
    comm.Barrier()  # both wait in the ring, unread, when the receives come
    if rank == 1:
        assert comm.recv(source=0, tag=3, status=status) == {"i": 1}
        assert (status.Get_source(), status.Get_tag()) == (0, 3) and status.Get_count() > 0
        assert comm.recv(source=0, tag=MPI.ANY_TAG) == {"i": 0}
        early = comm.irecv(source=0, tag=MPI.ANY_TAG)
    comm.Barrier()
    if rank == 0:
        comm.send({"i": 2}, dest=1, tag=1)
        comm.send({"i": 3}, dest=1, tag=1)
    comm.Barrier()
    if rank == 1:
        assert comm.recv(source=0, tag=1) == {"i": 3}  # the receive posted earlier took {"i": 2}
        assert early.wait() == {"i": 2}
        assert comm.recv(source=0, tag=4) == "synchronous"
        assert comm.recv(source=0, tag=5) == b""
    else:
        comm.ssend("synchronous", dest=1, tag=4)
        comm.send(b"", dest=1, tag=5)
    # objects longer than a ring are lent; the receiver's "read" answers come before the reply
    rng = np.random.default_rng(5)
    for nbytes in (2 << 20, 300 << 10):
        payload = {"blob": rng.bytes(nbytes)}
        if rank == 0:
            comm.send(payload, dest=1, tag=6)
            assert comm.recv(source=1, tag=7) == nbytes
        else:
            assert comm.recv(source=0, tag=6) == payload
            comm.send(nbytes, dest=0, tag=7)
    # the short way's checks keep the last plain ints they passed, not values equal to them
    peer = 1 - rank
    comm.send("plain", dest=peer, tag=8)
    assert comm.recv(source=peer, tag=8) == "plain"
    with pytest.raises(TypeError, match="bool"):
        comm.send("a bool rank", dest=bool(peer), tag=8)
    with pytest.raises(TypeError, match="bool"):
        comm.recv(source=bool(peer), tag=8)
    comm.send("numpy", dest=np.int64(peer), tag=np.int64(8))
    assert comm.recv(source=np.int64(peer), tag=8, status=status) == "numpy"
    assert status.Get_tag() == 8 and type(status.Get_tag()) is int
    comm.Barrier()


def test_blocking_object_receive_keeps_order():
    run_ranks(body_blocking_object_order, 2, timeout=60)


AFTER_FINALIZE = """
import numpy as np
from tensorcomm import MPI
comm = MPI.COMM_WORLD
peer = 1 - comm.Get_rank()
comm.send("before", dest=peer)
assert comm.recv(source=peer) == "before"
MPI.Finalize()
for name, call in [("send", lambda: comm.send(1, dest=peer)), ("recv", lambda: comm.recv(source=peer)),
                   ("Send", lambda: comm.Send(np.zeros(2), dest=peer)), ("Barrier", comm.Barrier)]:
    try:
        call()
        print(name, "did not fail")
    except RuntimeError as exc:
        print(name, "failed:", exc)
"""


def test_calls_after_finalize_fail_clearly(tmp_path):
    # point-to-point too, though its mailbox (in the unmapped segment) is gone
    script = tmp_path / "rank.py"
    script.write_text(AFTER_FINALIZE)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TENSORCOMM_")}
    done = subprocess.run([sys.executable, "-m", "tensorcomm", "run", "-n", "2", str(script)],
                          capture_output=True, text=True, timeout=60, env=environ)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if "fail" in line]
    assert len(lines) == 8 and all(" failed: " in line for line in lines), done.stdout


def body_ring_overflow() -> None:
    """More messages than a mailbox ring holds, sent before the receiver looks: the overflow goes
    by the transport, and every message, object or buffer, short or long, still arrives in the
    order it was sent."""
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    count, long_every = 600, 100  # ~630 KiB of objects against a 256 KiB ring at 2 ranks
    if rank == 0:
        for i in range(count):
            if i % long_every == 7:  # longer than a ring takes: the payload goes by the transport
                sent = np.full(40000, i, np.float64)
                comm.Send(sent, dest=1, tag=i % 5)
                sent[:] = -1  # the caller's buffer is its own again once Send returns
            else:
                comm.send({"i": i, "pad": b"p" * 1000}, dest=1, tag=i % 5)
    comm.Barrier()
    if rank == 1:
        status = MPI.Status()
        for i in range(count):
            if i % long_every == 7:
                got = np.empty(40000)
                comm.Recv(got, source=0, tag=MPI.ANY_TAG, status=status)
                assert (got == i).all()
            else:
                assert comm.recv(source=0, tag=MPI.ANY_TAG, status=status)["i"] == i
            assert status.Get_tag() == i % 5
    comm.Barrier()


@pytest.mark.parametrize("cma", ["auto", "off"])
def test_ring_overflow_keeps_order(cma):
    # off: payloads longer than a ring follow their envelopes on the transport instead of being lent
    run_ranks(body_ring_overflow, 2, timeout=90, env={"TENSORCOMM_CMA": cma})


def body_collectives() -> None:
    """Buffer collectives (every message form), reductions native and in rank order,
    nonblocking and persistent forms, object collectives."""
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    everyone = np.arange(size)
    x = np.arange(6, dtype=np.float64) + rank
    total = np.empty_like(x)
    comm.Allreduce(x, total, op=MPI.SUM)
    np.testing.assert_allclose(total, sum(np.arange(6) + r for r in everyone))
    comm.Allreduce(MPI.IN_PLACE, x, op=MPI.MAX)
    np.testing.assert_array_equal(x, np.arange(6) + size - 1)
    # reductions tensorcomm has no kernel for: PROD on complex, LXOR, MAXLOC, a user op
    z = np.array([1 + 1j * (rank + 1)], np.complex128)
    comm.Allreduce(MPI.IN_PLACE, z, op=MPI.PROD)
    np.testing.assert_allclose(z, [np.prod([1 + 1j * (r + 1) for r in everyone])])
    flags = np.array([rank % 2, 1], np.int32)
    comm.Allreduce(MPI.IN_PLACE, flags, op=MPI.LXOR)
    assert list(flags) == [sum(r % 2 for r in everyone) % 2, size % 2]
    pairs = np.array([(float(rank % 2), rank)], dtype=MPI.DOUBLE_INT.dtype)
    comm.Allreduce(MPI.IN_PLACE, [pairs, MPI.DOUBLE_INT], op=MPI.MAXLOC)
    assert pairs[0]["index"] == (1 if size > 1 else 0)

    def first_wins(inbuf, inoutbuf, datatype):  # not commutative: MPI's order is rank order
        inoutbuf[:] = inbuf

    first = MPI.Op.Create(first_wins, commute=False)
    mine = np.array([rank], np.int32)
    out = np.empty(1, np.int32)
    comm.Allreduce(mine, out, op=first)
    assert out[0] == 0
    first.Free()
    # uneven forms with displacements
    counts = [r + 1 for r in everyone]
    displs = [sum(counts[:r]) + r for r in everyone]  # gaps between the blocks
    gathered = np.full(sum(counts) + size, -1, np.int32)
    comm.Allgatherv(np.full(rank + 1, rank, np.int32), [gathered, (counts, displs), MPI.INT])
    for r in everyone:
        assert (gathered[displs[r]:displs[r] + counts[r]] == r).all()
    root_buf = np.arange(sum(counts), dtype=np.float32) if rank == 0 else None
    piece = np.empty(rank + 1, np.float32)
    comm.Scatterv([root_buf, counts, MPI.FLOAT] if rank == 0 else None, piece, root=0)
    start = sum(counts[:rank])
    np.testing.assert_array_equal(piece, np.arange(start, start + rank + 1))
    sends = np.full(sum(counts), rank, np.int64)
    recvs = np.empty(size * (rank + 1), np.int64)
    comm.Alltoallv([sends, counts, MPI.LONG], [recvs, [rank + 1] * size, MPI.LONG])
    np.testing.assert_array_equal(recvs, np.repeat(everyone, rank + 1))
    # nonblocking uneven reduce_scatter, persistent allreduce, scan/exscan
    block = np.ones(sum(counts), np.float64)
    result = np.empty(rank + 1)
    comm.Ireduce_scatter(block, result, counts, op=MPI.SUM).Wait()
    assert (result == size).all()
    value = np.array([rank + 1.0])
    persistent = comm.Allreduce_init(MPI.IN_PLACE, value)
    for _ in range(2):
        value[:] = rank + 1.0
        persistent.Start()
        persistent.Wait()
        assert value[0] == size * (size + 1) / 2
    persistent.Free()
    prefix = np.empty(1, np.int64)
    comm.Scan(np.array([rank + 1]), prefix)
    assert prefix[0] == (rank + 1) * (rank + 2) // 2
    # object collectives, with an MPI op and a Python callable
    assert comm.bcast({"root": rank} if rank == 0 else None, root=0) == {"root": 0}
    assert comm.allgather(rank) == list(everyone)
    assert comm.alltoall([(rank, j) for j in everyone]) == [(r, rank) for r in everyone]
    assert comm.allreduce(rank, op=MPI.SUM) == sum(everyone)
    joined = comm.reduce([rank], op=lambda a, b: a + b, root=size - 1)
    assert joined == (list(everyone) if rank == size - 1 else None)
    assert comm.exscan(rank + 1) == (None if rank == 0 else rank * (rank + 1) // 2)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_collectives(world_size):
    run_ranks(body_collectives, world_size, timeout=90)


def body_errors() -> list[str]:
    """A bad argument is an MPI.Exception and a ValueError, raised before anything is sent:
    the communicator goes on; a mismatch between ranks is tensorcomm's and MPI's error."""
    comm = MPI.COMM_WORLD
    seen = []
    with pytest.raises(MPI.Exception) as caught:
        comm.Bcast(np.zeros(2), root=comm.size)
    assert isinstance(caught.value, ValueError) and caught.value.Get_error_class() == MPI.ERR_ROOT
    seen.append("root")
    with pytest.raises(ValueError):
        comm.send(1, dest=-5)
    buf = np.ones(3)
    comm.Allreduce(MPI.IN_PLACE, buf)
    assert (buf == comm.size).all()
    with pytest.raises(NotImplementedError, match="Create_vector"):
        MPI.DOUBLE.Create_vector(2, 1, 2)
    if comm.size > 1:
        with pytest.raises(MPI.Exception) as mismatch:
            comm.Bcast(np.zeros(2 + comm.rank), root=0)
        assert isinstance(mismatch.value, (CollectiveMismatchError, PeerLostError))
        seen.append("mismatch")
    return seen


@pytest.mark.parametrize("world_size", [1, 2])
def test_errors(world_size):
    for seen in run_ranks(body_errors, world_size, timeout=90, env={"TENSORCOMM_TIMEOUT": "10"}):
        assert seen == (["root", "mismatch"] if world_size > 1 else ["root"])


def body_peer_lost() -> str:
    """Rank 1 leaves; rank 0's receive from it fails naming it, as a PeerLostError that is an
    MPI.Exception too."""
    import os

    comm = MPI.COMM_WORLD
    comm.Barrier()
    if comm.rank == 1:
        os._exit(3)
    try:
        comm.recv(source=1, tag=0)
    except PeerLostError as exc:
        assert isinstance(exc, MPI.Exception) and exc.Get_error_class() == MPI.ERR_PROC_FAILED
        return f"lost {exc.rank}"
    return "received"


def test_peer_lost_is_an_mpi_error():
    outcomes = spawn_ranks(body_peer_lost, 2, timeout=60, env={"TENSORCOMM_TIMEOUT": "20"})
    assert outcomes[0].result == "lost 1", outcomes[0].output
    assert outcomes[1].exitcode == 3


def body_sent_while_looking_who_left() -> str:
    """Rank 1 sends and leaves while rank 0, waiting for it, has looked at what arrived and not
    yet at who left (held there until rank 1 is gone): the message counts, not the leaving."""
    import time

    from tensorcomm.core.lifecycle import current_world

    comm = MPI.COMM_WORLD
    comm.Barrier()
    if comm.rank == 1:
        time.sleep(0.3)  # rank 0 is waiting by then
        comm.send("last words", dest=0, tag=3)
        return "sent"
    transport = current_world().transport
    look = transport.lost_peers

    def late_look() -> frozenset[int]:
        deadline = time.monotonic() + 20
        while 1 not in look() and time.monotonic() < deadline:
            time.sleep(0.01)
        return look()

    transport.lost_peers = late_look  # type: ignore[method-assign]
    return comm.recv(source=1, tag=3)


@pytest.mark.parametrize("env", [{}, {"TENSORCOMM_TRANSPORT": "tcp"}], ids=["shm", "tcp"])
def test_a_message_sent_before_leaving_counts_though_the_leaving_is_seen_first(env):
    outcomes = spawn_ranks(body_sent_while_looking_who_left, 2, timeout=60,
                           env={"TENSORCOMM_TIMEOUT": "20", **env})
    assert [o.result for o in outcomes] == ["last words", "sent"], outcomes[0].output


def body_lent_then_lost() -> str:
    """Rank 1 starts sending an object longer than a mailbox ring (read from its memory where the
    domain allows) and leaves before rank 0 looks: rank 0's receive fails naming rank 1, or gets
    the whole object where it went by the transport; never part of one."""
    import os
    import time

    comm = MPI.COMM_WORLD
    big = np.arange(1 << 17, dtype=np.float64)  # 1 MiB
    comm.Barrier()
    if comm.rank == 1:
        comm.isend(big, dest=0, tag=4)
        os._exit(3)
    time.sleep(1.0)
    try:
        got = comm.recv(source=1, tag=4)
    except PeerLostError as exc:
        assert isinstance(exc, MPI.Exception)
        return f"lost {exc.rank}"
    np.testing.assert_array_equal(got, big)
    return "received"


def body_send_then_leave() -> str:
    """Rank 0 sends an object longer than a mailbox ring and its program ends at once; rank 1
    receives it a second later, whole: a sender does not leave while what it lent is unread."""
    import time

    comm = MPI.COMM_WORLD
    big = np.arange(1 << 17, dtype=np.float64)
    comm.Barrier()
    if comm.rank == 0:
        comm.send(big, dest=1, tag=9)
        return "sent"
    time.sleep(1.0)
    np.testing.assert_array_equal(comm.recv(source=0, tag=9), big)
    return "received"


def test_a_sender_that_ends_leaves_its_message_readable():
    outcomes = spawn_ranks(body_send_then_leave, 2, timeout=60)
    assert [o.result for o in outcomes] == ["sent", "received"], outcomes[1].output


def test_a_lent_payload_of_a_lost_sender_fails_naming_it():
    outcomes = spawn_ranks(body_lent_then_lost, 2, timeout=60, env={"TENSORCOMM_TIMEOUT": "20"})
    assert outcomes[0].result in ("lost 1", "received"), outcomes[0].output
    assert outcomes[1].exitcode == 3


def test_plain_python_is_a_world_of_one(tmp_path):
    script = ("from tensorcomm import MPI\n"
              "c = MPI.COMM_WORLD\n"
              "print(c.Get_rank(), c.Get_size(), c.allreduce(5), MPI.Is_initialized())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "1", "5", "True"]
