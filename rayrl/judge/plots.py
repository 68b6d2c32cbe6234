"""The report's PNG plots: matplotlib Figures made without pyplot (no global backend state).

Separate from the report so that the notebooks draw the same figures `rayrl report` writes, and so
that matplotlib (a dev extra) is imported only when a plot is drawn: without it the report still
writes its tables.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from rayrl import keys
from rayrl.judge.runfolder import RunFolder, best_trial_id, knee_batch, subject_history


def _axes(ax: Any = None, size: tuple[float, float] = (6.4, 4.0)) -> Any:
    """The caller's axes (a notebook's subplot), else a fresh Figure's; matplotlib imported here."""
    if ax is not None:
        return ax
    from matplotlib.figure import Figure

    return Figure(figsize=size, layout="constrained").add_subplot()


def _no_data(ax: Any, frame: pd.DataFrame | None, message: str) -> bool:
    """Whether ``frame`` is missing or empty; if so ``message`` is drawn where the plot would be.

    A plot of a run that lacks its data still returns axes (a train run has no ladder), so the
    report and the notebooks never branch on what the folder holds.
    """
    if frame is not None and not frame.empty:
        return False
    ax.text(0.5, 0.5, message, ha="center", transform=ax.transAxes)
    return True


def min_gain(run: RunFolder) -> float:
    """The doubling rule's threshold (spec search.doubling.min_gain)."""
    return run.sections["search"].doubling.min_gain


def plot_doubling(run: RunFolder, ax: Any = None) -> Any:
    """Env steps/s per rung; the bar each rung had to clear (previous x (1 + min_gain)); the knee."""
    ax = _axes(ax)
    d = run.doubling
    if _no_data(ax, d, "no doubling ladder (not a sweep)"):
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
    ax.set_title(f"Doubling ladder (the {g:.0%} rule)")
    ax.legend(fontsize=8)
    return ax


def plot_trial_curves(run: RunFolder, ax: Any = None, phase: str = "search") -> Any:
    """Episode return against env steps for every trial of ``phase`` (ASHA's view); best in bold."""
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
    if _no_data(ax, t, "no phase-2 trials"):
        return ax
    for batch, g in t.groupby("batch_size"):
        ax.scatter(g["lr"], g["episode_return_mean"], label=f"batch {int(batch)}")
    ax.set_xscale("log")
    ax.set_xlabel("lr")
    ax.set_ylabel("episode return (final)")
    ax.set_title("lr against return")
    ax.legend(fontsize=8)
    return ax


def plot_confirm(run: RunFolder, ax: Any = None) -> Any:
    """Each confirmation run's cost to the target per candidate (x: did not reach it, drawn at the top),
    with the candidate's median (bar) and 95% bootstrap interval; the shipped candidate in green."""
    ax = _axes(ax)
    c, runs = run.summary.get("confirm"), run.confirm
    if _no_data(ax, runs, "no confirmation (search.confirm_top_k: 0)") or not c:
        return ax
    objective = c["objective"]
    finite = runs.loc[runs["reached"], objective]
    top = float(finite.max()) * 1.15 if len(finite) else 1.0
    labels = []
    for i, k in enumerate(c["candidates"]):
        rows = runs[runs["candidate"] == k["candidate"]]
        colour = "tab:green" if k["candidate"] == c["chosen"] else "tab:blue"
        hit = rows[rows["reached"]]
        ax.scatter([i] * len(hit), hit[objective], color=colour, zorder=3,
                   label="run at target" if i == 0 else None)
        ax.scatter([i] * (len(rows) - len(hit)), [top] * (len(rows) - len(hit)), marker="x", color="tab:red",
                   zorder=3, label="run missed target" if i == 0 else None)
        if k["median"] is not None:
            lo, hi = k["ci_low"], top if k["ci_high"] is None else k["ci_high"]  # null: a run missed the target
            ax.hlines(k["median"], i - 0.25, i + 0.25, color=colour, lw=2, label="median" if i == 0 else None)
            ax.vlines(i + 0.3, lo, hi, color="grey", lw=1, label="95% interval" if i == 0 else None)
        labels.append(f"batch {k['batch_size']}\nlr {k['lr']:.2g}" + ("\n(shipped)" if k["candidate"] ==
                                                                        c["chosen"] else ""))
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylim(bottom=0, top=top * 1.08)
    unit = {"usd": "USD", "wall_s": "wall s", "env_steps": "env steps"}.get(objective, objective)
    ax.set_ylabel(f"{unit} to return {c.get('target_return')}")
    ax.set_title(f"Confirmation on seeds {c['seeds']}")
    ax.legend(fontsize=7)
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
    """The report's plots by file name (a sweep's ladder, trials and lr; the judged trial's training)."""
    out = {}
    if run.kind == "sweep":
        out["doubling.png"] = plot_doubling(run).figure
        out["trials.png"] = plot_trial_curves(run).figure
        out["lr_return.png"] = plot_lr_return(run).figure
        if run.confirm is not None:
            out["confirm.png"] = plot_confirm(run).figure
    subject = subject_history(run)
    if not subject.empty:
        title = f"{run.name}: " + ("best trial" if run.kind == "sweep" else "training")
        out["training.png"] = plot_training(subject, title)
    return out
