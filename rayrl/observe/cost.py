"""The price model: what a trial, a run or a sample costs, and the change against a baseline.

Pure functions of plain numbers, so the arithmetic behind every cost figure in the report, the
notebooks and the Prometheus gauge is one piece of tested code. Prices come from the spec's
``cost`` section (:class:`rayrl.spec.CostSpec`): USD per GPU-hour and per CPU-hour, less a spot
discount. Time is wall-clock seconds of the resources a trial holds (Tune reserves them for the
whole trial, busy or idle), which is what a cloud bill charges.

An *effective sample* is an env step the learner actually trained on. For PPO, APPO and IMPALA
every sampled env step is trained on, so rayrl counts the env steps sampled (lifetime).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rayrl.spec import CostSpec, build_section

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class TrialResources:
    """What one trial holds for its whole life: GPUs and CPUs (fractions allowed; rayrl.tune.resources
    models it from the spec)."""

    gpus: float
    cpus: float


def hourly_rate(resources: TrialResources, prices: CostSpec = CostSpec()) -> float:
    """USD per hour for ``resources`` at ``prices`` after the spot discount."""
    gross = resources.gpus * prices.gpu_hour_usd + resources.cpus * prices.cpu_hour_usd
    return gross * (1.0 - prices.spot_discount)


def trial_cost(resources: TrialResources, wall_s: float, prices: CostSpec = CostSpec()) -> float:
    """USD for one trial holding ``resources`` for ``wall_s`` seconds."""
    if wall_s < 0:
        raise ValueError(f"wall_s: {wall_s} is negative; a trial's wall time is >= 0 seconds.")
    return hourly_rate(resources, prices) * wall_s / SECONDS_PER_HOUR


def run_cost(trials: Iterable[tuple[TrialResources, float]], prices: CostSpec = CostSpec()) -> float:
    """USD for a run: the sum over its trials of resources x wall time x price."""
    return sum(trial_cost(res, wall_s, prices) for res, wall_s in trials)


def fleet_cost(gpus: float, hours: float, gpu_hour_usd: float = 3.0, spot_discount: float = 0.0) -> float:
    """USD for ``gpus`` GPUs held ``hours`` hours: the back-of-the-envelope figure for a cluster."""
    return gpus * hours * gpu_hour_usd * (1.0 - spot_discount)


def cost_per_sample(cost_usd: float, effective_samples: float) -> float:
    """USD per effective sample; NaN when nothing was trained on (no honest figure exists)."""
    if not effective_samples or effective_samples <= 0 or not math.isfinite(effective_samples):
        return math.nan
    return cost_usd / effective_samples


def cost_per_sample_at(resources: TrialResources, env_steps_per_s: float, prices: CostSpec = CostSpec()) -> float:
    """USD per effective sample for a trial running at ``env_steps_per_s`` (a ladder rung)."""
    if not env_steps_per_s or env_steps_per_s <= 0 or not math.isfinite(env_steps_per_s):
        return math.nan
    return hourly_rate(resources, prices) / (env_steps_per_s * SECONDS_PER_HOUR)


def per_million(usd_per_sample: float) -> float:
    """USD per sample -> USD per million samples (the unit the report and the gauge show)."""
    return usd_per_sample * 1e6


def change(value: float, baseline: float) -> float:
    """Relative change against ``baseline``: -0.1 means 10% lower. NaN if the baseline is 0/NaN."""
    if not baseline or not math.isfinite(baseline) or not math.isfinite(value):
        return math.nan
    return (value - baseline) / baseline


def savings(cost_usd: float, shorter_fraction: float) -> float:
    """USD saved when a run costing ``cost_usd`` is made ``shorter_fraction`` shorter."""
    return cost_usd * shorter_fraction


def prices_from(data: CostSpec | Mapping[str, Any] | None) -> CostSpec:
    """A CostSpec from the spec's ``cost`` section (plain data or the dataclass), validated as the spec is."""
    return data if isinstance(data, CostSpec) else build_section(CostSpec, data, "cost")
