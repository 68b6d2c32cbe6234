"""Tune-side search: the doubling rule as a Searcher (phase 1); ASHA/HyperBand + Optuna (phase 2)."""

from __future__ import annotations

import math
import pickle
from typing import Any

from ray.tune.search import Searcher

from rayrl import keys, throughput
from rayrl.spec import Spec, scaled_lr


class DoublingSearcher(Searcher):
    """Proposes one rung at a time and reads its throughput, so the ladder is an ordinary Tune run.

    A rung's figure is the median env steps/s of its measured iterations after warm-up
    (:func:`rayrl.throughput.rung_throughput`). State is saved with the experiment, so an
    interrupted ladder resumes where it stopped.
    """

    def __init__(self, spec: Spec) -> None:
        super().__init__(metric=keys.ENV_STEPS_PER_S, mode="max")
        d = spec.search.doubling
        self.start, self.factor, self.cap, self.min_gain = d.start, d.factor, d.cap, d.min_gain
        self.warmup, self.measure = d.warmup_iters, d.measure_iters
        self.base_batch, self.base_minibatch = spec.algo.train_batch_per_learner, spec.algo.minibatch_size
        self.rungs: list[throughput.Rung] = []
        self.pending: dict[str, int] = {}       # trial_id -> batch size
        self.samples: dict[str, dict[int, float]] = {}  # trial_id -> {iteration: env steps/s}

    def rows(self) -> list[throughput.Row]:
        return throughput.decide(self.rungs, factor=self.factor, cap=self.cap, min_gain=self.min_gain)

    def suggest(self, trial_id: str) -> dict | str | None:
        if self.pending:
            return None  # one rung at a time: the next depends on this one's figure
        batch = throughput.next_batch(self.rungs, start=self.start, factor=self.factor, cap=self.cap,
                                      min_gain=self.min_gain)
        if batch is None:
            return Searcher.FINISHED
        self.pending[trial_id] = batch
        self.samples[trial_id] = {}
        return {
            "train_batch_size_per_learner": batch,
            "minibatch_size": throughput.minibatch_for(batch, self.base_batch, self.base_minibatch),
        }

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        value = keys.lookup(result, keys.ENV_STEPS_PER_S)
        if trial_id in self.samples and value is not None:
            self.samples[trial_id][int(keys.lookup(result, keys.ITERATION, 0))] = float(value)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if result and not error:  # Tune hands the last result here, not to on_trial_result
            self.on_trial_result(trial_id, result)
        batch = self.pending.pop(trial_id, None)
        if batch is None:
            return
        series = [v for _, v in sorted(self.samples.get(trial_id, {}).items())]
        sps = None if error else throughput.rung_throughput(series, self.warmup, self.measure)
        self.rungs.append(throughput.Rung(batch, sps))

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.__dict__, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(pickle.load(f))
        # A rung that was running when the driver died is measured again from scratch.
        self.pending.clear()


class Phase2Space:
    """Optuna define-by-run space: lr log-uniform, batch from the admissible ladder and the sizes below its
    start (rayrl.throughput.search_batches).

    Returns the RLlib config keys as constants so the minibatch follows the batch and the lr
    follows the declared scaling rule. A class (not a closure) so Tune can pickle the searcher.
    """

    def __init__(self, spec: Spec, ladder: list[int]) -> None:
        s, a, r = spec.search, spec.algo, spec.resources
        self.lr_min, self.lr_max, self.ladder = s.lr_min, s.lr_max, list(ladder)
        self.base_batch, self.base_minibatch = a.train_batch_per_learner, a.minibatch_size
        self.learners, self.lr_scaling = r.learners, r.lr_scaling

    def __call__(self, trial: Any) -> dict:
        lr = trial.suggest_float("rayrl_lr", self.lr_min, self.lr_max, log=True)
        batch = trial.suggest_categorical("rayrl_batch", self.ladder)
        return {
            "lr": scaled_lr(lr, self.learners, self.lr_scaling),
            "train_batch_size_per_learner": batch,
            "minibatch_size": throughput.minibatch_for(batch, self.base_batch, self.base_minibatch),
        }


def phase2_tune_config(spec: Spec, ladder: list[int], max_concurrent: int) -> Any:
    """TuneConfig with ASHA (or HyperBand) over env steps and a seeded Optuna TPE searcher."""
    import optuna
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, HyperBandScheduler
    from ray.tune.search.optuna import OptunaSearch

    s = spec.search
    if s.scheduler == "asha":
        scheduler = ASHAScheduler(time_attr=keys.ENV_STEPS, max_t=s.max_env_steps, grace_period=s.grace_env_steps,
                                  reduction_factor=s.reduction_factor)
    else:
        scheduler = HyperBandScheduler(time_attr=keys.ENV_STEPS, max_t=s.max_env_steps,
                                       reduction_factor=s.reduction_factor)
    # The return key is in every result (NaN until the first episode/evaluation): ASHA neither stops a
    # trial on a NaN nor counts it in a rung's cutoff; Optuna records a trial that ends on NaN as failed.
    metric = keys.return_key(spec.judged_by)
    searcher = OptunaSearch(space=Phase2Space(spec, ladder), metric=metric, mode="max",
                            sampler=optuna.samplers.TPESampler(seed=spec.seed))
    return tune.TuneConfig(metric=metric, mode="max", scheduler=scheduler, search_alg=searcher,
                           num_samples=s.num_samples, max_concurrent_trials=max_concurrent)


def trial_misfit(cluster: dict[str, float], request: dict[str, float]) -> str | None:
    """Why one trial can never start on a fixed-size cluster (a local Ray: no autoscaler adds nodes),
    or None when it fits. Tune would otherwise wait forever, logging a warning once a minute."""
    short = [f"{request.get(k, 0):g} {k}s (the cluster has {cluster.get(k, 0):g})"
             for k in ("CPU", "GPU") if request.get(k, 0) > cluster.get(k, 0) + 1e-9]
    if not short:
        return None
    return (f"one trial needs {' and '.join(short)}: the trial itself, each env runner (resources.env_runners, "
            "evaluation.env_runners) and each learner (resources.learners, cpus_per_learner, gpus_per_learner) "
            "hold their own; nothing would ever start on this local Ray. Lower those counts or give --num-cpus "
            "more CPUs.")


def max_concurrent_trials(cluster: dict[str, float], cpus_per_trial: float, gpus_per_trial: float,
                          configured: int = 0) -> int:
    """Trials that fit at once in the cluster's CPUs and GPUs (``configured`` > 0 wins)."""
    if configured > 0:
        return configured
    fits = [cluster.get("CPU", 0) / cpus_per_trial] if cpus_per_trial > 0 else []
    if gpus_per_trial > 0:
        fits.append(cluster.get("GPU", 0) / gpus_per_trial)
    return max(1, math.floor(min(fits))) if fits else 1
