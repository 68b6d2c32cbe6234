"""`rayrl report RUN_DIR`: the five-part acceptance check (report.md + PNG plots) for a run folder.

The five parts are the source guide's: hardware, training, reward, cost, fault tolerance. Each
check is a pure function of plain numbers returning PASS, FAIL or N/A with the measured value
beside the threshold (N/A says why), so every verdict can be tested on synthetic data. The
thresholds are a dataclass with the guide's defaults; a run overrides them with an optional
``acceptance:`` block in its spec.yaml. A sweep is judged on its best phase-2 trial, a train
run on its one trial. See docs/observability.md for every definition.
"""

from __future__ import annotations

import argparse
import io
import math
import numbers
import os
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from rayrl import cost, keys
from rayrl.spec import AcceptanceSpec, SpecError, build_section

from rayrl.runfolder import RunFolder, RunFolderError, knee_batch, load, subject_history

PASS, FAIL, NA = "PASS", "FAIL", "N/A"
PARTS = ("hardware", "training", "reward", "cost", "fault tolerance")
EXIT_USAGE = 2


# The thresholds live in the spec (``acceptance:``), documented there with their defaults.
Thresholds = AcceptanceSpec


@dataclass(frozen=True)
class Check:
    """One row of the acceptance table."""

    part: str
    name: str
    threshold: str
    measured: str
    verdict: str


def thresholds_from(spec: dict) -> Thresholds:
    """Thresholds with the spec's optional ``acceptance:`` block applied (validated like any spec)."""
    try:
        return build_section(AcceptanceSpec, spec.get("acceptance"), "acceptance")
    except SpecError as exc:
        raise RunFolderError(f"spec.yaml: {exc}") from None


# ---------------------------------------------------------------------------------------------
# The checks: pure functions of plain numbers


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _finite(values: Iterable[float]) -> np.ndarray:
    arr = np.asarray(pd.to_numeric(pd.Series(list(values), dtype="object"), errors="coerce"), dtype=float)
    return arr[np.isfinite(arr)]


def check_gpu_util(gpu_util: Sequence[float], t: Thresholds = Thresholds()) -> Check:
    """Mean GPU utilisation >= gpu_util_min."""
    v = _finite(gpu_util)
    name, thr = "GPU utilisation (mean)", f">= {_pct(t.gpu_util_min)}"
    if v.size == 0:
        return Check("hardware", name, thr, "no GPU measured (no GPU in the run, or nvidia-ml-py missing)", NA)
    m = float(v.mean())
    return Check("hardware", name, thr, _pct(m), PASS if m >= t.gpu_util_min else FAIL)


def check_memory(gpu_mem_util: Sequence[float], mem_util: Sequence[float], t: Thresholds = Thresholds()) -> Check:
    """Peak memory < mem_util_max: GPU memory and host memory, the worse of the two judged."""
    gpu, host = _finite(gpu_mem_util), _finite(mem_util)
    name, thr = "memory (peak)", f"< {_pct(t.mem_util_max)}"
    parts = ([f"GPU {_pct(gpu.max())}"] if gpu.size else []) + ([f"host {_pct(host.max())}"] if host.size else [])
    if not parts:
        return Check("hardware", name, thr, "no memory figure in history.csv", NA)
    worst = max(x.max() for x in (gpu, host) if x.size)
    return Check("hardware", name, thr, ", ".join(parts), PASS if worst < t.mem_util_max else FAIL)


def check_network(net_util: Sequence[float], t: Thresholds = Thresholds()) -> Check:
    """Peak NIC throughput over link speed < net_util_max."""
    v = _finite(net_util)
    name, thr = "network (peak of link speed)", f"< {_pct(t.net_util_max)}"
    if v.size == 0:
        return Check("hardware", name, thr, "link speed unknown (virtual NIC) or not measured", NA)
    return Check("hardware", name, thr, _pct(v.max()), PASS if v.max() < t.net_util_max else FAIL)


def check_throughput(measured: float | None, expected: float | None, source: str,
                     t: Thresholds = Thresholds()) -> Check:
    """Median env steps/s after warm-up >= expected x (1 - tolerance)."""
    name = "env steps/s (median)"
    if expected is None or not math.isfinite(expected):
        return Check("training", name, "expected figure", source, NA)
    thr = f">= {expected * (1 - t.env_steps_per_s_tolerance):,.0f} ({source} {expected:,.0f} - " \
          f"{_pct(t.env_steps_per_s_tolerance)})"
    if measured is None or not math.isfinite(measured):
        return Check("training", name, thr, "no env steps/s in history.csv", NA)
    ok = measured >= expected * (1 - t.env_steps_per_s_tolerance)
    return Check("training", name, thr, f"{measured:,.0f}", PASS if ok else FAIL)


def loss_spikes(loss: Sequence[float], k: float = 6.0, min_points: int = 5) -> list[int]:
    """Positions of spikes: +/-inf, or a rise over the previous point beyond the usual change.

    A spike is a point whose change from the point before exceeds median + k x scaled MAD
    (1.4826 x the median absolute deviation) of all point-to-point changes. Changes, not levels,
    so a loss that trends (losses drift as returns grow) is not a spike, while a jump out of the
    series' own noise is. NaN means "not reported" and is skipped.
    """
    x = pd.Series(list(loss), dtype=float).reset_index(drop=True)
    spikes = [int(i) for i in x.index[np.isinf(x)]]
    fin = x[np.isfinite(x)]
    if len(fin) >= min_points:
        d = fin.diff().dropna()
        mad = 1.4826 * float((d - d.median()).abs().median())
        floor = 0.01 * abs(float(fin.median())) + 1e-12
        spikes += [int(i) for i in d.index[d > float(d.median()) + k * max(mad, floor)]]
    return sorted(spikes)


def check_loss(losses: dict[str, Sequence[float]], t: Thresholds = Thresholds(), min_points: int = 5) -> Check:
    """No loss spike (see :func:`loss_spikes`) in any judged trial's loss curve."""
    name, thr = "loss without spikes", f"0 rises > median + {t.loss_spike_k:g} MAD of changes"
    reported = {tid: int(pd.Series(list(v), dtype=float).notna().sum()) for tid, v in losses.items()}
    usable = {tid: v for tid, v in losses.items() if reported[tid] >= min_points}
    if not usable:
        return Check("training", name, thr, f"fewer than {min_points} loss points", NA)
    found = {tid: loss_spikes(v, t.loss_spike_k, min_points) for tid, v in usable.items()}
    n = sum(len(s) for s in found.values())
    points = sum(reported[tid] for tid in usable)
    where = "; ".join(f"{tid}: points {s}" for tid, s in found.items() if s)
    return Check("training", name, thr, f"{n} spikes in {points} points" + (f" ({where})" if where else ""),
                 PASS if n == 0 else FAIL)


def check_return(final_return: float | None, target: float | None) -> Check:
    """Final mean episode return >= the target."""
    name = "episode return (final)"
    if target is None:
        return Check("reward", name, "target", "no target: spec stop.episode_return is null", NA)
    thr = f">= {target:g}"
    if final_return is None or not math.isfinite(final_return):
        return Check("reward", name, thr, "no episode finished", NA)
    return Check("reward", name, thr, f"{final_return:.1f}", PASS if final_return >= target else FAIL)


def return_cv(returns: Sequence[float], window: int = 10) -> tuple[float, int]:
    """Coefficient of variation (population std / |mean|) of the last ``window`` finite returns."""
    v = _finite(returns)[-window:]
    if v.size == 0:
        return math.nan, 0
    mean = float(v.mean())
    return (float(v.std()) / abs(mean) if mean else math.inf), int(v.size)


def check_stability(returns: Sequence[float], t: Thresholds = Thresholds(), min_points: int = 3) -> Check:
    """The return's coefficient of variation over the last window iterations < return_cv_max."""
    name, thr = f"return stability (CV, last {t.return_cv_window})", f"< {t.return_cv_max:g}"
    cv, n = return_cv(returns, t.return_cv_window)
    if n < min_points:
        return Check("reward", name, thr, f"{n} returns reported, need >= {min_points}", NA)
    note = "" if n >= t.return_cv_window else f" (only {n} iterations)"
    return Check("reward", name, thr, f"{cv:.3f}{note}", PASS if cv < t.return_cv_max else FAIL)


def check_cost(value: float | None, baseline: float | None, label: str, t: Thresholds = Thresholds()) -> Check:
    """Cost per effective sample at least cost_reduction_min below the baseline's."""
    name, thr = "cost per effective sample vs baseline", f"<= -{_pct(t.cost_reduction_min)}"
    if baseline is None or value is None or not math.isfinite(baseline) or not math.isfinite(value):
        return Check("cost", name, thr, label, NA)
    delta = cost.change(value, baseline)
    measured = f"{delta:+.1%} (${cost.per_million(value):.4g}/M vs ${cost.per_million(baseline):.4g}/M, {label})"
    return Check("cost", name, thr, measured, PASS if delta <= -t.cost_reduction_min else FAIL)


def check_recovery(drill: dict | None, t: Thresholds = Thresholds()) -> Check:
    """Every fault drill recovered, each in under recovery_s_max."""
    name, thr = "recovery time (worst drill)", f"< {t.recovery_s_max:g} s"
    drills = (drill or {}).get("drills") or []
    if not drills:
        return Check("fault tolerance", name, thr, "no drill.json (run `rayrl drill RUN_DIR`)" if drill is None
                     else "drill.json lists no drills", NA)
    failed = [d.get("name", "?") for d in drills if d.get("outcome") != "recovered"]
    times = [float(d["recovery_s"]) for d in drills
             if d.get("outcome") == "recovered" and d.get("recovery_s") is not None]
    worst = max(times) if times else math.nan
    text = (f"{worst:.1f} s" if times else "no recovery") + (f"; failed: {', '.join(failed)}" if failed else "")
    return Check("fault tolerance", name, thr, text, PASS if not failed and worst < t.recovery_s_max else FAIL)


def check_restore(drill: dict | None, t: Thresholds = Thresholds()) -> Check:
    """Checkpoint restore rate (drill.json's restore_rate, else drills recovered / run) >= the minimum."""
    name, thr = "checkpoint restore rate", f">= {_pct(t.restore_rate_min)}"
    drills = (drill or {}).get("drills") or []
    rate = (drill or {}).get("restore_rate")
    if rate is None and drills:
        rate = sum(d.get("outcome") == "recovered" for d in drills) / len(drills)
    if rate is None:
        return Check("fault tolerance", name, thr, "no drill.json (run `rayrl drill RUN_DIR`)" if drill is None
                     else "drill.json has no restores", NA)
    return Check("fault tolerance", name, thr, _pct(float(rate)), PASS if rate >= t.restore_rate_min else FAIL)


def part_verdicts(checks: Sequence[Check]) -> dict[str, str]:
    """A part fails if any check fails, passes if any passes (and none fails), else N/A."""
    out = {}
    for part in PARTS:
        verdicts = [c.verdict for c in checks if c.part == part]
        out[part] = FAIL if FAIL in verdicts else PASS if PASS in verdicts else NA
    return out


# ---------------------------------------------------------------------------------------------
# From a run folder to the checks


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
    return {"usd": usd, "env_steps": steps, "usd_per_sample": cost.cost_per_sample(usd, steps),
            "trial_hours": float(per_trial["wall_s"].sum()) / cost.SECONDS_PER_HOUR,
            "gpus_per_trial": res.gpus, "cpus_per_trial": res.cpus}


def _ladder_rate(doubling: pd.DataFrame | None, batch: Any) -> float | None:
    if doubling is None or batch is None or (isinstance(batch, float) and math.isnan(batch)):
        return None
    rows = doubling[(doubling["batch_size"] == batch) & doubling["decision"].ne("failed")]
    return float(rows["env_steps_per_s"].iloc[0]) if not rows.empty else None


def config_cost(run: RunFolder, role: str, warmup_iters: int = 1) -> tuple[float | None, str]:
    """Steady-state USD per effective sample of a run's configuration: hourly rate / env steps/s.

    The same measure for every run, start-up excluded: a sweep as subject is the ladder's rung at
    the best trial's batch size (the config it ships; the knee if no best), as baseline its first
    rung (the guide's baseline); a train run is its median env steps/s after warm-up. Returns
    (value or None, what was measured).
    """
    res, prices = run.resources, run.prices
    if run.kind == "sweep":
        ladder = ladder_costs(run)
        best = (run.summary.get("best") or {}).get("batch_size")
        if role == "subject":
            batch, name = (int(best), "best batch") if best is not None else (knee_batch(run), "knee")
        else:
            batch, name = int(ladder["batch_size"].iloc[0]), "first rung"
        rows = ladder[ladder["batch_size"] == batch]
        if rows.empty or not math.isfinite(rows["usd_per_m_samples"].iloc[0]):
            return None, f"no measured rung at batch {batch} in doubling.csv"
        return float(rows["usd_per_m_samples"].iloc[0]) / 1e6, f"{name} {batch}"
    rate = after_warmup(run.history, warmup_iters)["env_steps_per_s"].median()
    if not rate or not math.isfinite(rate):
        return None, "no env steps/s in history.csv"
    return cost.cost_per_sample_at(res, float(rate), prices), f"{run.name} at {rate:,.0f} steps/s"


def evaluate(run: RunFolder, baseline: RunFolder | None = None, t: Thresholds | None = None) -> list[Check]:
    """All acceptance checks of ``run`` (cost against ``baseline`` if given, else the first rung)."""
    t = t or thresholds_from(run.spec)
    subject = subject_history(run)
    judged = after_warmup(subject, t.warmup_iters)
    checks = [check_gpu_util(judged["gpu_util"], t), check_memory(judged["gpu_mem_util"], judged["mem_util"], t),
              check_network(judged["net_util"], t)]

    batch = judged["batch_size"].mode().iloc[0] if judged["batch_size"].notna().any() else None
    if t.env_steps_per_s is not None:
        expected, source = t.env_steps_per_s, "acceptance.env_steps_per_s"
    else:
        ladder = run.doubling if run.doubling is not None else baseline.doubling if baseline else None
        expected = _ladder_rate(ladder, batch)
        source = f"ladder rung {batch}" if expected is not None else (
            "no expected figure: set acceptance.env_steps_per_s in spec.yaml, or pass --baseline SWEEP_DIR"
            if ladder is None else f"no expected figure: the ladder has no rung at batch {batch}")
    rate = judged["env_steps_per_s"].median() if judged["env_steps_per_s"].notna().any() else None
    checks.append(check_throughput(rate, expected, source, t))
    losses = {str(tid): g["total_loss"].tolist() for tid, g in judged.groupby("trial_id")}
    checks.append(check_loss(losses, t))

    target = t.episode_return if t.episode_return is not None else run.target_return
    returns = subject["episode_return_mean"].dropna()
    checks.append(check_return(float(returns.iloc[-1]) if not returns.empty else None, target))
    checks.append(check_stability(subject["episode_return_mean"], t))

    if baseline is None and run.kind == "train":
        checks.append(check_cost(None, None, "no baseline: pass --baseline RUN_DIR (a sweep, whose first rung is "
                                 "the baseline, or another train run)", t))
    else:
        value, ours = config_cost(run, "subject", t.warmup_iters)
        base, theirs = config_cost(baseline or run, "baseline", t.warmup_iters)
        where = f" of {baseline.name}" if baseline is not None else ""
        checks.append(check_cost(value, base, f"{ours} vs {theirs}{where}", t))
    checks += [check_recovery(run.drill, t), check_restore(run.drill, t)]
    return checks


# ---------------------------------------------------------------------------------------------
# Plots: matplotlib Figures made without pyplot (no global backend state); the notebooks use them


def _axes(ax: Any = None, size: tuple[float, float] = (6.4, 4.0)) -> Any:
    if ax is not None:
        return ax
    from matplotlib.figure import Figure

    return Figure(figsize=size, layout="constrained").add_subplot()


def min_gain(run: RunFolder) -> float:
    """The doubling rule's threshold (spec search.doubling.min_gain, default 15%)."""
    return float(((run.spec.get("search") or {}).get("doubling") or {}).get("min_gain", 0.15))


def plot_doubling(run: RunFolder, ax: Any = None) -> Any:
    """Env steps/s per rung; the bar each rung had to clear (previous x (1 + min_gain)); the knee."""
    ax = _axes(ax)
    d = run.doubling
    if d is None or d.empty:
        ax.text(0.5, 0.5, "no doubling ladder (not a sweep)", ha="center", transform=ax.transAxes)
        return ax
    g = min_gain(run)
    ax.plot(d["batch_size"], d["env_steps_per_s"], "o-", color="tab:blue", label="measured env steps/s")
    bars = d["env_steps_per_s"].shift(1) * (1 + g)
    ax.plot(d["batch_size"], bars, "_", markersize=22, mew=2, color="tab:red",
            label=f"needed to keep doubling (+{g:.0%})")
    for _, row in d.iterrows():
        gain = "" if pd.isna(row["gain"]) else f"{row['gain']:+.0%} "
        ax.annotate(f"{gain}{row['decision']}", (row["batch_size"], row["env_steps_per_s"]),
                    textcoords="offset points", xytext=(0, 8), ha="center", fontsize=8)
    knee = knee_batch(run)
    if knee is not None:
        ax.axvline(knee, color="tab:green", ls="--", label=f"knee {knee}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(d["batch_size"]), [str(int(b)) for b in d["batch_size"]])
    ax.margins(x=0.1, y=0.15)
    ax.set_xlabel("train batch per learner (env steps)")
    ax.set_ylabel("env steps / s")
    ax.set_title("Doubling ladder (the 15% rule)")
    ax.legend(fontsize=8)
    return ax


def plot_trial_curves(run: RunFolder, ax: Any = None, phase: str = "search") -> Any:
    """Episode return against env steps for every trial of ``phase`` (ASHA's view); best in bold."""
    from rayrl.runfolder import best_trial_id

    ax = _axes(ax)
    h = run.history[run.history["phase"] == phase] if run.kind == "sweep" else run.history
    best = best_trial_id(run)
    for tid, g in h.groupby("trial_id"):
        g = g.sort_values("env_steps")
        is_best = str(tid) == best
        label = f"{tid} (best)" if is_best else None
        ax.plot(g["env_steps"], g["episode_return_mean"], lw=2.5 if is_best else 1, alpha=1 if is_best else 0.6,
                label=label)
    ax.set_xlabel("env steps")
    ax.set_ylabel("episode return (mean)")
    ax.set_title(f"Trials: return against env steps ({phase})")
    if best is not None:
        ax.legend(fontsize=8)
    return ax


def plot_lr_return(run: RunFolder, ax: Any = None) -> Any:
    """Final return of each phase-2 trial against its lr, coloured by batch size."""
    ax = _axes(ax)
    t = run.trials
    if t is None or t.empty:
        ax.text(0.5, 0.5, "no phase-2 trials", ha="center", transform=ax.transAxes)
        return ax
    for batch, g in t.groupby("batch_size"):
        ax.scatter(g["lr"], g["episode_return_mean"], label=f"batch {int(batch)}")
    ax.set_xscale("log")
    ax.set_xlabel("lr")
    ax.set_ylabel("episode return (final)")
    ax.set_title("lr against return")
    ax.legend(fontsize=8)
    return ax


def plot_training(history: pd.DataFrame, title: str = "Training") -> Any:
    """Return, throughput, loss and hardware over wall time (one line per trial)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 7), layout="constrained")
    axes = fig.subplots(2, 2)
    fig.suptitle(title)
    panels = [(axes[0, 0], ["episode_return_mean"], "episode return"),
              (axes[0, 1], ["env_steps_per_s", "learner_samples_per_s"], "per second"),
              (axes[1, 0], ["total_loss"], "total loss"),
              (axes[1, 1], ["cpu_util", "mem_util", "gpu_util", "gpu_mem_util", "net_util"], "utilisation (0..1)")]
    many = history["trial_id"].nunique() > 1
    for ax, cols, ylabel in panels:
        for tid, g in history.groupby("trial_id"):
            g = g.sort_values(keys.TIME_TOTAL)
            for col in cols:
                if g[col].notna().any():
                    ax.plot(g[keys.TIME_TOTAL], g[col], ".-", label=f"{col} {tid}" if many else col)
        ax.set_xlabel("time (s)")
        ax.set_ylabel(ylabel)
        if cols[0] == "cpu_util":
            ax.set_ylim(0, 1.05)
        if ax.lines:
            ax.legend(fontsize=7)
    return fig


def figures(run: RunFolder) -> dict[str, Any]:
    """The report's plots by file name."""
    out = {}
    if run.kind == "sweep":
        out["doubling.png"] = plot_doubling(run).figure
        out["trials.png"] = plot_trial_curves(run).figure
        out["lr_return.png"] = plot_lr_return(run).figure
    subject = subject_history(run)
    if not subject.empty:
        title = f"{run.name}: " + ("best trial" if run.kind == "sweep" else "training")
        out["training.png"] = plot_training(subject, title)
    return out


# ---------------------------------------------------------------------------------------------
# report.md


def _table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    esc = lambda v: str(v).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(esc(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _fmt(v: Any, spec: str = ",.4g") -> str:
    if isinstance(v, numbers.Real) and not isinstance(v, bool):
        return format(v, spec) if math.isfinite(v) else "-"
    return "-" if v is None or v is pd.NA else str(v)


def render(run: RunFolder, checks: Sequence[Check], plots: Iterable[str], baseline: RunFolder | None = None) -> str:
    """report.md's text."""
    s = run.summary
    parts = part_verdicts(checks)
    out = [f"# rayrl report: {run.name}", "", "## Summary", ""]
    rows = [("kind", run.kind), ("env", (run.spec.get("env") or {}).get("id", "-")),
            ("algorithm", (run.spec.get("algo") or {}).get("name", "-"))]
    if run.kind == "sweep":
        best = s.get("best") or {}
        rows += [("knee batch size", _fmt(s.get("knee_batch_size"), "d")),
                 ("best", f"batch {_fmt(best.get('batch_size'), 'd')}, lr {_fmt(best.get('lr'), '.3g')}, return "
                          f"{_fmt(best.get('episode_return_mean'), '.1f')}"),
                 ("trials", _fmt(s.get("trials"))), ("stopped early", _fmt(s.get("stopped_early")))]
    rows += [("env steps", _fmt(s.get("env_steps_total", s.get("env_steps")), ",.0f")),
             ("wall time (s)", _fmt(s.get("wall_s"), ",.0f"))]
    if baseline is not None:
        rows.append(("baseline", str(baseline.path)))
    out += [_table(rows, ("", "")), ""]
    out += [f"- note: {n}" for n in run.notes] + ([""] if run.notes else [])

    out += ["## Acceptance", "", _table([(p, parts[p]) for p in PARTS], ("part", "verdict")), "",
            _table([(c.part, c.name, c.threshold, c.measured, c.verdict) for c in checks],
                   ("part", "check", "threshold", "measured", "verdict")), ""]

    rc = run_costs(run)
    p = run.prices
    out += ["## Cost", "",
            f"Prices: ${p.gpu_hour_usd:g}/GPU-hour, ${p.cpu_hour_usd:g}/CPU-hour, spot discount "
            f"{p.spot_discount:.0%}; each trial holds {rc['gpus_per_trial']:g} GPU and {rc['cpus_per_trial']:g} CPU.",
            "", _table([("trial-hours", _fmt(rc["trial_hours"], ".3f")), ("run cost (USD)", _fmt(rc["usd"], ",.4f")),
                        ("env steps trained", _fmt(rc["env_steps"], ",.0f")),
                        ("USD per million samples", _fmt(cost.per_million(rc["usd_per_sample"])))], ("", "")), ""]
    ladder = ladder_costs(run)
    out += ["## Throughput ladder", ""]
    if ladder is None:
        out += ["Not applicable: a train run has no doubling ladder (run a sweep for one).", ""]
    else:
        out += [_table([(int(r.batch_size), _fmt(r.env_steps_per_s, ",.0f"), _fmt(r.gain, "+.1%"), r.decision,
                         _fmt(r.usd_per_m_samples), _fmt(r.change_vs_first, "+.1%")) for r in ladder.itertuples()],
                       ("batch", "env steps/s", "gain", "decision", "USD / M samples", "vs first rung")), ""]
    out += ["## Trials", ""]
    if run.trials is None:
        out += ["Not applicable: a train run is one trial (see Training).", ""]
    elif run.trials.empty:
        out += ["No phase-2 trial reported.", ""]
    else:
        t = run.trials.sort_values("episode_return_mean", ascending=False)
        out += [_table([(r.trial_id, int(r.batch_size), _fmt(r.lr, ".3g"), _fmt(r.env_steps, ",.0f"),
                         _fmt(r.episode_return_mean, ".1f"), r.status) for r in t.itertuples()],
                       ("trial", "batch", "lr", "env steps", "return", "status")), ""]
    subject = subject_history(run)
    out += ["## Training", ""]
    if subject.empty:
        out += ["No iterations of the judged trial in history.csv.", ""]
    else:
        last = subject.iloc[-1]
        out += [_table([("trial", last["trial_id"]), ("iterations", _fmt(last[keys.ITERATION], ",.0f")),
                        ("env steps", _fmt(last["env_steps"], ",.0f")),
                        ("median env steps/s", _fmt(subject["env_steps_per_s"].median(), ",.0f")),
                        ("final return", _fmt(last["episode_return_mean"], ".1f")),
                        ("non-finite steps", _fmt(subject["nonfinite_steps"].max(), ",.0f")),
                        ("precision / backend", f"{last['precision']} / {last['backend']}")], ("", "")), ""]
    out += ["## Fault tolerance", ""]
    if run.drill is None:
        out += ["No drill.json: run `rayrl drill RUN_DIR` to measure recovery and checkpoint restores.", ""]
    else:
        out += [_table([(d.get("name"), _fmt(d.get("recovery_s"), ".1f"), d.get("outcome"))
                        for d in run.drill.get("drills") or []], ("drill", "recovery (s)", "outcome")), ""]
    out += ["## Plots", ""] + [f"![{Path(name).stem}](plots/{name})" for name in plots] + [""]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rayrl report", description="Write report.md and plots/*.png for a run "
                                "folder: the five-part acceptance table (hardware, training, reward, cost, "
                                "fault tolerance) with PASS / FAIL / N/A and the measured values.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder: {storage}/{name} of a sweep or `rayrl train`")
    p.add_argument("--baseline", metavar="RUN_DIR", default=None,
                   help="compare cost per effective sample against this run (default: the ladder's first rung)")
    p.add_argument("--out", metavar="DIR", default=None, help="where report.md and plots/ go (default: RUN_DIR)")
    p.add_argument("--strict", action="store_true", help="exit 1 when any check fails")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `rayrl report`; exit 2 (one paragraph, nothing written) on a bad folder."""
    args = build_parser().parse_args(argv)
    try:
        run = load(args.run_dir)
        baseline = load(args.baseline) if args.baseline else None
        checks = evaluate(run, baseline)
        try:
            pngs = {name: _png(fig) for name, fig in figures(run).items()}
        except ImportError:  # matplotlib is in the dev extra; the tables need no plots
            pngs = {}
            run.notes.append("no plots: matplotlib is not installed (pip install matplotlib).")
        text = render(run, checks, pngs, baseline)
        out = Path(args.out) if args.out else run.path
        _write(out, text, pngs)
    except (RunFolderError, OSError) as exc:
        sys.stderr.write(textwrap.fill(f"rayrl report: error: {exc}", width=100) + "\n")
        return EXIT_USAGE
    verdicts = part_verdicts(checks)
    print(f"rayrl report: {out / 'report.md'}: " + ", ".join(f"{p} {v}" for p, v in verdicts.items()))
    return 1 if args.strict and FAIL in verdicts.values() else 0


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _write(out: Path, text: str, pngs: dict[str, bytes]) -> None:
    """Everything is rendered before this runs; each file is replaced atomically."""
    (out / "plots").mkdir(parents=True, exist_ok=True)
    for name, data in {**{f"plots/{n}": d for n, d in pngs.items()}, "report.md": text.encode()}.items():
        tmp = out / (name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, out / name)
