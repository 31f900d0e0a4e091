"""Every hand-inlined copy on the hot paths (a comment saying "inline" names what it copies) does
what its original does on the same inputs: each test runs the code that holds the copy and the
original side by side, so a change to one that the other misses fails here."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
import pytest

import tensorcomm
from tensorcomm import config
from tensorcomm.algorithms import allreduce, kernels, shm_allreduce
from tensorcomm.algorithms.shm_common import reduce_terms
from tensorcomm.core import collectives
from tensorcomm.frontends import functional
from tensorcomm.signature import signature
from tensorcomm.transports.base import SEQ_BITS, STEP_BITS, call_of_tag
from tensorcomm.transports.matching import MessageRequest
from tensorcomm.transports.tcp import framing
from tensorcomm.transports.tcp.driving import Driving
from tensorcomm.transports.tcp.link import Link
from tensorcomm.transports.tcp.transport import TcpTransport
from tensorcomm.types import SUPPORTED_DTYPES, ReduceOp

from helpers import close_all, ctx_for, open_domains, run_each_rank

OPS: list[Any] = [*ReduceOp, "sum", "max", ReduceOp.premul_sum(2.0), 3.5, None]


def _candidates() -> list[Any]:
    """Arrays (and not arrays) of every kind ``_plain`` tells apart."""
    x = np.arange(12, dtype=np.float32)
    frozen = x.copy()
    frozen.flags.writeable = False

    class Sub(np.ndarray):
        pass

    return [x, x.reshape(3, 4), x.reshape(3, 4).T, x[::2], np.float32(1.0), np.array(2.0, np.float32),
            frozen, np.frombuffer(bytearray(13), np.uint8)[1:].view(np.float32), np.zeros(0, np.float32),
            np.ones(3, np.float16), np.ones(3, bool), np.ones(3, np.complex64), np.ones(3, object),
            x.view(Sub), [1.0, 2.0]]


def test_functional_all_reduce_takes_its_fast_path_exactly_for_plain_arrays() -> None:
    """``all_reduce``'s condition is ``_plain``'s: a plain array goes to the core as it is, every
    other tensor through ``calls.in_place``."""
    staged = RuntimeError("staged")
    for tensor in _candidates():
        core = mock.Mock()
        with mock.patch.object(functional.collectives, "all_reduce", core), \
                mock.patch.object(functional, "current_world", lambda: SimpleNamespace(world_group="g")), \
                mock.patch.object(functional.calls, "in_place", mock.Mock(side_effect=staged)):
            try:
                functional.all_reduce(tensor)
                fast = True
            except RuntimeError as exc:
                assert exc is staged
                fast = False
        assert fast == functional._plain(tensor), (type(tensor), getattr(tensor, "dtype", None))
        if fast:
            assert core.call_args.args == ("g", tensor, ReduceOp.SUM, False)


class _Group:
    """As much of a group as a collective's plan lookup touches: the plan under ``key`` (the
    group is its own ``Caller``)."""

    def __init__(self, key: Any) -> None:
        self.plan = SimpleNamespace(op="parsed op")
        self.plans = {key: self.plan}
        self._inside = self
        self.ran: tuple[Any, ...] = ()

    def keep_plan(self, key: Any, plan: Any) -> Any:
        raise AssertionError(f"no plan under the original's key; the inline made {key!r}")

    def run(self, plan: Any, async_op: bool, *args: Any) -> None:
        assert plan is self.plan
        self.ran = args


def _same_arrays(found: tuple[Any, ...], expected: tuple[Any, ...]) -> bool:
    return len(found) == len(expected) and all(
        f == e if not isinstance(e, np.ndarray) else
        (f.shape == e.shape and f.dtype == e.dtype and np.shares_memory(f, e))
        for f, e in zip(found, expected, strict=True))


@pytest.mark.parametrize("shape", [(8,), (2, 4), (2, 2, 2), (1,)])
def test_core_collectives_find_their_plans_under_the_originals_keys(shape: tuple[int, ...]) -> None:
    """``_flat`` and ``_op_key`` inlined in ``core.collectives`` (all_reduce; reduce_scatter's key):
    the same key, the same flat arrays."""
    flat, key_of = collectives._flat, collectives._op_key
    counts = (4, 4) if int(np.prod(shape)) == 8 else (1,)
    with mock.patch.object(collectives, "_reduction", side_effect=AssertionError("plan missed")), \
            mock.patch.object(collectives, "_make", side_effect=AssertionError("plan missed")):
        for op in OPS:
            x = np.zeros(shape, np.float32)
            g = _Group(("all_reduce", x.dtype, x.size, key_of(op)))
            collectives.all_reduce(g, x, op, False)  # type: ignore[arg-type]
            assert _same_arrays(g.ran, (flat(x), "parsed op")), (op, shape)
            out = np.zeros(sum(counts), np.float32)
            g = _Group(("reduce_scatter", x.dtype, counts, key_of(op)))
            collectives.reduce_scatter(g, x, out.reshape(-1, 1), counts, op, False)  # type: ignore[arg-type]
            assert _same_arrays(g.ran, (flat(x), flat(out), counts, "parsed op")), (op, shape)
        x, out = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        g = _Group(("broadcast", x.dtype, x.size, 1))
        collectives.broadcast(g, x, 1, False)  # type: ignore[arg-type]
        assert _same_arrays(g.ran, (flat(x), 1))
        g = _Group(("all_gather", x.dtype, counts))
        collectives.all_gather(g, x, out, list(counts), False)  # type: ignore[arg-type]
        assert _same_arrays(g.ran, (flat(x), flat(out), counts))
        g = _Group(("all_to_all", x.dtype, counts, counts))
        collectives.all_to_all(g, x, list(counts), out, list(counts), False)  # type: ignore[arg-type]
        assert _same_arrays(g.ran, (flat(x), counts, flat(out), counts))


def _pairs() -> list[tuple[Any, np.dtype]]:
    """Every (op, dtype) a reduction accepts."""
    found = []
    for dtype in map(np.dtype, SUPPORTED_DTYPES):
        for op in [*ReduceOp, ReduceOp.premul_sum(3.0)]:
            try:
                kernels.check_op_dtype(op, dtype, "op")
            except (TypeError, ValueError):
                continue
            found.append((op, dtype))
    return found


@pytest.mark.parametrize(("op", "dtype"), _pairs(), ids=str)
def test_shm_direct_two_member_sum_is_reduce_terms(op: Any, dtype: np.dtype) -> None:
    """``shm_allreduce.direct``'s inlined ``reduce_terms`` (two members, raw terms) gives its bits."""
    red = kernels.reduction(op, dtype)
    rng = np.random.default_rng(7)
    peer = (rng.standard_normal(5) * 4).astype(red.acc)
    stacked = [np.zeros((2, 5), red.acc) for _ in (0, 1)]
    domain = SimpleNamespace(rank=0, size=2, stacked=lambda p, acc, n: stacked[p], next_round=lambda: 1,
                             start=lambda ctx: None)
    plan = SimpleNamespace(reduction=red, label="all_reduce")
    state = shm_allreduce.prepare_direct(SimpleNamespace(shm=domain), plan, np.zeros(5, dtype))  # type: ignore[arg-type]
    x = (rng.standard_normal(5) * 4).astype(dtype)
    stacked[1][1] = peer
    plan.state = state
    shm_allreduce.direct(SimpleNamespace(plan=plan), x, op)  # type: ignore[arg-type]
    expected = np.empty_like(x)
    reduce_terms(red, stacked[1], expected)  # the slots direct reduced: this member's terms, the peer's
    assert x.tobytes() == expected.tobytes()
    assert (state.pair is not None) == (red.raw and red.positional and not red.average)


class _Ctx:
    """A TCP exchange's partner: what arrives is ``theirs``; what is sent is kept."""

    def __init__(self, theirs: np.ndarray) -> None:
        self.theirs, self.sent = theirs, np.zeros_like(theirs)
        self.at = 0

    def irecv(self, src: int, arr: np.ndarray, step: int) -> None:
        arr[...] = self.theirs[self.at:self.at + arr.size]
        self.at += arr.size

    def isend(self, dst: int, arr: np.ndarray, step: int) -> np.ndarray:
        return arr.copy()

    def wait(self, request: Any) -> None:
        pass


@pytest.mark.parametrize("dst", [None, 1])
@pytest.mark.parametrize("partner_first", [False, True])
@pytest.mark.parametrize("in_place", [False, True])
def test_tcp_exchange_of_one_piece_is_the_loop(dst: int | None, partner_first: bool, in_place: bool) -> None:
    """``allreduce._exchange``'s one-piece case, inlined, combines as its loop over pieces does
    (the operand order shows with a subtraction)."""
    results = []
    for chunk in (1 << 20, 8):  # one piece: the inlined case; 8 bytes: the loop, two elements a piece
        rng = np.random.default_rng(3)
        theirs, mine = rng.standard_normal(16), rng.standard_normal(16)
        buf = mine if in_place else np.zeros(16)
        with mock.patch.object(config, "TCP_CHUNK_BYTES", chunk):
            allreduce._exchange(_Ctx(theirs), dst, 1, mine, buf, np.zeros(16), 0, np.subtract, None,  # type: ignore[arg-type]
                                partner_first)
        results.append(buf.tobytes())
    assert results[0] == results[1]


def _roles() -> list[Driving]:
    """A transport's driving role in every state ``completed`` tells apart (its wake-ups mocked)."""
    roles = []
    me = threading.get_ident()
    for sleepers in (0, 1):
        for driving in (False, True):
            for driver in (None, me, me + 1):
                for background in (False, True) if driving else (False,):
                    role = object.__new__(Driving)
                    role.sleepers, role._driving, role.driver = sleepers, driving, driver
                    role._background_driving = background
                    role._state_lock = threading.Lock()
                    role._cv = mock.Mock()
                    role.poke = mock.Mock()  # type: ignore[method-assign]
                    roles.append(role)
    return roles


def _woken(role: Driving) -> tuple[int, int]:
    return role._cv.notify_all.call_count, role.poke.call_count  # type: ignore[attr-defined]


def test_driving_completed_pokes_a_driving_caller_as_poke_elsewhere_does() -> None:
    """A finished request wakes a caller that drives from another thread (it may wait for it),
    never the background thread (it waits for no request)."""
    for role in _roles():
        role.completed()
        poked = role.poke.call_count  # type: ignore[attr-defined]
        role.poke.reset_mock()  # type: ignore[attr-defined]
        role.poke_elsewhere()
        expected = 0 if role._background_driving else role.poke.call_count  # type: ignore[attr-defined]
        assert poked == expected, vars(role)


def test_a_data_frame_completes_its_request_as_finish_does() -> None:
    """``Link._end``'s inlined ``request.finish`` and ``role.completed`` test: the same request
    state and the same wake-ups as ``MessageRequest.finish``, in every state of the role."""
    for inline_role, original_role in zip(_roles(), _roles(), strict=True):
        inline, original = MessageRequest(None, 5, 9), MessageRequest(original_role, 5, 9)
        link = SimpleNamespace(kind=framing.KIND_DATA, peer=3, target=None, request=inline, entry=None,
                               _role=inline_role)
        Link._end(link)  # type: ignore[arg-type]
        original.finish(3)
        assert (inline.source, inline.finished, inline._error) == \
            (original.source, original.finished, original._error)
        assert _woken(inline_role) == _woken(original_role), vars(original_role)


def _tags() -> list[int]:
    return [(group << (SEQ_BITS + STEP_BITS)) | (seq << STEP_BITS) | step for group in (0, 1, 77)
            for seq in (0, 1, (1 << SEQ_BITS) - 1) for step in (0, 5, (1 << STEP_BITS) - 1)]


def test_note_call_reads_the_tag_as_call_of_tag_does() -> None:
    for tag in _tags():
        match = mock.Mock()
        match.note_call.return_value = None
        state = SimpleNamespace(lock=threading.Lock(), _noted=None, abort_group=None, match=match)
        sig = signature("all_reduce", np.dtype(np.float32), 4)
        TcpTransport._note_call(state, tag, sig)  # type: ignore[arg-type]
        match.note_call.assert_called_once_with(call_of_tag(tag), sig)


def test_isend_packs_the_header_as_pack_header_does() -> None:
    data = memoryview(bytes(range(24)))
    for tag in _tags():
        for sig in (None, signature("broadcast", np.dtype(np.int64), 3, root=1)):
            link = SimpleNamespace(send=lambda header, payload, tag: header)
            state = SimpleNamespace(rank=0, _noted=tag >> STEP_BITS, _links={1: link},
                                    match=SimpleNamespace(aborted=False, aborted_groups=None, lost=None))
            header = TcpTransport.isend(state, 1, data, tag, sig)  # type: ignore[arg-type]
            assert header == framing.pack_header(framing.KIND_DATA, tag, len(data), sig)


def _line_words(d: Any) -> list[int]:
    """The words of ``d``'s rank's control line that a start writes (counter, two entries)."""
    slots = d.slots
    base = slots.counter_word[slots.rank]
    return [slots.words[base + i] for i in range(8)]


@pytest.mark.parametrize("mismatch", [False, True])
def test_slots_start_is_announce_then_meet(mismatch: bool) -> None:
    """``Slots.start``'s inlined ``announce`` and ``meet``: of two thread-ranks, one starts each
    call with ``start`` and the other with ``announce`` then ``meet``, with and without an
    extent; they leave the same words on their lines, the same posts, and raise the same
    mismatch."""
    domains = open_domains(2)
    sigs = [signature("all_reduce", np.dtype(np.float32), 4, ReduceOp.SUM, -1)] * 2
    if mismatch:
        sigs[1] = signature("all_gather", np.dtype(np.float32), 8, None, -1)

    def rank(r: int) -> list[Any]:
        d = domains[r]
        seen: list[Any] = []
        for seq, extent in ((0, None), (1, 24), (2, 8)):
            ctx = ctx_for(d, seq, sigs[r])
            try:
                if r == 0:
                    d.slots.start(ctx, extent)
                else:
                    d.slots.announce(ctx, extent)
                    d.slots.meet(ctx)
            except tensorcomm.CollectiveMismatchError as exc:
                seen.append(str(exc).split(" while ")[0].split(" called ")[1])
                return seen
            seen.append((_line_words(d), d.slots.posts))
        return seen

    try:
        got = run_each_rank(2, rank)
    finally:
        close_all(domains)
    if mismatch:
        assert got == [["all_gather(float32[8])"], ["all_reduce(float32[4], op=sum)"]]
    else:
        assert got[0] == got[1] and len(got[0]) == 3


@pytest.mark.parametrize("differ", [False, True])
def test_slots_start_checks_extents_as_extents_differ_does(differ: bool) -> None:
    """``Slots.start``'s inlined ``extents_differ``: each of two thread-ranks starts calls with
    extents expected per member (one of them announcing another extent when ``differ``);
    ``start``'s answer is ``extents_differ``'s on the same call (a peer's extent counts, not
    one's own), and False without ``expected``."""
    domains = open_domains(2)
    sig = signature("all_gather", np.dtype(np.float32), 8, None, -1)

    def rank(r: int) -> list[Any]:
        d = domains[r]
        seen: list[Any] = []
        for seq in range(4):
            ctx = ctx_for(d, seq, sig)
            extent = 16 + (8 if differ and r == 1 and seq % 2 else 0)
            expected = d.slots.extent_checks([16, 16]) if seq < 3 else None
            seen.append((d.slots.start(ctx, extent, expected),
                         expected is not None and d.slots.extents_differ(ctx, expected)))
        return seen

    try:
        got = run_each_rank(2, rank)
    finally:
        close_all(domains)
    for r, seen in enumerate(got):  # rank 0 sees its peer's other extent; rank 1 only its own
        assert all(a == b for a, b in seen) and seen[3] == (False, False)
        assert [a for a, _ in seen[:3]] == ([False, True, False] if differ and r == 0 else [False] * 3)


# Where the copies are (a comment naming the original, then "inline"), and how many each module
# holds: a new copy, or one moved, must come with its test here.
PINNED = {"algorithms/allreduce.py": 1, "algorithms/shm_allreduce.py": 1, "core/collectives.py": 2,
          "transports/shm/slots.py": 2,
          "frontends/functional.py": 1, "transports/tcp/link.py": 2,
          "transports/tcp/transport.py": 2}
_COPY = re.compile(r"#.*(``[^`]+``|does)[^#]*\binline\b")


def test_every_inlined_copy_is_pinned_here() -> None:
    root = Path(tensorcomm.__file__).parent
    found = {}
    for path in sorted(root.rglob("*.py")):
        count = sum(1 for line in path.read_text().splitlines() if _COPY.search(line))
        if count:
            found[path.relative_to(root).as_posix()] = count
    assert found == PINNED
