"""The Ray examples run as shipped and print what they promise (each starts its own Ray)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install 'tensorcomm[ray]')")

pytestmark = pytest.mark.multiprocess

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(script: str, timeout: float) -> str:
    done = subprocess.run([sys.executable, str(EXAMPLES / script)], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stdout}\n{done.stderr[-4000:]}"
    return done.stdout + done.stderr


@pytest.mark.timeout(200)
def test_ray_sgd():
    out = _run("ray_sgd.py", 180)
    distance = re.search(r"identical weights on 4 actors; distance to the true weights: ([\d.]+)", out)
    assert distance and float(distance.group(1)) < 0.05, out


@pytest.mark.timeout(400)
@pytest.mark.skipif(importlib.util.find_spec("pandas") is None or importlib.util.find_spec("torch") is None,
                    reason="Ray Train needs pip install 'ray[train]' and torch")
def test_ray_train_torch_trainer_on_tensorcomm():
    out = _run("ray_train_torch.py", 380)
    lines = re.findall(r"rank (\d): backend tensorcomm, loss [\d.]+, weights (\[.*?\])", out)
    assert {rank for rank, _ in lines} == {"0", "1"}, out[-4000:]
    assert len({weights for _, weights in lines}) == 1, lines
    assert "error: None" not in out  # fit() raises on failure; success prints nothing more
