"""The tuning file (algorithms/tuning.py), its use by select, and the sums of `tensorcomm tune`."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from tensorcomm import cli, config
from tensorcomm.algorithms import select, tuning
from tensorcomm.bench import tune
from tensorcomm.launch.env import LaunchConfigError
from tensorcomm.rendezvous import discovery
from tensorcomm.transports.shm.domain import SLOT_BYTES

KNOWN = {c: select.names(c) for c in select.collectives()}


def good(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "format": tuning.FORMAT, "tensorcomm": config.VERSION, "host": tuning.fingerprint(),
        "choices": [
            {"transport": "shm", "collective": "all_reduce", "members": 2,
             "rows": [[4096, "shm_split"], [None, "shm_pipelined"]]},
            {"transport": "shm", "collective": "all_reduce", "members": 8,
             "rows": [[None, "shm_direct"]]},
            {"transport": "tcp", "collective": "all_reduce", "members": 2,
             "rows": [[None, "ring"]]}]}
    data.update(changes)
    return data


def test_a_good_file_gives_its_rows_by_transport_members_and_size() -> None:
    table = tuning.parse(good(), KNOWN)
    assert tuning.lookup(table, "shm", "all_reduce", 2, 4096) == "shm_split"
    assert tuning.lookup(table, "shm", "all_reduce", 2, 4097) == "shm_pipelined"
    assert tuning.lookup(table, "tcp", "all_reduce", 2, 1) == "ring"
    assert tuning.lookup(table, "shm", "all_reduce", 4, 1) == "shm_split"  # nearest tuned count: 2
    assert tuning.lookup(table, "shm", "all_reduce", 6, 1) == "shm_direct"  # nearest is 8
    assert tuning.lookup(table, "shm", "all_reduce", 5, 1) == "shm_split"  # a tie: the smaller count
    assert tuning.lookup(table, "shm", "reduce", 2, 1) is None  # not tuned
    assert tuning.lookup(table, None, "all_reduce", 2, 1) is None
    bounded = tuning.parse(good(choices=[{"transport": "shm", "collective": "all_reduce", "members": 2,
                                          "rows": [[4096, "shm_split"], [65536, "shm_pipelined"]]}]),
                           KNOWN)
    assert tuning.lookup(bounded, "shm", "all_reduce", 2, 65536) == "shm_pipelined"
    assert tuning.lookup(bounded, "shm", "all_reduce", 2, 65537) is None  # not measured: built-in


@pytest.mark.parametrize("changes, kind, words", [
    ({"format": 0}, "stale", "format 0"),
    ({"tensorcomm": "0.0.1"}, "stale", "0.0.1"),
    ({"host": {"cpu": "elsewhere", "cores": 999, "memory_gib": 1}}, "foreign", "elsewhere"),
    ({"choices": {}}, "malformed", "list"),
    ({"choices": [{"transport": "nvlink", "collective": "all_reduce", "members": 2,
                   "rows": [[None, "ring"]]}]}, "malformed", "nvlink"),
    ({"choices": [{"transport": "tcp", "collective": "all_reduce", "members": 2,
                   "rows": [[None, "shm_direct"]]}]}, "malformed", "not a tcp algorithm"),
    ({"choices": [{"transport": "tcp", "collective": "all_reduce", "members": 2,
                   "rows": [[None, "bogus"]]}]}, "malformed", "bogus"),
    ({"choices": [{"transport": "tcp", "collective": "all_reduce", "members": 2,
                   "rows": [[10, "ring"], [5, "ring"], [None, "ring"]]}]}, "malformed", "ascending"),
    ({"choices": [{"transport": "tcp", "collective": "all_reduce", "members": 2,
                   "rows": [[None, "ring"], [10, "ring"]]}]}, "malformed", "null only last"),
    ({"choices": [{"transport": "tcp", "collective": "all_reduce", "members": 1,
                   "rows": [[None, "ring"]]}]}, "malformed", "members"),
    ({"choices": [{"transport": "tcp", "collective": "frobnicate", "members": 2,
                   "rows": [[None, "ring"]]}]}, "malformed", "frobnicate"),
])
def test_stale_foreign_and_malformed_files_are_refused_saying_why(changes, kind, words) -> None:
    with pytest.raises(tuning.Ignored, match=words) as caught:
        tuning.parse(good(**changes), KNOWN)
    assert caught.value.kind == kind and str(caught.value).startswith(kind)


def env_for(path: Path | str | None, cache: Path) -> dict[str, str]:
    env = {discovery.XDG_CACHE_HOME: str(cache)}
    if path is not None:
        env[config.ENV_TUNING_FILE] = str(path)
    return env


def read(env: dict[str, str]) -> tuple[tuning.Table | None, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = tuning.read(KNOWN, env)
    return table, [str(w.message) for w in caught]


def test_read_finds_the_file_by_env_var_or_per_user_default(tmp_path: Path) -> None:
    explicit = tmp_path / "mine.json"
    explicit.write_text(json.dumps(good()))
    table, said = read(env_for(explicit, tmp_path))
    assert table is not None and said == []
    default = tuning.default_path(env_for(None, tmp_path / "cache"))
    assert default is not None and default.startswith(str(tmp_path / "cache" / "tensorcomm" / "tuning-"))
    assert read(env_for(None, tmp_path / "cache")) == (None, [])  # untuned: silent
    Path(default).parent.mkdir(parents=True)
    Path(default).write_text(json.dumps(good()))
    assert read(env_for(None, tmp_path / "cache"))[0] is not None
    assert read(env_for("off", tmp_path / "cache")) == (None, [])
    assert tuning.default_path(env_for(" OFF ", tmp_path)) is None


def test_read_warns_naming_the_file_and_the_reason(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    table, said = read(env_for(missing, tmp_path))
    assert table is None and len(said) == 1 and str(missing) in said[0] and "does not exist" in said[0]
    for text, reason in ((json.dumps(good(host={"cpu": "x", "cores": 1, "memory_gib": 1})), "foreign"),
                         (json.dumps(good(format=0)), "stale"), ("{not json", "malformed"),
                         ("[]", "malformed")):
        missing.write_text(text)
        table, said = read(env_for(missing, tmp_path))
        assert table is None and len(said) == 1, said
        assert str(missing) in said[0] and f"ignoring tuning file {missing}, {reason}" in said[0]
        assert "built-in" in said[0]


def test_choose_takes_the_tuned_row_where_it_fits_else_the_predicates() -> None:
    team = tune.model_team(2, "shm")
    assert select.choose("all_reduce", team, 1024, None).name == "shm_direct"
    assert select.choose("all_reduce", team, 1024, "shm_pipelined").name == "shm_pipelined"
    # one slot is all shm_split can take: beyond it the predicates choose
    assert select.choose("all_reduce", team, SLOT_BYTES + 4, "shm_split").name == "shm_pipelined"
    assert select.choose("all_reduce", tune.model_team(2, "tcp"), 1024, "shm_split").name == \
        "pair_in_place"  # no domain: a shared-memory row does not fit
    assert select.choose("all_reduce", tune.model_team(2, "tcp"), 1024, "ring").name == "ring"
    assert not select.fits("reduce", "shm_direct", team, SLOT_BYTES + 1)
    assert select.fits("reduce", "shm_direct", team, SLOT_BYTES)


def test_tuned_groups_are_shm_or_tcp_on_one_host() -> None:
    assert tuning.transport_of(tune.model_team(3, "shm")) == "shm"
    assert tuning.transport_of(tune.model_team(3, "tcp")) is None  # no TCP transport in a model team


def test_candidates_per_transport() -> None:
    assert tune.candidates("all_reduce", "shm") == ["shm_cma", "shm_direct", "shm_split", "shm_pipelined"]
    assert tune.candidates("all_reduce", "tcp") == ["pair_in_place", "recursive_doubling", "halving_doubling",
                                                    "ring"]
    assert tune.candidates("all_to_all", "tcp") == ["pairwise_exchange"]


def test_winners_are_the_fewest_bands_within_five_percent_of_the_fastest() -> None:
    measured = {1024: {"a": 1.0, "b": 2.0}, 4096: {"a": 1.0, "b": 1.5}, 16384: {"a": 3.0, "b": 1.0},
                65536: {"a": 5.0, "b": 4.9}, 262144: {"b": 1.0}}
    assert tune.winners(measured) == ((4096, "a"), (262144, "b"))
    # b is fastest at 1024 alone, but a is within 5% there and good for longer: one band
    noisy = {1024: {"a": 1.04, "b": 1.0}, 4096: {"a": 1.0, "b": 2.0}, 16384: {"a": 1.0, "b": 2.0}}
    assert tune.winners(noisy) == ((16384, "a"),)
    # a row timed only up to some size (one slot) ends its band there
    fits = {1024: {"a": 1.0, "b": 1.2}, 4096: {"b": 1.0}}
    assert tune.winners(fits) == ((1024, "a"), (4096, "b"))
    assert tune.winners({1024: {"a": 1.0, "b": 1.0}}) == ((1024, "a"),)  # a tie: either, once
    assert tune.winners({}) == ()


@pytest.mark.parametrize("text, expected", [("2", [2]), ("2,4", [2, 4]), ("2-4,8", [2, 3, 4, 8]),
                                            ("4,2,4", [2, 4])])
def test_member_counts(text: str, expected: list[int]) -> None:
    assert tune._ranks(text) == expected


def test_default_member_counts() -> None:
    assert tune.default_counts(1) == [2]
    assert tune.default_counts(2) == [2]
    assert tune.default_counts(8) == [2, 3, 4, 5, 6, 7, 8]
    assert tune.default_counts(16) == [2, 4, 8, 16]
    assert tune.default_counts(24) == [2, 4, 8, 16, 24]


@pytest.mark.parametrize("text", ["1", "x", "", "2-x"])
def test_bad_member_counts(text: str) -> None:
    with pytest.raises(LaunchConfigError, match="-n"):
        tune._ranks(text)


@pytest.mark.parametrize("argv, words", [
    (["--transport", "nvlink"], "--transport"), (["frobnicate"], "COLLECTIVE"),
    (["-b", "1X"], "size"), (["-f", "1"], "-f"), (["--rounds", "0"], "--rounds"), (["-n", "1"], "-n")])
def test_usage_errors_return_2_naming_the_flag(argv: list[str], words: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["tune", *argv]) == 2
    err = capsys.readouterr().err
    assert "usage: tensorcomm tune" in err and words in err


def test_off_without_a_file_is_a_usage_error(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(config.ENV_TUNING_FILE, "off")
    assert cli.main(["tune"]) == 2
    assert "-o" in capsys.readouterr().err
