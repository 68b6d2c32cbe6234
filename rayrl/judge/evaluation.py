"""From a loaded run folder to the acceptance checks: what is judged, against what, at what cost.

The rules themselves are pure (rayrl.judge.acceptance); this is the one place that decides which
iterations they see. A sweep is judged on its best search trial, a train run on its one trial,
both past their warm-up iterations. The expected throughput comes from the doubling ladder, and
the cost figures (the run's USD, the ladder's USD per sample, a configuration's steady-state cost
per effective sample) from rayrl.observe.cost at the run's prices.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from rayrl.judge.acceptance import (
    Check,
    Thresholds,
    check_checkpoints,
    check_cost,
    check_gpu_util,
    check_loss,
    check_memory,
    check_network,
    check_recovery,
    check_restore,
    check_return,
    check_stability,
    check_throughput,
)
from rayrl.judge.folder import RunFolder, knee_batch, subject_history
from rayrl.observe import cost, keys


def after_warmup(history: pd.DataFrame, warmup_iters: int) -> pd.DataFrame:
    """Rows past each trial's warm-up iterations (all rows if that would leave none)."""
    later = history[history[keys.ITERATION] > warmup_iters]
    return later if not later.empty else history


def ladder_costs(run: RunFolder) -> pd.DataFrame | None:
    """The doubling ladder with USD per million samples and the change against the first rung."""
    if run.doubling is None or run.doubling.empty:
        return None
    d = run.doubling.copy()
    res, prices = run.resources, run.prices
    d["usd_per_m_samples"] = [cost.per_million(cost.cost_per_sample_at(res, s, prices)) for s in d["env_steps_per_s"]]
    base = d["usd_per_m_samples"].iloc[0]
    d["change_vs_first"] = [cost.change(v, base) for v in d["usd_per_m_samples"]]
    return d


def run_costs(run: RunFolder) -> dict[str, float]:
    """USD for the run (each trial's resources x its wall time) and USD per effective sample."""
    h = run.history
    per_trial = h.groupby("trial_id").agg(wall_s=(keys.TIME_TOTAL, "max"), env_steps=("env_steps", "max"))
    per_trial = per_trial.fillna(0.0)
    res = run.resources
    usd = cost.run_cost(((res, float(w)) for w in per_trial["wall_s"]), run.prices)
    steps = float(per_trial["env_steps"].sum())
    return {
        "usd": usd,
        "env_steps": steps,
        "usd_per_sample": cost.cost_per_sample(usd, steps),
        "trial_hours": float(per_trial["wall_s"].sum()) / cost.SECONDS_PER_HOUR,
        "gpus_per_trial": res.gpus,
        "cpus_per_trial": res.cpus,
    }


def _ladder_rate(doubling: pd.DataFrame | None, batch: Any) -> float | None:
    if doubling is None or batch is None or (isinstance(batch, float) and math.isnan(batch)):
        return None
    rows = doubling[(doubling["batch_size"] == batch) & doubling["decision"].ne("failed")]
    return float(rows["env_steps_per_s"].iloc[0]) if not rows.empty else None


def config_cost(run: RunFolder, role: str, warmup_iters: int) -> tuple[float | None, str]:
    """Steady-state USD per effective sample of a run's configuration: hourly rate / env steps/s.

    The same measure for every run, start-up excluded: a sweep as subject is the ladder's rung at
    the best trial's batch size (the config it ships; the knee if no best), as baseline its first
    rung (the guide's baseline); a train run is its median env steps/s after warm-up. Returns
    (value or None, what was measured).
    """
    res, prices = run.resources, run.prices
    if run.kind == "sweep":
        if run.doubling is None or run.doubling.empty:
            return None, "no rung in doubling.csv"
        best = (run.summary.get("best") or {}).get("batch_size")
        if role == "subject":
            batch, name = (int(best), "best batch") if best is not None else (knee_batch(run), "knee")
        else:
            batch, name = int(run.doubling["batch_size"].iloc[0]), "first rung"
        rate = _ladder_rate(run.doubling, batch)
        if rate is None or not math.isfinite(rate) or rate <= 0:
            return None, f"no measured rung at batch {batch} in doubling.csv"
        return cost.cost_per_sample_at(res, rate, prices), f"{name} {batch}"
    rate = after_warmup(run.history, warmup_iters)["env_steps_per_s"].median()
    if not rate or not math.isfinite(rate):
        return None, "no env steps/s in history.csv"
    return cost.cost_per_sample_at(res, float(rate), prices), f"{run.name} at {rate:,.0f} steps/s"


def evaluate(run: RunFolder, baseline: RunFolder | None = None, t: Thresholds | None = None) -> list[Check]:
    """All acceptance checks of ``run`` (cost against ``baseline`` if given, else the first rung)."""
    t = t or run.sections["acceptance"]
    subject = subject_history(run)
    judged = after_warmup(subject, t.warmup_iters)
    checks = [
        check_gpu_util(judged["gpu_util"], t),
        check_memory(judged["gpu_mem_util"], judged["mem_util"], t),
        check_network(judged["net_util"], t),
    ]

    batch = judged["batch_size"].mode().iloc[0] if judged["batch_size"].notna().any() else None
    if t.env_steps_per_s is not None:
        expected, source = t.env_steps_per_s, "acceptance.env_steps_per_s"
    else:
        ladder = run.doubling if run.doubling is not None else baseline.doubling if baseline else None
        expected = _ladder_rate(ladder, batch)
        source = (
            f"ladder rung {batch}"
            if expected is not None
            else (
                "no expected figure: set acceptance.env_steps_per_s in spec.yaml, or pass --baseline SWEEP_DIR"
                if ladder is None
                else f"no expected figure: the ladder has no rung at batch {batch}"
            )
        )
    rate = judged["env_steps_per_s"].median() if judged["env_steps_per_s"].notna().any() else None
    checks.append(check_throughput(rate, expected, source, t))
    losses = {str(tid): g["total_loss"].tolist() for tid, g in judged.groupby("trial_id")}
    checks.append(check_loss(losses, t))

    target = t.episode_return if t.episode_return is not None else run.target_return
    column = run.return_column  # the evaluation return when the spec judges by it
    returns = subject[column].dropna()
    checks.append(check_return(float(returns.iloc[-1]) if not returns.empty else None, target, run.judged_by))
    checks.append(check_stability(subject[column], t))

    if baseline is None and run.kind == "train":
        checks.append(
            check_cost(
                None,
                None,
                "no baseline: pass --baseline RUN_DIR (a sweep, whose first rung is "
                "the baseline, or another train run)",
                t,
            )
        )
    else:
        value, ours = config_cost(run, "subject", t.warmup_iters)
        base, theirs = config_cost(baseline or run, "baseline", t.warmup_iters)
        where = f" of {baseline.name}" if baseline is not None else ""
        checks.append(check_cost(value, base, f"{ours} vs {theirs}{where}", t))
    checks += [check_recovery(run.drill, t), check_restore(run.drill, t)]
    if run.kind == "train":
        checks.append(check_checkpoints(run.summary.get("checkpoints")))
    return checks
