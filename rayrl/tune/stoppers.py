"""A training run's stop criteria as Tune's stop dict (the sweep's stoppers: rayrl.sweep.confirm_run)."""

from __future__ import annotations

from rayrl.observe import keys
from rayrl.spec import Spec


def stop_criteria(spec: Spec) -> dict[str, float]:
    """Tune's stop dict for a training run: it ends when any metric reaches its value."""
    stop: dict[str, float] = {}
    if spec.stop.env_steps is not None:
        stop[keys.ENV_STEPS] = spec.stop.env_steps
    if spec.stop.episode_return is not None:  # NaN (no episode or evaluation yet) never stops a run
        stop[keys.return_key(spec.judged_by)] = spec.stop.episode_return
    if spec.stop.wall_s is not None:
        stop[keys.TIME_TOTAL] = spec.stop.wall_s
    return stop
