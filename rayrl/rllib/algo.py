"""The one adapter from a rayrl Spec onto RLlib's AlgorithmConfig (new API stack).

Everything RLlib-specific about building an algorithm lives here; the rest of rayrl sees a Spec
and a result dict (see :mod:`rayrl.observe.keys`).
"""

from __future__ import annotations

from typing import Any

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

from rayrl.envs import registry
from rayrl.rllib import models
from rayrl.rllib.callback import RayrlCallback
from rayrl.sampling import runner_class
from rayrl.spec import Spec, schedule


def env_name(spec: Spec) -> str:
    """The name RLlib builds the env from (factories and ALE ids are registered: rayrl.envs.registry)."""
    return registry.env_name(spec.env.id)


def quiet_notices(algo_name: str) -> None:
    """Spend RLlib's once-per-process "you are running X on the new API stack" notice.

    rayrl always runs the new API stack, so the notice only adds lines to every trial's log; it is
    guarded by RLlib's own ``log_once`` key, which this takes first (nothing else is silenced).
    """
    from ray.util import log_once

    log_once(f"{algo_name}_on_new_api_stack")


def build_config(spec: Spec) -> AlgorithmConfig:
    """Spec -> AlgorithmConfig for PPO, APPO or IMPALA; nothing is started here."""
    from rayrl.rllib.learner import learner_class, learner_settings

    quiet_notices(spec.algo.name)

    a, r = spec.algo, spec.resources
    config = _config_class(a.name)()
    config = (
        config.environment(env_name(spec), env_config=dict(spec.env.config))
        .framework("torch")
        .env_runners(
            num_env_runners=r.env_runners,
            num_envs_per_env_runner=spec.env.envs_per_runner,
            num_cpus_per_env_runner=r.cpus_per_env_runner,
            env_runner_cls=runner_class(spec.env_runner, spec.env.backend),
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
            lr=schedule.lr(a.lr, a.lr_final, spec.effective_lr, spec.stop.env_steps),
            gamma=a.gamma,
            train_batch_size_per_learner=a.train_batch_per_learner,
            minibatch_size=a.minibatch_size,
            num_epochs=a.epochs,
            entropy_coeff=schedule.points(a.entropy_coeff, a.entropy_final, spec.stop.env_steps),
            vf_loss_coeff=a.vf_loss_coeff,
            # rayrl's learner clips (and reports the pre-clip norm) itself: see rayrl.rllib.learner.
            grad_clip=None,
        )
        .rl_module(
            model_config=models.model_config(spec.model, atari=registry.is_ale(spec.env.id)),
            rl_module_spec=models.module_spec(spec),
        )
        .callbacks(RayrlCallback)
        .debugging(seed=spec.seed, log_level="ERROR")
        .reporting(metrics_num_episodes_for_smoothing=20)
    )
    if spec.model.normalize_obs:
        config.env_runners(env_to_module_connector=models.obs_filter_factory(spec.model.obs_clip))
    if spec.evaluation.interval > 0:
        e = spec.evaluation
        config.evaluation(
            evaluation_interval=e.interval,
            evaluation_duration=e.episodes,
            evaluation_duration_unit="episodes",
            evaluation_num_env_runners=e.env_runners,
            evaluation_config={"explore": not e.deterministic},
        )
    if spec.checkpoint.hung_runner_s > 0:  # a hung runner's late sample is dropped before the watchdog acts
        config.env_runners(sample_timeout_s=min(config.sample_timeout_s or 60.0, spec.checkpoint.hung_runner_s / 2))
    if a.clip is not None:
        config.training(clip_param=a.clip)
    if a.name == "PPO":
        config = config.training(
            lambda_=a.gae_lambda, vf_clip_param=a.vf_clip if a.vf_clip is not None else float("inf")
        )
        config.training(**kl_settings(a.kl_coeff))
        config.env_runners(rollout_fragment_length="auto")
        config.reporting(min_sample_timesteps_per_iteration=a.report_env_steps or None)
        if a.sample_ahead:
            config.algo_class = algorithm_class(a.name, sample_ahead=True)
            # The runners' connector states come back with each sample (rayrl.rllib.sample_ahead);
            # RLlib's blocking gather after every step would wait behind the sample in flight.
            config._dont_auto_sync_env_runner_states = True
    else:
        # IMPALA/APPO need minibatches made of whole rollout fragments.
        config.env_runners(rollout_fragment_length=fragment_length(a.minibatch_size))
    return config


def kl_settings(kl_coeff: float | None) -> dict[str, Any]:
    """RLlib's PPO training settings for ``algo.kl_coeff``: none for null (RLlib's own), and 0 is no
    KL term at all, not a zero weight on one (RLlib would still compute the KL and adapt it)."""
    if kl_coeff is None:
        return {}
    if kl_coeff == 0:
        return {"use_kl_loss": False}
    return {"use_kl_loss": True, "kl_coeff": kl_coeff}


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


def algorithm_class(name: str, sample_ahead: bool = False) -> type:
    """The RLlib Algorithm (a Tune Trainable) for ``name``; PPO's sampling-ahead subclass when asked."""
    if sample_ahead and name == "PPO":
        from rayrl.rllib.sample_ahead import PPO

        return PPO
    return _config_class(name)().algo_class
