"""Weights & Biases through Tune's WandbLoggerCallback; offline mode needs neither network nor key."""

from __future__ import annotations

import os
from typing import Any

from ray.air.integrations.wandb import WandbLoggerCallback, _get_wandb_project

from rayrl.spec import WandbSpec


class WandbTracker(WandbLoggerCallback):
    """Tune's callback; in offline mode it skips the API-key lookup (Tune only skips it when WANDB_MODE
    is set in the driver's environment), and the run folder lands in the trial folder's wandb/."""

    project: Any  # Tune's callback sets both from its arguments
    group: Any

    def setup(self, *args: Any, **kwargs: Any) -> None:
        if self.kwargs.get("mode") != "offline":
            super().setup(*args, **kwargs)
            return
        self.api_key_file = None
        self.project = _get_wandb_project(self.project)
        if not self.group and os.environ.get("WANDB_RUN_GROUP"):
            self.group = os.environ["WANDB_RUN_GROUP"]


def wandb_callback(w: WandbSpec, run_name: str, phase: str) -> WandbTracker:
    """The callback for one Tuner: project, group (default: run name/phase) and mode from the spec."""
    project = w.project or os.environ.get("WANDB_PROJECT") or run_name
    group = w.group or f"{run_name}/{phase}"
    return WandbTracker(project=project, group=group, mode=w.mode)
