"""Tune logger callbacks for one Tuner: CSV and JSON always, TensorBoard, MLflow and W&B as the spec says.

Tune's own loggers do the work; rayrl's subclasses only choose what is recorded: rayrl's metrics by
env steps (TensorBoard), the trial's spec values and rayrl's result keys (MLflow), and a run name
that says phase, batch and lr (all three, through the Tuner's trial_name_creator).
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from ray.air.integrations.mlflow import MLflowLoggerCallback
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback

from rayrl.observe import keys
from rayrl.spec import Spec
from rayrl.track.naming import rayrl_metrics, trial_params


def logger_callbacks(spec: Spec, phase: str, run_name: str) -> list:
    """The loggers of one Tuner. Tune adds its CSV/JSON/TBX loggers itself unless told not to; rayrl
    lists them explicitly (so tracking.tensorboard: false really writes no event files)."""
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    t = spec.tracking
    out: list = [CSVLoggerCallback(), JsonLoggerCallback()]  # progress.csv / result.json: ExperimentAnalysis
    if t.tensorboard:
        out.append(TensorBoardTracker())
    if t.mlflow.enabled:
        out.append(
            MLflowTracker(
                spec, phase, tracking_uri=t.mlflow.tracking_uri, experiment_name=t.mlflow.experiment or run_name
            )
        )
    if t.wandb.enabled:
        from rayrl.track.wandb_logger import wandb_callback

        out.append(wandb_callback(t.wandb, run_name, phase))
    return out


#: seconds between two writes of Tune's whole result (every numeric key under ray/tune/) per trial
TUNE_KEYS_EVERY_S = 10.0


class TensorBoardTracker(TBXLoggerCallback):
    """rayrl's metrics under rayrl/ on every result, with env steps as the step, so trials of different
    batch sizes line up; Tune's TBX logger (every numeric result key under ray/tune/) on a trial's first
    and last result and at most every ``TUNE_KEYS_EVERY_S`` between.

    Tune's logger writes and flushes RLlib's ~300 numeric keys per result in the driver, which Tune runs
    between a trial's iterations: about 13 ms per result on a 2-core machine, a fifth of a batch-256
    iteration. Every result's rayrl/ scalars keep the curves whole; the ray/tune/ ones are a sample."""

    def __init__(self) -> None:
        super().__init__()
        self._tune_keys_at: dict[Any, float] = {}  #: per trial, when its ray/tune/ keys were last written
        self._unwritten: dict[Any, tuple[int, dict]] = {}  #: per trial, a result whose Tune keys were not

    def __setstate__(self, state: dict) -> None:
        # A run started by an older rayrl restores its tracker pickled without these (old tuner.pkl).
        self.__dict__.update(state)
        self.__dict__.setdefault("_tune_keys_at", {})
        self.__dict__.setdefault("_unwritten", {})

    def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
        now = time.monotonic()
        if trial not in self._trial_writer or now - self._tune_keys_at.get(trial, -math.inf) >= TUNE_KEYS_EVERY_S:
            super().log_trial_result(iteration, trial, result)  # opens the trial's writer, flushes
            self._tune_keys_at[trial] = now
            self._unwritten.pop(trial, None)
        else:
            self._unwritten[trial] = (iteration, result)
        metrics = rayrl_metrics(result)
        step = int(metrics.get("rayrl/env_steps", result.get(keys.ITERATION, iteration)))
        writer = self._trial_writer[trial]
        for tag, value in metrics.items():
            writer.add_scalar(tag, value, global_step=step)

    def log_trial_end(self, trial: Any, failed: bool = False) -> None:
        pending = self._unwritten.pop(trial, None)
        if pending is not None and trial in self._trial_writer:  # the last result's Tune keys, always
            super().log_trial_result(pending[0], trial, pending[1])
        super().log_trial_end(trial, failed)


class MLflowTracker(MLflowLoggerCallback):
    """One MLflow run per trial: params are the trial's spec values (not RLlib's hundreds of config
    keys), metrics are rayrl's result keys, stepped by env steps; tagged with the phase."""

    def __init__(self, spec: Spec, phase: str, **kwargs: Any) -> None:
        super().__init__(tags={"rayrl.phase": phase}, **kwargs)
        self.spec = spec

    def log_trial_start(self, trial: Any) -> None:
        if trial in self._trial_runs:  # a restart (retry, PBT exploit): MLflow params cannot change
            return
        tags = {**self.tags, "trial_name": str(trial), "trial_id": trial.trial_id}
        self._trial_runs[trial] = self.mlflow_util.start_run(tags=tags, run_name=str(trial)).info.run_id
        self.mlflow_util.log_params(run_id=self._trial_runs[trial], params_to_log=trial_params(self.spec, trial.config))

    def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
        if trial not in self._trial_runs:
            self.log_trial_start(trial)
        metrics = rayrl_metrics(result)
        step = int(metrics.get("rayrl/env_steps", result.get(keys.ITERATION, iteration)))
        self.mlflow_util.log_metrics(run_id=self._trial_runs[trial], metrics_to_log=metrics, step=step)
