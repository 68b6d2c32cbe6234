"""Application metrics: hardware sampling into every result, and Ray gauges for Prometheus.

Each trial process (the RLlib Algorithm, a Tune Trainable) samples its node's hardware once per
iteration into ``result["rayrl"]`` (so the figures land in history.csv) and sets ``ray.util.metrics``
gauges tagged by experiment and trial (so they appear in Ray's Prometheus export as ``ray_rayrl_*``
and in the dashboard's Metrics view). State (counters for rates, the gauges) lives in objects
held by the trial's callback, never in module globals. The sampling itself is rayrl.observe.hardware.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Mapping
from pathlib import PurePosixPath
from typing import Any

from rayrl.observe import cost, hardware, keys
from rayrl.observe.hardware import HardwareSampler

logger = logging.getLogger(__name__)

COST_PER_M_SAMPLES = "rayrl/cost_per_million_samples"  #: USD per million env steps, so far (if priced)

#: (Prometheus name without Ray's ``ray_`` prefix, result key, description)
GAUGES: tuple[tuple[str, str, str], ...] = (
    ("rayrl_env_steps_per_s", keys.ENV_STEPS_PER_S, "End-to-end env steps per second (sampling + learning)"),
    (
        "rayrl_learner_samples_per_s",
        keys.LEARNER_SAMPLES_PER_S,
        "Samples the learners trained on per second, epochs included",
    ),
    ("rayrl_batch_size", keys.GLOBAL_BATCH, "Global train batch: per-learner batch x learners, env steps"),
    ("rayrl_episode_return", keys.EPISODE_RETURN, "Mean return of recent episodes"),
    ("rayrl_nonfinite_steps", keys.NONFINITE_STEPS, "Non-finite (NaN/Inf) learner steps skipped, lifetime"),
    ("rayrl_loss_scale", keys.LOSS_SCALE, "fp16 dynamic loss scale"),
    ("rayrl_cost_per_million_samples", COST_PER_M_SAMPLES, "USD per million env steps trained on, so far"),
    ("rayrl_cpu_util", keys.CPU_UTIL, "Node CPU utilisation, fraction"),
    ("rayrl_mem_util", keys.MEM_UTIL, "Node host memory in use, fraction"),
    (
        "rayrl_gpu_util",
        keys.GPU_UTIL,
        "Mean utilisation of the trial's GPUs (its remote learners' when it has them), fraction",
    ),
    (
        "rayrl_gpu_mem_util",
        keys.GPU_MEM_UTIL,
        "Peak memory in use on the trial's GPUs (its remote learners' when it has them), fraction",
    ),
    (
        "rayrl_env_runner_gpu_util",
        "rayrl/env_runner_gpu_util",
        "Mean GPU utilisation on the env runners' nodes, fraction",
    ),
    ("rayrl_net_util", keys.NET_UTIL, "Busiest NIC's throughput over its link speed, fraction"),
)
TAG_KEYS = ("experiment", "trial")


class Publisher:
    """The rayrl gauges for one trial, tagged {experiment, trial}; made once per trial process."""

    def __init__(self, experiment: str, trial: str, gauge: Callable[..., Any] | None = None) -> None:
        if gauge is None:
            from ray.util.metrics import Gauge

            gauge = Gauge
        tags = {"experiment": experiment, "trial": trial}
        self._gauges = [
            (key, gauge(name, description=desc, tag_keys=TAG_KEYS).set_default_tags(tags)) for name, key, desc in GAUGES
        ]

    def publish(self, result: dict) -> dict[str, float]:
        """Set every gauge whose value in ``result`` is a finite number; return what was set."""
        published = {}
        for key, g in self._gauges:
            value = _number(keys.lookup(result, key))
            if value is not None:
                g.set(value)
                published[key] = value
        return published


# Tune trial ids: 8 hex digits (searcher trials) or 5 hex digits + "_" + 5 digits (grid/random),
# in rayrl's folder names ("PPO_<id>", rayrl.train.run.trial_dirname) or Tune's ("PPO_<env>_<id>_<n>_...").
_TRIAL_ID = re.compile(r"_([0-9a-f]{8}|[0-9a-f]{5}_\d{5})(?:_\d+)?(?:_|$)")


def trial_tags(algorithm: Any) -> tuple[str, str]:
    """(experiment, trial) of a Tune trial's Algorithm; "none" for either outside Tune.

    RLlib drops Tune's trial info from the config, so inside a trial ``algorithm.trial_id`` says
    "default"; the trial's StorageContext still names it. The experiment is "RUN/TUNE_EXPERIMENT"
    (e.g. "my-sweep/phase2", "my-run/tune"): the run folder's name (the last part of Tune's
    storage path) and Tune's experiment in it, so two sweeps' searches do not share a tag. The
    trial is Tune's trial id, parsed from the trial folder name ("PPO_<id>" as rayrl names it).
    """
    info = getattr(algorithm, "_trial_info", None)
    storage = getattr(algorithm, "_storage", None)
    experiment = getattr(info, "experiment_name", None) or getattr(storage, "experiment_dir_name", None)
    root = getattr(storage, "storage_fs_path", None)
    if experiment and isinstance(root, str) and PurePosixPath(root).name:
        experiment = f"{PurePosixPath(root).name}/{experiment}"
    trial = getattr(info, "trial_id", None)
    if not trial:
        match = _TRIAL_ID.search(str(getattr(storage, "trial_dir_name", None) or ""))
        trial = match.group(1) if match else getattr(algorithm, "trial_id", None)
    return str(experiment or "none"), str(trial) if trial and trial != "default" else "none"


def algorithm_resources(algorithm: Any) -> cost.TrialResources:
    """GPUs and CPUs the trial holds: Tune's placement group, else the one RLlib would request for the
    config (outside Tune), so the cost figure prices what the cluster reserves."""
    pgf = getattr(algorithm, "trial_resources", None)
    required = getattr(pgf, "required_resources", None)
    if not (isinstance(required, Mapping) and required):
        required = type(algorithm).default_resource_request(algorithm.config).required_resources
    return cost.TrialResources(gpus=float(required.get("GPU", 0.0)), cpus=float(required.get("CPU", 0.0)))


class TrialObserver:
    """Per-trial state: the hardware sampler, the gauges, and the prices if the config carries them.

    Cost per million samples is computed only when ``learner_config_dict["cost"]`` holds the
    spec's prices: resources x time so far x prices / env steps so far. Without prices no cost
    figure is invented.
    """

    def __init__(
        self, algorithm: Any, sampler: HardwareSampler | None = None, publisher: Publisher | None = None
    ) -> None:
        self.experiment, self.trial = trial_tags(algorithm)
        self._algorithm = algorithm  # its remote learners and env runners sample their own hardware
        self.sampler = sampler or HardwareSampler()
        self._publisher = publisher
        self._publish_failed = False
        prices = (getattr(algorithm.config, "learner_config_dict", None) or {}).get("cost")
        self.prices = cost.prices_from(prices) if prices else None
        self.resources = algorithm_resources(algorithm) if self.prices else None

    def observe(self, result: dict) -> None:
        """Add the hardware sample (and learner rate, cost) to result["rayrl"], then publish."""
        section = result.setdefault("rayrl", {})
        section.update(self.sampler.sample())
        hardware.aggregate(section, *hardware.collect(self._algorithm))
        if section.get("learner_samples_per_s") is None:
            rate = _number(keys.lookup(result, "learners/__all_modules__/num_module_steps_trained_throughput"))
            section["learner_samples_per_s"] = math.nan if rate is None else rate
        if self.prices is not None and self.resources is not None:
            steps = _number(keys.lookup(result, keys.ENV_STEPS))
            wall = _number(result.get(keys.TIME_TOTAL))
            usd = cost.trial_cost(self.resources, wall, self.prices) if wall is not None else math.nan
            section["cost_per_million_samples"] = cost.per_million(cost.cost_per_sample(usd, steps or 0.0))
        self._publish(result)

    def _publish(self, result: dict) -> None:
        if self._publish_failed:
            return
        try:
            if self._publisher is None:
                self._publisher = Publisher(self.experiment, self.trial)
            self._publisher.publish(result)
        except Exception as exc:  # noqa: BLE001 - metrics must never fail a training step
            self._publish_failed = True
            logger.warning(
                "rayrl metrics: publishing to Ray's metrics failed (%s); gauges are off for this "
                "trial, results still carry the figures.",
                exc,
            )


def _number(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None
