"""What a tracked trial is called and what it records: pure functions of a spec and a Tune result."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

from rayrl.observe import keys
from rayrl.spec import Spec, schedule, to_dict

# Result keys outside the rayrl section that rayrl's readers use, under the names trackers show.
TRACKED = {
    keys.ENV_STEPS: "rayrl/env_steps",
    keys.EPISODE_RETURN: "rayrl/episode_return_mean",
    keys.ITERATION: "rayrl/iteration",
    keys.TIME_TOTAL: "rayrl/time_total_s",
}


def run_name(trial: Any, phase: str) -> str:
    """'search_b2048_lr3.0e-04_ab12c_00003': phase, batch and lr readable in any tracker's run list."""
    config = getattr(trial, "config", {}) or {}
    batch = config.get("train_batch_size_per_learner", config.get("_train_batch_size_per_learner"))
    lr = config.get("rayrl_lr", schedule.first(config.get("lr")))
    lr_text = f"{lr:.1e}" if isinstance(lr, (int, float)) else "na"
    return f"{phase}_b{batch}_lr{lr_text}_{trial.trial_id}"


def rayrl_metrics(result: Mapping[str, Any]) -> dict[str, float]:
    """rayrl's finite numeric result keys: the rayrl section plus env steps, return, iteration, time."""
    out: dict[str, float] = {}
    for key, name in TRACKED.items():
        value = keys.lookup(dict(result), key)
        if _finite(value):
            out[name] = float(value)
    section = result.get("rayrl")
    flat = (
        section.items()
        if isinstance(section, Mapping)
        else ((k.removeprefix("rayrl/"), v) for k, v in result.items() if k.startswith("rayrl/"))
    )
    for key, value in flat:
        if _finite(value):
            out[f"rayrl/{key}"] = float(value)
    return out


def _finite(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def trial_params(spec: Spec, config: Mapping[str, Any]) -> dict[str, Any]:
    """The trial's spec values, dotted (algo.lr, resources.learners, ...): the spec with the values the
    search chose for this trial (batch, minibatch, lr) put in place of the spec's own."""
    flat = flatten(to_dict(spec))
    flat.pop("tracking.mlflow.tracking_uri", None)  # where the params go, not what the trial ran
    if "train_batch_size_per_learner" in config:
        flat["algo.train_batch_per_learner"] = config["train_batch_size_per_learner"]
    if "minibatch_size" in config:
        flat["algo.minibatch_size"] = config["minibatch_size"]
    if "rayrl_lr" in config:  # the search: the lr Optuna chose, before the learner scaling rule
        flat["algo.lr"] = config["rayrl_lr"]
    elif isinstance(schedule.first(config.get("lr")), (int, float)):  # the RLlib lr is the scaled one; undo it
        flat["algo.lr"] = float(schedule.first(config["lr"]) or 0.0) / (spec.effective_lr / spec.algo.lr)
    if isinstance(config.get("entropy_coeff"), (int, float)):  # a population's own draw
        flat["algo.entropy_coeff"] = config["entropy_coeff"]
    return flat


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out
