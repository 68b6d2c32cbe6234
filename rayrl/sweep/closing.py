"""The sweep's closing summary: what each phase found and what to run next (pure; no Ray).

The same few screens a person reads after a long sweep, built from summary.json and trials.csv's
rows: the ladder, the best search trials, the confirmation's candidates, the choice, the files.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rayrl import runfolder
from rayrl.observe import keys

TOP_TRIALS = 5


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))  # noqa: E731
    return ["  " + line(headers), *("  " + line(r) for r in rows)]


def _fmt(value: Any, spec: str) -> str:
    v = keys.number(value)
    return format(v, spec) if math.isfinite(v) else "-"


def _value(value: Any) -> str:
    """A searched field's value (search.space): numbers to 4 significant digits, lists and text as they are."""
    if isinstance(value, (bool, list)):
        return str(value).lower() if isinstance(value, bool) else str(value)
    try:
        return format(float(value), ".4g")
    except (TypeError, ValueError):
        return "-" if value in (None, "") else str(value)


def _cost(value: Any) -> str:
    """A confirmation cost: summary.json stores infinity (a median or bound past a seed that missed) as null."""
    return "inf" if value is None else _fmt(value, ".4g")


def closing_summary(summary: dict, ladder: list[Any], trials: list[dict], run_dir: str | Path) -> str:
    """The text printed when a sweep ends: summary.json, doubling.csv's and trials.csv's rows."""
    run_dir = Path(run_dir)
    out = [f"[sweep] done in {summary.get('wall_s', 0):.0f}s, {summary.get('env_steps_total', 0):,} env steps"]
    if ladder:
        out.append(f"ladder (env steps/s per batch size; knee {summary.get('knee_batch_size')}):")
        out += _table(
            ["batch", "env steps/s", "gain", "decision"],
            [
                [str(r.batch_size), _fmt(r.env_steps_per_s, ",.0f"), _fmt(r.gain, "+.0%"), str(r.decision)]
                for r in ladder
            ],
        )
    ranked = runfolder.rank_trials(trials)[:TOP_TRIALS]
    searched = [k for k in (trials[0] if trials else {}) if k not in runfolder.TRIALS_COLUMNS]  # search.space
    if ranked:
        out.append(f"search: {len(trials)} trials, {summary.get('stopped_early', 0)} stopped early; the best:")
        out += _table(
            ["trial", "batch", "lr", *searched, "env steps", "return", "status"],
            [
                [
                    str(t["trial_id"]),
                    str(t["batch_size"]),
                    _fmt(t["lr"], ".2e"),
                    *(_value(t.get(k)) for k in searched),
                    _fmt(t["env_steps"], ",.0f"),
                    _fmt(t["episode_return_mean"], ".1f"),
                    str(t["status"]),
                ]
                for t in ranked
            ],
        )
    confirm = summary.get("confirm") or {}
    candidates = confirm.get("candidates") or []
    if candidates:
        objective = confirm.get("objective", "cost")
        out.append(
            f"confirm: {len(candidates)} candidates on seeds {confirm.get('seeds')}, {objective} to return "
            f"{confirm.get('target_return')}: score = the cost within which {runfolder.score_share(confirm)} seeds "
            "got there (the lowest ships), median and its 95% interval; a run that missed counts as infinite:"
        )
        out += _table(
            ["", "candidate", "batch", "lr", "score", "median", "95% interval", "at target", "median return"],
            [
                [
                    "*" if c.get("candidate") == confirm.get("chosen") else "",
                    str(c.get("phase2_trial_id")),
                    str(c.get("batch_size")),
                    _fmt(c.get("lr"), ".2e"),
                    _cost(c.get("score")),
                    _cost(c.get("median")),
                    f"{_cost(c.get('ci_low'))} .. {_cost(c.get('ci_high'))}",
                    f"{c.get('reached')}/{c.get('runs')}",
                    _fmt(c.get("median_return"), ".1f"),
                ]
                for c in candidates
            ],
        )
    best = summary.get("best")
    if best:
        ret = _fmt(best.get("episode_return_mean"), ".1f")
        how = " (confirmed on fresh seeds)" if best.get("confirmed") else " (search only, not confirmed)"
        values = "".join(f" {k} {_value(best[k])}" for k in searched if k in best)
        if confirm.get("spec_won_by_tie"):
            how += f"; no searched config was more than {confirm.get('tie', 0):.0%} cheaper, so the spec's own ships"
        out.append(f"best: batch {best['batch_size']} lr {keys.number(best['lr']):.2e}{values}, return {ret}{how}")
        out.append(f"  config: {run_dir / runfolder.BEST_CONFIG}")
        out.append(f"  train it: rayrl train --config {run_dir / runfolder.BEST_CONFIG}")
    out.append(
        f"files: {run_dir} (summary.json, doubling.csv, trials.csv, confirm.csv, history.csv); "
        f"report and plots: rayrl report {run_dir}"
    )
    return "\n".join(out)
