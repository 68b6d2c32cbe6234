"""The callback that adds rayrl's section to every RLlib result: throughput, backend, numerics, hardware."""

from __future__ import annotations

import math
import numbers
import time
from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback

from rayrl.faults.watchdog import Watchdog
from rayrl.observe import keys, metrics


class RayrlCallback(RLlibCallback):
    """Adds rayrl's section to every result: throughput, backend, batch, numerics.

    The backend is read from the learners themselves once (not inferred from the config), so a
    result says what actually ran.
    """

    def __init__(self) -> None:
        super().__init__()
        self._backend: str | None = None
        self._last_steps: float | None = None
        self._last_time = 0.0
        self._observer: metrics.TrialObserver | None = None
        self._returns = {"train_return": math.nan, "eval_return": math.nan}  # last known
        self._watchdog: Watchdog | None = None

    def on_algorithm_init(self, *, algorithm: Any, **kwargs: Any) -> None:
        # Made here, not at the first result, so the first hardware interval spans the first iteration.
        self._observer = metrics.TrialObserver(algorithm)
        self._watchdog = Watchdog((algorithm.config.learner_config_dict or {}).get("hung_runner_s", 0.0))

    def on_evaluate_start(self, *, algorithm: Any, **kwargs: Any) -> None:
        sync_local_eval_connectors(algorithm)

    def on_train_result(self, *, algorithm: Any, result: dict, **kwargs: Any) -> None:
        cfg = algorithm.config
        if self._backend is None:
            self._backend = learner_backend(algorithm)
        steps = float(keys.lookup(result, keys.ENV_STEPS, 0) or 0)
        now = time.perf_counter()
        if self._last_steps is not None and steps >= self._last_steps:
            # Wall time between results (sampling + learning + overhead), not the learner's time alone.
            this_iter, elapsed = steps - self._last_steps, now - self._last_time
        else:  # first result of this process (new run or restored from a checkpoint)
            this_iter = float(keys.lookup(result, "env_runners/num_env_steps_sampled", 0) or 0)
            elapsed = float(result.get("time_this_iter_s", 0) or 0)
        self._last_steps, self._last_time = steps, now
        settings = cfg.learner_config_dict or {}
        stats = learner_stats(result)
        # update, not replace: the trainable (rayrl.tune.trainable) adds its checkpoint figures too
        result.setdefault("rayrl", {}).update(
            {
                "env_steps_per_s": this_iter / elapsed if elapsed > 0 else 0.0,
                "env_steps_this_iter": this_iter,
                "backend": self._backend,
                "num_learners": cfg.num_learners,
                "global_batch": cfg.train_batch_size_per_learner * max(cfg.num_learners, 1),
                "effective_minibatch": (cfg.minibatch_size or cfg.train_batch_size_per_learner)
                * settings.get("accumulation_steps", 1),
                "effective_lr": cfg.lr,
                "precision": settings.get("precision", "fp32"),
                **stats,
                **self._known_returns(result),
            }
        )
        if self._observer is None or self._watchdog is None:  # attached to an algorithm already built
            self._observer = metrics.TrialObserver(algorithm)
            self._watchdog = Watchdog(settings.get("hung_runner_s", 0.0))
        self._observer.observe(result)  # hardware sample into result["rayrl"]; Ray gauges
        result["rayrl"]["hung_runner_restarts"] = self._watchdog.check(algorithm)

    def _known_returns(self, result: dict) -> dict:
        """Training and evaluation returns, carried over iterations that finished no episode (NaN before
        the first), so every result has both keys and a missing return is never an error."""
        for name, key in (("train_return", keys.EPISODE_RETURN), ("eval_return", keys.EVAL_EPISODE_RETURN)):
            value = keys.lookup(result, key)
            # numpy scalars too: with remote learners RLlib reports float32 (not a Python float)
            if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
                self._returns[name] = float(value)
        return dict(self._returns)


def sync_local_eval_connectors(algorithm: Any) -> None:
    """Give an in-process evaluation runner the training runners' connector states (MeanStdFilter).

    RLlib's ``sync_env_runner_states`` returns early when a group has no remote runners, so with
    ``evaluation.env_runners: 0`` the evaluation runner's observation filter never receives the
    training statistics: it normalises by its own few evaluation steps and the greedy policy sees
    observations it was not trained on (on Hopper, episodes of ~30 steps from a policy that hops
    1,000). Remote evaluation runners are synced by RLlib itself.
    """
    from ray.rllib.core import COMPONENT_ENV_TO_MODULE_CONNECTOR, COMPONENT_MODULE_TO_ENV_CONNECTOR

    group, source = getattr(algorithm, "eval_env_runner_group", None), getattr(algorithm, "env_runner", None)
    if group is None or source is None or group.num_remote_env_runners() > 0 or group.local_env_runner is None:
        return
    state = source.get_state(components=[COMPONENT_ENV_TO_MODULE_CONNECTOR, COMPONENT_MODULE_TO_ENV_CONNECTOR])
    if state:
        group.local_env_runner.set_state(state)


def learner_backend(algorithm: Any) -> str:
    group = algorithm.learner_group
    if group is None or group.is_local:
        return "none"

    def backend(_learner: Any) -> str:
        import torch.distributed as dist

        return dist.get_backend() if dist.is_available() and dist.is_initialized() else "none"

    # foreach_learner returns RemoteCallResults (CallResult items), not the bare values.
    found = {r.get() for r in group.foreach_learner(backend)}
    return ",".join(sorted(found))


def learner_stats(result: dict) -> dict:
    """rayrl's learner metrics (see rayrl.rllib.learner), summed/maxed over modules."""
    learners = result.get("learners", {}) or {}
    out = {"nonfinite_steps": 0.0, "loss_scale": math.nan, "grad_norm": math.nan, "total_loss": math.nan}
    for module_id, stats in learners.items():
        if not isinstance(stats, dict) or module_id == "__all_modules__":
            continue
        out["nonfinite_steps"] += float(stats.get("rayrl_nonfinite_steps", 0) or 0)
        for src, dst in (
            ("rayrl_loss_scale", "loss_scale"),
            ("rayrl_grad_norm", "grad_norm"),
            ("total_loss", "total_loss"),
        ):
            if src in stats and stats[src] is not None:
                out[dst] = float(stats[src])
    return out
