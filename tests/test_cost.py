"""The price model's arithmetic (no Ray)."""

import json
import math

import plan_run
import pytest

from rayrl import cli
from rayrl.observe import cost
from rayrl.spec import CostSpec


def test_fleet_month_costs_21_6_million_and_a_tenth_shorter_run_saves_2_16_million(tmp_path, capsys):
    # The design's figure, through what the product computes: `rayrl plan` prices the asked fleet for
    # the deadline (cost.fleet_cost) and what a run 10% shorter saves (cost.savings).
    run = plan_run.write_run(tmp_path / "run", cost={"gpu_hour_usd": 3.0, "cpu_hour_usd": 0.0})
    assert cli.main(["plan", str(run), "--gpus", "10000", "--deadline", str(30 * 24), "--cluster", "h100-ib"]) == 0
    fleet = json.loads((run / "plan.json").read_text())["fleet"]
    assert fleet["gpus"] == 10_000 and fleet["hours"] == 720
    assert fleet["usd"] == pytest.approx(21_600_000.0)
    assert fleet["usd_saved_if_shorter"] == pytest.approx(2_160_000.0)
    assert "10,000 GPUs for 720 h cost $21,600,000; a run 10% shorter saves $2,160,000" in capsys.readouterr().out
    # The same figure through the per-trial path: one "trial" holding 10k GPUs for 30 days.
    per_trial = cost.trial_cost(cost.TrialResources(gpus=10_000, cpus=0), 30 * 24 * 3600, CostSpec(cpu_hour_usd=0))
    assert per_trial == pytest.approx(21_600_000.0)


def test_hourly_rate_adds_gpus_and_cpus_and_applies_the_spot_discount():
    res = cost.TrialResources(gpus=2, cpus=10)
    assert cost.hourly_rate(res, CostSpec(gpu_hour_usd=3.0, cpu_hour_usd=0.05)) == pytest.approx(6.5)
    assert cost.hourly_rate(res, CostSpec(gpu_hour_usd=3.0, cpu_hour_usd=0.05, spot_discount=0.6)) == pytest.approx(2.6)


def test_run_cost_sums_trials_by_their_wall_time():
    prices = CostSpec(gpu_hour_usd=3.0, cpu_hour_usd=0.0)
    one_gpu = cost.TrialResources(gpus=1, cpus=4)
    assert cost.run_cost([(one_gpu, 1800), (one_gpu, 3600)], prices) == pytest.approx(4.5)
    with pytest.raises(ValueError, match="negative"):
        cost.trial_cost(one_gpu, -1, prices)


def test_cost_per_effective_sample_and_per_rung():
    assert cost.cost_per_sample(3.0, 1_000_000) == pytest.approx(3e-6)
    assert cost.per_million(cost.cost_per_sample(3.0, 1_000_000)) == pytest.approx(3.0)
    assert math.isnan(cost.cost_per_sample(3.0, 0))
    # One GPU at $3/h producing 1000 env steps/s: 3.6M samples per hour -> $0.8333 per million.
    rung = cost.cost_per_sample_at(cost.TrialResources(gpus=1, cpus=0), 1000.0, CostSpec(cpu_hour_usd=0))
    assert cost.per_million(rung) == pytest.approx(3.0 / 3.6)
    assert math.isnan(cost.cost_per_sample_at(cost.TrialResources(1, 0), 0.0))


def test_change_against_a_baseline():
    assert cost.change(90.0, 100.0) == pytest.approx(-0.10)
    assert cost.change(115.0, 100.0) == pytest.approx(0.15)
    assert math.isnan(cost.change(1.0, 0.0))
    assert math.isnan(cost.change(1.0, math.nan))
    # Doubling throughput at fixed resources halves the cost per sample.
    res = cost.TrialResources(gpus=1, cpus=2)
    base, doubled = cost.cost_per_sample_at(res, 500.0), cost.cost_per_sample_at(res, 1000.0)
    assert cost.change(doubled, base) == pytest.approx(-0.5)


def test_prices_from_plain_data_validates():
    assert cost.prices_from(None) == CostSpec()
    assert cost.prices_from({"gpu_hour_usd": 2}) == CostSpec(gpu_hour_usd=2.0)
    with pytest.raises(ValueError, match="cost.gpu_hour_usd"):
        cost.prices_from({"gpu_hour_usd": "cheap"})
    with pytest.raises(ValueError, match="spot_discount"):
        cost.prices_from({"spot_discount": 1.0})
