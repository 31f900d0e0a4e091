"""Another local user against the files the launcher, the benchmark and the flight recorder's
default directory write (docs/security.md); the companion of test_stranger_files.py.

The stranger is ``nobody`` (uid 65534, no groups), running plain shell commands: it makes
directories and links first at predictable paths in a world-writable sticky directory like /tmp.
Those tests need root to act as ``nobody``; they skip otherwise. The tests that plant a link in
this user's own directory run as anyone.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from tensorcomm import cli
from tensorcomm.bench import cli as bench_cli
from tensorcomm.bench import options, report
from tensorcomm.launch import spawner
from tensorcomm.rendezvous import private
from tensorcomm.trace import recorder

from helpers import NOBODY, PRECIOUS, stranger, victim

pytestmark = [pytest.mark.fault, pytest.mark.timeout(120)]


# --- tensorcomm run --log-dir ---

def _run_logged(log_dir: Path, ran: Path) -> tuple[int, str]:
    """One rank that prints a line and touches ``ran``, logged to ``log_dir``: (code, stderr)."""
    code = f"open({str(ran)!r}, 'w').close(); print('rank output')"
    specs = [spawner.RankSpec(0, [sys.executable, "-c", code], dict(os.environ))]
    out, err = io.StringIO(), io.StringIO()
    result = spawner.run_ranks(specs, timeout=20, stdout=out, stderr=err,
                               output=spawner.Output(log_dir=str(log_dir)))
    return result, err.getvalue()


@pytest.mark.spawns
@pytest.mark.parametrize("mode", ["0777", "0755"])
def test_a_log_directory_another_user_owns_is_refused_before_any_rank_starts(
        sticky: Path, tmp_path: Path, mode: str) -> None:
    target = victim(sticky)
    logs = sticky / "logs"
    stranger("mkdir", "-m", mode, str(logs))  # 0755: the stranger reads every rank's output
    stranger("ln", "-s", str(target), str(logs / "rank0.stdout"))
    code, err = _run_logged(logs, tmp_path / "ran")
    assert code == 1 and not (tmp_path / "ran").exists()
    assert re.search(f"log directory {re.escape(str(logs))}: is owned by uid {NOBODY}", err), err
    assert target.read_text() == PRECIOUS


@pytest.mark.spawns
def test_a_shared_log_directory_is_refused(sticky: Path, tmp_path: Path) -> None:
    code, err = _run_logged(sticky, tmp_path / "ran")
    assert code == 1 and not (tmp_path / "ran").exists()
    assert f"log directory {sticky}: has mode 1777" in err
    assert not any(name.startswith("rank") for name in os.listdir(sticky))


@pytest.mark.spawns
def test_tensorcomm_run_refuses_a_shared_log_directory(sticky: Path, tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    script = tmp_path / "rank.py"
    script.write_text(f"open({str(ran)!r}, 'w').close()\n")
    result = subprocess.run([sys.executable, "-m", "tensorcomm", "run", "-n", "2", "--log-dir",
                             str(sticky), str(script)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and not ran.exists()
    assert f"tensorcomm: log directory {sticky}: has mode 1777" in result.stderr


@pytest.mark.spawns
def test_a_log_file_replaces_a_link_at_its_name(tmp_path: Path) -> None:
    target = victim(tmp_path)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank0.stdout").symlink_to(target)
    code, err = _run_logged(logs, tmp_path / "ran")
    assert code == 0, err
    assert target.read_text() == PRECIOUS
    assert not (logs / "rank0.stdout").is_symlink()
    assert (logs / "rank0.stdout").read_text() == "rank output\n"
    assert (logs / "rank0.stdout").stat().st_mode & 0o777 == 0o600


@pytest.mark.spawns
def test_a_missing_log_directory_is_made_private(tmp_path: Path) -> None:
    logs = tmp_path / "a" / "logs"
    code, err = _run_logged(logs, tmp_path / "ran")
    assert code == 0, err
    assert logs.stat().st_mode & 0o777 == 0o700
    assert (logs / "rank0.stdout").read_text() == "rank output\n"
    assert (logs / "rank0.stderr").read_text() == ""


# --- tensorcomm bench --csv / --json ---

def _options(*argv: str) -> options.BenchOptions:
    return options.from_args(cli.build_parser().parse_args(["bench", *argv]))


def _write_both(directory: Path) -> None:
    report.write_csv(str(directory / "results.csv"), [])
    report.write_json(str(directory / "results.json"), {}, _options(), [])


def _written(directory: Path) -> None:
    for name in ("results.csv", "results.json"):
        assert not (directory / name).is_symlink()
    assert (directory / "results.csv").read_text().startswith("collective,")
    assert json.loads((directory / "results.json").read_text())["rows"] == []


def test_bench_output_replaces_a_link_planted_in_a_shared_directory(sticky: Path) -> None:
    target = victim(sticky)
    for name in ("results.csv", "results.json"):
        stranger("ln", "-s", str(target), str(sticky / name))
    _write_both(sticky)  # /tmp is fine for results: the link is replaced, not followed
    assert target.read_text() == PRECIOUS
    _written(sticky)


def test_bench_output_replaces_a_link_at_its_name(tmp_path: Path) -> None:
    target = victim(tmp_path)
    for name in ("results.csv", "results.json"):
        (tmp_path / name).symlink_to(target)
    _write_both(tmp_path)
    assert target.read_text() == PRECIOUS
    _written(tmp_path)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no leftovers


def test_bench_says_which_output_it_cannot_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no" / "results.json"
    assert bench_cli._finish(_options("--json", str(missing)), [], {}, 2) == 1
    assert f"cannot write {missing}: No such file or directory" in capsys.readouterr().err


# --- the flight recorder's default directory ---

def test_the_old_default_flight_directory_squatted_stops_no_record(
        sticky: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(sticky))
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    squatted = sticky / f"tensorcomm-flight-{os.getuid()}"  # the default before: <tempdir>/...
    stranger("mkdir", "-m", "0777", str(squatted))
    recorder.configure(8)
    try:
        path = recorder.dump("test")
    finally:
        recorder.configure(0)
    assert path == str(runtime / "tensorcomm" / "flight" / f"pid{os.getpid()}.json")
    assert json.loads(Path(path).read_text())["format"] == "tensorcomm-flight-1"
    assert os.listdir(squatted) == []


def test_without_xdg_runtime_dir_flight_records_go_under_the_home(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(private.pwd, "getpwuid", lambda uid: SimpleNamespace(pw_dir=str(home)))
    recorder.configure(8)
    try:
        path = recorder.dump("test")
    finally:
        recorder.configure(0)
    base = home / ".cache" / "tensorcomm"
    assert path == str(base / "flight" / f"pid{os.getpid()}.json")
    assert base.stat().st_mode & 0o777 == 0o700 and (base / "flight").stat().st_mode & 0o777 == 0o700
    private.SecretDir(str(base))  # the secrets' default directory is still private enough for them
