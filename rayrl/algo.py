"""The one adapter from a rayrl Spec onto RLlib's AlgorithmConfig (new API stack).

Everything RLlib-specific about building an algorithm lives here; the rest of rayrl sees a Spec
and a result dict (see :mod:`rayrl.keys`).
"""

from __future__ import annotations

import math
import numbers
import time
from typing import Any

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.callbacks.callbacks import RLlibCallback

from rayrl import keys, metrics, models
from rayrl.envs import registry
from rayrl.faults.watchdog import Watchdog
from rayrl.sampling import runner_class
from rayrl.spec import Spec


def env_name(spec: Spec) -> str:
    """The name RLlib builds the env from (factories and ALE ids are registered: rayrl.envs.registry)."""
    return registry.env_name(spec.env.id)


def build_config(spec: Spec) -> AlgorithmConfig:
    """Spec -> AlgorithmConfig for PPO, APPO or IMPALA; nothing is started here."""
    from rayrl.learner import learner_class, learner_settings

    a, r = spec.algo, spec.resources
    config = _config_class(a.name)()
    config = (
        config.environment(env_name(spec), env_config=dict(spec.env.config))
        .framework("torch")
        .env_runners(
            num_env_runners=r.env_runners,
            num_envs_per_env_runner=spec.env.envs_per_runner,
            num_cpus_per_env_runner=r.cpus_per_env_runner,
            env_runner_cls=runner_class(spec.env.runner, spec.env.backend),
        )
        .learners(
            num_learners=r.learners,
            num_gpus_per_learner=r.gpus_per_learner,
            num_cpus_per_learner=r.cpus_per_learner if r.gpus_per_learner == 0 or r.learners else "auto",
            custom_resources_per_learner=dict(r.custom_per_learner),
            learner_class=learner_class(a.name),
            # rayrl's settings ride in the config; the watchdog in RayrlCallback reads hung_runner_s.
            learner_config_dict={**learner_settings(spec), "hung_runner_s": spec.checkpoint.hung_runner_s},
        )
        .training(
            lr=spec.effective_lr,
            gamma=a.gamma,
            train_batch_size_per_learner=a.train_batch_per_learner,
            minibatch_size=a.minibatch_size,
            num_epochs=a.epochs,
            entropy_coeff=a.entropy_coeff,
            vf_loss_coeff=a.vf_loss_coeff,
            # rayrl's learner clips (and reports the pre-clip norm) itself: see rayrl.learner.
            grad_clip=None,
        )
        .rl_module(model_config=models.model_config(spec.model, atari=registry.is_ale(spec.env.id)))
        .callbacks(RayrlCallback)
        .debugging(seed=spec.seed, log_level="ERROR")
        .reporting(metrics_num_episodes_for_smoothing=20)
    )
    if spec.model.normalize_obs:
        config.env_runners(env_to_module_connector=models.obs_filter)
    if spec.evaluation.interval > 0:
        e = spec.evaluation
        config.evaluation(evaluation_interval=e.interval, evaluation_duration=e.episodes,
                          evaluation_duration_unit="episodes", evaluation_num_env_runners=e.env_runners,
                          evaluation_config={"explore": not e.deterministic})
    if spec.checkpoint.hung_runner_s > 0:  # a hung runner's late sample is dropped before the watchdog acts
        config.env_runners(sample_timeout_s=min(config.sample_timeout_s or 60.0, spec.checkpoint.hung_runner_s / 2))
    if a.name == "PPO":
        config = config.training(lambda_=a.gae_lambda)
        config.env_runners(rollout_fragment_length="auto")
    else:
        # IMPALA/APPO need minibatches made of whole rollout fragments.
        config.env_runners(rollout_fragment_length=fragment_length(a.minibatch_size))
    return config


def fragment_length(minibatch_size: int, longest: int = 50) -> int:
    """The longest rollout fragment (<= ``longest`` steps) that divides the minibatch evenly."""
    return next(d for d in range(min(longest, minibatch_size), 0, -1) if minibatch_size % d == 0)


def _config_class(name: str) -> type:
    if name == "PPO":
        from ray.rllib.algorithms.ppo import PPOConfig

        return PPOConfig
    if name == "APPO":
        from ray.rllib.algorithms.appo import APPOConfig

        return APPOConfig
    from ray.rllib.algorithms.impala import IMPALAConfig

    return IMPALAConfig


def algorithm_class(name: str) -> type:
    """The RLlib Algorithm (a Tune Trainable) for ``name``."""
    return _config_class(name)().algo_class


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

    def on_train_result(self, *, algorithm: Any, result: dict, **kwargs: Any) -> None:
        cfg = algorithm.config
        if self._backend is None:
            self._backend = _learner_backend(algorithm)
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
        learner_stats = _learner_stats(result)
        # update, not replace: the trainable (rayrl.storage.trainable) adds its checkpoint figures too
        result.setdefault("rayrl", {}).update({
            "env_steps_per_s": this_iter / elapsed if elapsed > 0 else 0.0,
            "env_steps_this_iter": this_iter,
            "backend": self._backend,
            "num_learners": cfg.num_learners,
            "global_batch": cfg.train_batch_size_per_learner * max(cfg.num_learners, 1),
            "effective_minibatch": (cfg.minibatch_size or cfg.train_batch_size_per_learner)
            * settings.get("accumulation_steps", 1),
            "effective_lr": cfg.lr,
            "precision": settings.get("precision", "fp32"),
            **learner_stats,
            **self._known_returns(result),
        })
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


def _learner_backend(algorithm: Any) -> str:
    group = algorithm.learner_group
    if group is None or group.is_local:
        return "none"

    def backend(_learner: Any) -> str:
        import torch.distributed as dist

        return dist.get_backend() if dist.is_available() and dist.is_initialized() else "none"

    # foreach_learner returns RemoteCallResults (CallResult items), not the bare values.
    found = {r.get() for r in group.foreach_learner(backend)}
    return ",".join(sorted(found))


def _learner_stats(result: dict) -> dict:
    """rayrl's learner metrics (see rayrl.learner), summed/maxed over modules."""
    learners = result.get("learners", {}) or {}
    out = {"nonfinite_steps": 0.0, "loss_scale": math.nan, "grad_norm": math.nan, "total_loss": math.nan}
    for module_id, stats in learners.items():
        if not isinstance(stats, dict) or module_id == "__all_modules__":
            continue
        out["nonfinite_steps"] += float(stats.get("rayrl_nonfinite_steps", 0) or 0)
        for src, dst in (("rayrl_loss_scale", "loss_scale"), ("rayrl_grad_norm", "grad_norm"),
                         ("total_loss", "total_loss")):
            if src in stats and stats[src] is not None:
                out[dst] = float(stats[src])
    return out


def resource_request(spec: Spec) -> dict[str, float]:
    """What one trial of ``spec`` holds in the cluster (RLlib's placement group, summed over bundles)."""
    return dict(algorithm_class(spec.algo.name).default_resource_request(build_config(spec)).required_resources)


def check_fits(spec: Spec) -> str | None:
    """Why one trial cannot start on the connected (fixed-size, local) Ray, or None."""
    import ray

    from rayrl.search import trial_misfit

    return trial_misfit(ray.cluster_resources(), resource_request(spec))
