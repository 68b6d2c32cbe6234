"""Population Based Training for `rayrl train`: K trials, Tune's PopulationBasedTraining scheduler.

Every ``population.perturbation_env_steps`` a trial in the bottom quantile (by episode return)
loads a top trial's checkpoint (exploit) and perturbs its lr and entropy coefficient within the
spec's ranges (explore). Each such step is appended to the run folder's population.csv (Tune also
keeps pbt_global.txt in its own experiment folder).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from ray import tune
from ray.tune.schedulers import PopulationBasedTraining

from rayrl.observe import keys
from rayrl.spec import Spec

COLUMNS = (
    "trial_id",
    "cloned_from",
    "iteration",
    "cloned_iteration",
    "env_steps",
    "lr_old",
    "lr_cloned",
    "lr_new",
    "entropy_coeff_old",
    "entropy_coeff_cloned",
    "entropy_coeff_new",
)


def mutations(spec: Spec) -> dict[str, Any]:
    """The hyperparameters PBT perturbs and resamples, within the spec's ranges."""
    p = spec.population
    return {
        "lr": tune.loguniform(spec.search.lr_min, spec.search.lr_max),
        "entropy_coeff": tune.uniform(p.entropy_min, p.entropy_max),
    }


def bounds(spec: Spec) -> dict[str, tuple[float, float]]:
    return {
        "lr": (spec.search.lr_min, spec.search.lr_max),
        "entropy_coeff": (spec.population.entropy_min, spec.population.entropy_max),
    }


class Clamp:
    """PBT's explore multiplies by 1.2 or 0.8 without bounds; this keeps each value in its range."""

    def __init__(self, ranges: dict[str, tuple[float, float]]) -> None:
        self.ranges = dict(ranges)

    def __call__(self, config: dict) -> dict:
        for key, (low, high) in self.ranges.items():
            if key in config:
                config[key] = min(max(float(config[key]), low), high)
        return config


def param_space(spec: Spec) -> dict:
    """The RLlib config with lr and entropy_coeff drawn per trial from the same ranges."""
    from rayrl.rllib.algo import build_config

    params = build_config(spec).to_dict()
    params.update(mutations(spec))
    return params


def tune_config(spec: Spec, run_dir: Path) -> Any:
    """TuneConfig: K samples, PBT over env steps by episode return."""
    p = spec.population
    scheduler = RecordingPBT(
        run_dir / "population.csv",
        time_attr=keys.ENV_STEPS,
        perturbation_interval=p.perturbation_env_steps,
        hyperparam_mutations=mutations(spec),
        quantile_fraction=p.quantile_fraction,
        metric=keys.EPISODE_RETURN,
        mode="max",
        custom_explore_fn=Clamp(bounds(spec)),
        synch=p.synchronous,
    )
    return tune.TuneConfig(scheduler=scheduler, num_samples=p.size, reuse_actors=False)


def drop_stale_stop(tune_controller: Any, trial: Any) -> bool:
    """Undo the STOP Tune caches when PBT pauses a trial that is mid-save (ray-project/ray#57906).

    Synchronous PBT pauses a waiting trial with a save; exploiting it while that save is in flight
    pauses it again without one, and Tune's controller then caches a STOP "for after the save" and
    drops the save. The STOP outlives the pause: the trial's next save after its restart ends it,
    short of its budget and out of the population. The trial is PAUSED (to resume from the clone's
    checkpoint), so no decision is pending for it: drop the STOP. True when one was dropped.
    """
    from ray.tune.experiment import Trial
    from ray.tune.schedulers import TrialScheduler

    controller = getattr(tune_controller, "_tune_controller", tune_controller)  # the scheduler's view wraps it
    cached = getattr(controller, "_cached_trial_decisions", None)
    if trial.status != Trial.PAUSED or not isinstance(cached, dict):
        return False
    if cached.get(trial.trial_id) != TrialScheduler.STOP:
        return False
    del cached[trial.trial_id]
    return True


class RecordingPBT(PopulationBasedTraining):
    """Tune's PBT, also appending each exploit/explore step to population.csv in the run folder."""

    def __init__(self, path: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.path = Path(path)

    def _exploit(self, tune_controller: Any, trial: Any, trial_to_clone: Any) -> None:
        super()._exploit(tune_controller, trial, trial_to_clone)
        drop_stale_stop(tune_controller, trial)

    def _log_config_on_step(
        self, trial_state: Any, new_state: Any, trial: Any, trial_to_clone: Any, new_config: dict
    ) -> None:
        super()._log_config_on_step(trial_state, new_state, trial, trial_to_clone, new_config)
        # The states hold the results PBT ranked; trial.last_result is still the report before.
        last = trial_state.last_result or {}
        row = {
            "trial_id": trial.trial_id,
            "cloned_from": trial_to_clone.trial_id,
            "iteration": last.get(keys.ITERATION),
            "cloned_iteration": (new_state.last_result or {}).get(keys.ITERATION),
            "env_steps": keys.lookup(last, keys.ENV_STEPS),
            **{
                f"{name}_{which}": config.get(name)
                for name in ("lr", "entropy_coeff")
                for which, config in (("old", trial.config), ("cloned", trial_to_clone.config), ("new", new_config))
            },
        }
        new = not self.path.exists()
        with self.path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(COLUMNS))
            if new:
                writer.writeheader()
            writer.writerow(row)
