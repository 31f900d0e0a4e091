"""The examples run as shipped, through ``python -m tensorcomm run -n N``, and print what they promise."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.spawns  # every example runs under `tensorcomm run`

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TIMEOUT = 60  # seconds per example; the launcher's own --timeout stops a hung job first


def _run(script: str, ranks: int) -> dict[int, str]:
    """Run an example; return each rank's output (launcher prefixes stripped), in print order."""
    done = subprocess.run([sys.executable, "-m", "tensorcomm", "run", "-n", str(ranks), "--timeout",
                           str(TIMEOUT - 10), str(EXAMPLES / script)],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    lines: dict[int, list[str]] = defaultdict(list)
    for line in done.stdout.splitlines():
        match = re.match(r"\[rank (\d+)\] (.*)", line)
        if match:
            lines[int(match.group(1))].append(match.group(2))
    assert sorted(lines) == list(range(ranks)), done.stdout
    return {rank: "\n".join(text) for rank, text in lines.items()}


def test_seed_allreduce():
    expected = str(np.full([2, 8], 2.0, np.float32))
    assert _run("seed_allreduce.py", 2) == {0: expected, 1: expected}


def test_seed_alltoall_8_ranks():
    assert set(_run("seed_alltoall.py", 8).values()) == {"[[[[0. 1. 2. 3. 4. 5. 6. 7.]]]]"}


def test_seed_gather():
    out = _run("seed_gather.py", 2)
    gathered = np.arange(4).reshape([2, 2]).astype(np.float32)
    assert out[0] == repr([gathered, gathered])
    assert out[1] == repr([np.zeros([2, 2], np.float32)] * 2)  # left untouched off the root


def test_cross_device_batch_reduce():
    out = _run("cross_device_batch_reduce.py", 3)
    means = "means: [1.5, 1.5, 1.5] shapes: [(3, 3), (4,), (2, 2, 2)]"
    assert out == {0: f"{means}\nsum on rank 0: {[9.0] * 4}", 1: means, 2: means}


def test_uneven_all_to_all():
    out = _run("uneven_all_to_all.py", 3)
    gathered = "all_gather_v sizes: [1, 2, 3] values: [0, 0, 1, 0, 1, 2]"
    assert out[0] == f"received splits: [1, 1, 1] first column: [0, 10, 20]\n{gathered}"
    assert out[2] == f"received splits: [3, 3, 3] first column: {[2] * 3 + [12] * 3 + [22] * 3}\n{gathered}"


@pytest.mark.parametrize("ranks", [1, 3])
def test_object_collectives(ranks):
    out = _run("object_collectives.py", ranks)
    names = [f"worker-{r}" for r in range(ranks)]
    for text in out.values():
        assert text == f"gathered: {names}\nconfig: {{'lr': 0.1, 'layers': [64, 64]}}"
