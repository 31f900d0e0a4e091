"""Selection that learns (``algorithms/learning.py``) on real rank processes: the members run
the same algorithm at every call, switch when the decider's times say so, name what ran, and
learn only if every member allows it; the decision log it uses, in one process.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.algorithms import learning
from tensorcomm.testing import run_ranks
from tensorcomm.transports.shm import slots

from helpers import close_all, open_domains

pytestmark = pytest.mark.skipif(not slots.SUPPORTED, reason="shared memory needs x86-64")

COUNT = 1 << 16  # float32: 256 KiB (LEARN_BYTES), where all_reduce has three or more candidates
CALLS = 3 * learning.PERIOD + 16  # past the second decision (the first with every candidate timed)
SLOW = "shm_direct"  # what the built-in rules choose at COUNT on 2 ranks; made to look slow


def _penalise(name: str) -> None:
    """Make the decider's times of ``name`` look a second longer (the others' as measured)."""
    decide = learning.Learner._decide

    def slowed(self: learning.Learner, call: int) -> None:
        times = self.samples[self.names.index(name)]  # the deque its timer appends to
        slowed_times = [t + 1.0 for t in times]
        times.clear()
        times.extend(slowed_times)
        decide(self, call)

    learning.Learner._decide = slowed  # type: ignore[method-assign]


def body_learns(learn_on_rank1: str) -> tuple[list[str], list[str]]:
    """``CALLS`` all_reduces of ``COUNT``, every fifth one async; returns what ran, call by call,
    and what the shape had settled on (``last_call.settled``)."""
    if os.environ["RANK"] == "1":  # read by init: rank 1's own setting
        os.environ["TENSORCOMM_LEARN"] = learn_on_rank1
    tc.init()
    _penalise(SLOW)
    rank, size = tc.get_rank(), tc.get_world_size()
    ran, settled = [], []
    for call in range(CALLS):
        x = np.full(COUNT, rank + call, np.float32)
        if call % 5 == 4:
            work = tc.all_reduce(x, async_op=True)
            work.wait()
            assert work.algorithm == tc.WORLD.last_call.algorithm, (call, work.algorithm)
        else:
            tc.all_reduce(x)
        np.testing.assert_array_equal(x, np.full(COUNT, sum(range(size)) + size * call, np.float32))
        ran.append(tc.WORLD.last_call.algorithm)
        settled.append(tc.WORLD.last_call.settled)
    return ran, settled


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_members_run_the_same_algorithm_and_leave_a_slow_one() -> None:
    (ran, settled), other = run_ranks(body_learns, 2, "auto", init=False, timeout=90)
    assert (ran, settled) == other
    first = 2 * learning.PERIOD + 1  # the decision at call 2 * PERIOD applies from the next
    assert set(ran[:first]) == set(ran) and ran[0] == SLOW
    others = [name for name in ran[:first] if name != SLOW]
    assert 0 < len(others) <= 2 * learning.TRIAL_CALLS * (len(set(ran)) - 1)  # trials only
    after = ran[first:]
    assert after[0] != SLOW and after.count(SLOW) <= learning.TRIAL_CALLS
    # ``settled`` names the incumbent through the trials, the new one from the switch on (a
    # later decision may switch again), and what ran at every call outside the trials
    assert settled[:first] == [SLOW] * first and settled[first] == after[0] and SLOW not in settled[first:]
    trials = range(learning.TRIAL_FROM, learning.TRIAL_FROM + learning.TRIAL_CALLS * (len(set(ran)) - 1))
    pairs = list(zip(ran, settled, strict=True))
    assert all(r == s for call, (r, s) in enumerate(pairs) if call % learning.PERIOD not in trials)
    assert any(r != s for r, s in pairs)  # the trials ran what the shape had not settled on


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_member_that_does_not_learn_keeps_the_group_on_the_fixed_choice() -> None:
    for ran, settled in run_ranks(body_learns, 2, "off", init=False, timeout=90):
        assert ran == settled == [SLOW] * CALLS


def test_the_decision_log_hands_records_on_and_refuses_to_be_lapped() -> None:
    domains = open_domains(2)
    try:
        writer, reader = domains[0].slots, domains[1].slots
        assert reader.published(0, 0) == [] and reader.words[reader.log_head_word(0)] == 0
        for i in range(3):
            writer.publish((-(1 << 62) + i, i, 7))
        assert reader.published(0, 1) == [(-(1 << 62) + 1, 1, 7), (-(1 << 62) + 2, 2, 7)]
        for i in range(3, 3 + slots.LOG_RECORDS):
            writer.publish((i, i, 0))
        assert reader.published(0, 3) == [(i, i, 0) for i in range(3, 3 + slots.LOG_RECORDS)]
        with pytest.raises(RuntimeError, match="decision log ran 6 records ahead"):
            reader.published(0, 2)
    finally:
        close_all(domains)
