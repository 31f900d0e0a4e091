"""``tensorcomm run``: parsing, the environment contract, output relay, fail-fast and signals.

Real launchers run as ``python -m tensorcomm run ...`` on small scripts written to ``tmp_path``
that never import tensorcomm. Tests whose single-node launcher hosts the store skip until
``tensorcomm.rendezvous.tcp_store`` exists; launches as node 1 of 2 host nothing and always run.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tensorcomm import cli
from tensorcomm.launch import env, run, spawner
from tensorcomm.testing import free_port

LAUNCH_TIMEOUT = 20.0  # hard limit of every launcher started here; jobs take well under 2 s
NODE1_OF_2 = ["--nnodes", "2", "--node-rank", "1", "--master", "127.0.0.1:29999"]
LAUNCHER_VARS = (env.ENV_NPROCS, env.ENV_NNODES, env.ENV_NODE_RANK, env.ENV_MASTER,
                 env.ENV_JOB_TIMEOUT, "TENSORCOMM_SECRET", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def store() -> None:
    """Skip until the store server the single-node launcher hosts has landed."""
    pytest.importorskip("tensorcomm.rendezvous.tcp_store")


def _clean_env(**extra: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    environ.update(extra)
    return environ


def _script(tmp_path: Path, body: str, name: str = "rank.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def _launch(*args: str, stdin: str | None = None, **extra_env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tensorcomm", "run", *args],
                          capture_output=True, text=True, timeout=LAUNCH_TIMEOUT,
                          env=_clean_env(**extra_env), input=stdin,
                          stdin=subprocess.DEVNULL if stdin is None else None)


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie nobody reaped yet counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def _wait_for_pids(directory: Path, count: int, launcher: subprocess.Popen[str]) -> list[int]:
    """Pids the sleeping ranks wrote into ``directory`` (``<rank>.pid``), once all are there."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        files = sorted(directory.glob("*.pid"))
        if len(files) == count and all(f.read_text().endswith("\n") for f in files):
            return [int(f.read_text()) for f in files]
        assert launcher.poll() is None, launcher.communicate()
        time.sleep(0.02)
    raise AssertionError(f"ranks did not write {count} pid files in time")


def _assert_gone(pids: list[int], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not [pid for pid in pids if _alive(pid)]


SLEEPER = """\
    import os, sys, time
    from pathlib import Path
    # Written to a temporary name first, so the test never reads half a pid.
    tmp = Path(sys.argv[1]) / (os.environ["RANK"] + ".tmp")
    tmp.write_text(f"{os.getpid()}\\n")
    tmp.rename(tmp.with_suffix(".pid"))
    time.sleep(60)
"""


# --- parsing ---------------------------------------------------------------------------------

def _parse(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["run", *argv])


def test_script_command_uses_launcher_python_and_keeps_its_options() -> None:
    args = _parse("-n", "4", "train.py", "-n", "5", "--lr", "0.1")
    assert args.nprocs == 4
    assert run.rank_command(args) == [sys.executable, "train.py", "-n", "5", "--lr", "0.1"]


def test_module_and_no_python_commands() -> None:
    assert run.rank_command(_parse("-m", "pkg.train", "x")) == [sys.executable, "-m", "pkg.train",
                                                                "x"]
    assert run.rank_command(_parse("--no-python", "sh", "-c", "echo")) == ["sh", "-c", "echo"]


@pytest.mark.spawns
def test_missing_script_is_a_usage_error() -> None:
    result = _launch("-n", "2")
    assert result.returncode == 2
    assert "usage: tensorcomm run" in result.stderr and "TARGET is required" in result.stderr


@pytest.mark.parametrize("argv", [["-n", "2", "-m"], ["-m", "--no-python", "x"],
                                  ["-n", "zero", "x.py"], ["-n", "0", "x.py"]])
def test_usage_errors_return_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", *argv]) == 2
    assert "usage: tensorcomm run" in capsys.readouterr().err


def test_main_returns_codes_instead_of_raising(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert cli.main(["run", "--help"]) == 0
    assert "TARGET" in capsys.readouterr().out


def test_every_subcommand_is_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name, subcommand in cli.SUBCOMMANDS.items():
        assert f"{name}  " in out and subcommand.HELP.split()[0] in out
    assert set(cli.SUBCOMMANDS) == {"run", "demo", "bench", "tune", "trace"}


@pytest.mark.parametrize("command, dest", [("run", "nprocs"), ("demo", "nprocs"), ("bench", "ranks")])
@pytest.mark.parametrize("spelling", [["-n", "3"], ["-n3"], ["-np", "3"], ["--nproc-per-node", "3"],
                                      ["--nproc_per_node=3"], ["--nproc_per_node", "3"]])
def test_every_spelling_of_ranks_per_node(command: str, dest: str, spelling: list[str]) -> None:
    args = cli.build_parser().parse_args([command, *spelling, *(["x.py"] if command == "run" else [])])
    assert getattr(args, dest) == 3


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import tensorcomm

    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"tensorcomm {tensorcomm.__version__}"


@pytest.mark.parametrize("argv", [["--local-ranks-filter", "0,x", "x.py"],
                                  ["--local-ranks-filter", "-1", "x.py"],
                                  ["-n", "2", "--local-ranks-filter", "2", "x.py"],
                                  ["--master", "h:1", "--master-port", "2", "x.py"],
                                  ["--master-port", "70000", "x.py"]])
def test_output_and_master_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", *argv]) == 2
    assert "usage: tensorcomm run" in capsys.readouterr().err


@pytest.mark.parametrize("flags, environ, master", [
    ({}, {}, None),
    ({"master_addr": "h"}, {}, ("h", 0)),
    ({"master_port": 29500}, {}, ("127.0.0.1", 29500)),
    ({}, {"MASTER_ADDR": "h", "MASTER_PORT": "29500"}, ("h", 29500)),
    ({}, {"MASTER_ADDR": "h"}, ("h", 0)),
    ({}, {"MASTER_ADDR": "h", "MASTER_PORT": "1", env.ENV_MASTER: "t:2"}, ("t", 2)),
    ({"master_addr": "f"}, {"MASTER_ADDR": "h", "MASTER_PORT": "1"}, ("f", 0)),
    ({"master": "m:3"}, {"MASTER_ADDR": "h", "MASTER_PORT": "1"}, ("m", 3)),
])
def test_master_from_flags_then_tensorcomm_master_then_master_addr(
        flags: dict[str, object], environ: dict[str, str], master: tuple[str, int] | None) -> None:
    assert env.resolve_settings(environ, **flags).master == master  # type: ignore[arg-type]


def test_exported_master_addr_and_port_serve_two_nodes() -> None:
    environ = {"MASTER_ADDR": "head", "MASTER_PORT": "29500", "TENSORCOMM_SECRET": "a-secret-for-tests"}
    assert env.resolve_settings(environ, nnodes=2, node_rank=1).master == ("head", 29500)
    with pytest.raises(env.LaunchConfigError, match="MASTER_PORT='p'"):
        env.resolve_settings({"MASTER_ADDR": "head", "MASTER_PORT": "p"})


# --- the environment contract ------------------------------------------------------------------

def test_rank_env_for_second_node() -> None:
    base = {"PATH": "/bin", "RANK": "stale"}
    settings = env.resolve_settings({"TENSORCOMM_SECRET": "secret-of-node-s3"}, nprocs=3, nnodes=2,
                                    node_rank=1, master="node0:29500")
    store = env.StoreAddress("node0", 29500)
    envs = [env.rank_env(base, settings, store, local) for local in range(3)]
    assert [e["RANK"] for e in envs] == ["3", "4", "5"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2"]
    assert {(e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"],
             e["TENSORCOMM_SECRET"], e["TENSORCOMM_STORE_HOSTED"], e["PYTHONUNBUFFERED"],
             e["PATH"]) for e in envs} == {("6", "3", "node0", "29500", "secret-of-node-s3", "1", "1",
                                            "/bin")}
    # msrun's names, which MindSpore programs read
    assert [(e["RANK_ID"], e["RANK_SIZE"], e["DEVICE_ID"]) for e in envs] == \
        [("3", "6", "0"), ("4", "6", "1"), ("5", "6", "2")]
    assert base == {"PATH": "/bin", "RANK": "stale"}
    with pytest.raises(ValueError, match="local_rank"):
        env.rank_env(base, settings, store, 3)
    assert "TENSORCOMM_KEEP_GOING" not in envs[0]
    assert env.rank_env(base, settings, store, 0, keep_going=True)["TENSORCOMM_KEEP_GOING"] == "1"


def test_store_address_is_the_bound_port() -> None:
    one_node = env.resolve_settings({}, master="10.0.0.5:0")
    assert env.store_bind_address(one_node) == ("10.0.0.5", 0)
    assert env.store_address(one_node, 4321) == env.StoreAddress("10.0.0.5", 4321)
    assert env.store_address(env.resolve_settings({}), 99) == env.StoreAddress("127.0.0.1", 99)
    node0 = env.resolve_settings({"TENSORCOMM_SECRET": "a-secret-for-tests"}, nnodes=2, master="head:29500")
    assert env.store_bind_address(node0) == ("0.0.0.0", 29500)  # reachable from other nodes
    node1 = env.resolve_settings({"TENSORCOMM_SECRET": "a-secret-for-tests"}, nnodes=2, node_rank=1,
                                 master="head:29500")
    assert env.store_address(node1, None) == env.StoreAddress("head", 29500)


def test_flags_fall_back_to_env_and_win_over_it() -> None:
    environ = {"TENSORCOMM_NPROCS": "4", "TENSORCOMM_NNODES": "2", "TENSORCOMM_NODE_RANK": "1",
               "TENSORCOMM_MASTER": "[::1]:1234", "TENSORCOMM_JOB_TIMEOUT": "9",
               "TENSORCOMM_SECRET": "secret-abc-of-the-job"}
    settings = env.resolve_settings(environ)
    assert (settings.nprocs, settings.nnodes, settings.node_rank, settings.master,
            settings.timeout, settings.secret) == (4, 2, 1, ("::1", 1234), 9.0, "secret-abc-of-the-job")
    assert not settings.hosts_store
    assert env.resolve_settings(environ, nprocs=2, node_rank=0).nprocs == 2


def test_single_node_defaults_and_fresh_secret() -> None:
    settings = env.resolve_settings({})
    assert (settings.nprocs, settings.nnodes, settings.node_rank, settings.master) == (1, 1, 0,
                                                                                       None)
    assert settings.secret.startswith("generated:") and len(bytes.fromhex(settings.secret[10:])) == 32
    assert env.store_bind_address(settings) == ("127.0.0.1", 0)
    assert env.resolve_settings({}).secret != settings.secret


@pytest.mark.parametrize("kwargs, environ, message", [
    ({"nnodes": 2, "master": "h:1"}, {}, "TENSORCOMM_SECRET"),
    ({"nnodes": 2}, {"TENSORCOMM_SECRET": "a-secret-for-tests"}, "--master"),
    ({"nnodes": 2, "master": "h:0"}, {"TENSORCOMM_SECRET": "a-secret-for-tests"}, "non-zero port"),
    ({"nnodes": 2, "master": "h:1"}, {"TENSORCOMM_SECRET": "Summer2024!"},
     r"TENSORCOMM_SECRET: the job secret is 11 bytes long.*token_hex\(32\)"),
    ({"node_rank": 1}, {}, "--node-rank"),
    ({"master": "nohost"}, {}, "host:port"),
    ({"timeout": 0.0}, {}, "--timeout"),
    ({}, {"TENSORCOMM_NPROCS": "four"}, "TENSORCOMM_NPROCS"),
])
def test_bad_settings_name_the_flag(kwargs: dict[str, object], environ: dict[str, str],
                                    message: str) -> None:
    with pytest.raises(env.LaunchConfigError, match=message):
        env.resolve_settings(environ, **kwargs)  # type: ignore[arg-type]


@pytest.mark.spawns
def test_second_node_runs_ranks_with_global_numbers(tmp_path: Path) -> None:
    script = _script(tmp_path, """\
        import os
        print(*(os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                          "MASTER_PORT", "TENSORCOMM_SECRET")))
    """)
    result = _launch("-n", "2", *NODE1_OF_2, script, TENSORCOMM_SECRET="feed-feed-feed-feed")
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [
        "[rank 2] 2 4 0 127.0.0.1 29999 feed-feed-feed-feed",
        "[rank 3] 3 4 1 127.0.0.1 29999 feed-feed-feed-feed"]
    assert "store at" not in result.stderr  # only node 0 hosts the store


@pytest.mark.spawns
def test_multi_node_without_secret_is_a_usage_error(tmp_path: Path) -> None:
    result = _launch("-n", "1", *NODE1_OF_2, _script(tmp_path, "pass\n"))
    assert result.returncode == 2 and "TENSORCOMM_SECRET" in result.stderr


# --- store hosting and the secret --------------------------------------------------------------

@pytest.mark.spawns
def test_single_node_hosts_store_and_shares_one_secret(tmp_path: Path, store: None) -> None:
    script = _script(tmp_path, """\
        import os, socket
        socket.create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])),
                                 timeout=5).close()
        print(os.environ["MASTER_PORT"], os.environ["TENSORCOMM_SECRET"],
              os.environ["TENSORCOMM_STORE_HOSTED"])
    """)
    result = _launch("-n", "3", script)
    assert result.returncode == 0, result.stderr
    lines = {line.split("] ", 1)[1] for line in result.stdout.splitlines()}
    assert len(lines) == 1, lines  # same port, same secret on every rank
    port, secret, hosted = lines.pop().split()
    assert f"tensorcomm: store at 127.0.0.1:{port}" in result.stderr
    assert secret.startswith("generated:") and hosted == "1"
    assert _launch("-n", "1", script).stdout.split()[3] != secret  # fresh per job


@pytest.mark.spawns
def test_store_that_cannot_bind_fails_the_launch(tmp_path: Path, store: None) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = _launch("--master", f"127.0.0.1:{port}", _script(tmp_path, "print('ran')\n"))
    assert result.returncode == 1 and f"127.0.0.1:{port}" in result.stderr
    assert "ran" not in result.stdout


@pytest.mark.spawns
def test_secret_from_env_is_passed_and_launcher_environ_untouched(
        tmp_path: Path, store: None, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    script = _script(tmp_path, "import os; print(os.environ['TENSORCOMM_SECRET'])\n")
    for name in (*LAUNCHER_VARS, "RANK", "WORLD_SIZE", "MASTER_PORT", "TENSORCOMM_STORE_HOSTED"):
        monkeypatch.delenv(name, raising=False)
    before = dict(os.environ)
    assert cli.main(["run", "-n", "2", script]) == 0
    assert dict(os.environ) == before
    monkeypatch.setenv("TENSORCOMM_SECRET", "given-secret-16+")
    assert cli.main(["run", "-n", "2", script]) == 0
    assert capfd.readouterr().out.count("] given-secret-16+\n") == 2


# --- output ----------------------------------------------------------------------------------

@pytest.mark.spawns
def test_output_is_prefixed_per_stream_and_line(tmp_path: Path) -> None:
    script = _script(tmp_path, """\
        import os, sys
        rank = os.environ["RANK"]
        print(f"out {rank}\\nsecond {rank}")
        print(f"err {rank}", file=sys.stderr)
        sys.stdout.buffer.write(b"bad \\xff\\xfe bytes")  # no newline at the end
    """)
    result = _launch("-n", "2", *NODE1_OF_2, script, TENSORCOMM_SECRET="a-secret-for-tests")
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    for rank in (2, 3):
        assert f"[rank {rank}] out {rank}" in out and f"[rank {rank}] second {rank}" in out
        assert f"[rank {rank}] bad \ufffd\ufffd bytes" in out
        assert f"[rank {rank}] err {rank}" in result.stderr.splitlines()
    assert "err" not in result.stdout


@pytest.mark.spawns
def test_rank_0_reads_the_launchers_stdin_and_the_others_dev_null(tmp_path: Path) -> None:
    script = _script(tmp_path, """\
        import os, sys
        print(f"read {sys.stdin.read()!r}")
    """)
    result = _launch("-n", "2", *NODE1_OF_2, script, stdin="10\n0\n", TENSORCOMM_SECRET="a-secret-for-tests")
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["[rank 2] read ''", "[rank 3] read ''"]  # node 1
    result = _launch("-n", "3", "--nnodes", "2", "--node-rank", "0", "--master", f"127.0.0.1:{free_port()}",
                     "--timeout", "5", script, stdin="10\n0\n", TENSORCOMM_SECRET="a-secret-for-tests")
    assert sorted(result.stdout.splitlines()) == ["[rank 0] read '10\\n0\\n'", "[rank 1] read ''",
                                                  "[rank 2] read ''"], result.stderr


@pytest.mark.spawns
def test_run_ranks_calls_cleanup_once_and_relays_to_given_streams(
        capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[int] = []
    codes = ["import time; time.sleep(60)", "print('hi'); raise SystemExit(4)"]
    specs = [spawner.RankSpec(r, [sys.executable, "-c", code], dict(os.environ))
             for r, code in enumerate(codes)]
    assert spawner.run_ranks(specs, cleanup=lambda: calls.append(1)) == 4
    assert calls == [1]
    captured = capsys.readouterr()
    assert captured.out == "[rank 1] hi\n"
    assert "rank 1 exited with code 4" in captured.err


@pytest.mark.spawns
def test_output_without_prefix_filtered_and_in_log_files(tmp_path: Path) -> None:
    script = _script(tmp_path, """\
        import os, sys
        print("out", os.environ["LOCAL_RANK"])
        print("err", os.environ["LOCAL_RANK"], file=sys.stderr)
    """)
    logs = tmp_path / "logs" / "job"
    result = _launch("-np", "3", "--no-prefix", "--local_ranks_filter", "0,2", "--log-dir", str(logs),
                     script)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["out 0", "out 2"]
    assert "err 0" in result.stderr.splitlines() and "err 1" not in result.stderr
    for rank in range(3):
        assert (logs / f"rank{rank}.stdout").read_text() == f"out {rank}\n"
        assert (logs / f"rank{rank}.stderr").read_text() == f"err {rank}\n"


@pytest.mark.spawns
def test_exported_master_port_is_where_the_store_listens(tmp_path: Path) -> None:
    port = str(free_port())
    script = _script(tmp_path, "import os; print(os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'])")
    result = _launch("-n", "1", script, MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"[rank 0] 127.0.0.1 {port}"]


# --- failures and signals ----------------------------------------------------------------------

@pytest.mark.spawns
def test_exit_code_of_the_failing_rank(tmp_path: Path) -> None:
    script = _script(tmp_path, "import os, sys; sys.exit(5 if os.environ['RANK'] == '3' else 0)\n")
    result = _launch("-n", "2", *NODE1_OF_2, script, TENSORCOMM_SECRET="a-secret-for-tests")
    assert result.returncode == 5
    assert "tensorcomm: rank 3 exited with code 5" in result.stderr


@pytest.mark.spawns
def test_failing_rank_stops_the_others_at_once(tmp_path: Path, store: None) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    script = _script(tmp_path, SLEEPER.replace(
        "    time.sleep(60)",
        "    if os.environ['RANK'] == '0':\n"
        "        while len(list(Path(sys.argv[1]).glob('*.pid'))) < 3: time.sleep(0.01)\n"
        "        sys.exit(3)\n"
        "    time.sleep(60)"))
    started = time.monotonic()
    result = _launch("-n", "3", script, str(pids))
    assert result.returncode == 3, result.stderr
    assert time.monotonic() - started < 8
    assert "rank 0 exited with code 3; stopping the other ranks" in result.stderr
    _assert_gone([int(p.read_text()) for p in pids.glob("*.pid")], within=0.5)


@pytest.mark.spawns
def test_failure_also_stops_what_an_exited_rank_left_running(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    script = _script(tmp_path, f"""\
        import os, subprocess, sys, time
        from pathlib import Path
        pid_file = Path({str(pid_file)!r})
        if os.environ["RANK"] == "2":  # leaves a process behind in its group and succeeds
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            pid_file.with_suffix(".tmp").write_text(str(child.pid))
            pid_file.with_suffix(".tmp").rename(pid_file)
        else:
            while not pid_file.exists(): time.sleep(0.01)
            time.sleep(0.2)  # rank 2 has exited by now
            sys.exit(1)
    """)
    result = _launch("-n", "2", *NODE1_OF_2, script, TENSORCOMM_SECRET="a-secret-for-tests")
    assert result.returncode == 1, result.stderr
    _assert_gone([int(pid_file.read_text())])


@pytest.mark.spawns
def test_rank_killed_by_signal(tmp_path: Path) -> None:
    script = _script(tmp_path, """\
        import os, signal, time
        if os.environ["RANK"] == "2":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
    """)
    result = _launch("-n", "2", *NODE1_OF_2, script, TENSORCOMM_SECRET="a-secret-for-tests")
    assert result.returncode == 128 + signal.SIGKILL
    assert "rank 2 was killed by SIGKILL (exit code 137)" in result.stderr


@pytest.mark.spawns
def test_program_that_cannot_start_exits_127(tmp_path: Path) -> None:
    result = _launch("-n", "2", *NODE1_OF_2, "--no-python", str(tmp_path / "missing"),
                     TENSORCOMM_SECRET="a-secret-for-tests")
    assert result.returncode == 127 and "cannot start rank 2" in result.stderr


@pytest.mark.spawns
def test_job_timeout_stops_everything_with_124(tmp_path: Path) -> None:
    script = _script(tmp_path, "import time; time.sleep(60)\n")
    result = _launch("-n", "2", *NODE1_OF_2, "--timeout", "0.5", script,
                     TENSORCOMM_SECRET="a-secret-for-tests")
    assert result.returncode == 124 and "timed out after 0.5 s" in result.stderr


@pytest.mark.spawns
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_launcher_stops_all_ranks(tmp_path: Path, signum: signal.Signals) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tensorcomm", "run", "-n", "3", *NODE1_OF_2,
         _script(tmp_path, SLEEPER), str(pids)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=_clean_env(TENSORCOMM_SECRET="a-secret-for-tests"))
    try:
        ranks = _wait_for_pids(pids, 3, launcher)
        launcher.send_signal(signum)
        _, err = launcher.communicate(timeout=LAUNCH_TIMEOUT)
    finally:
        launcher.kill()
        launcher.wait()
    assert launcher.returncode == 128 + signum, err
    assert f"received {signum.name}" in err
    _assert_gone(ranks, within=0.5)


@pytest.mark.spawns
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_ranks_die_with_a_killed_launcher(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tensorcomm", "run", "-n", "2", *NODE1_OF_2,
         _script(tmp_path, SLEEPER), str(pids)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=_clean_env(TENSORCOMM_SECRET="a-secret-for-tests"))
    try:
        ranks = _wait_for_pids(pids, 2, launcher)  # type: ignore[arg-type]
    finally:
        launcher.kill()
        launcher.wait()
    _assert_gone(ranks)
