"""The copy bound printed under the bench's table (``tensorcomm.bench.bound``)."""

from __future__ import annotations

import pytest

from tensorcomm.bench import bound
from tensorcomm.bench.results import Row


def _row(collective: str, size: int, library: str = "tensorcomm", time_us: float = 100.0) -> Row:
    return Row(collective, library, 2, size, size // 4, "float32", "sum", time_us, time_us, time_us,
               1.0, 1.0, 0, 10)


def test_bytes_a_rank_copies_per_call():
    mib = 1 << 20
    assert bound.copied_bytes("all_gather", 4 * mib, 2) == 6 * mib  # publish, take, own: S/2 each
    assert bound.copied_bytes("all_to_all", 4 * mib, 2) == 6 * mib
    assert bound.copied_bytes("reduce_scatter", 4 * mib, 2) == 5 * mib  # S/2, then 3 x S/2 / 2
    assert bound.copied_bytes("broadcast", 4 * mib, 2) == 4 * mib
    assert bound.copied_bytes("all_gather", 4 * mib, 4) == 5 * mib
    assert bound.copied_bytes("all_reduce", 4 * mib, 2) == 9 * mib  # reduce_scatter's, then S out
    assert bound.copied_bytes("reduce", 4 * mib, 2) is None


def test_the_bound_uses_the_rate_measured_nearest_the_size():
    rates = {1 << 16: 1e9, 1 << 26: 4e9}
    assert bound.bound_us("broadcast", 1 << 16, 2, rates) == pytest.approx((1 << 16) / 1e9 * 1e6)
    assert bound.bound_us("broadcast", 1 << 25, 2, rates) == pytest.approx((1 << 25) / 4e9 * 1e6)
    assert bound.bound_us("reduce", 1 << 16, 2, rates) is None


def test_summary_prints_time_over_bound_for_tensorcomm_rows_only(monkeypatch):
    monkeypatch.setattr(bound, "measure", lambda sizes, ranks: dict.fromkeys(sizes, 1e9))
    rows = [_row("broadcast", 1000, time_us=2.0), _row("broadcast", 1000, "mpi"),
            _row("reduce", 1000)]
    lines = bound.summary(rows, 2)
    assert len(lines) == 4 and lines[-1].split()[:2] == ["broadcast", "1000"]
    assert lines[-1].endswith("2.00x")  # 1000 B at 1 GB/s: 1 us
    assert bound.summary([_row("reduce", 1000)], 2) == []


@pytest.mark.spawns
def test_measure_copies_in_every_process_at_once():
    rates = bound.measure([1 << 12], 2)
    assert list(rates) == [1 << 12] and rates[1 << 12] > 0
