"""Run mpi4py's demo programs through ``tensorcomm.MPI`` and through mpi4py, and compare output.

    python tools/mpi4py_demos.py PATH/TO/mpi4py [--ranks 2]

Each demo runs under ``python -m tensorcomm run -n N`` with ``mpi4py`` resolved to
``tensorcomm.MPI`` (a ``sys.modules`` alias made before the demo runs) and under
``mpiexec -n N`` with mpi4py itself. The output is compared with numbers that are timings
(microseconds, MB/s, seconds) masked, so what must match is every line's text, message sizes and
computed values. No mpi4py code is copied here: the demos are read from the checkout given.
"""

from __future__ import annotations

import argparse
import difflib
import re
import runpy
import subprocess
import sys
from pathlib import Path

# demo (relative to demo/), stdin it reads, whether its numbers are timings to mask
DEMOS = [
    ("compute-pi/cpi-cco.py", "1000000\n0\n", False),
    ("mandelbrot/mandelbrot.py", "", True),
    ("osu_latency.py", "", True),
    ("osu_bw.py", "", True),
    ("osu_bibw.py", "", True),
    ("osu_allgather.py", "", True),
    ("osu_alltoall.py", "", True),
    ("osu_bcast.py", "", True),
    ("osu_barrier.py", "", True),
    ("osu_gather.py", "", True),
    ("osu_scatter.py", "", True),
    ("osu_multi_lat.py", "", True),
    ("osu_alltoallv.py", "", True),
]
_LAUNCHER = re.compile(r"^tensorcomm: .*$", re.M)
_FLOAT = re.compile(r" *\d+\.\d+(e[-+]?\d+)?")  # with its padding: widths vary with the value


def _alias_and_run(demo: Path, argv: list[str]) -> None:
    from tensorcomm import MPI

    package = type(sys)("mpi4py")
    package.__path__ = []  # type: ignore[attr-defined]
    package.MPI = MPI  # type: ignore[attr-defined]
    sys.modules["mpi4py"] = package
    sys.modules["mpi4py.MPI"] = MPI
    sys.argv = [str(demo), *argv]
    sys.path.insert(0, str(demo.parent))
    runpy.run_path(str(demo), run_name="__main__")


def _run(command: list[str], stdin: str) -> str:
    done = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=600)
    out = _LAUNCHER.sub("", done.stdout)
    out = re.sub(r"^\[rank \d+\] ?", "", out, flags=re.M)
    if done.returncode:
        out += f"\n[exit code {done.returncode}] {done.stderr[-500:]}"
    return "\n".join(line.rstrip() for line in out.splitlines() if line.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="an mpi4py checkout (holding demo/)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--only", nargs="+", help="run these demos only (names as in DEMOS)")
    parser.add_argument("--run", type=Path, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.run is not None:
        _alias_and_run(args.run, rest)
        return
    matched = 0
    chosen = [d for d in DEMOS if args.only is None or d[0] in args.only]
    for name, stdin, timings in chosen:
        demo = args.source / "demo" / name
        if not demo.exists():
            print(f"{name}: not in this checkout")
            continue
        ours = _run([sys.executable, "-m", "tensorcomm", "run", "-n", str(args.ranks), __file__,
                     str(args.source), "--run", str(demo)], stdin)
        theirs = _run(["mpiexec", "-n", str(args.ranks), sys.executable, str(demo)], stdin)
        if timings:
            ours, theirs = _FLOAT.sub(" #", ours), _FLOAT.sub(" #", theirs)
        same = ours == theirs
        matched += same
        print(f"{name}: {'same output' if same else 'DIFFERENT'}"
              f"{' (timings masked)' if timings else ''}, {len(ours.splitlines())} lines")
        if not same:  # the lines that differ, tensorcomm.MPI's marked -, mpi4py's +
            diff = difflib.unified_diff(ours.splitlines(), theirs.splitlines(), lineterm="", n=0)
            print("    " + "\n    ".join(list(diff)[2:24]))
    print(f"{matched} of {len(chosen)} demos print what mpi4py prints")


if __name__ == "__main__":
    main()
