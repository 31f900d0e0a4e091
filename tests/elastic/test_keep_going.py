"""``tensorcomm run --keep-going``: a failing rank does not stop the others; the job succeeds if
any rank does; node 0's launcher serves the store while ranks of other nodes still use it."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tensorcomm.launch import spawner

pytestmark = pytest.mark.timeout(60)


def _specs(*codes: str) -> list[spawner.RankSpec]:
    return [spawner.RankSpec(rank, [sys.executable, "-c", code], dict(os.environ))
            for rank, code in enumerate(codes)]


def test_the_others_run_on_after_a_failure_and_the_job_succeeds() -> None:
    err = io.StringIO()
    survivor = "import time; time.sleep(1.5); print('finished')"
    code = spawner.run_ranks(_specs("raise SystemExit(3)", survivor, survivor), keep_going=True,
                             timeout=30, stdout=(out := io.StringIO()), stderr=err)
    assert code == 0, err.getvalue()
    assert out.getvalue().count("finished") == 2, out.getvalue()
    assert "rank 0 exited with code 3; the other ranks go on (--keep-going)" in err.getvalue()
    assert "1 of 3 ranks failed (rank 0); the others succeeded" in err.getvalue()


def test_without_keep_going_the_first_failure_still_stops_everyone() -> None:
    err = io.StringIO()
    code = spawner.run_ranks(_specs("raise SystemExit(3)", "import time; time.sleep(30)"),
                             timeout=30, stdout=io.StringIO(), stderr=err)
    assert code == 3 and "stopping the other ranks" in err.getvalue()


def test_when_every_rank_fails_the_first_failure_is_the_exit_code() -> None:
    specs = _specs("raise SystemExit(5)", "import time; time.sleep(0.5); raise SystemExit(6)")
    code = spawner.run_ranks(specs, keep_going=True, timeout=30, stdout=io.StringIO(), stderr=io.StringIO())
    assert code == 5


def test_the_store_is_served_until_its_last_user_leaves() -> None:
    leaves = time.monotonic() + 1.5
    err = io.StringIO()
    started = time.monotonic()
    code = spawner.run_ranks(_specs("pass"), keep_going=True, timeout=30, stdout=io.StringIO(),
                             stderr=err, store_users=lambda: int(time.monotonic() < leaves))
    assert code == 0 and time.monotonic() - started >= 1.5
    assert "serving the store while ranks of other nodes use it" in err.getvalue()


def test_the_command_line_flag(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time
        if os.environ["RANK"] == "1":
            os.kill(os.getpid(), 9)
        time.sleep(1.0)
        print("survived, keep-going", os.environ.get("TENSORCOMM_KEEP_GOING"))
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORCOMM_")}
    done = subprocess.run([sys.executable, "-m", "tensorcomm", "run", "-n", "3", "--keep-going",
                           str(script)], capture_output=True, text=True, timeout=50, env=env)
    assert done.returncode == 0, done.stderr
    # the ranks are told that failed calls must leave their arrays untouched or complete
    for rank in (0, 2):
        assert f"[rank {rank}] survived, keep-going 1" in done.stdout, done.stdout
    assert "rank 1 was killed by SIGKILL (exit code 137); the other ranks go on" in done.stderr
