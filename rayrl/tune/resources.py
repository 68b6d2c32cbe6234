"""The one model of what a trial holds: cost, gauges, concurrency and the misfit check all read it.

It mirrors RLlib's placement group for the new API stack (``Algorithm.default_resource_request``,
checked against it in tests/test_resources.py): the trial's own process (1 CPU; with ``learners: 0``
it hosts the learner, so at least ``cpus_per_learner`` and ``gpus_per_learner`` GPUs), each env
runner, each evaluation runner (when evaluation is on) and each remote learner. Plain data, no Ray:
Tune reserves these for the whole trial, busy or idle, which is what a cloud bill charges.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from rayrl.observe.cost import TrialResources
from rayrl.spec import ResourcesSpec, Spec


def trial_resources(resources: ResourcesSpec | Mapping[str, Any], evaluation_env_runners: int = 0) -> TrialResources:
    """GPUs and CPUs one trial reserves; ``evaluation_env_runners`` only when evaluation is on."""
    r = resources if isinstance(resources, ResourcesSpec) else _resources_spec(resources)
    runner_cpus = (r.env_runners + evaluation_env_runners) * r.cpus_per_env_runner
    if r.learners == 0:  # the local learner lives in the trial's process
        main_cpus = 1.0 if r.gpus_per_learner > 0 else max(1.0, r.cpus_per_learner)
        return TrialResources(gpus=float(r.gpus_per_learner), cpus=float(main_cpus + runner_cpus))
    return TrialResources(
        gpus=float(r.learners * r.gpus_per_learner), cpus=float(1.0 + runner_cpus + r.learners * r.cpus_per_learner)
    )


def of_spec(spec: Spec) -> TrialResources:
    """What one trial of ``spec`` holds (evaluation runners counted when evaluation is on)."""
    return trial_resources(spec.resources, spec.evaluation.env_runners if spec.evaluation.interval > 0 else 0)


def as_summary(held: TrialResources) -> dict[str, float]:
    """summary.json's ``resources``: the figures the report prices a run with."""
    return {"cpus_per_trial": held.cpus, "gpus_per_trial": held.gpus}


def trial_misfit(cluster: Mapping[str, float], held: TrialResources) -> str | None:
    """Why one trial can never start on a fixed-size cluster (a local Ray: no autoscaler adds nodes),
    or None when it fits. Tune would otherwise wait forever, logging a warning once a minute."""
    need = {"CPU": held.cpus, "GPU": held.gpus}
    short = [
        f"{need[k]:g} {k}s (the cluster has {cluster.get(k, 0):g})"
        for k in ("CPU", "GPU")
        if need[k] > cluster.get(k, 0) + 1e-9
    ]
    if not short:
        return None
    return (
        f"one trial needs {' and '.join(short)}: the trial itself, each env runner (resources.env_runners, "
        "evaluation.env_runners) and each learner (resources.learners, cpus_per_learner, gpus_per_learner) "
        "hold their own; nothing would ever start on this local Ray. Lower those counts or give --num-cpus "
        "more CPUs."
    )


def max_concurrent_trials(cluster: Mapping[str, float], held: TrialResources, configured: int = 0) -> int:
    """Trials that fit at once in the cluster's CPUs and GPUs (``configured`` > 0 wins)."""
    if configured > 0:
        return configured
    fits = [cluster.get("CPU", 0) / held.cpus] if held.cpus > 0 else []
    if held.gpus > 0:
        fits.append(cluster.get("GPU", 0) / held.gpus)
    return max(1, math.floor(min(fits))) if fits else 1


def _resources_spec(data: Mapping[str, Any]) -> ResourcesSpec:
    names = {f.name for f in dataclasses.fields(ResourcesSpec)} - {"custom_per_learner", "lr_scaling"}
    return ResourcesSpec(**{k: v for k, v in (data or {}).items() if k in names})
