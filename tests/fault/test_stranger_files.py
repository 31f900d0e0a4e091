"""Another local user against the files tracing and tuning read and write (docs/security.md).

The stranger is ``nobody`` (uid 65534, no groups), running plain shell commands: it makes
directories and links first at predictable paths in a world-writable sticky directory like
/tmp, and plants files. Those tests need root to act as ``nobody`` (the CI runs as root); they
skip otherwise. The tests that plant a link in this user's own directory run as anyone.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tensorcomm import config
from tensorcomm.algorithms import select, tuning
from tensorcomm.bench import tune
from tensorcomm.rendezvous import private
from tensorcomm.trace import chrome, cli, recorder
from tensorcomm.trace.analyze import analyze
from tensorcomm.trace.merge import merge

from helpers import NOBODY, PRECIOUS, stranger, victim

pytestmark = [pytest.mark.fault, pytest.mark.timeout(120)]

KNOWN = {c: select.names(c) for c in select.collectives()}


def _call(seq: int, call: str) -> dict[str, Any]:
    return {"seq": seq, "group": "world", "ranks": [0, 1], "call": call, "collective": call[:-2],
            "site": f"/job/train.py:{10 + seq} (step)", "state": "completed", "started_ns": seq,
            "ended_ns": seq + 1, "error": None}


def _record(rank: int, calls: list[dict[str, Any]]) -> str:
    return json.dumps({"format": "tensorcomm-flight-1", "rank": rank, "world_size": 2, "calls": calls})


GENUINE = [_call(0, "a()"), _call(1, "b()"), _call(2, "a()")]
PLANTED = [_call(0, "a()"), _call(1, "a()"), _call(2, "a()")]  # rank 1 "diverged" at step 1


def _timeline(rank: int) -> str:
    head = json.dumps({"format": "tensorcomm-trace-1", "rank": rank, "clock_sync_ns": [1000, 2000]})
    return '{"tensorcomm": ' + head + ',\n"traceEvents": [\n{"ph": "i", "ts": 1}\n]}\n'


# --- the flight recorder's dumps ---

@pytest.mark.parametrize("mode", ["0777", "0700"])
def test_a_squatted_default_flight_directory_is_not_written_to(
        sticky: Path, mode: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # the last resort, for a user without a private home (test_stranger_files2.py: the others)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(private.pwd, "getpwuid", _no_home)
    monkeypatch.setattr(private, "DEFAULT_DIR", str(sticky / "tensorcomm-{uid}"))
    squatted = str(sticky / f"tensorcomm-{os.geteuid()}")
    stranger("mkdir", "-m", mode, squatted)  # before any job of this user's dumps
    recorder.configure(8)
    try:
        with caplog.at_level(logging.WARNING, "tensorcomm.trace"):
            assert recorder.dump("test") is None
        assert os.listdir(squatted) == []
        assert squatted in caplog.text and f"owned by uid {NOBODY}" in caplog.text
    finally:
        recorder.configure(0)


def _no_home(uid: int) -> Any:
    raise KeyError(uid)


def test_a_shared_flight_directory_is_not_written_to(sticky: Path, caplog: pytest.LogCaptureFixture) -> None:
    recorder.configure(8, str(sticky))  # TENSORCOMM_FLIGHT_DIR=/tmp, say
    try:
        with caplog.at_level(logging.WARNING, "tensorcomm.trace"):
            assert recorder.dump("test") is None
        assert "mode 1777" in caplog.text and str(sticky) in caplog.text
        assert [name for name in os.listdir(sticky) if "rank" in name or "pid" in name] == []
    finally:
        recorder.configure(0)


def test_a_record_planted_in_a_shared_directory_blames_no_rank(sticky: Path) -> None:
    shared = sticky / "flight"
    shared.mkdir()
    shared.chmod(0o777)  # a dump directory other users may write in
    (shared / "rank0.json").write_text(_record(0, GENUINE))
    (shared / "rank1.json").write_text(_record(1, GENUINE))
    stranger("sh", "-c", f"rm -f {shared}/rank1.json && cat > {shared}/rank1.json",
             stdin=_record(1, PLANTED))
    with pytest.raises(PermissionError, match=re.escape(f"{shared}: has mode 0777")):
        analyze(shared)


def test_a_record_another_user_owns_is_not_trusted(tmp_path: Path, sticky: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "rank0.json").write_text(_record(0, GENUINE))
    planted = sticky / "rank1.json"
    stranger("sh", "-c", f"cat > {planted}", stdin=_record(1, PLANTED))
    shutil.copy2(planted, tmp_path / "rank1.json")
    os.chown(tmp_path / "rank1.json", NOBODY, NOBODY)  # as a copy that kept its owner would be
    assert cli.main(argparse.Namespace(action="analyze", directory=str(tmp_path))) == 1
    error = capsys.readouterr().err
    assert f"{tmp_path / 'rank1.json'}: is owned by uid {NOBODY}" in error and "diverged" not in error


def test_a_linked_record_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / "rank0.json").write_text(_record(0, GENUINE))
    (tmp_path / "elsewhere.json").write_text(_record(1, PLANTED))
    (tmp_path / "rank1.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(PermissionError, match=re.escape("rank1.json: is a symbolic link")):
        analyze(tmp_path)


def test_a_private_dump_directory_still_works(tmp_path: Path) -> None:
    recorder.configure(8, str(tmp_path / "flight"))
    try:
        path = recorder.dump("test")
    finally:
        recorder.configure(0)
    assert path == str(tmp_path / "flight" / f"pid{os.getpid()}.json")
    assert (tmp_path / "flight").stat().st_mode & 0o777 == 0o700
    assert Path(path).stat().st_mode & 0o777 == 0o600


# --- timelines (TENSORCOMM_TRACE) and trace merge ---

def _start(directory: Path) -> str:
    chrome.joined(lambda: None, 0, 1)
    try:
        return chrome.start(directory)
    finally:
        chrome.stop()
        chrome.joined(None, None, None)


def test_a_timeline_does_not_follow_a_link_planted_in_a_shared_directory(sticky: Path) -> None:
    target = victim(sticky)
    traces = sticky / "traces"
    stranger("mkdir", "-m", "0777", str(traces))
    stranger("ln", "-s", str(target), str(traces / "rank0.trace.json"))
    with pytest.raises(PermissionError, match=re.escape(f"{traces}: is owned by uid {NOBODY}")):
        _start(traces)
    assert target.read_text() == PRECIOUS


def test_a_timeline_replaces_a_link_at_its_name(tmp_path: Path) -> None:
    target = victim(tmp_path)
    (tmp_path / "rank0.trace.json").symlink_to(target)
    path = _start(tmp_path)
    assert target.read_text() == PRECIOUS
    assert not os.path.islink(path) and json.loads(Path(path).read_text())["tensorcomm"]["rank"] == 0
    assert Path(path).stat().st_mode & 0o777 == 0o600


def test_merge_does_not_write_through_a_planted_link(tmp_path: Path, sticky: Path) -> None:
    (tmp_path / "rank0.trace.json").write_text(_timeline(0))
    target = victim(sticky)
    stranger("ln", "-s", str(target), str(sticky / "merged.json"))
    with pytest.raises(PermissionError, match=re.escape(f"{sticky}: has mode 1777")):
        merge(tmp_path, sticky / "merged.json")
    assert target.read_text() == PRECIOUS


def test_merge_replaces_a_link_at_its_output(tmp_path: Path) -> None:
    (tmp_path / "rank0.trace.json").write_text(_timeline(0))
    target = victim(tmp_path)
    (tmp_path / "merged.trace.json").symlink_to(target)
    path, _ = merge(tmp_path)
    assert target.read_text() == PRECIOUS and not os.path.islink(path)
    assert "traceEvents" in json.loads(Path(path).read_text())


def test_merge_does_not_read_a_timeline_another_user_may_write(tmp_path: Path) -> None:
    (tmp_path / "rank0.trace.json").write_text(_timeline(0))
    (tmp_path / "rank1.trace.json").write_text(_timeline(1))
    (tmp_path / "rank1.trace.json").chmod(0o666)
    with pytest.raises(PermissionError, match=re.escape("rank1.trace.json: has mode 0666")):
        merge(tmp_path)


# --- the tuning file ---

def _tuning() -> str:
    return json.dumps({"format": tuning.FORMAT, "tensorcomm": config.VERSION, "host": tuning.fingerprint(),
                       "choices": [{"transport": "tcp", "collective": "all_reduce", "members": 2,
                                    "rows": [[None, "ring"]]}]})


def _read_warns(path: Path, *words: str) -> None:
    with pytest.warns(RuntimeWarning) as caught:
        assert tuning.read(KNOWN, {config.ENV_TUNING_FILE: str(path)}) is None
    text = " ".join(str(w.message) for w in caught)
    assert str(path) in text and "unsafe" in text and all(word in text for word in words), text


def test_a_tuning_file_another_user_planted_is_ignored(sticky: Path) -> None:
    planted = sticky / "tuning.json"
    stranger("sh", "-c", f"cat > {planted}", stdin=_tuning())
    _read_warns(planted, f"owned by uid {NOBODY}")


def test_a_tuning_file_others_may_write_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "tuning.json"
    path.write_text(_tuning())
    assert tuning.load(str(path), KNOWN)  # a good file, while only this user may write it
    path.chmod(0o646)
    _read_warns(path, "mode 0646")


def test_tune_does_not_write_through_a_link_planted_in_a_shared_directory(sticky: Path) -> None:
    target = victim(sticky)
    path = sticky / "tuning.json"
    stranger("ln", "-s", str(target), f"{path}.{os.getpid()}.tmp")  # the old temporary name
    stranger("ln", "-s", str(target), str(path))
    with pytest.raises(PermissionError, match=re.escape(f"{sticky}: has mode 1777")):
        tune._write(str(path), [], [])
    assert target.read_text() == PRECIOUS


def test_tune_replaces_a_link_at_the_tuning_file(tmp_path: Path) -> None:
    target = victim(tmp_path)
    path = tmp_path / "cache" / "tuning.json"
    path.parent.mkdir(mode=0o700)
    path.symlink_to(target)
    tune._write(str(path), [], [])
    assert target.read_text() == PRECIOUS and not path.is_symlink()
    assert json.loads(path.read_text())["choices"] == []
