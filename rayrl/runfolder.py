"""The run-folder contract: every file name and column of a run folder, its CSV writers and readers.

The sweep and `rayrl train` write these files; the report, the doctor, the plan, the drills and the
notebooks read them (rayrl.judge.folder parses them into data frames). Names on disk predate the
phase names used in code (ladder, search, confirm) and stay as they are so that older run folders
resume: :data:`PHASE_DIRS` and :data:`OLD_PHASE_NAMES` say how they map. Plain Python, no Ray.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

# Files
SPEC = "spec.yaml"
SUMMARY = "summary.json"
HISTORY = "history.csv"
DOUBLING = "doubling.csv"
TRIALS = "trials.csv"
CONFIRM = "confirm.csv"
BEST_CONFIG = "best_config.yaml"
POPULATION = "population.csv"
POSTURE = "posture.json"
DRILL = "drill.json"

# Phases: the name in code and in history.csv's ``phase`` column -> the Tune experiment's folder.
LADDER, SEARCH, CONFIRM_PHASE, TRAIN = "ladder", "search", "confirm", "train"
PHASE_DIRS = {LADDER: "phase1", SEARCH: "phase2", CONFIRM_PHASE: "confirm", TRAIN: "tune"}
SWEEP_DIRS = tuple(PHASE_DIRS[p] for p in (LADDER, SEARCH, CONFIRM_PHASE))
#: history.csv phase values written by earlier versions, read as today's
OLD_PHASE_NAMES = {"doubling": LADDER}

# Columns
DOUBLING_COLUMNS = ("batch_size", "env_steps_per_s", "gain", "decision")
EXPAND, STOP, CAP, FAILED = "expand", "stop", "cap", "failed"
DECISIONS = (EXPAND, STOP, CAP, FAILED)
TRIALS_COLUMNS = ("trial_id", "batch_size", "lr", "env_steps", "episode_return_mean", "status")
TRIAL_STATUSES = ("reached_target", "completed", "stopped_early", "error")
CONFIRM_COLUMNS = (
    "candidate",
    "phase2_trial_id",
    "batch_size",
    "lr",
    "seed",
    "trial_id",
    "env_steps",
    "wall_s",
    "usd",
    "episode_return_mean",
    "reached",
    "stopped",
)
#: confirm.csv's ``stopped``: at the target, at the budget, by the race (it could no longer change the
#: choice), or errored
CONFIRM_STOPPED = ("target", "budget", "race", "error")
HISTORY_COLUMNS = (
    "trial_id",
    "phase",
    "batch_size",
    "lr",
    "training_iteration",
    "env_steps",
    "episode_return_mean",
    "eval_return_mean",
    "env_steps_per_s",
    "learner_samples_per_s",
    "total_loss",
    "grad_norm",
    "loss_scale",
    "nonfinite_steps",
    "time_total_s",
    "cpu_util",
    "mem_util",
    "gpu_util",
    "gpu_mem_util",
    "net_util",
    "num_learners",
    "backend",
    "precision",
)


@dataclass(frozen=True)
class LadderRow:
    """One line of doubling.csv: a rung's throughput and the decision taken after measuring it."""

    batch_size: int
    env_steps_per_s: float | None
    gain: float | None
    decision: str


class TextWriter(Protocol):
    """Where a run folder's files go (rayrl.runtime.RunPaths: atomic, uploaded on object storage)."""

    def write_text(self, rel: str, text: str) -> None: ...


def knee(rows: Sequence[LadderRow]) -> int | None:
    """The knee: the last rung whose doubling paid off, i.e. marked expand or cap (None when the first
    rung failed). The ladder decides the marks (rayrl.sweep.ladder); every reader of doubling.csv uses this."""
    best = None
    for row in rows:
        if row.decision in (EXPAND, CAP):
            best = row.batch_size
    return best


def reached(judged_return: Any, target: float | None) -> bool:
    """Whether a judged return counts as at the target: finite and at least ``target``.

    The one rule behind trials.csv's ``reached_target``, confirm.csv's ``reached`` and the stoppers.
    """
    if target is None or judged_return is None:
        return False
    try:
        value = float(judged_return)
    except (TypeError, ValueError):
        return False
    return math.isfinite(value) and value >= target


def rank_trials(trials: Iterable[dict]) -> list[dict]:
    """Phase-2 trials (trials.csv rows) best first: those at the target by fewest env steps (ties: higher
    return), then the rest by highest return; errored trials and trials with no return are left out.

    A trial stops at its first result at or above the target, so among those the final return is
    noise (451 vs 478); the env steps it took are what a production run of that config will pay.
    """
    usable = [t for t in trials if t["episode_return_mean"] is not None and t["status"] != "error"]
    at_target = [t for t in usable if t["status"] == "reached_target" and t["env_steps"] is not None]
    rest = [t for t in usable if not any(t is r for r in at_target)]
    return sorted(at_target, key=lambda t: (t["env_steps"], -t["episode_return_mean"])) + sorted(
        rest, key=lambda t: -t["episode_return_mean"]
    )


def speaking_run(confirm_runs: Iterable[dict], phase2_trial_id: str) -> str | None:
    """The confirmation run that speaks for a candidate (confirm.csv rows): its first run at the target by
    seed, else its first run; None when it has none. A config the search never ran (the spec's own,
    search.confirm_baseline) has no search trial, so its policy, history and report come from here."""
    runs = [r for r in confirm_runs if str(r["phase2_trial_id"]) == str(phase2_trial_id)]
    if not runs:
        return None
    first = min(runs, key=lambda r: (not r["reached"], int(r["seed"])))  # rows as read_confirm parses them
    return str(first["trial_id"])


def write_csv(out: TextWriter, rel: str, columns: Sequence[str], rows: Iterable[dict]) -> None:
    """One run-folder CSV, written in one piece (atomically, and uploaded, by ``out``)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns))
    writer.writeheader()
    writer.writerows(rows)
    out.write_text(rel, buf.getvalue())


def write_doubling(out: TextWriter, rows: Sequence[LadderRow]) -> None:
    write_csv(
        out,
        DOUBLING,
        DOUBLING_COLUMNS,
        [
            {
                "batch_size": r.batch_size,
                "env_steps_per_s": "" if r.env_steps_per_s is None else round(r.env_steps_per_s, 2),
                "gain": "" if r.gain is None else round(r.gain, 4),
                "decision": r.decision,
            }
            for r in rows
        ],
    )


def read_doubling(path: Path) -> list[LadderRow]:
    with path.open() as f:
        return [
            LadderRow(
                int(r["batch_size"]),
                float(r["env_steps_per_s"]) if r["env_steps_per_s"] else None,
                float(r["gain"]) if r["gain"] else None,
                r["decision"],
            )
            for r in csv.DictReader(f)
        ]


def _cell(v: str | None) -> float | None:
    """A CSV cell as a number; an empty cell is None (not yet known)."""
    return float(v) if v not in ("", None) else None


def read_trials(path: Path) -> list[dict]:
    """trials.csv's rows with numbers parsed (empty cells: None), as rank_trials takes them."""
    num = _cell
    with path.open() as f:
        return [
            {
                **r,
                "batch_size": int(r["batch_size"]),
                "lr": float(r["lr"]),
                "env_steps": num(r["env_steps"]),
                "episode_return_mean": num(r["episode_return_mean"]),
            }
            for r in csv.DictReader(f)
        ]


def read_confirm(path: Path) -> list[dict]:
    """confirm.csv's rows with numbers and booleans parsed (``stopped`` empty in files that predate it)."""
    num = _cell
    with path.open() as f:
        return [
            {
                **r,
                "candidate": int(r["candidate"]),
                "batch_size": int(r["batch_size"]),
                "lr": float(r["lr"]),
                "seed": int(r["seed"]),
                "env_steps": num(r["env_steps"]),
                "wall_s": num(r["wall_s"]),
                "usd": num(r["usd"]),
                "episode_return_mean": num(r["episode_return_mean"]),
                "reached": r["reached"] == "True",
                "stopped": r.get("stopped") or "",
            }
            for r in csv.DictReader(f)
        ]


def phase_env_steps(history: Path, phase: str) -> int:
    """Env steps a finished phase consumed, from history.csv (last row per trial; old phase names count)."""
    if not history.exists():
        return 0
    last: dict[str, float] = {}
    with history.open() as f:
        for row in csv.DictReader(f):
            if OLD_PHASE_NAMES.get(row["phase"], row["phase"]) == phase and row["env_steps"]:
                last[row["trial_id"]] = float(row["env_steps"])
    return int(sum(last.values()))


#: Modules named in Tune state pickled before the layout move -> the modules that hold those names now
#: (rayrl.tune.tuner.alias_old_modules applies it before a restore).
OLD_MODULES = {
    "rayrl.algo": ("rayrl.rllib.algo", "rayrl.rllib.callback"),
    "rayrl.learner": ("rayrl.rllib.learner",),
    "rayrl.models": ("rayrl.rllib.models",),
    "rayrl.search": ("rayrl.sweep.search",),
    "rayrl.confirm_stop": ("rayrl.sweep.confirm_run",),
    "rayrl.confirm": ("rayrl.sweep.confirm",),
    "rayrl.throughput": ("rayrl.sweep.ladder",),
    "rayrl.progress": ("rayrl.observe.progress",),
    "rayrl.metrics": ("rayrl.observe.metrics", "rayrl.observe.hardware"),
    "rayrl.keys": ("rayrl.observe.keys",),
    "rayrl.cost": ("rayrl.observe.cost",),
    "rayrl.population": ("rayrl.train.population",),
    "rayrl.train": ("rayrl.tune.tuner", "rayrl.train.run"),
}


def score_share(confirm: dict) -> str:
    """'4 of 5': how many of a candidate's seeds its score covers (a folder written before the score
    existed ranked by the median: 'half')."""
    first = (confirm.get("candidates") or [{}])[0]
    return f"{first['score_k']} of {first.get('runs')}" if first.get("score_k") else "half"
