"""`tensorcomm tune` and the tuning file in real jobs: the file is written, selection follows it,
and stale, foreign or malformed files (and TENSORCOMM_TUNING_FILE) behave as docs/tuning.md says."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm import config
from tensorcomm.algorithms import select, tuning
from tensorcomm.testing import run_ranks

COUNT = 1024  # float32: 4 KiB, where the built-in rules pick shm_direct / pair_in_place
DEFAULT = {"auto": "shm_direct", "tcp": "pair_in_place"}
TUNED = {"auto": "shm_pipelined", "tcp": "ring"}


class _Chosen(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.names: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.args and isinstance(record.args, tuple) and record.args[0] == "all_reduce":
            self.names.append(str(record.args[-1]))


def body_all_reduce() -> tuple[list[str], list[str]]:
    """Init, one all_reduce; return the algorithms plans got and the warnings raised."""
    chosen = _Chosen()
    log = logging.getLogger("tensorcomm.plan")
    log.addHandler(chosen)
    log.setLevel(logging.DEBUG)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tc.init()
        x = np.full(COUNT, tc.get_rank() + 1, np.float32)
        tc.all_reduce(x)
        assert (x == 3).all()
        tc.destroy()
    return chosen.names, [str(w.message) for w in caught if "tuning" in str(w.message)]


def tuning_file(path: Path, **changes: Any) -> Path:
    data: dict[str, Any] = {
        "format": tuning.FORMAT, "tensorcomm": config.VERSION, "host": tuning.fingerprint(),
        "choices": [{"transport": "shm", "collective": "all_reduce", "members": 2,
                     "rows": [[None, TUNED["auto"]]]},
                    {"transport": "tcp", "collective": "all_reduce", "members": 2,
                     "rows": [[None, TUNED["tcp"]]]}]}
    data.update(changes)
    path.write_text(json.dumps(data))
    return path


def job(transport: str, **env: str) -> list[tuple[list[str], list[str]]]:
    return run_ranks(body_all_reduce, 2, timeout=60, init=False,
                     env={config.ENV_TRANSPORT: transport, **env})


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_selection_follows_the_tuning_file(tmp_path: Path, transport: str) -> None:
    path = tuning_file(tmp_path / "t.json")
    for names, said in job(transport, **{config.ENV_TUNING_FILE: str(path)}):
        assert names == [TUNED[transport]] and said == []
    for names, said in job(transport, **{config.ENV_TUNING_FILE: "off"}):
        assert names == [DEFAULT[transport]] and said == []


def test_the_per_user_default_file_is_read(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    path = tuning.default_path({"XDG_CACHE_HOME": str(cache)})
    assert path is not None
    Path(path).parent.mkdir(parents=True)
    tuning_file(Path(path))
    # empty counts as unset (the suite sets "off": tests/conftest.py)
    for names, said in job("auto", XDG_CACHE_HOME=str(cache), **{config.ENV_TUNING_FILE: ""}):
        assert names == [TUNED["auto"]] and said == []


@pytest.mark.parametrize("changes, reason", [
    ({"host": {"cpu": "another", "cores": 4096, "memory_gib": 1}}, "foreign"),
    ({"format": tuning.FORMAT - 1}, "stale"),
    ({"tensorcomm": "0.0.0"}, "stale"),
    ({"choices": [{"transport": "shm", "collective": "all_reduce", "members": 2,
                   "rows": [[None, "no_such_algorithm"]]}]}, "malformed"),
])
def test_unusable_files_are_ignored_with_a_warning(tmp_path: Path, changes: dict[str, Any],
                                                   reason: str) -> None:
    path = tuning_file(tmp_path / "t.json", **changes)
    for names, said in job("auto", **{config.ENV_TUNING_FILE: str(path)}):
        assert names == [DEFAULT["auto"]]
        assert len(said) == 1 and f"ignoring tuning file {path}, {reason}" in said[0]


def test_a_file_that_is_not_json_or_missing_is_ignored_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text("{half a file")
    for names, said in job("auto", **{config.ENV_TUNING_FILE: str(path)}):
        assert names == [DEFAULT["auto"]] and len(said) == 1 and "malformed: not JSON" in said[0]
    for names, said in job("auto", **{config.ENV_TUNING_FILE: str(tmp_path / "none.json")}):
        assert names == [DEFAULT["auto"]] and len(said) == 1 and "does not exist" in said[0]


def tune_command(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tensorcomm", "tune", "-n", "2", "-b", "1K",
                           "-e", "4K", "--iters", "2", "-w", "1", "--rounds", "1", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_a_short_tune_writes_a_file_that_selection_accepts_and_check_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "tuned.json"
    done = tune_command("all_reduce", "broadcast", "-o", str(path))
    assert done.returncode == 0, done.stderr
    assert f"wrote {path}" in done.stdout
    data = json.loads(path.read_text())
    table = tuning.load(str(path), {c: select.names(c) for c in select.collectives()})
    # broadcast has two shared-memory rows: the slots and direct reads (shm_cma)
    assert set(table) == {("shm", "all_reduce"), ("shm", "broadcast"), ("tcp", "all_reduce"),
                          ("tcp", "broadcast")}
    assert all(list(by_members) == [2] for by_members in table.values())
    assert {m["collective"] for m in data["measured"]} == {"all_reduce", "broadcast"}
    assert set(data["measured"][0]["times_us"]) == {"1024", "4096"}
    # a second run for one transport keeps the other's entries
    assert tune_command("broadcast", "--transport", "tcp", "-o", str(path)).returncode == 0
    assert set(tuning.load(str(path), {c: select.names(c) for c in select.collectives()})) == set(table)
    checked = tune_command("all_reduce", "--transport", "shm", "--check", "-o", str(path))
    assert checked.returncode in (0, 1), checked.stderr  # 1: a timing miss, which tests do not judge
    lines = [line.split() for line in checked.stdout.splitlines() if line.startswith("shm ")]
    assert [fields[3] for fields in lines] == ["1024", "4096"]
    assert all(fields[11] == fields[4] for fields in lines)  # the selecting job ran the chosen row
    assert "0 where the selecting job ran another row" in checked.stdout


def test_check_without_a_file_fails_saying_so(tmp_path: Path) -> None:
    done = tune_command("all_reduce", "--check", "-o", str(tmp_path / "none.json"), timeout=60)
    assert done.returncode == 1 and "run `tensorcomm tune` first" in done.stderr
