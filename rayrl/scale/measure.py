"""Measured inputs for the scaling model, read from a run folder and Tune's files beside it.

RLlib's iteration timers (``timers/env_runner_sampling_timer``, ``timers/learner_update_timer``)
are exponential moving averages (coefficient 0.01), so the figure after a few iterations is
mostly the first, warm-up iteration; :func:`unsmooth` recovers each iteration's own time, and the
median after the first iteration is the measurement. Gradient bytes are the policy and value
MLPs' parameters (RLlib's default model: separate encoders, ``vf_share_layers: False``) x 4
bytes (DDP all-reduces fp32 gradients), counted from the env's spaces.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from rayrl import runfolder
from rayrl.judge.folder import RunFolder, RunFolderError, best_trial_id, knee_batch, load
from rayrl.observe import keys
from rayrl.scale.model import Measured, fit_critical_batch, min_env_steps

RLLIB_TIMER_EMA = 0.01
SAMPLE_TIMER = "timers/env_runner_sampling_timer"
LEARN_TIMER = "timers/learner_update_timer"
SAMPLED = "env_runners/num_env_steps_sampled"


def unsmooth(ema: Sequence[float], coeff: float = RLLIB_TIMER_EMA) -> list[float]:
    """Each iteration's own value from an EMA series (the first EMA value is the first value)."""
    out = [float(ema[0])] if len(ema) else []
    for prev, cur in zip(ema, ema[1:]):
        out.append((float(cur) - (1.0 - coeff) * float(prev)) / coeff)
    return out


def steady(values: Sequence[float]) -> float:
    """Median after the first (warm-up) iteration; the only value when there is one."""
    rest = list(values[1:]) or list(values)
    return float(statistics.median(rest))


def mlp_params(obs_dim: int, action_dim: int, hidden: Sequence[int]) -> int:
    """Parameters of a policy MLP (obs -> hidden -> action_dim) and a value MLP (obs -> hidden -> 1)."""

    def mlp(sizes: list[int]) -> int:
        return sum(a * b + b for a, b in zip(sizes, sizes[1:]))

    return mlp([obs_dim, *hidden, action_dim]) + mlp([obs_dim, *hidden, 1])


def space_dims(env_id: str, env_config: dict | None = None) -> tuple[int, int]:
    """(flat observation size, policy output size) of the env: Discrete n -> n, Box d -> 2d (mean, log std)."""
    import gymnasium
    import numpy as np

    from rayrl.spec import resolve_factory

    if ":" in env_id:
        env = resolve_factory(env_id)(dict(env_config or {}))
    else:
        if env_id.startswith("ALE/"):
            import ale_py

            gymnasium.register_envs(ale_py)
        env = gymnasium.make(env_id, **dict(env_config or {}))
    try:
        obs = int(np.prod(env.observation_space.shape))
        act = env.action_space
        out = int(act.n) if hasattr(act, "n") else 2 * int(np.prod(act.shape))
    finally:
        env.close()
    return obs, out


def trial_progress(run: RunFolder) -> tuple[pd.DataFrame, str]:
    """Tune's progress.csv of the trial the plan measures: the best search trial, else the knee rung,
    else (a train run) the run's trial; with the trial id."""
    root = run.path
    candidates: list[tuple[str, str]] = []
    if run.kind == "sweep":
        best = best_trial_id(run)
        if best:
            candidates.append((runfolder.PHASE_DIRS[runfolder.SEARCH], best))
        knee = knee_batch(run)
        rungs = run.history[(run.history["phase"] == runfolder.LADDER) & (run.history["batch_size"] == knee)]
        candidates += [(runfolder.PHASE_DIRS[runfolder.LADDER], str(t)) for t in rungs["trial_id"].unique()]
    else:
        candidates += [
            (runfolder.PHASE_DIRS[runfolder.TRAIN], str(t)) for t in run.history["trial_id"].dropna().unique()
        ]
    for folder, trial in candidates:
        for path in sorted((root / folder).glob(f"*{trial}*/progress.csv")):
            frame = pd.read_csv(path)
            if {SAMPLE_TIMER, LEARN_TIMER} <= set(frame.columns) and len(frame):
                return frame, trial
    raise RunFolderError(
        f"{root}: no Tune progress.csv with RLlib's iteration timers for the measured trial "
        f"(looked for {', '.join(f'{f}/*{t}*/progress.csv' for f, t in candidates) or 'none'}); "
        "the plan needs the Tune experiment folders the run wrote beside its csv files."
    )


def target_points(run: RunFolder, target: float | None = None) -> list[tuple[float, float]]:
    """(global batch, env steps to target) for every trial that reached ``target`` (default: the run's)."""
    target = run.target_return if target is None else target
    if target is None:
        return []
    points = []
    for _trial, rows in run.history.groupby("trial_id"):
        if (rows["phase"] == runfolder.LADDER).all():
            continue
        rows = rows.sort_values("env_steps")
        hit = rows[rows["episode_return_mean"] >= target]
        if len(hit):
            learners = max(int(rows["num_learners"].fillna(0).iloc[0]), 1)
            points.append((float(rows["batch_size"].iloc[0]) * learners, float(hit["env_steps"].iloc[0])))
    return points


def measure(
    run_dir: str | Path,
    grad_bytes: float | None = None,
    critical_batch: float | None = None,
    target: float | None = None,
) -> tuple[Measured, dict[str, Any]]:
    """The model's inputs from ``run_dir``, and a dict saying where each came from (for plan.json)."""
    run = load(run_dir)
    spec, res = run.spec, run.sections["resources"]
    algo = spec.get("algo") or {}
    env = spec.get("env") or {}
    frame, trial = trial_progress(run)
    batch = (
        int(frame["rayrl/global_batch"].iloc[-1])
        if "rayrl/global_batch" in frame
        else int(algo.get("train_batch_per_learner", 2048))
    )
    learners = res.learners
    per_learner = batch // max(learners, 1)
    minibatch = (
        int(frame[keys.EFFECTIVE_MINIBATCH].iloc[-1])
        if keys.EFFECTIVE_MINIBATCH in frame
        else int(algo.get("minibatch_size", 256))
    )
    sample_s = steady(unsmooth(frame[SAMPLE_TIMER].tolist()))
    learn_s = steady(unsmooth(frame[LEARN_TIMER].tolist()))
    sampled = steady(frame[SAMPLED].tolist()) if SAMPLED in frame else float(batch)
    sources: dict[str, Any] = {
        "trial": trial,
        "iterations": int(len(frame)),
        "sample_s": sample_s,
        "learn_s": learn_s,
        "env_steps_per_iteration": sampled,
    }
    if grad_bytes is None:
        obs, out = space_dims(env.get("id", "CartPole-v1"), env.get("config"))
        params = mlp_params(obs, out, algo.get("hidden", [64, 64]))
        grad_bytes = 4.0 * params
        sources["grad_bytes"] = f"{params} parameters x 4 bytes (obs {obs}, policy outputs {out})"
    else:
        sources["grad_bytes"] = "--grad-bytes"
    target = run.target_return if target is None else target
    points = target_points(run, target)
    fit = fit_critical_batch(points)
    e_target = None
    if critical_batch is not None:
        crit, sources["critical_batch"] = critical_batch, "--critical-batch"
    elif fit is not None:
        crit, sources["critical_batch"] = fit[1], f"fitted over {len(points)} trials that reached the target"
    else:
        crit = float(run.sections["search"].doubling.cap)
        sources["critical_batch"] = "search.doubling.cap (the guide: sample efficiency falls above it)"
    if points:
        # E_min from every trial that reached the target, expressed at the measured batch.
        e_min = statistics.median(min_env_steps(e, b, crit) for b, e in points)
        e_target = e_min * (1.0 + batch / crit)
        sources["env_steps_to_target"] = f"{len(points)} trial(s) reached return {target:g}"
    else:
        sources["env_steps_to_target"] = (
            f"no trial reached return {target:g}: time and cost to target unknown"
            if target is not None
            else "the run has no target return (--target)"
        )
    m = Measured(
        algo=str(algo.get("name", "PPO")),
        batch_per_learner=per_learner,
        minibatch=minibatch,
        epochs=int(algo.get("epochs", 1)),
        learners=learners,
        env_runners=res.env_runners,
        sample_s=sample_s * batch / sampled if sampled > 0 else sample_s,
        learn_s=learn_s,
        grad_bytes=float(grad_bytes),
        cpus_per_env_runner=res.cpus_per_env_runner,
        cpus_per_learner=res.cpus_per_learner,
        env_steps_to_target=e_target,
        critical_batch=crit,
    )
    if not (math.isfinite(m.sample_s) and m.sample_s > 0 and math.isfinite(m.learn_s) and m.learn_s > 0):
        raise RunFolderError(
            f"{run.path}: trial {trial}'s timers give sample {sample_s!r} s and learn {learn_s!r} s "
            "per iteration; both must be positive. The progress.csv is damaged."
        )
    return m, sources
