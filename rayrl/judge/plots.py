"""The report's PNG plots: matplotlib Figures made without pyplot (no global backend state).

Separate from the report so that the notebooks draw the same figures `rayrl report` writes, and so
that matplotlib (a dev extra) is imported only when a plot is drawn: without it the report still
writes its tables.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from rayrl.judge.folder import RunFolder, best_trial_id, knee_batch, subject_history
from rayrl.observe import keys


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
    if _no_data(ax, d, "no doubling ladder (not a sweep)") or d is None:
        return ax
    g = min_gain(run)
    ax.plot(d["batch_size"], d["env_steps_per_s"], "o-", color="tab:blue", label="measured env steps/s")
    bars = d["env_steps_per_s"].shift(1) * (1 + g)
    ax.plot(
        d["batch_size"], bars, "_", markersize=22, mew=2, color="tab:red", label=f"needed to keep doubling (+{g:.0%})"
    )
    for _, row in d.iterrows():
        gain = "" if pd.isna(row["gain"]) else f"{row['gain']:+.0%} "
        ax.annotate(
            f"{gain}{row['decision']}",
            (row["batch_size"], row["env_steps_per_s"]),
            textcoords="offset points",
            xytext=(0, 8),
            ha="center",
            fontsize=8,
        )
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


#: Readable names of history.csv's columns, with units, for legends and axes.
LABELS = {
    "episode_return_mean": "episode return (mean of recent episodes)",
    "env_steps_per_s": "env steps/s (end to end)",
    "learner_samples_per_s": "learner samples/s (epochs included)",
    "total_loss": "total loss",
    "cpu_util": "CPU",
    "mem_util": "host memory",
    "gpu_util": "GPU",
    "gpu_mem_util": "GPU memory",
    "net_util": "network (of link speed)",
}
#: Above this many trials a legend would hide the curves: only the best is named.
MAX_NAMED_TRIALS = 12


def _target(ax: Any, target: float | None) -> None:
    if target is not None:
        ax.axhline(target, color="tab:gray", ls=":", lw=1, label=f"target return {target:g}")


def _trial_label(tid: Any, row: Any, best: bool) -> str:
    """ "ID: lr 3.0e-04, batch 4096 (best)"; the bare id where trials.csv lacks a readable lr or batch."""
    lr, batch = (
        pd.to_numeric(pd.Series([row.get(k) if row is not None else None]), errors="coerce").iloc[0]
        for k in ("lr", "batch_size")
    )
    text = f"{tid}: lr {lr:.1e}, batch {batch:.0f}" if pd.notna(lr) and pd.notna(batch) else str(tid)
    return text + (" (best)" if best else "")


def plot_trial_curves(run: RunFolder, ax: Any = None, phase: str = "search") -> Any:
    """Episode return against env steps for every trial of ``phase`` (ASHA's view); best in bold.

    Each trial is named by its lr and batch (up to MAX_NAMED_TRIALS), an x marks a trial the
    scheduler stopped early, and the dotted line is the target return.
    """
    ax = _axes(ax)
    h = run.history[run.history["phase"] == phase] if run.kind == "sweep" else run.history
    best = best_trial_id(run)
    trials = run.trials.set_index(run.trials["trial_id"].astype(str)) if run.trials is not None else None
    named = h["trial_id"].nunique() <= MAX_NAMED_TRIALS
    stopped = False
    for tid, g in h.groupby("trial_id"):
        g = g.dropna(subset=["episode_return_mean"]).sort_values("env_steps")  # NaN: no episode ended yet
        is_best = str(tid) == best
        row = trials.loc[str(tid)] if trials is not None and str(tid) in trials.index else None
        if isinstance(row, pd.DataFrame):  # a trial id listed twice: its last row
            row = row.iloc[-1]
        label = _trial_label(tid, row, is_best) if named or is_best else None
        (line,) = ax.plot(
            g["env_steps"],
            g["episode_return_mean"],
            lw=2.5 if is_best else 1,
            alpha=1 if is_best else 0.7,
            label=label,
            zorder=3 if is_best else 2,
        )
        if row is not None and str(row.get("status")) == "stopped_early" and not g.empty:
            ax.plot(
                g["env_steps"].iloc[-1:], g["episode_return_mean"].iloc[-1:], "x", color=line.get_color(), ms=8, mew=2
            )
            stopped = True
    if stopped:  # one neutral legend entry for every trial's x
        ax.plot([], [], "x", color="black", ms=8, mew=2, label="stopped early (scheduler)")
    _target(ax, run.target_return)
    ax.set_xlabel("env steps")
    ax.set_ylabel(LABELS["episode_return_mean"])
    ax.set_title(f"Trials: return against env steps ({phase})")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    return ax


def plot_lr_return(run: RunFolder, ax: Any = None) -> Any:
    """Each search trial's last return against its lr (log axis over the searched range), coloured by batch
    size, marked by how the trial ended; the best trial ringed, the target dotted."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax = _axes(ax)
    t = run.trials
    if _no_data(ax, t, "no search trials") or t is None:
        return ax
    for batch, g in t.groupby("batch_size"):
        ax.scatter(g["lr"], g["episode_return_mean"], marker="o", s=36, zorder=3, label=f"batch {int(batch)}")
    stopped = t[t["status"] == "stopped_early"]
    if not stopped.empty:  # their return is from the point the scheduler stopped them, not an end result
        ax.scatter(
            stopped["lr"],
            stopped["episode_return_mean"],
            marker="x",
            s=60,
            color="black",
            lw=1,
            zorder=4,
            label="stopped early (return when stopped)",
        )
    best = best_trial_id(run)
    top = t[t["trial_id"].astype(str) == best]
    if not top.empty:
        ax.scatter(
            top["lr"],
            top["episode_return_mean"],
            s=220,
            facecolors="none",
            edgecolors="tab:red",
            lw=1.5,
            zorder=5,
            label=f"best {best}",
        )
    _target(ax, run.target_return)
    search = run.sections["search"]
    ax.set_xscale("log")
    # The searched range (do the best crowd an edge?), widened to any trial outside it.
    ax.set_xlim(min(search.lr_min, t["lr"].min()) / 1.5, max(search.lr_max, t["lr"].max()) * 1.5)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:.0e}"))
    ax.xaxis.set_minor_formatter(NullFormatter())  # unlabeled minor ticks: the labels ran into each other
    ax.set_xlabel(f"learning rate (log scale; searched {search.lr_min:.0e} to {search.lr_max:.0e})")
    ax.set_ylabel("episode return at the trial's end")
    ax.set_title("Learning rate against return (search trials)")
    ax.legend(fontsize=7)
    return ax


def plot_confirm(run: RunFolder, ax: Any = None) -> Any:
    """Each confirmation run's cost to the target per candidate (x: did not reach it, drawn at the top),
    with the candidate's median (bar) and 95% bootstrap interval; the shipped candidate in green."""
    ax = _axes(ax)
    c, runs = run.summary.get("confirm"), run.confirm
    if _no_data(ax, runs, "no confirmation (search.confirm_top_k: 0)") or runs is None or not c:
        return ax
    objective = c["objective"]
    finite = runs.loc[runs["reached"], objective]
    top = float(finite.max()) * 1.15 if len(finite) else 1.0
    labels = []
    for i, k in enumerate(c["candidates"]):
        rows = runs[runs["candidate"] == k["candidate"]]
        colour = "tab:green" if k["candidate"] == c["chosen"] else "tab:blue"
        hit = rows[rows["reached"]]
        ax.scatter([i] * len(hit), hit[objective], color=colour, zorder=3, label="run at target" if i == 0 else None)
        ax.scatter(
            [i] * (len(rows) - len(hit)),
            [top] * (len(rows) - len(hit)),
            marker="x",
            color="tab:red",
            zorder=3,
            label="run missed target" if i == 0 else None,
        )
        if k["median"] is not None:
            lo, hi = k["ci_low"], top if k["ci_high"] is None else k["ci_high"]  # null: a run missed the target
            ax.hlines(k["median"], i - 0.25, i + 0.25, color=colour, lw=2, label="median" if i == 0 else None)
            ax.vlines(i + 0.3, lo, hi, color="grey", lw=1, label="95% interval" if i == 0 else None)
        labels.append(
            f"batch {k['batch_size']}\nlr {k['lr']:.2g}" + ("\n(shipped)" if k["candidate"] == c["chosen"] else "")
        )
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylim(bottom=0, top=top * 1.08)
    unit = {"usd": "USD", "wall_s": "wall s", "env_steps": "env steps"}.get(objective, objective)
    ax.set_ylabel(f"{unit} to return {c.get('target_return')}")
    ax.set_title(f"Confirmation on seeds {c['seeds']}")
    ax.legend(fontsize=7)
    return ax


def plot_training(history: pd.DataFrame, title: str = "Training", target: float | None = None) -> Any:
    """Return, throughput, loss and hardware over the trial's time (one line per trial and figure)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 7), layout="constrained")
    axes = fig.subplots(2, 2)
    fig.suptitle(title)
    panels = [
        (axes[0, 0], ["episode_return_mean"], "episode return"),
        (axes[0, 1], ["env_steps_per_s", "learner_samples_per_s"], "samples / s"),
        (axes[1, 0], ["total_loss"], "total loss (RLlib learner, per iteration)"),
        (axes[1, 1], ["cpu_util", "mem_util", "gpu_util", "gpu_mem_util", "net_util"], "utilisation (fraction, 0..1)"),
    ]
    many = history["trial_id"].nunique() > 1
    for ax, cols, ylabel in panels:
        for tid, g in history.groupby("trial_id"):
            g = g.sort_values(keys.TIME_TOTAL)
            for col in cols:
                v = g[g[col].notna()]  # NaN: not reported that iteration; the line joins its neighbours
                if not v.empty:
                    ax.plot(v[keys.TIME_TOTAL], v[col], ".-", label=f"{LABELS[col]} {tid}" if many else LABELS[col])
        missing = [LABELS[c] for c in cols if not history[c].notna().any()]
        if missing and len(cols) > 1:  # say what is absent rather than leave a reader looking for it
            ax.text(
                0.01,
                0.01,
                "not measured: " + ", ".join(missing),
                transform=ax.transAxes,
                fontsize=7,
                color="tab:gray",
                va="bottom",
            )
        if cols[0] == "episode_return_mean":
            _target(ax, target)
        ax.set_xlabel("trial time (s)")
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
        out["training.png"] = plot_training(subject, title, run.target_return)
    return out
