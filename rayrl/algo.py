"""The one adapter from a rayrl Spec onto RLlib's AlgorithmConfig (new API stack).

Everything RLlib-specific about building an algorithm lives here; the rest of rayrl sees a Spec
and a result dict (see :mod:`rayrl.keys`).
"""

from __future__ import annotations

import math
import time
from typing import Any

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.tune.registry import register_env

from rayrl import keys, metrics
from rayrl.faults.watchdog import Watchdog
from rayrl.spec import Spec, resolve_factory


def env_name(spec: Spec) -> str:
    """The name RLlib builds the env from; factories are registered with Tune's registry."""
    env_id = spec.env.id
    if ":" in env_id:
        factory = resolve_factory(env_id)
        name = "rayrl_env:" + env_id
        register_env(name, lambda cfg, f=factory: f(dict(cfg)))
        return name
    if env_id.startswith("ALE/"):
        name = "rayrl_ale:" + env_id

        def make_ale(cfg: dict, env_id: str = env_id) -> Any:
            import ale_py
            import gymnasium

            gymnasium.register_envs(ale_py)
            return gymnasium.make(env_id, **dict(cfg))

        register_env(name, make_ale)
        return name
    return env_id


def backend_for(spec: Spec) -> str:
    """The torch.distributed backend RLlib's LearnerGroup starts (via Ray Train's TorchConfig)."""
    if spec.resources.learners == 0:
        return "none"
    return "nccl" if spec.resources.gpus_per_learner > 0 else "gloo"


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
        .rl_module(model_config={"fcnet_hiddens": list(a.hidden), "vf_share_layers": False})
        .callbacks(RayrlCallback)
        .debugging(seed=spec.seed, log_level="ERROR")
        .reporting(metrics_num_episodes_for_smoothing=20)
    )
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
        })
        self._observer.observe(result)  # hardware sample into result["rayrl"]; Ray gauges
        result["rayrl"]["hung_runner_restarts"] = self._watchdog.check(algorithm)


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
