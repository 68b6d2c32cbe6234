"""Metric keys shared by the trainer, the sweep, the stoppers, the report and the notebooks.

Keys are Tune's flattened names ('/' between levels) of an RLlib result after rayrl's callback
has added its ``rayrl`` section. One place, so a renamed metric breaks loudly, not silently.
"""

from __future__ import annotations

import math
from typing import Any

from rayrl.spec import schedule

ENV_STEPS = "num_env_steps_sampled_lifetime"  #: env steps sampled since the run began
EPISODE_RETURN = "env_runners/episode_return_mean"  #: RLlib's: mean return of recent episodes; absent
#: until the first episode finishes
EVAL_EPISODE_RETURN = "evaluation/env_runners/episode_return_mean"  #: RLlib's, on evaluation iterations only

# Returns as rayrl reports them: present in every result (see rayrl.rllib.callback.RayrlCallback), so an iteration
# without a finished episode is normal for the scheduler, searcher, stoppers, progress line and history.
TRAIN_RETURN = "rayrl/train_return"  #: training return, last known; NaN before any episode
EVAL_RETURN = "rayrl/eval_return"  #: evaluation return, last known; NaN before any evaluation
ITERATION = "training_iteration"
TIME_TOTAL = "time_total_s"

ENV_STEPS_PER_S = "rayrl/env_steps_per_s"  #: end-to-end (sample + learn) this iteration
ENV_STEPS_THIS_ITER = "rayrl/env_steps_this_iter"
BACKEND = "rayrl/backend"  #: torch.distributed backend: none, gloo, nccl
NUM_LEARNERS = "rayrl/num_learners"
GLOBAL_BATCH = "rayrl/global_batch"  #: per-learner batch x learners
EFFECTIVE_MINIBATCH = "rayrl/effective_minibatch"  #: minibatch x accumulation steps
PRECISION = "rayrl/precision"
NONFINITE_STEPS = "rayrl/nonfinite_steps"  #: skipped non-finite steps, lifetime
LOSS_SCALE = "rayrl/loss_scale"  #: fp16 dynamic loss scale (NaN otherwise)
GRAD_NORM = "rayrl/grad_norm"  #: pre-clip global gradient norm
TOTAL_LOSS = "rayrl/total_loss"
HUNG_RUNNER_RESTARTS = "rayrl/hung_runner_restarts"  #: EnvRunners the watchdog restarted (this process)
CHECKPOINT_UPLOAD_FAILURES = "rayrl/checkpoint_upload_failures"  #: failed upload attempts (retried)
#: the tiered trainable's checkpoint counts (this trial process), for summary.json's ``checkpoints``
CHECKPOINT_COUNTS = {
    "uploaded": "rayrl/checkpoint_uploads",
    "upload_failures": CHECKPOINT_UPLOAD_FAILURES,
    "skipped": "rayrl/checkpoints_skipped",
    "pending": "rayrl/checkpoint_uploads_pending",
    "tier1_reuploads": "rayrl/tier1_reuploads",
    "restarted_fresh": "rayrl/restarted_fresh",
    "restored_newer_than_registered": "rayrl/restored_newer_than_registered",
}


def return_key(judged_by: str) -> str:
    """The key runs are ranked and stopped by: Spec.judged_by is "evaluation" or "training"."""
    return EVAL_RETURN if judged_by == "evaluation" else TRAIN_RETURN


def number(value: Any) -> float:
    """A result value as a float; NaN where it is missing or not a number (not yet known)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def lookup(result: dict, key: str, default: Any = None) -> Any:
    """Read a flattened key from a nested or a flattened result dict."""
    if key in result:
        return result[key]
    node = result
    for part in key.split("/"):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


# Hardware, sampled on the trial's node each iteration (fractions 0..1; NaN where unknown).
CPU_UTIL = "rayrl/cpu_util"
MEM_UTIL = "rayrl/mem_util"
GPU_UTIL = "rayrl/gpu_util"
GPU_MEM_UTIL = "rayrl/gpu_mem_util"
NET_UTIL = "rayrl/net_util"
LEARNER_SAMPLES_PER_S = "rayrl/learner_samples_per_s"


def config_batch_lr(config: dict) -> tuple[Any, Any]:
    """(train batch per learner, lr) of an RLlib config dict, whichever spelling it carries."""
    batch = config.get("train_batch_size_per_learner", config.get("_train_batch_size_per_learner"))
    return batch, schedule.first(config.get("lr"))
