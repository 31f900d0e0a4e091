"""The copy bound printed under the bench's table (``tensorcomm.bench.bound``)."""

from __future__ import annotations

import pytest

from tensorcomm.bench import bound
from tensorcomm.bench.results import Row


def _row(collective: str, size: int, library: str = "tensorcomm", time_us: float = 100.0) -> Row:
    return Row(collective, library, 2, size, size // 4, "float32", "sum", time_us, time_us, time_us,
               1.0, 1.0, 0, 10)


def test_each_design_prices_its_copies_at_their_rates():
    mib = 1 << 20
    rates = bound.Rates(private=4e9, cross=2e9, cma=1e9, memory=0.5e9)
    s = 4 * mib
    us = 1e6
    # all_gather at 2 ranks: own block and publish S/2 private, take S/2 cross; or read S/2 by CMA
    half = s / 2
    ag = {design: bound.design_us("all_gather", s, 2, rates, design) for design in ("slots", "cma", "shared")}
    assert ag["slots"] == pytest.approx((s / 4e9 + s / 4e9) * us)
    assert ag["cma"] == pytest.approx((half / 4e9 + half / 1e9) * us)
    assert ag["shared"] == pytest.approx((half / 4e9 + half / 2e9) * us)
    # reduce_scatter: publish the peer's block, reduce 3 halves-of-a-half; or read it by CMA first
    assert bound.design_us("reduce_scatter", s, 2, rates, "slots") == \
        pytest.approx((s / 2 / 4e9 + 1.5 * s / 2 / 4e9) * us)
    assert bound.design_us("all_reduce", s, 2, rates, "cma") == \
        pytest.approx((1.5 * s / 2 / 4e9 + s / 2 / 1e9 + s / 2 / 1e9) * us)
    # broadcast: root and receivers at once through the slots; half each way by CMA at 2 ranks
    assert bound.design_us("broadcast", s, 2, rates, "slots") == pytest.approx(s / 2e9 * us)
    assert bound.design_us("broadcast", s, 2, rates, "cma") == pytest.approx(s / 2 / 1e9 * us)
    assert bound.design_us("reduce", s, 2, rates, "slots") is None
    assert bound.design_us("broadcast", s, 2, rates._replace(cma=0.0), "cma") is None


def test_the_bound_is_the_cheapest_design_at_the_rates_measured_nearest_the_size():
    slow_cma, fast_cma = bound.Rates(8e9, 8e9, 1e9, 1e9), bound.Rates(8e9, 8e9, 64e9, 1e9)
    rates = {1 << 16: slow_cma, 1 << 26: fast_cma}
    assert bound.bound_us("broadcast", 1 << 16, 2, rates) == pytest.approx((1 << 16) / 8e9 * 1e6)
    assert bound.bound_us("broadcast", 1 << 25, 2, rates) == pytest.approx((1 << 24) / 64e9 * 1e6)
    assert bound.bound_us("broadcast", 1 << 25, 2, rates, shared=True) == \
        pytest.approx((1 << 25) / 8e9 * 1e6)
    assert bound.bound_us("reduce", 1 << 16, 2, rates) is None


def test_summary_prints_time_over_bound_for_tensorcomm_rows_only(monkeypatch):
    same = bound.Rates(1e9, 1e9, 0.0, 1e9)
    monkeypatch.setattr(bound, "measure", lambda sizes, ranks: dict.fromkeys(sizes, same))
    rows = [_row("broadcast", 1000, time_us=2.0), _row("broadcast", 1000, "mpi"),
            _row("reduce", 1000)]
    lines = bound.summary(rows, 2)
    assert len(lines) == 4 and lines[-1].split()[:2] == ["broadcast", "1000"]
    assert lines[-1].endswith("2.00x")  # 1000 B at 1 GB/s: 1 us
    assert bound.summary([_row("reduce", 1000)], 2) == []


@pytest.mark.spawns
def test_measure_copies_in_every_process_at_once():
    rates = bound.measure([1 << 12], 2)
    assert list(rates) == [1 << 12]
    assert min(rates[1 << 12]) >= 0 and rates[1 << 12].private > 0 and rates[1 << 12].cross > 0
