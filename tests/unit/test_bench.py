"""``tensorcomm bench``: flags, sweep, formulas, correctness check, timing plan, control channel,
output shapes, and small real runs through the CLI. No test asserts a time."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tensorcomm import cli
from tensorcomm.bench import check, copyrate, options, peers, report, runner, timing
from tensorcomm.bench import cli as bench_cli
from tensorcomm.bench.control import ControlClient, JobChannel, JobFailed
from tensorcomm.bench.formulas import COLLECTIVES, algbw, busbw, element_count
from tensorcomm.bench.peers.base import Task, Unsupported, ping_pong
from tensorcomm.bench.results import Row, make_row, ratios
from tensorcomm.launch.env import LaunchConfigError

CLI_TIMEOUT = 120  # seconds for one spawned `tensorcomm bench`; a hang fails here, not in CI


def _options(*argv: str) -> options.BenchOptions:
    args = cli.build_parser().parse_args(["bench", *argv])
    return options.from_args(args)


# --- flags and sizes -------------------------------------------------------------------------

def test_defaults_and_flags_parse():
    default = _options()
    assert default.collectives == ("all_reduce",)
    assert default.ranks is None and default.dtype == "float32" and default.op == "sum"
    assert default.check and default.compare == () and default.rounds == 1
    assert default.sizes[0] == 8 and default.sizes[-1] == 64 << 20

    opts = _options("all_gather", "broadcast", "-n", "3", "-b", "1K", "-e", "1M", "-f", "4",
                    "-d", "bfloat16", "-o", "max", "-c", "0", "--iters", "10", "-w", "0",
                    "--compare", "gloo,MPI", "--rounds", "2", "--csv", "a.csv")
    assert opts.collectives == ("all_gather", "broadcast") and opts.ranks == 3
    assert opts.sizes == (1024, 4096, 16384, 65536, 262144, 1 << 20)
    assert (opts.dtype, opts.op, opts.check, opts.iters, opts.warmup) == ("bfloat16", "max",
                                                                          False, 10, 0)
    assert opts.compare == ("gloo", "mpi") and opts.rounds == 2 and opts.csv == "a.csv"
    assert _options("all").collectives == tuple(COLLECTIVES)
    assert _options("--compare", "all").compare == ("gloo", "mpi", "tc-mpi", "mindspore")


@pytest.mark.parametrize("argv, flag", [
    (["-f", "1"], "-f"), (["-b", "1M", "-e", "1K"], "-b/-e"), (["-b", "lots"], "size"),
    (["all_sum"], "COLLECTIVE"), (["--compare", "nccl"], "--compare"), (["-n", "0"], "-n"),
    (["--iters", "0"], "--iters"), (["-w", "-1"], "--warmup"), (["--time-budget", "0"], "budget"),
])
def test_bad_flags_name_the_flag(argv, flag):
    with pytest.raises(LaunchConfigError, match=flag):
        _options(*argv)


def test_bad_flag_is_a_usage_error_through_main(capsys):
    assert cli.main(["bench", "-f", "0.5"]) == 2
    assert "-f: expected a factor above 1" in capsys.readouterr().err


@pytest.mark.parametrize("text, size", [("8", 8), ("64K", 65536), ("256M", 256 << 20),
                                        ("1G", 1 << 30), ("2KiB", 2048), ("3kb", 3072)])
def test_parse_size(text, size):
    assert options.parse_size(text) == size


def test_size_sweep():
    full = options.size_sweep(8, 256 << 20, 2)
    assert len(full) == 26 and full[0] == 8 and full[-1] == 256 << 20
    assert options.size_sweep(8, 100, 4) == (8, 32)
    assert options.size_sweep(10, 40, step=10) == (10, 20, 30, 40)
    assert options.size_sweep(10, 40, 2, 10) == (10, 20, 40)  # a factor wins, as in nccl-tests
    assert options.size_sweep(8, 12, 1.1) == (8, 9, 10, 11, 12)  # a small factor still moves on
    assert options.size_sweep(5, 5) == (5,)


# --- formulas --------------------------------------------------------------------------------

@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 8])
def test_bus_factors_are_nccl_tests(ranks):
    expected = {"all_reduce": 2 * (ranks - 1) / ranks, "broadcast": 1.0, "reduce": 1.0, "send_recv": 1.0}
    for name in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        expected[name] = (ranks - 1) / ranks
    assert {n: c.bus_factor(ranks) for n, c in COLLECTIVES.items()} == pytest.approx(expected)


def test_bandwidths():
    assert algbw(2_000_000_000, 2.0) == pytest.approx(1.0)
    assert busbw("all_reduce", 1_000_000_000, 1.0, 4) == pytest.approx(1.5)
    assert busbw("all_gather", 1_000_000_000, 1.0, 4) == pytest.approx(0.75)
    assert busbw("broadcast", 1_000_000_000, 0.5, 4) == pytest.approx(2.0)


def test_element_count_rounds_as_nccl_tests():
    assert element_count("all_reduce", 8, 4, 3) == 2
    assert element_count("all_reduce", 1, 4, 3) == 1
    assert element_count("all_gather", 8, 4, 3) == 3  # at least one element per rank
    assert element_count("all_gather", 1000, 4, 3) == 249  # a multiple of the ranks
    assert element_count("all_to_all", 1 << 20, 2, 4) == 1 << 19


# --- correctness check (simulated collectives, numpy only) -----------------------------------

def _simulate(collective: str, op: str, inputs: list[np.ndarray], rank: int,
              ranks: int) -> np.ndarray:
    """What a correct library leaves in ``rank``'s result buffer."""
    ufunc = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum,
             "max": np.maximum}[op]
    block = inputs[0].size // ranks if collective != "all_gather" else inputs[0].size
    if COLLECTIVES[collective].reduces:
        total = inputs[0].copy()
        for other in inputs[1:]:
            total = ufunc(total, other).astype(total.dtype)
        if op == "avg":
            total = (total / ranks).astype(total.dtype)
        if collective == "reduce_scatter":
            return total[rank * block:(rank + 1) * block]
        return total if collective == "all_reduce" or rank == 0 else inputs[rank]
    if collective == "broadcast" or (collective == "send_recv" and rank < 2):
        return inputs[0]  # send_recv: rank 0's buffer came back, rank 1 received it
    if collective == "send_recv":
        return inputs[rank]  # idle
    if collective == "all_to_all":
        return np.concatenate([x[rank * block:(rank + 1) * block] for x in inputs])
    if collective == "scatter":
        block = inputs[0].size // ranks
        return inputs[0][rank * block:(rank + 1) * block]
    return np.concatenate(inputs)  # all_gather, gather (root)


@pytest.mark.parametrize("collective", list(COLLECTIVES))
@pytest.mark.parametrize("ranks", [1, 2, 3, 5])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "float16"])
def test_check_accepts_right_and_counts_wrong(collective, ranks, dtype):
    ops = check.OPS if dtype.startswith(("float", "bfloat")) else ("sum", "prod", "min", "max")
    for op in ops if COLLECTIVES[collective].reduces else ("sum",):
        count = element_count(collective, 100, check.DTYPES[dtype].itemsize, ranks)
        args = (collective, op, check.DTYPES[dtype], count, ranks)
        inputs = [check.fill_input(*args, r) for r in range(ranks)]
        for rank in range(ranks):
            result = _simulate(collective, op, inputs, rank, ranks)
            assert check.count_wrong(*args, rank, result.copy()) == 0, (op, rank)
            checked = not ((collective in ("reduce", "gather") and rank != 0)
                           or (collective == "send_recv" and rank >= 2))
            if checked:
                broken = result.copy()
                broken[::3] = 99  # 99 is in no pattern, nor any reduction of patterns
                assert check.count_wrong(*args, rank, broken) == len(broken[::3]), (op, rank)


def test_layout_per_collective():
    assert check.layout("all_reduce", 12, 3, 1) == (12, None)
    assert check.layout("all_gather", 12, 3, 1) == (4, 12)
    assert check.layout("reduce_scatter", 12, 3, 1) == (12, 4)
    assert check.layout("gather", 12, 3, 0) == (4, 12)
    assert check.layout("gather", 12, 3, 1) == (4, 0)
    assert check.layout("scatter", 12, 3, 1) == (0, 4)


# --- timing plan, with a fake case, clock and coordinator ------------------------------------

class _FakeCase:
    def __init__(self, clock: list[float], seconds: float) -> None:
        self.calls, self.clock, self.seconds = 0, clock, seconds

    def reset(self) -> None:
        pass

    def run(self) -> None:
        self.calls += 1
        self.clock[0] += self.seconds

    def finish(self) -> None:
        pass

    def wrong(self) -> int:
        return 1


class _Alone:
    """The coordinator of a one-rank job."""

    def reduce(self, values, op):
        return list(values)


def test_plan_counts():
    plan = timing.Plan(budget=0.2)
    assert timing.warmup_calls(0.001, plan) == 40
    assert timing.warmup_calls(10.0, plan) == 1
    assert timing.warmup_calls(0.001, timing.Plan(budget=0.2, warmup=3)) == 3
    assert timing.batches(0.001, plan) == (20, 10)  # 200 calls in 20 batches
    assert timing.batches(1.0, plan) == (5, 1)  # never fewer than MIN_ITERS calls
    assert timing.batches(1e-9, plan) == (20, timing.MAX_ITERS // 20)
    assert timing.batches(0.001, timing.Plan(budget=0.2, iters=7)) == (7, 1)


def test_measure_makes_the_planned_calls():
    clock = [0.0]
    case = _FakeCase(clock, 0.01)
    barriers = []
    result = timing.measure(case, lambda: barriers.append(1), _Alone(),
                            timing.Plan(budget=0.1, warmup=2, iters=6), clock=lambda: clock[0])
    assert case.calls == 1 + 1 + 2 + 6  # check, probe, warm-up, timed
    assert result.wrong == 1 and result.iters == 6 and result.warmup == 2
    assert len(result.batch_times) == 6 and len(barriers) == 2 + 6
    assert result.median == pytest.approx(0.01)


def test_barrier_each_times_every_call_alone_after_its_own_barrier():
    """``--barrier each``: a barrier before every warm-up and timed call, and the barriers'
    own time left out of the call's (here each barrier takes 5 ms of the fake clock)."""
    clock = [0.0]
    case = _FakeCase(clock, 0.01)
    barriers = []

    def barrier() -> None:
        barriers.append(1)
        clock[0] += 0.005

    result = timing.measure(case, barrier, _Alone(),
                            timing.Plan(budget=0.1, warmup=2, iters=6, each=True), clock=lambda: clock[0])
    assert case.calls == 1 + 1 + 2 + 6
    assert len(barriers) == 2 + 2 + 6 + 6  # before probe and warm-up; per warm-up call; per batch and call
    assert result.median == pytest.approx(0.01)


def test_barrier_flag_parses_and_reaches_the_plan_and_the_header():
    assert _options().barrier == "batch" and not _options().plan().each
    each = _options("--barrier", "each")
    assert each.barrier == "each" and each.plan().each
    machine = report.machine_info({}, {"tensorcomm": "tensorcomm 0"})
    assert "back to back" in "\n".join(report.header(_options(), 2, machine))
    assert "one at a time" in "\n".join(report.header(each, 2, machine))
    with pytest.raises(SystemExit):
        _options("--barrier", "never")


def test_the_cross_core_copy_rate_is_measured_and_shown():
    measured = copyrate.measure(seconds=0.05, nbytes=1 << 20)
    assert measured is not None and 0 < measured[0] <= measured[1]
    machine = {**report.machine_info({}, {"tensorcomm": "tensorcomm 0"}), "cross_core": measured}
    assert any(line.startswith("# cross-core copy: 4 MiB") for line in report.header(_options(), 2, machine))
    assert "not measured" in copyrate.line(None)


# --- control channel, with threads as ranks --------------------------------------------------

def _fake_rank(port: int, token: str, rank: int, size: int, fail: bool) -> None:
    client = ControlClient("127.0.0.1", port)
    client.send({"hello": {"rank": rank, "size": size, "version": "fake 1", "token": token}})
    try:
        message = client.recv()
        assert message is not None and "task" in message
        if fail and rank == 1:
            client.send({"error": "rank 1: boom"})
            return
        total = client.reduce([rank + 1.0], "sum")
        peak = client.reduce([rank, 10.0 - rank], "max")
        client.send({"done": {"total": total, "peak": peak}})
        assert client.recv() == {"exit": True}
    except ConnectionError:
        if not fail:  # after a failure the parent closes every connection
            raise
    finally:
        client.close()


@pytest.mark.parametrize("fail", [False, True])
def test_control_channel_reduces_and_reports_errors(fail):
    channel = JobChannel()
    ranks = [threading.Thread(target=_fake_rank, args=(channel.port, channel.token, r, 3, fail),
                              daemon=True) for r in range(3)]
    for thread in ranks:
        thread.start()
    deadline = time.monotonic() + 20
    hellos = channel.accept(3, deadline, lambda: None)
    assert [h["rank"] for h in hellos] == [0, 1, 2]
    if fail:
        with pytest.raises(JobFailed, match="boom"):
            channel.run({"task": {}}, deadline, lambda: None)
    else:
        reply = channel.run({"task": {}}, deadline, lambda: None)
        assert reply == {"done": {"total": [6.0], "peak": [2.0, 10.0]}}
        channel.send_all({"exit": True})
    channel.close()
    for thread in ranks:
        thread.join(5)


def test_control_channel_ignores_a_wrong_token_and_times_out():
    channel = JobChannel()
    intruder = ControlClient("127.0.0.1", channel.port)
    intruder.send({"hello": {"rank": 0, "size": 1, "version": "x", "token": "guess"}})
    with pytest.raises(JobFailed, match="timed out"):
        channel.accept(1, time.monotonic() + 1.0, lambda: None)
    intruder.close()
    channel.close()


# --- rows, ratios, CSV and JSON --------------------------------------------------------------

def _rows() -> list[Row]:
    task = Task("all_reduce", 256, "float32", "sum")
    fast = {"batch_times": [1e-4, 2e-4, 3e-4], "iters": 30, "warmup": 2, "wrong": 0}
    slow = {"batch_times": [4e-4], "iters": 10, "warmup": 2, "wrong": 0}
    return [make_row(task, "tensorcomm", 2, 4, [fast]), make_row(task, "gloo", 2, 4, [slow]),
            make_row(task, "mindspore", 2, 4, [], "n/a: no kernel")]


def test_rows_and_ratios():
    ours, _, mindspore = _rows()
    assert ours.size == 1024 and ours.time_us == pytest.approx(200.0)
    assert (ours.min_us, ours.max_us) == pytest.approx((100.0, 300.0))
    assert ours.busbw == pytest.approx(busbw("all_reduce", 1024, 2e-4, 2))
    assert mindspore.time_us is None and mindspore.note == "n/a: no kernel"
    assert ratios(_rows()) == {("all_reduce", 1024, "gloo"): pytest.approx(2.0)}


def test_csv_and_json_shapes(tmp_path):
    rows = _rows()
    opts = _options("--csv", "x")
    report.write_csv(str(tmp_path / "out.csv"), rows)
    with open(tmp_path / "out.csv", newline="") as handle:
        read = list(csv.DictReader(handle))
    assert [r["library"] for r in read] == ["tensorcomm", "gloo", "mindspore"]
    assert {"size", "count", "dtype", "op", "time_us", "min_us", "max_us", "algbw", "busbw",
            "wrong", "tensorcomm_speedup"} <= set(read[0])
    assert float(read[1]["tensorcomm_speedup"]) == pytest.approx(2.0)

    machine = report.machine_info({"OMP_NUM_THREADS": "1"}, {"tensorcomm": "tensorcomm 0"})
    report.write_json(str(tmp_path / "out.json"), machine, opts, rows)
    document = json.loads((tmp_path / "out.json").read_text())
    assert set(document) == {"machine", "options", "rows", "ratios"}
    assert document["machine"]["env"]["OMP_NUM_THREADS"] == "1"
    assert document["machine"]["cores"] >= 1 and "numpy" in document["machine"]
    assert len(document["rows"]) == 3
    assert document["ratios"] == [{"collective": "all_reduce", "size": 1024, "peer": "gloo",
                                   "tensorcomm_speedup": pytest.approx(2.0)}]


@pytest.mark.parametrize("load, cores, warns", [([0.5, 0.4, 0.3], 2, False), ([8.1, 6.0, 5.0], 2, True),
                                               ([2.0, 2.0, 2.0], 2, False)])
def test_header_shows_the_load_and_warns_above_the_cores(load, cores, warns):
    lines = report.load_lines({"load": load, "usable_cores": cores})
    assert lines[0].startswith(f"# load: {load[0]:.2f} (1 min)") and f"on {cores} usable cores" in lines[0]
    assert (len(lines) == 2 and "WARNING: the load" in lines[1]) == warns
    assert report.load_lines({"load": None, "usable_cores": 2}) == ["# load: unknown"]
    machine = report.machine_info({}, {"tensorcomm": "tensorcomm 0"})
    assert any(line.startswith("# load: ") for line in report.header(_options(), 2, machine))


def test_missing_dependencies_are_refused_before_the_sweep(monkeypatch, capsys):
    real = bench_cli.importlib.util.find_spec
    monkeypatch.setattr(bench_cli.importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    monkeypatch.setattr(peers, "missing", lambda name: f"skipped: {name}'s library not installed (how)")
    monkeypatch.setattr(runner, "start_jobs", lambda *a, **k: pytest.fail("the sweep started"))
    assert cli.main(["bench", "-n", "2", "--plot", "x.png"]) == 2
    assert "--plot needs matplotlib" in capsys.readouterr().err
    assert cli.main(["bench", "-n", "2", "--compare", "gloo"]) == 2
    assert "--compare gloo: gloo's library not installed (how)" in capsys.readouterr().err
    bench_cli.check_dependencies(_options("--compare", "all"))  # all: the missing are skipped


def test_plot_draws_min_max_bands(tmp_path):
    pytest.importorskip("matplotlib")
    from tensorcomm.bench.plot import plot

    plot(_rows(), str(tmp_path / "p.png"), "title")
    assert (tmp_path / "p.png").stat().st_size > 0


def test_send_recv_rows_are_one_way():
    task = Task("send_recv", 256, "float32", "sum")
    row = make_row(task, "tensorcomm", 2, 4, [{"batch_times": [2e-4, 4e-4, 6e-4], "iters": 3,
                                                "warmup": 1, "wrong": 0}])
    assert (row.time_us, row.min_us, row.max_us) == pytest.approx((200.0, 100.0, 300.0))
    assert row.algbw == row.busbw == pytest.approx(1024 / 200e-6 / 1e9)
    assert check.layout("send_recv", 256, 3, 2) == (256, None)
    ones = np.resize(check.fill_input("send_recv", "sum", np.dtype(np.float32), 16, 2, 0), 16)
    assert check.count_wrong("send_recv", "sum", np.dtype(np.float32), 16, 2, 1, ones) == 0


def test_send_recv_needs_two_ranks():
    with pytest.raises(Unsupported, match="2 ranks"):
        ping_pong(0, 1, print, print)


def test_table_lines(capsys):
    import sys as _sys
    writer = report.TableWriter(_sys.stdout)
    writer.emit(_rows())
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "# all_reduce" and lines[2].startswith("#    size(B)")
    assert "tensorcomm" in lines[3] and lines[4].endswith("2.00x")
    assert lines[5].endswith("n/a: no kernel")


def test_missing_peer_says_how_to_install(monkeypatch):
    monkeypatch.setattr(peers.importlib.util, "find_spec", lambda name: None)
    assert peers.missing("mpi") == ("skipped: mpi4py not installed (pip install --no-binary "
                                    "mpi4py mpi4py after apt-get install mpich libmpich-dev)")
    assert peers.missing("tensorcomm") is None


def test_tasks_skip_sizes_that_round_alike():
    opts = _options("all_gather", "-b", "4", "-e", "32", "-f", "2")
    assert [t.count for t in runner.tasks(opts, 4)] == [4, 8]  # 4, 8, 16 B -> 4 elements


# --- real runs through the CLI ---------------------------------------------------------------

def _bench(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tensorcomm", *argv], capture_output=True,
                          text=True, timeout=CLI_TIMEOUT)


@pytest.mark.multiprocess
def test_small_run_with_two_ranks_is_correct(tmp_path):
    done = _bench("bench", "all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                  "broadcast", "-n", "2", "-b", "8", "-e", "4K", "-f", "16", "--iters", "3",
                  "-w", "1", "--csv", str(tmp_path / "r.csv"), "--json", str(tmp_path / "r.json"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "# tensorcomm: wrong elements 0 (OK)" in done.stdout
    with open(tmp_path / "r.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 5 * 3 and {r["wrong"] for r in rows} == {"0"}
    assert json.loads((tmp_path / "r.json").read_text())["options"]["ranks"] == 2


@pytest.mark.multiprocess
def test_send_recv_in_osu_columns():
    done = _bench("bench", "send_recv", "-n", "3", "-b", "8", "-e", "64K", "-f", "64", "--iters", "3",
                  "-w", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert report.OSU_NOTE in lines and "# tensorcomm: wrong elements 0 (OK)" in done.stdout
    assert lines[lines.index(report.OSU_NOTE) + 1].split() == [
        "#", "size(B)", "type", "library", "latency(us)", "min(us)", "max(us)", "bandwidth(MB/s)",
        "#wrong", "tc/peer"]
    rows = [line.split() for line in lines if " tensorcomm " in line and not line.startswith("#")]
    assert [int(r[0]) for r in rows] == [8, 512, 32768] and all(r[7] == "0" for r in rows)


@pytest.mark.multiprocess
def test_in_process_under_tensorcomm_run():
    done = _bench("run", "-n", "2", "--timeout", str(CLI_TIMEOUT - 10), "-m", "tensorcomm",
                  "bench", "-b", "64", "-e", "64", "--iters", "2", "-w", "0", "-d", "int32",
                  "-o", "max")
    assert done.returncode == 0, done.stdout + done.stderr
    table = [line for line in done.stdout.splitlines() if "tensorcomm " in line
             and not line.startswith("[rank 0] #")]
    assert len(table) == 1 and table[0].startswith("[rank 0]")  # rank 0 prints, once
    assert " int32 " in table[0] and " max " in table[0]


@pytest.mark.multiprocess
def test_peers_agree_with_numpy():
    installed = [p for p in ("gloo", "mpi") if peers.missing(p) is None]
    if not installed:
        pytest.skip("neither torch nor mpi4py is installed")
    done = _bench("bench", "all_reduce", "all_to_all", "gather", "send_recv", "-n", "2", "-b", "8",
                  "-e", "1K", "-f", "128", "--iters", "2", "-w", "1", "--compare",
                  ",".join(installed))
    assert done.returncode == 0, done.stdout + done.stderr
    for peer in installed:
        assert f"# {peer}: wrong elements 0 (OK)" in done.stdout, done.stdout
