"""benchmarks/ as a kit: every script answers ``--help`` (so it still imports and parses its
arguments) and is listed in benchmarks/README.md, and every recorded result is a flat file of
benchmarks/results/ headed as that README says. Benchmarks themselves never run in the suite."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))
RESULTS = BENCHMARKS / "results"
HEADER = ("# command: ", "# commit: ", "# machine: ", "# load: ")
OPTIONAL = {"torch", "mpi4py", "matplotlib", "ray", "cryptography"}  # a script may need an extra


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_script_answers_help(script: Path, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # scripts import their neighbours by bare name
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit) as exited:
        try:
            runpy.run_path(str(script), run_name="__main__")
        except ModuleNotFoundError as error:
            if error.name in OPTIONAL:
                pytest.skip(f"{script.name} needs {error.name}")
            raise
    assert exited.value.code in (0, None)
    assert "usage:" in capsys.readouterr().out


def test_readme_lists_every_script() -> None:
    readme = (BENCHMARKS / "README.md").read_text()
    assert [s.name for s in SCRIPTS if f"benchmarks/{s.name}" not in readme] == []


def test_results_are_flat_and_headed() -> None:
    assert [p.name for p in RESULTS.iterdir() if p.is_dir()] == []
    for text_file in RESULTS.glob("*.txt"):
        head = text_file.read_text().splitlines()[:len(HEADER)]
        assert [line.split(":")[0] + ": " for line in head] == list(HEADER), text_file.name
    stems = {p.stem for p in RESULTS.glob("*.txt")}
    assert [p.name for p in RESULTS.iterdir() if p.stem not in stems] == []  # .csv/.json beside a .txt


def test_ab_alternates_which_tree_goes_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """``ab.py`` runs A then B in odd rounds and B then A in even ones, and its order effect is
    the first run's figure over the second's (here A's 1 and B's 2: 0.5 and 2, median 1.25)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import ab  # type: ignore[import-not-found]

    for tree in ("one", "two"):
        (tmp_path / tree / "src" / "tensorcomm").mkdir(parents=True)
    order = tmp_path / "order.log"
    figures = ("import json, os, sys; open(sys.argv[2], 'a').write(os.environ['SIDE']); "
               "json.dump({'t': float(os.environ['T'])}, open(sys.argv[1], 'w'))")
    assert ab.main([str(tmp_path / "one"), str(tmp_path / "two"), "--rounds", "4",
                    "--env-a", "SIDE=A", "--env-a", "T=1", "--env-b", "SIDE=B", "--env-b", "T=2",
                    "--", sys.executable, "-c", figures, "{json}", str(order)]) == 0
    assert order.read_text() == "ABBAABBA"
    out = capsys.readouterr().out
    assert "order effect: first run of a round / second, median over figures and rounds: 1.25" in out
    assert [line.split()[1:] for line in out.splitlines() if line.startswith("t ")] == \
        [["1.00", "2.00", "0.50"]]
