"""`rayrl doctor RUN_DIR [RUN_DIR ...]`: name the likely causes of a run's problems and their fixes.

The source guide's troubleshooting table as code: each rule is a pure function of
:class:`Evidence` (plain pandas data read from run folders) returning a :class:`Finding` or
None, so each is tested on synthetic results. Several run folders may be given, e.g. the same
config at 1, 2 and 4 learners, so rules that compare scale can see all of them.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rayrl.errors import EXIT_USAGE
from rayrl.judge.evaluation import after_warmup
from rayrl.judge.folder import RunFolderError, load


@dataclass(frozen=True)
class Evidence:
    """What the rules read: every run's history rows, the doubling ladder, the fault drills."""

    history: pd.DataFrame  #: history.csv rows of every run (column "run" added)
    doubling: pd.DataFrame | None = None  #: the first sweep's doubling.csv, if any
    drills: list[dict] = field(default_factory=list)  #: drill entries from every drill.json
    restore_rate: float | None = None  #: the lowest restore_rate any drill.json reports
    warmup_iters: int = 1  #: iterations of each trial not judged


@dataclass(frozen=True)
class Finding:
    """A diagnosis: what was seen (with numbers), the likely cause, the fix."""

    rule: str
    symptom: str
    cause: str
    fix: str


def _judged(ev: Evidence) -> pd.DataFrame:
    return after_warmup(ev.history, ev.warmup_iters)


def communication_bound(ev: Evidence, min_gain: float = 0.15) -> Finding | None:
    """Throughput that does not grow with more learners: the gradient all-reduce dominates.

    Compares the median env steps/s at each learner count seen (across runs); fires when a step
    up in learners raises it by less than ``min_gain`` (the doubling rule's 15%).
    """
    h = _judged(ev).dropna(subset=["num_learners", "env_steps_per_s"])
    by_n = h.groupby("num_learners")["env_steps_per_s"].median().sort_index()
    if len(by_n) < 2:
        return None
    counts, rates = by_n.index.tolist(), by_n.tolist()
    for (n0, r0), (n1, r1) in zip(zip(counts, rates), zip(counts[1:], rates[1:])):
        if r0 > 0 and r1 / r0 - 1 < min_gain:
            return Finding(
                "communication bound",
                f"{int(n0)} -> {int(n1)} learners: env steps/s {r0:,.0f} -> {r1:,.0f} "
                f"({r1 / r0 - 1:+.0%}, under +{min_gain:.0%})",
                "the learners spend their time synchronising gradients, not computing",
                "use NCCL over RDMA (InfiniBand/RoCE; check NCCL_IB_* and that NCCL, not gloo, "
                "is the backend), use fewer learners, or a larger batch per learner so each "
                "all-reduce carries more work",
            )
    return None


def nonfinite_loss(ev: Evidence) -> Finding | None:
    """Skipped non-finite steps, or an infinite loss or gradient norm: the update diverged."""
    h = ev.history
    skipped = h.groupby("trial_id")["nonfinite_steps"].max().fillna(0)
    bad = skipped[skipped > 0]
    inf = h[np.isinf(h["total_loss"].astype(float)) | np.isinf(h["grad_norm"].astype(float))]
    if bad.empty and inf.empty:
        return None
    seen = [f"trial {tid}: {int(n)} non-finite steps skipped" for tid, n in bad.items()]
    if not inf.empty:
        seen.append(f"{len(inf)} iterations with an infinite loss or gradient norm")
    return Finding(
        "non-finite loss",
        "; ".join(seen),
        "exploding gradients or too high a learning rate (or fp16 overflow)",
        "clip gradients at 1.0 (algo.grad_clip: 1.0), lower the lr (halve algo.lr), and with fp16 "
        "keep dynamic loss scaling or switch to precision.mode: bf16",
    )


def uneven_scheduling(ev: Evidence, max_swing: float = 0.20) -> Finding | None:
    """Utilisation swinging by more than ``max_swing`` within a trial: it waits on others.

    Judges GPU utilisation where measured, else CPU; the swing is the 90th minus the 10th
    percentile over a trial's iterations after warm-up (robust to one odd sample).
    """
    h = _judged(ev)
    col = "gpu_util" if h["gpu_util"].notna().any() else "cpu_util"
    worst: tuple[str, float] | None = None
    for tid, g in h.groupby("trial_id"):
        v = g[col].dropna()
        if len(v) < 3:
            continue
        swing = float(v.quantile(0.9) - v.quantile(0.1))
        if swing > max_swing and (worst is None or swing > worst[1]):
            worst = (str(tid), swing)
    if worst is None:
        return None
    return Finding(
        "uneven scheduling",
        f"trial {worst[0]}: {col.replace('_util', '').upper()} utilisation swings by {worst[1]:.0%} "
        f"(10th to 90th percentile; limit {max_swing:.0%})",
        "trials or actors compete for the same devices, so work arrives unevenly",
        "give the scheduler fair-share weights and priorities (Volcano queues and priority classes for "
        "production vs sweeps: cluster_configs/kuberay/volcano-multitenant.yaml), run fewer "
        "concurrent trials (search.max_concurrent), or pin actors with custom resources",
    )


def slow_restores(ev: Evidence, max_recovery_s: float = 300.0) -> Finding | None:
    """Fault drills that failed or took longer than ``max_recovery_s`` to come back."""
    failed = [d.get("name", "?") for d in ev.drills if d.get("outcome") != "recovered"]
    slow = [
        (d.get("name", "?"), float(d["recovery_s"]))
        for d in ev.drills
        if d.get("outcome") == "recovered"
        and d.get("recovery_s") is not None
        and float(d["recovery_s"]) >= max_recovery_s
    ]
    low_rate = ev.restore_rate is not None and ev.restore_rate < 1.0
    if not failed and not slow and not low_rate:
        return None
    seen = (
        ([f"failed: {', '.join(failed)}"] if failed else [])
        + [f"{name} took {s:.0f} s (limit {max_recovery_s:.0f} s)" for name, s in slow]
        + ([f"restore rate {ev.restore_rate:.0%}"] if low_rate else [])
    )
    return Finding(
        "slow or failed checkpoint restores",
        "; ".join(seen),
        "checkpoints are written to and read back from slow remote storage, or are incomplete",
        "checkpoint to local SSD and sync to object storage asynchronously (Tune's storage_path on "
        "local disk plus a background sync to s3://); keep checkpoint.keep >= 2",
    )


def env_runner_bound(ev: Evidence) -> Finding | None:
    """The doubling ladder stopped at its first rung: a bigger batch did not raise throughput.

    Reads doubling.csv as written rung by rung: the second rung's decision is 'stop' when its
    gain stayed under the rule's threshold, so the knee is the first rung.
    """
    d = ev.doubling
    if d is None or len(d) < 2 or d["decision"].iloc[1] != "stop":
        return None
    first, second = d.iloc[0], d.iloc[1]
    gain = second["gain"] if pd.notna(second["gain"]) else second["env_steps_per_s"] / first["env_steps_per_s"] - 1
    return Finding(
        "env runners are the bottleneck",
        f"the ladder stopped at its first rung: batch {int(first['batch_size'])} -> "
        f"{int(second['batch_size'])} gained {gain:+.0%} env steps/s",
        "sampling, not learning, limits throughput: the learner waits for env steps",
        "add env runners (resources.env_runners) or envs per runner (env.envs_per_runner) before "
        "growing the batch; then run the sweep again",
    )


Rule = Callable[[Evidence], "Finding | None"]
RULES: tuple[tuple[str, Rule], ...] = (
    ("throughput does not grow with learners", communication_bound),
    ("non-finite loss", nonfinite_loss),
    ("utilisation swings by more than 20%", uneven_scheduling),
    ("slow or failed checkpoint restores", slow_restores),
    ("doubling ladder stops at its first rung", env_runner_bound),
)


def diagnose(ev: Evidence, rules: Sequence[tuple[str, Rule]] = RULES) -> list[Finding]:
    """Every rule's finding, in table order."""
    return [f for _, rule in rules if (f := rule(ev)) is not None]


def evidence(run_dirs: Sequence[str]) -> Evidence:
    """Load run folders (raising RunFolderError on a bad one) into one Evidence."""
    runs = [load(p) for p in run_dirs]
    history = pd.concat([r.history.assign(run=r.name) for r in runs], ignore_index=True)
    # Trial ids are unique within a run, not across runs.
    history["trial_id"] = history["run"].astype(str) + "/" + history["trial_id"].astype(str)
    doubling = next((r.doubling for r in runs if r.doubling is not None), None)
    drills = [d for r in runs if r.drill for d in r.drill.get("drills") or []]
    rates = [float(r.drill["restore_rate"]) for r in runs if r.drill and r.drill.get("restore_rate") is not None]
    return Evidence(history=history, doubling=doubling, drills=drills, restore_rate=min(rates) if rates else None)


def render(findings: Sequence[Finding]) -> str:
    """Findings as a plain-text table (one block per finding)."""
    if not findings:
        return f"rayrl doctor: no problem found by the {len(RULES)} rules ({'; '.join(name for name, _ in RULES)})."
    out = [f"rayrl doctor: {len(findings)} finding(s)"]
    for i, f in enumerate(findings, 1):
        out += [
            "",
            f"{i}. {f.rule}",
            *textwrap.wrap(f"seen:  {f.symptom}", 100, subsequent_indent="       "),
            *textwrap.wrap(f"cause: {f.cause}", 100, subsequent_indent="       "),
            *textwrap.wrap(f"fix:   {f.fix}", 100, subsequent_indent="       "),
        ]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `rayrl doctor`; exit 2 with one paragraph on a missing or damaged folder."""
    p = argparse.ArgumentParser(
        prog="rayrl doctor",
        description="Diagnose run folders: name likely causes "
        "and fixes (communication bound, non-finite loss, uneven scheduling, slow "
        "restores, env-runner bound). Give several folders to compare scale.",
    )
    p.add_argument("run_dirs", metavar="RUN_DIR", nargs="+", help="run folders ({storage}/{name})")
    args = p.parse_args(argv)
    try:
        findings = diagnose(evidence(args.run_dirs))
    except RunFolderError as exc:
        sys.stderr.write(textwrap.fill(f"rayrl doctor: error: {exc}", width=100) + "\n")
        return EXIT_USAGE
    print(render(findings))
    return 0
