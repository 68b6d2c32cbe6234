"""The doubling rule on synthetic ladders (no Ray)."""

from __future__ import annotations

import pytest

from rayrl.runfolder import CAP, EXPAND, FAILED, STOP, knee
from rayrl.sweep import ladder as T
from rayrl.sweep.ladder import Rung

RULE = dict(factor=2, cap=16384, min_gain=0.15)


def run_ladder(measure, start=2048, **rule):
    """Drive the rule as the Searcher does: ask for the next batch, 'measure' it, repeat."""
    rule = {**RULE, **rule}
    rungs: list[Rung] = []
    while (batch := T.next_batch(rungs, start=start, **rule)) is not None:
        rungs.append(Rung(batch, measure(batch)))
        assert len(rungs) < 20
    rows = T.decide(rungs, **rule)
    return rows, knee(rows)


def decisions(rows):
    return [(r.batch_size, r.decision) for r in rows]


def test_steady_growth_runs_to_the_cap():
    rows, knee = run_ladder(lambda b: b * 1.0)  # doubling doubles throughput
    assert decisions(rows) == [(2048, EXPAND), (4096, EXPAND), (8192, EXPAND), (16384, CAP)]
    assert knee == 16384
    assert rows[0].gain is None and rows[1].gain == pytest.approx(1.0)


def test_saturation_stops_at_the_first_small_gain():
    table = {2048: 1000.0, 4096: 1500.0, 8192: 1700.0, 16384: 1800.0}
    rows, knee = run_ladder(table.__getitem__)
    assert decisions(rows) == [(2048, EXPAND), (4096, EXPAND), (8192, STOP)]
    assert rows[2].gain == pytest.approx(1700 / 1500 - 1)
    assert knee == 4096  # 4096 -> 8192 gained 13%: the last doubling that paid off was 2048 -> 4096


def test_the_issue_example_knee_8192():
    table = {2048: 1000.0, 4096: 1600.0, 8192: 2400.0, 16384: 2600.0}
    rows, knee = run_ladder(table.__getitem__)
    assert decisions(rows)[-1] == (16384, STOP)
    assert knee == 8192


def test_noisy_plateau_stops_and_never_reads_past_the_stop():
    calls = []
    table = {2048: 1000.0, 4096: 1100.0, 8192: 5000.0}  # a noisy jump after the plateau is never measured

    def measure(b):
        calls.append(b)
        return table[b]

    rows, knee = run_ladder(measure)
    assert calls == [2048, 4096]
    assert decisions(rows) == [(2048, EXPAND), (4096, STOP)]
    assert knee == 2048


def test_exactly_min_gain_expands():
    rows, _ = run_ladder({2048: 100.0, 4096: 115.0, 8192: 115.0}.__getitem__)
    assert decisions(rows)[:2] == [(2048, EXPAND), (4096, EXPAND)]


def test_a_drop_stops():
    rows, knee = run_ladder({2048: 1000.0, 4096: 1400.0, 8192: 900.0}.__getitem__)
    assert decisions(rows)[-1] == (8192, STOP)
    assert rows[-1].gain < 0
    assert knee == 4096


def test_failing_first_rung_has_no_knee():
    rows, knee = run_ladder(lambda b: None)
    assert decisions(rows) == [(2048, FAILED)]
    assert knee is None
    assert T.admissible(rows) == []


def test_failing_later_rung_ends_the_ladder_at_the_last_good_rung():
    rows, knee = run_ladder({2048: 1000.0, 4096: 2000.0, 8192: None}.__getitem__)
    assert decisions(rows) == [(2048, EXPAND), (4096, EXPAND), (8192, FAILED)]
    assert knee == 4096
    assert T.admissible(rows) == [2048, 4096]


def test_cap_limits_a_ladder_that_still_pays():
    rows, knee = run_ladder(lambda b: float(b), cap=4096)
    assert decisions(rows) == [(2048, EXPAND), (4096, CAP)]
    assert knee == 4096


def test_start_equal_to_cap_is_one_rung():
    rows, knee = run_ladder(lambda b: 10.0, start=16384)
    assert decisions(rows) == [(16384, CAP)]
    assert knee == 16384


def test_stop_at_the_cap_rung_keeps_the_previous_knee():
    rows, knee = run_ladder({2048: 100.0, 4096: 200.0, 8192: 400.0, 16384: 410.0}.__getitem__)
    assert decisions(rows)[-1] == (16384, STOP)
    assert knee == 8192


def test_rung_throughput_is_the_median_after_warmup():
    assert T.rung_throughput([10.0, 100.0, 300.0, 200.0], warmup=1, measure=3) == 200.0
    assert T.rung_throughput([10.0, 100.0], warmup=1, measure=3) is None  # too few measured iterations
    assert T.rung_throughput([10.0, 100.0, 120.0, 999.0], warmup=1, measure=2) == pytest.approx(110.0)


def test_minibatches_per_epoch_stay_constant():
    # 2048 / 256 = 8 minibatches per epoch at every rung
    assert [T.minibatch_for(b, 2048, 256) for b in (2048, 4096, 16384)] == [256, 512, 2048]
    # below the spec's batch the spec's minibatch stays (capped at the batch): fewer, larger SGD steps
    assert [T.minibatch_for(b, 2048, 256) for b in (1024, 512, 256, 128)] == [256, 256, 256, 128]
    assert T.minibatch_for(1024, 2048, 2048) == 1024
