"""Scripts started by MindSpore's msrun: the scheduler process is no rank and the job exits 0.

msrun runs the script in a scheduler process (``MS_ROLE=MS_SCHED``) beside the workers; there
``tensorcomm.init()`` ends the process with status 0. The real-msrun tests run where MindSpore
(which installs msrun) is installed, e.g. ``PYTHONPATH=src /work/venvs/ms/bin/python -m pytest -m ""
tests/frameworks/test_msrun.py`` (docs/frameworks.md says how to install the tested MindSpore), and
skip elsewhere; the scheduler's exit is also checked without MindSpore.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tensorcomm.testing import free_port

pytestmark = pytest.mark.multiprocess

PLAIN = textwrap.dedent("""\
    import numpy as np, tensorcomm as tc
    tc.init()
    x = np.ones(4) * (tc.get_rank() + 1)
    tc.all_reduce(x)
    print(f"rank {tc.get_rank()} of {tc.get_world_size()}: {x.tolist()}", flush=True)
    tc.destroy()
""")
# MindSpore's own init() first: in the scheduler process it serves MindSpore's cluster and never
# returns; in the workers it holds MS_SCHED_PORT, so tensorcomm's store takes the next port.
MINDSPORE_INIT = textwrap.dedent("""\
    import mindspore as ms
    from mindspore.communication import init
    ms.set_context(device_target="CPU")
    init()
""") + PLAIN


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "job.py"
    path.write_text(body)
    return str(path)


def _env(**extra: str) -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[2] / "src")
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("MASTER_", "TENSORCOMM_", "MS_")) and k not in ("RANK", "WORLD_SIZE")}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [src, environ.get("PYTHONPATH")]))
    environ.update(extra)
    return environ


def test_init_ends_msruns_scheduler_process(tmp_path: Path) -> None:
    script = _script(tmp_path, PLAIN + "raise SystemExit('the scheduler ran on past init()')\n")
    result = subprocess.run(
        [sys.executable, script], capture_output=True, text=True, timeout=60,
        env=_env(MS_ROLE="MS_SCHED", RANK_ID="0", RANK_SIZE="2", MS_WORKER_NUM="2",
                 MS_SCHED_HOST="127.0.0.1", MS_SCHED_PORT=str(free_port())))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and "scheduler process (MS_ROLE=MS_SCHED) is not a rank" in result.stderr


@pytest.mark.timeout(300)
@pytest.mark.parametrize("script", ["tensorcomm only", "MindSpore's init first"])
def test_msrun_job_exits_0(script: str, tmp_path: Path) -> None:
    pytest.importorskip("mindspore", reason="MindSpore is not installed (docs/frameworks.md)")
    msrun = Path(sys.executable).parent / "msrun"
    if not msrun.exists():
        pytest.skip(f"no msrun beside {sys.executable}")
    path = _script(tmp_path, PLAIN if script == "tensorcomm only" else MINDSPORE_INIT)
    logs = tmp_path / "logs"
    # msrun starts "python" from PATH: this interpreter's
    env = _env(PATH=os.pathsep.join([str(msrun.parent), os.environ.get("PATH", "")]), GLOG_v="3")
    result = subprocess.run(
        [sys.executable, str(msrun), "--worker_num=3", "--local_worker_num=3",
         f"--master_port={free_port()}", f"--log_dir={logs}", "--join=True", path],
        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    workers = "".join((logs / f"worker_{i}.log").read_text() for i in range(3))
    scheduler = (logs / "scheduler.log").read_text()
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}\n{workers}\n{scheduler}"
    for rank in range(3):
        assert f"rank {rank} of 3: [6.0, 6.0, 6.0, 6.0]" in workers, workers
    assert "rank " not in scheduler


@pytest.mark.timeout(120)
def test_mindspore_program_reads_msruns_variables_under_tensorcomm_run(tmp_path: Path) -> None:
    pytest.importorskip("mindspore", reason="MindSpore is not installed (docs/frameworks.md)")
    path = _script(tmp_path, textwrap.dedent("""\
        import os
        import numpy as np
        import mindspore as ms
        import tensorcomm as tc
        from tensorcomm.ops import AllReduce
        rank_id, rank_size = int(os.environ["RANK_ID"]), int(os.environ["RANK_SIZE"])
        ms.set_context(device_target="CPU", device_id=int(os.environ["DEVICE_ID"]))
        tc.init()
        assert (rank_id, rank_size) == (tc.get_rank(), tc.get_world_size())
        out = AllReduce()(ms.Tensor(np.full(3, rank_id + 1.0, np.float32)))
        print(f"rank_id {rank_id} of {rank_size}: {type(out).__name__} {out.asnumpy().tolist()}")
        tc.destroy()
    """))
    result = subprocess.run([sys.executable, "-m", "tensorcomm", "run", "-n", "2", "--no-prefix", path],
                            capture_output=True, text=True, timeout=100, env=_env(GLOG_v="3"))
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [f"rank_id {r} of 2: Tensor [3.0, 3.0, 3.0]"
                                                  for r in range(2)]
