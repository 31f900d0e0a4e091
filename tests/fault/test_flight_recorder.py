"""The flight recorder on real jobs that go wrong (issue 25): one rank skips a collective, or a
rank is stopped (SIGSTOP). Every rank that fails a call writes its record; ``tensorcomm trace
analyze`` must name the rank that skipped or stopped, whether that rank wrote a record or not."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.cli import main as cli_main
from tensorcomm.testing import spawn_ranks
from tensorcomm.trace.analyze import find, load

pytestmark = pytest.mark.fault

TRANSPORTS = {"tcp": {"TENSORCOMM_TRANSPORT": "tcp"}, "shm": {}}


def body_skip(skipper: int) -> str:
    """Each round an all_reduce then a broadcast; ``skipper`` leaves out round 2's broadcast."""
    x = np.ones(4, np.float32)
    try:
        for round_ in range(4):
            tc.all_reduce(x)
            if not (tc.get_rank() == skipper and round_ == 2):
                tc.broadcast(x, 0)
    except tc.CommError as exc:
        return type(exc).__name__
    return "ok"


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("ranks", [2, 3])
def test_analyze_names_the_rank_that_skipped_a_collective(tmp_path: Path, transport: str, ranks: int,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    env = {**TRANSPORTS[transport], "TENSORCOMM_FLIGHT_DIR": str(tmp_path)}
    outcomes = spawn_ranks(body_skip, ranks, 1, timeout=60, comm_timeout=10, env=env)
    assert all(o.exitcode is not None for o in outcomes), [o.output for o in outcomes]
    records = load(tmp_path)
    assert sorted(records) == list(range(ranks))  # every rank failed a call and wrote its record
    findings = find(records)
    assert findings.diverged == [1], findings.paragraph()
    assert "step 5 of group 'world'" in (findings.divergence or ""), findings.paragraph()
    assert cli_main(["trace", "analyze", str(tmp_path)]) == 0
    paragraph = capsys.readouterr().out
    assert "rank 1 called all_reduce(float32[4], op=sum) at test_flight_recorder.py:" in paragraph, paragraph
    assert "broadcast(float32[4], root=0)" in paragraph, paragraph


def body_stop(resume: bool) -> str:
    """Rank 1 stops itself (SIGSTOP) after three all_reduces; rank 0's fourth times out. Then
    rank 0 either kills rank 1, or (``resume``) sends it SIGUSR1 and SIGCONT: it writes its
    record and goes on to a call the group has given up on."""
    x = np.ones(4, np.float32)
    pids = [0] * tc.get_world_size()
    tc.all_gather_object(pids, os.getpid())
    try:
        for step in range(6):
            if tc.get_rank() == 1 and step == 3:
                os.kill(os.getpid(), signal.SIGSTOP)
            tc.all_reduce(x)
    except tc.CommError as exc:
        if tc.get_rank() == 0:
            if resume:
                os.kill(pids[1], signal.SIGUSR1)
                time.sleep(0.2)
                os.kill(pids[1], signal.SIGCONT)
            else:
                os.kill(pids[1], signal.SIGKILL)
        return type(exc).__name__
    return "ok"


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("resume", [False, True], ids=["killed", "resumed"])
def test_analyze_names_the_stopped_rank(tmp_path: Path, transport: str, resume: bool) -> None:
    env = {**TRANSPORTS[transport], "TENSORCOMM_FLIGHT_DIR": str(tmp_path)}
    outcomes = spawn_ranks(body_stop, 2, resume, timeout=90, comm_timeout=3, env=env)
    assert outcomes[0].result == "CommTimeoutError", outcomes[0].output
    records = load(tmp_path)
    findings = find(records)
    assert 1 in findings.behind, findings.paragraph()
    paragraph = findings.paragraph()
    # what rank 0 dumped: its fourth all_reduce timed out, and where in this file it was made
    calls = [c for c in records[0]["calls"] if c["collective"] == "all_reduce"]
    assert [c["state"] for c in calls] == ["completed"] * 3 + ["failed"], calls
    step = calls[-1]["seq"]
    site = calls[-1]["site"].split(" ")[0]
    assert site.endswith(f"test_flight_recorder.py:{_line_of('tc.all_reduce(x)', 2)}"), site
    if resume:
        assert sorted(records) == [0, 1], paragraph
        reasons = [d["reason"] for d in records[1]["dumps"]]
        assert reasons[0] == "signal SIGUSR1", reasons
        assert "Rank 1 " in paragraph and f"step {step} of group 'world'" in paragraph, paragraph
    else:
        assert sorted(records) == [0], paragraph
        assert "Rank 1 left no record" in paragraph, paragraph
    assert f"rank 0's all_reduce(float32[4], op=sum) at step {step}" in paragraph, paragraph


def body_stopped_from_outside() -> str:
    """Rank 0 stops rank 1 (SIGSTOP) from a timer thread while both run large all_reduces, so
    rank 1 stops wherever it is, most likely inside a call; rank 0 times out, then sends SIGUSR1
    and SIGCONT: rank 1 writes its record and goes on into a group that has failed."""
    x = np.ones(1 << 20, np.float32)
    pids = [0] * tc.get_world_size()
    tc.all_gather_object(pids, os.getpid())
    if tc.get_rank() == 0:
        threading.Timer(0.3, os.kill, (pids[1], signal.SIGSTOP)).start()
    try:
        for _ in range(100000):
            tc.all_reduce(x)
    except tc.CommError as exc:
        if tc.get_rank() == 0:
            os.kill(pids[1], signal.SIGUSR1)
            time.sleep(0.2)
            os.kill(pids[1], signal.SIGCONT)
        return type(exc).__name__
    return "ok"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_analyze_names_a_rank_stopped_inside_a_call(tmp_path: Path, transport: str) -> None:
    env = {**TRANSPORTS[transport], "TENSORCOMM_FLIGHT_DIR": str(tmp_path)}
    outcomes = spawn_ranks(body_stopped_from_outside, 2, timeout=90, comm_timeout=3, env=env)
    assert outcomes[0].result == "CommTimeoutError", outcomes[0].output
    findings = find(load(tmp_path))
    assert findings.behind == [1], findings.paragraph()
    assert "Rank 1 " in findings.paragraph(), findings.paragraph()


def _line_of(text: str, nth: int) -> int:
    """The line number of the ``nth`` (1-based) line of this file that ends with ``text``."""
    lines = [i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1) if line.strip() == text]
    return lines[nth - 1]
