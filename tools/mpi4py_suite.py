"""Run mpi4py's own test files through ``tensorcomm.MPI`` (or through real mpi4py) and count.

    python tools/mpi4py_suite.py PATH/TO/mpi4py --ranks 1 2 3            # tensorcomm.MPI
    python tools/mpi4py_suite.py PATH/TO/mpi4py --ranks 1 2 3 --real     # mpi4py under mpiexec

``PATH/TO/mpi4py`` is a checkout (or ``git archive``) of mpi4py holding ``test/``. For
tensorcomm the ranks start under ``python -m tensorcomm run -n N`` and each one makes the name
``mpi4py`` resolve to ``tensorcomm.MPI`` (a ``sys.modules`` alias) before importing the tests;
for ``--real`` they start under ``mpiexec -n N`` with mpi4py itself. A test passes when it
passes on every rank. Prints, per world size, passed / failed / errors / skipped and every test
that did not pass with its first error line; ``--json FILE`` keeps it all. No mpi4py code is
copied here: the tests are read from the checkout given.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import types
import unittest
from pathlib import Path

FILES = ["test_cco_buf", "test_cco_obj", "test_cco_nb_buf", "test_cco_nb_obj", "test_p2p_buf",
         "test_p2p_obj", "test_comm", "test_group", "test_op", "test_status", "test_request"]


def _alias() -> None:
    """Make ``import mpi4py`` / ``from mpi4py import MPI`` give tensorcomm.MPI."""
    from tensorcomm import MPI

    package = types.ModuleType("mpi4py")
    package.__path__ = []  # a package, so ``mpi4py.MPI`` imports
    package.MPI = MPI  # type: ignore[attr-defined]
    package.__version__ = "tensorcomm"  # type: ignore[attr-defined]
    sys.modules["mpi4py"] = package
    sys.modules["mpi4py.MPI"] = MPI


class _Record(unittest.TestResult):
    """Each test's outcome on this rank: pass, fail, error or skip (with the first error line)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.outcomes: dict[str, tuple[str, str]] = {}
        self.path = path

    def stopTest(self, test: unittest.TestCase) -> None:
        super().stopTest(test)
        self.path.write_text(json.dumps(self.outcomes))  # after every test: a hang loses no result

    def _set(self, test: unittest.TestCase, outcome: str, detail: str = "") -> None:
        name = test.id()
        if name.endswith(")") and " (" in name:  # a subtest: count its test once, worst outcome
            name = name.split(" (")[0]
        previous = self.outcomes.get(name)
        worse = outcome in ("fail", "error") and previous is not None and previous[0] == "skip"
        if previous is None or previous[0] == "pass" or worse:
            self.outcomes[name] = (outcome, detail)

    def addSuccess(self, test: unittest.TestCase) -> None:
        self._set(test, "pass")

    def addFailure(self, test: unittest.TestCase, err: object) -> None:
        self._set(test, "fail", self._exc_info_to_string(err, test).strip().splitlines()[-1])  # type: ignore[arg-type]

    def addError(self, test: unittest.TestCase, err: object) -> None:
        self._set(test, "error", self._exc_info_to_string(err, test).strip().splitlines()[-1])  # type: ignore[arg-type]

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        self._set(test, "skip", reason)

    def addSubTest(self, test: unittest.TestCase, subtest: unittest.TestCase, err: object) -> None:
        if err is not None:
            failure = issubclass(err[0], test.failureException)  # type: ignore[index]
            line = self._exc_info_to_string(err, test).strip().splitlines()[-1]  # type: ignore[arg-type]
            self._set(test, "fail" if failure else "error", line)

    def addExpectedFailure(self, test: unittest.TestCase, err: object) -> None:
        self._set(test, "pass")

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
        self._set(test, "fail", "unexpected success")


def worker(source: Path, out: Path, files: list[str], real: bool) -> None:
    """One rank: run the test files, write this rank's outcomes to ``out``/rank<r>.json."""
    if not real:
        _alias()
    sys.path.insert(0, str(source / "test"))
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.Get_rank()
    record = _Record(out / f"rank{rank}.json")
    names: list[str] = []
    suites = []
    for name in files:
        try:
            suite = unittest.defaultTestLoader.loadTestsFromName(name)
        except Exception as exc:  # noqa: BLE001 - an import failure is a result to record
            record.outcomes[f"{name} (import)"] = ("error", f"{type(exc).__name__}: {exc}")
            continue
        names += [test.id() for test in _tests(suite)]
        suites.append(suite)
    (out / "names.json").write_text(json.dumps(names))
    for suite in suites:
        suite.run(record)
    record.path.write_text(json.dumps(record.outcomes))


def _tests(suite: unittest.TestSuite) -> list[unittest.TestCase]:
    found: list[unittest.TestCase] = []
    for item in suite:
        found += _tests(item) if isinstance(item, unittest.TestSuite) else [item]  # type: ignore[list-item]
    return found


def run(source: Path, ranks: int, files: list[str], real: bool, timeout: float) -> dict[str, tuple[str, str]]:
    """Every test's outcome over ``ranks`` ranks (worst over the ranks), one job per file, so
    that a job that hangs (MPI has no timeout) costs the rest of its file only."""
    merged: dict[str, tuple[str, str]] = {}
    for name in files:
        merged.update(_run_file(source, ranks, name, real, timeout))
    return merged


def _run_file(source: Path, ranks: int, name: str, real: bool, timeout: float) -> dict[str, tuple[str, str]]:
    files = [name]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        me = [__file__, str(source), "--worker", str(out), "--files", *files]
        if real:
            command = ["mpiexec", "-n", str(ranks), sys.executable, *me, "--real"]
        else:
            command = [sys.executable, "-m", "tensorcomm", "run", "-n", str(ranks), *me]
        env = dict(os.environ, TENSORCOMM_TIMEOUT=os.environ.get("TENSORCOMM_TIMEOUT", "30"))
        job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
        try:
            _, stderr = job.communicate(timeout=timeout)
            if job.returncode:
                sys.stderr.write(f"ranks={ranks} {name}: exit code {job.returncode}\n{stderr[-2000:]}\n")
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)  # the launcher and its ranks: a hung MPI job spins on
            job.communicate()
            sys.stderr.write(f"ranks={ranks}: {name} timed out after {timeout:g} s\n")
        listed = out / "names.json"
        names = json.loads(listed.read_text()) if listed.exists() else []
        merged: dict[str, tuple[str, str]] = {}
        order = {"error": 3, "fail": 2, "skip": 1, "pass": 0}
        for r in range(ranks):
            path = out / f"rank{r}.json"
            outcomes = json.loads(path.read_text()) if path.exists() else {}
            for test in set(names) | set(outcomes):
                outcome, detail = outcomes.get(test, ("error", "did not run (the job hung or ended)"))
                if test not in merged or order[outcome] > order[merged[test][0]]:
                    merged[test] = (outcome, f"rank {r}: {detail}" if detail else "")
        return merged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="an mpi4py checkout (holding test/)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--real", action="store_true", help="real mpi4py under mpiexec")
    parser.add_argument("--files", nargs="+", default=FILES)
    parser.add_argument("--timeout", type=float, default=600, help="seconds per test file")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    files = [f for f in args.files if (args.source / "test" / f"{f}.py").exists()]
    if args.worker is not None:
        worker(args.source, args.worker, files, args.real)
        return
    missing = sorted(set(args.files) - set(files))
    if missing:
        print(f"not in this checkout: {', '.join(missing)}")
    results = {}
    for ranks in args.ranks:
        started = time.monotonic()
        merged = run(args.source, ranks, files, args.real, args.timeout)
        counts = {k: sum(1 for o, _ in merged.values() if o == k) for k in ("pass", "fail", "error", "skip")}
        print(f"{'mpi4py' if args.real else 'tensorcomm.MPI'} ranks={ranks}: {counts['pass']} passed, "
              f"{counts['fail']} failed, {counts['error']} errors, {counts['skip']} skipped "
              f"({time.monotonic() - started:.0f} s)")
        for name, (outcome, detail) in sorted(merged.items()):
            if outcome in ("fail", "error"):
                print(f"  {outcome:5} {name}: {detail[:300]}")
        results[ranks] = merged
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
