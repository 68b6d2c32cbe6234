"""The five-part acceptance table's rules: thresholds, one pure check per row, the part verdicts.

Kept apart from run folders, plots and markdown so that every verdict is a pure function of plain
numbers, testable on synthetic data without Ray. The five parts are the source guide's: hardware,
training, reward, cost, fault tolerance. Each check returns PASS, FAIL or N/A with the measured
value beside the threshold (N/A says why). The thresholds are a dataclass with the guide's
defaults; a run overrides them with an optional ``acceptance:`` block in its spec.yaml. See
docs/observability.md for every definition.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rayrl.observe import cost
from rayrl.spec import AcceptanceSpec

PASS, FAIL, NA = "PASS", "FAIL", "N/A"
PARTS = ("hardware", "training", "reward", "cost", "fault tolerance")


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


def check_throughput(
    measured: float | None, expected: float | None, source: str, t: Thresholds = Thresholds()
) -> Check:
    """Median env steps/s after warm-up >= expected x (1 - tolerance)."""
    name = "env steps/s (median)"
    if expected is None or not math.isfinite(expected):
        return Check("training", name, "expected figure", source, NA)
    thr = (
        f">= {expected * (1 - t.env_steps_per_s_tolerance):,.0f} ({source} {expected:,.0f} - "
        f"{_pct(t.env_steps_per_s_tolerance)})"
    )
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
    return Check(
        "training",
        name,
        thr,
        f"{n} spikes in {points} points" + (f" ({where})" if where else ""),
        PASS if n == 0 else FAIL,
    )


def check_return(final_return: float | None, target: float | None, judged_by: str = "training") -> Check:
    """Final mean episode return (training or evaluation, as the spec judges) >= the target."""
    name = "episode return (final)" if judged_by == "training" else "evaluation return (final)"
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
        return Check(
            "fault tolerance",
            name,
            thr,
            "no drill.json (run `rayrl drill RUN_DIR`)" if drill is None else "drill.json lists no drills",
            NA,
        )
    failed = [d.get("name", "?") for d in drills if d.get("outcome") != "recovered"]
    times = [
        float(d["recovery_s"]) for d in drills if d.get("outcome") == "recovered" and d.get("recovery_s") is not None
    ]
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
        return Check(
            "fault tolerance",
            name,
            thr,
            "no drill.json (run `rayrl drill RUN_DIR`)" if drill is None else "drill.json has no restores",
            NA,
        )
    return Check("fault tolerance", name, thr, _pct(float(rate)), PASS if rate >= t.restore_rate_min else FAIL)


def check_checkpoints(counts: dict | None) -> Check:
    """The run's last trial process kept every checkpoint (none skipped under back-pressure) and did not
    start over from iteration 0; upload failures (retried) and tier-1 re-uploads are shown beside."""
    name, thr = "checkpoints kept (last trial process)", "0 skipped, no restart from iteration 0"
    if not counts:
        return Check("fault tolerance", name, thr, "not reported (a sweep, or a run before rayrl counted them)", NA)
    skipped, fresh = counts.get("skipped", 0), counts.get("restarted_fresh", 0)
    text = (
        f"{counts.get('uploaded', 0)} uploaded, {counts.get('upload_failures', 0)} failed attempts (retried), "
        f"{skipped} skipped, {counts.get('tier1_reuploads', 0)} re-uploaded from tier 1"
        + ("; started over from iteration 0" if fresh else "")
    )
    return Check("fault tolerance", name, thr, text, PASS if not skipped and not fresh else FAIL)


def part_verdicts(checks: Sequence[Check]) -> dict[str, str]:
    """A part fails if any check fails, passes if any passes (and none fails), else N/A."""
    out = {}
    for part in PARTS:
        verdicts = [c.verdict for c in checks if c.part == part]
        out[part] = FAIL if FAIL in verdicts else PASS if PASS in verdicts else NA
    return out
