"""The Ray side of benchmarks/tuners.py: each tuner run once, and an answer trained to the target once.

* ``rayrl``: ``rayrl.sweep.run.run`` as shipped (ladder, ASHA + TPE, raced confirmation); its cost is
  summary.json's ``env_steps_total`` (all three phases), its answer best_config.yaml.
* ``tune_by_hand``: one Tune experiment, ASHA over env steps + OptunaSearch (TPE) over batch x lr:
  what a user writes from the guide, on rayrl's trainable (``make_tuner`` over the spec's config), with
  no ladder and no confirmation.
* ``random``: the same, but Tune's BasicVariantGenerator (``tune.loguniform`` x ``tune.choice``) and
  FIFO: every trial to its cap or the target.
* ``zoo_optimize`` / ``zoo_optimize_batch_lr``: RL Zoo's ``--optimize`` in a subprocess
  (benchmarks/zoo_optimize.py counts its env steps); the answer is its study's best trial.

Both Tune tuners share :class:`BudgetStopper`: a trial stops at its cap (the spec's
``search.max_env_steps``) or the target, and the experiment stops once the env steps of all its trials
add up to the budget (the trials running then finish their iteration: a small overrun, counted).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from ray.tune import Stopper

from benchmarks import common as C
from benchmarks import contenders as K
from benchmarks import time_to_reward as T
from benchmarks import zoo_answers as Z


class BudgetStopper(Stopper):
    """Tune stopper: a trial at ``per_trial`` env steps or the target; everything once ``budget`` is spent."""

    def __init__(self, budget: int, per_trial: int, return_key: str, target: float | None) -> None:
        self.budget, self.per_trial, self.return_key, self.target = budget, per_trial, return_key, target
        self.spent: dict[str, float] = {}

    def __call__(self, trial_id: str, result: dict) -> bool:
        from rayrl import runfolder
        from rayrl.observe import keys

        steps = float(keys.lookup(result, keys.ENV_STEPS, 0) or 0)
        self.spent[trial_id] = steps
        return steps >= self.per_trial or runfolder.reached(keys.lookup(result, self.return_key), self.target)

    def stop_all(self) -> bool:
        return sum(self.spent.values()) >= self.budget

    def criteria(self) -> dict[str, float]:
        """What the progress printer names as a finished trial's reason (rayrl.observe.progress)."""
        from rayrl.observe import keys

        out: dict[str, float] = {keys.ENV_STEPS: self.per_trial}
        if self.target is not None:
            out[self.return_key] = self.target
        return out


class ByHandSpace:
    """OptunaSearch's define-by-run space: lr log-uniform x batch; the minibatch follows the batch by
    the sweep's rule, so the trainable is the sweep's (a class, so Tune can pickle it)."""

    def __init__(self, lr_range: tuple[float, float], batches: list[int], base_batch: int, base_minibatch: int):
        self.lr_range, self.batches = lr_range, batches
        self.base_batch, self.base_minibatch = base_batch, base_minibatch

    def __call__(self, trial: Any) -> dict[str, Any]:
        from rayrl.sweep.ladder import minibatch_for

        trial.suggest_float("lr", *self.lr_range, log=True)
        batch = trial.suggest_categorical("train_batch_size_per_learner", self.batches)
        return {"minibatch_size": minibatch_for(int(batch), self.base_batch, self.base_minibatch)}


def run_rayrl(spec: Any, folder: Path) -> dict[str, Any]:
    """The sweep as shipped, in ``folder`` (resumable: the sweep reads back what it finished)."""
    from rayrl import runtime
    from rayrl.sweep import run as sweep

    paths = runtime.resolve(str(folder), "rayrl")
    t0 = time.time()
    sweep.run(spec, paths)
    return {**read_sweep(paths.run_dir), "tuner_wall_s": time.time() - t0}


def read_sweep(run_dir: Path) -> dict[str, Any]:
    """A finished sweep's cost (summary.json: all three phases) and answer (best_config.yaml)."""
    from rayrl import runfolder

    summary = json.loads((run_dir / runfolder.SUMMARY).read_text())
    best_config = run_dir / runfolder.BEST_CONFIG
    if not best_config.exists():
        raise RuntimeError(f"rayrl: the sweep in {run_dir} shipped no best_config.yaml (no usable trial)")
    best = C.load_spec(best_config)
    return {
        "tuner_env_steps": int(summary["env_steps_total"]),
        "accounting": "summary.json env_steps_total: ladder + search + confirmation, every trial's env steps",
        "phases": {
            "ladder": summary.get("env_steps_phase1"),
            "search": summary.get("env_steps_phase2"),
            "confirm": summary.get("env_steps_confirm"),
        },
        "answer": {
            "batch_size": best.algo.train_batch_per_learner,
            "lr": best.algo.lr,
            "minibatch_size": best.algo.minibatch_size,
            "best_config": str(best_config),
            "knee_batch_size": summary.get("knee_batch_size"),
        },
        "run_dir": str(run_dir),
    }


def run_tune(kind: str, spec: Any, folder: Path, budget: Any, lr_range: tuple[float, float], batches: list[int]):
    """``tune_by_hand`` or ``random`` over batch x lr until ``budget.env_steps`` are spent."""
    import optuna
    import ray
    from ray import tune
    from ray.tune import ExperimentAnalysis
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator
    from ray.tune.search.optuna import OptunaSearch

    from rayrl import runtime
    from rayrl.observe import keys
    from rayrl.sweep.ladder import minibatch_for
    from rayrl.tune import resources
    from rayrl.tune.tuner import base_params, make_tuner

    paths = runtime.resolve(str(folder), kind)
    metric = keys.return_key(spec.judged_by)
    target = spec.stop.episode_return
    base_b, base_mb = spec.algo.train_batch_per_learner, spec.algo.minibatch_size
    params = base_params(spec)
    if kind == "tune_by_hand":
        search: Any = OptunaSearch(
            space=ByHandSpace(lr_range, batches, base_b, base_mb),
            metric=metric,
            mode="max",
            sampler=optuna.samplers.TPESampler(seed=spec.seed),
        )
        scheduler: Any = ASHAScheduler(
            time_attr=keys.ENV_STEPS,
            max_t=budget.per_trial,
            grace_period=budget.grace,
            reduction_factor=budget.reduction_factor,
        )
        for key in ("lr", "minibatch_size"):  # the searcher sets them
            params.pop(key, None)
    else:
        params.update(
            lr=tune.loguniform(*lr_range),
            train_batch_size_per_learner=tune.choice(batches),
            minibatch_size=tune.sample_from(
                lambda s: minibatch_for(s.config["train_batch_size_per_learner"], base_b, base_mb)
            ),
        )
        search = BasicVariantGenerator(random_state=spec.seed)
        scheduler = FIFOScheduler()
    concurrent = resources.max_concurrent_trials(
        ray.cluster_resources(), resources.of_spec(spec), spec.search.max_concurrent
    )
    stopper = BudgetStopper(budget.env_steps, budget.per_trial, metric, target)
    tuner = make_tuner(
        spec,
        paths,
        phase=kind,
        subdir=kind,
        param_space=params,
        tune_config=tune.TuneConfig(
            metric=metric,
            mode="max",
            scheduler=scheduler,
            search_alg=search,
            num_samples=budget.num_samples,
            max_concurrent_trials=concurrent,
        ),
        stop=stopper,
        verbose_label=kind,
        checkpoints=False,
    )
    C.say(
        f"[{kind}] batch {batches} x lr {lr_range[0]:.0e}..{lr_range[1]:.0e}, up to {budget.per_trial:,} env steps "
        f"a trial, {budget.env_steps:,} in all, {concurrent} at once"
    )
    t0 = time.time()
    tuner.fit()
    wall = time.time() - t0
    exp_path, _ = paths.experiment(kind)
    trials = ExperimentAnalysis(exp_path).trials
    rows = [trial_row(t, metric, target, budget.per_trial) for t in trials]
    spent = int(sum(r["env_steps"] or 0 for r in rows))
    if any(t.status in ("RUNNING", "PAUSED") for t in trials) or (
        spent < budget.env_steps and any(t.status == "PENDING" for t in trials)
    ):
        raise KeyboardInterrupt(f"{kind} was interrupted; the same command resumes it")
    best = best_trial(rows)
    return {
        "tuner_env_steps": spent,
        "tuner_wall_s": wall,
        "accounting": "every trial's last env_steps (num_env_steps_sampled_lifetime), summed; the experiment "
        "stops once the sum reaches the budget",
        "trials": len([r for r in rows if r["env_steps"]]),
        "answer": None if best is None else {k: best[k] for k in ("batch_size", "lr", "minibatch_size")},
        "best_trial": best,
        "run_dir": str(paths.run_dir),
    }


def trial_row(trial: Any, metric: str, target: float | None, per_trial: int) -> dict[str, Any]:
    """A trials.csv-like row of one Tune trial (rayrl.runfolder.rank_trials ranks them)."""
    from rayrl import runfolder
    from rayrl.observe import keys

    m = trial.last_result or {}
    ret = Z.finite(keys.lookup(m, metric))
    steps = Z.finite(keys.lookup(m, keys.ENV_STEPS))
    batch, lr = keys.config_batch_lr(trial.config)
    if trial.status == "ERROR":
        status = "error"
    elif runfolder.reached(ret, target):
        status = "reached_target"
    elif steps is not None and steps >= per_trial:
        status = "completed"
    else:
        status = "stopped_early"
    return {
        "trial_id": trial.trial_id,
        "batch_size": None if batch is None else int(batch),
        "lr": lr,
        "minibatch_size": trial.config.get("minibatch_size"),
        "env_steps": steps,
        "episode_return_mean": ret,
        "status": status,
    }


def best_trial(rows: list[dict]) -> dict | None:
    """The answer of a hand-written tuner: the sweep's own ranking of search trials (rank_trials)."""
    from rayrl.runfolder import rank_trials

    ranked = rank_trials([r for r in rows if r["batch_size"] is not None])
    return ranked[0] if ranked else None


def run_zoo(tuner: str, env_id: str, folder: Path, budget: Any, seed: int, lr_range, batches) -> dict[str, Any]:
    """RL Zoo's --optimize in a subprocess (its output in folder/zoo.log); resumes its journal study."""
    folder.mkdir(parents=True, exist_ok=True)
    cmd = Z.command(
        tuner,
        env_id,
        n_trials=budget.zoo_trials,
        n_timesteps=budget.zoo_timesteps,
        n_evaluations=budget.zoo_evaluations,
        seed=seed,
        folder=folder,
        budget=budget.env_steps,
        lr_range=lr_range,
        batches=batches,
    )
    C.say(f"[{tuner}] {budget.zoo_trials} trials x {budget.zoo_timesteps:,} env steps: {' '.join(cmd[2:])}")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(C.ROOT)}
    t0 = time.time()
    with (folder / "zoo.log").open("a") as log:
        proc = subprocess.run(cmd, cwd=C.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{tuner}: rl_zoo3 exited {proc.returncode}; see {folder / 'zoo.log'}")
    best = Z.read_study(folder / "study.log", Z.study_name(tuner, env_id, seed)) or Z.read_report(folder / "logs")
    if best is None:
        raise RuntimeError(f"{tuner}: no finished trial in the study; see {folder / 'zoo.log'}")
    count = Z.zoo_optimize.counted(folder / "count.jsonl")
    return {
        "tuner_env_steps": count["train_env_steps"],
        "tuner_eval_env_steps": count["eval_env_steps"],
        "tuner_wall_s": wall,
        "accounting": "counted: each trial's training env steps (model.num_timesteps at the end of learn()); "
        "its evaluation episodes' env steps apart (tuner_eval_env_steps)",
        "trials": best["trials"],
        "pruned": best["pruned"],
        "answer": Z.answer(Z.SPACES[tuner], best, env_id),
        "best_trial": best,
        "run_dir": str(folder),
    }


# ---- judging ----------------------------------------------------------------------------------


def judge_rayrl(spec: Any, seed: int, target: float, caps: tuple[float, float]) -> dict[str, Any]:
    """Train ``spec`` with rayrl on ``seed`` until the target or a cap (time_to_reward.run_to_target)."""
    return T.run_to_target(K.rayrl(spec, spec.env.runner, seed), target, caps[0], caps[1])


def judge_sb3(answer: dict[str, Any], env_id: str, seed: int, target: float, caps: tuple[float, float]) -> dict:
    """Train RL Zoo's answer with SB3 on ``seed`` until the target or a cap (a lin_ schedule: over Zoo's
    n_timesteps for the env, as RL Zoo trains it, which then also caps the run)."""
    t0 = time.perf_counter()
    model = Z.sb3_model(answer, env_id, seed)
    build = time.perf_counter() - t0
    horizon = int((Z.defaults(env_id) or {}).get("n_timesteps", caps[0])) if Z.has_schedule(answer) else caps[0]
    out = K.sb3_learn(
        model, int(caps[0]), target=target, window=C.RETURN_WINDOW, max_wall_s=caps[1], horizon=int(horizon)
    )
    return {**out, "build_s": build}


def continuous(env_id: str) -> bool:
    """Whether the env's actions are continuous (a Box): SB3's Gaussian then has a free log std."""
    import gymnasium as gym

    env = gym.make(env_id)
    try:
        return isinstance(env.action_space, gym.spaces.Box)
    finally:
        env.close()
