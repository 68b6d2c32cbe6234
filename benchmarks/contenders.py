"""The contenders of the side-by-side benchmarks (throughput, time to reward), built one way each.

* ``rllib_same_settings``: stock RLlib ``PPOConfig`` with exactly rayrl's spec settings (runners, envs,
  batch, minibatch, epochs, lr, gamma, lambda, coefficients, clipping, network incl. ``free_log_std``,
  observation normalisation, evaluation, seed) and nothing of rayrl's: RLlib's learner, RLlib's
  SingleAgentEnvRunner, no callback. ``model.normalize_obs`` is RLlib's own ``MeanStdFilter``
  env-to-module connector piece (what ``rayrl.rllib.algo.build_config`` adds); the spec's ``evaluation``
  section is RLlib's ``config.evaluation`` with the same interval, episodes, runners and
  determinism, so both contenders pay the same evaluation cost in their wall time.
* ``rllib_tuned_example``: RLlib's ``rllib/tuned_examples/ppo/cartpole_ppo.py`` (a 32-unit linear
  network sharing value layers, lr 3e-4, 6 epochs, vf coeff 0.01, KL loss; RLlib's defaults
  otherwise: 2 runners x 1 env, batch 4000, minibatch 128), without its parallel evaluation runner
  (every contender is judged on its training return). CartPole-v1 only: RLlib 2.60's wheel ships no
  ``tuned_examples`` at all, and the repository's only new-stack MuJoCo PPO script
  (``benchmark_ppo_mujoco.py``: 32 runners, a GPU learner, all MuJoCo envs at once) is a cluster
  benchmark, not a tuned example this machine can run; its old ``hopper-ppo.yaml`` is old-stack.
* ``sb3_zoo``: Stable-Baselines3 PPO with RL Zoo's tuned hyperparameters (``ZOO``); needs the
  ``bench`` extra.

  - CartPole-v1: 8 envs, n_steps 32, batch 256, 20 epochs, gamma 0.98, gae_lambda 0.8, lr and clip
    range linear from 1e-3 and 0.2 over Zoo's 1e5 steps.
  - Hopper-v4/v5: RL Zoo ``hyperparams/ppo.yml``, entry ``Hopper-v4`` (DLR-RM/rl-baselines3-zoo,
    e.g. commit 208b6fd; the same values as its older ``Hopper-v3`` entry): normalize: true,
    n_envs 1, n_timesteps 1e6, batch_size 32, n_steps 512, gamma 0.999, learning_rate 9.80828e-05,
    ent_coef 0.00229519, clip_range 0.2, n_epochs 5, gae_lambda 0.99, max_grad_norm 0.7, vf_coef
    0.835671, policy_kwargs log_std_init=-2, ortho_init=False, activation_fn=nn.ReLU,
    net_arch=dict(pi=[256, 256], vf=[256, 256]). Zoo's ``normalize: true`` is ``VecNormalize`` with
    its defaults (observations *and* rewards normalised, clip 10) and, as Zoo's ExperimentManager
    does, VecNormalize's gamma set to the algorithm's (0.999). No schedules. SB3's ``Monitor``
    (added by ``make_vec_env`` under the VecNormalize) records raw episode returns, so
    ``ep_info_buffer`` and every figure here are unnormalised returns. Hopper-v5 has Hopper-v4's
    observation and action spaces and default reward; Zoo's entry was tuned on v3/v4.
* ``rayrl`` / ``rayrl_fast``: rayrl's spec through ``rayrl.rllib.algo.build_config`` with
  ``env.runner`` rllib / fast.
* ``sb3_same_settings``: Stable-Baselines3 PPO with the spec's settings (``sb3_same_settings``): envs,
  rollout (batch / envs steps per env), minibatch, epochs, lr, gamma, lambda, clip (RLlib's 0.3 when
  the spec leaves it unset), entropy and value coefficients, gradient clip, Adam's epsilon, the
  network (separate policy and value MLPs of ``model.hidden``, or SB3's shared trunk with
  ``vf_share_layers``), orthogonal init only with ``model.init: orthogonal``, VecNormalize with
  ``model.normalize_obs`` / ``algo.normalize_reward``. Not mapped (SB3 has no equivalent):
  RLlib's value-loss clip (``algo.vf_clip``), RLlib's KL penalty (``algo.kl_coeff`` unless 0) and
  schedules other than to 0; the ratio is then a
  platform result only as far as these match, which ``same_settings_gaps`` lists.
* ``rayrl_zoo_settings``: RL Zoo's tuned settings for the env (``ZOO_SPEC``) as rayrl spec overrides:
  the same algorithm as ``sb3_zoo``, on rayrl.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

ZOO_TIMESTEPS = 100_000  #: RL Zoo's n_timesteps for CartPole-v1: the horizon of its linear schedules
#: RL Zoo's n_timesteps per env id: the horizon ``model.learn`` is given (its schedules' end, if any).
ZOO_N_TIMESTEPS = {"CartPole-v1": ZOO_TIMESTEPS, "Hopper-v4": 1_000_000, "Hopper-v5": 1_000_000}
SB3_ZOO_ENVS = tuple(ZOO_N_TIMESTEPS)  #: env ids sb3_zoo has RL Zoo's tuned hyperparameters for
TUNED_EXAMPLE_ENVS = ("CartPole-v1",)  #: env ids RLlib has a tuned PPO example for (see the docstring)


#: RL Zoo's tuned PPO settings per env as rayrl spec overrides (the same values sb3_zoo gives SB3).
ZOO_SPEC: dict[str, dict[str, Any]] = {
    "CartPole-v1": {
        "env.envs_per_runner": 8,
        "algo.train_batch_per_learner": 8 * 32,
        "algo.minibatch_size": 256,
        "algo.epochs": 20,
        "algo.gamma": 0.98,
        "algo.gae_lambda": 0.8,
        "algo.entropy_coeff": 0.0,
        "algo.lr": 1e-3,
        "algo.lr_final": 0.0,
        "algo.clip": 0.2,
        "algo.clip_final": 1e-4,  # rayrl needs > 0; SB3's anneal ends at 0 on the last step
        "algo.vf_loss_coeff": 0.5,  # SB3's defaults from here on
        "algo.grad_clip": 0.5,
        "algo.vf_clip": None,
        "algo.kl_coeff": 0.0,  # SB3 has no KL penalty
        "algo.adam_eps": 1e-5,
        "model.hidden": [64, 64],
        "model.activation": "tanh",
        "model.vf_share_layers": False,
        "model.init": "orthogonal",
        "stop.env_steps": ZOO_TIMESTEPS,  # the schedules' horizon, as Zoo's n_timesteps
    },
    "Hopper-v5": {
        "env.envs_per_runner": 1,
        "algo.train_batch_per_learner": 512,
        "algo.minibatch_size": 32,
        "algo.epochs": 5,
        "algo.gamma": 0.999,
        "algo.gae_lambda": 0.99,
        "algo.lr": 9.80828e-05,
        "algo.entropy_coeff": 0.00229519,
        "algo.clip": 0.2,
        "algo.vf_loss_coeff": 0.835671,
        "algo.grad_clip": 0.7,
        "algo.vf_clip": None,
        "algo.kl_coeff": 0.0,  # SB3 has no KL penalty
        "algo.adam_eps": 1e-5,
        "algo.normalize_reward": True,
        "model.normalize_obs": True,
        "model.hidden": [256, 256],
        "model.activation": "relu",
        "model.vf_share_layers": False,
        "model.init": "default",
        "model.log_std_init": -2.0,
        "stop.env_steps": 1_000_000,
    },
}
ZOO_SPEC["Hopper-v4"] = ZOO_SPEC["Hopper-v5"]


def zoo_overrides(env_id: str) -> list[str]:
    """``--set`` style overrides that put RL Zoo's settings for ``env_id`` into a rayrl spec."""
    import json

    if env_id not in ZOO_SPEC:
        raise ValueError(
            f"rayrl_zoo_settings: RL Zoo settings are wired for {', '.join(ZOO_SPEC)} only, not {env_id!r}"
        )
    return [f"{k}={json.dumps(v)}" for k, v in ZOO_SPEC[env_id].items()]


def rayrl_zoo_settings(spec: Any, seed: int | None = None, sample_ahead: bool = False) -> Any:
    """rayrl's config for ``spec`` with RL Zoo's tuned settings for its env laid over it (and
    ``algo.sample_ahead`` on at least one remote runner, when asked)."""
    from rayrl import spec as spec_mod

    data = spec_mod.apply_overrides(spec_mod.to_dict(spec), zoo_overrides(spec.env.id))
    zoo = spec_mod.from_dict(data)
    if sample_ahead:
        return rayrl_sample_ahead(zoo, spec.env.runner, seed)
    return rayrl(zoo, spec.env.runner, seed)


def same_settings_gaps(spec: Any) -> list[str]:
    """What ``sb3_same_settings`` cannot give SB3 of this spec (empty: every setting maps)."""
    a = spec.algo
    gaps = []
    if a.vf_clip is not None:
        gaps.append(f"algo.vf_clip {a.vf_clip} (RLlib clips the value loss; SB3 has no such clip)")
    if a.name == "PPO" and a.kl_coeff != 0:
        coeff = "RLlib's 0.2" if a.kl_coeff is None else a.kl_coeff
        gaps.append(f"algo.kl_coeff {coeff} (RLlib's PPO adds an adaptive KL penalty; SB3 has none: set 0)")
    for name in ("lr_final", "clip_final", "entropy_final"):
        if getattr(a, name) not in (None, 0.0):
            gaps.append(f"algo.{name} {getattr(a, name)} (SB3's linear schedules end at 0)")
    if spec.resources.env_runners > 1:
        gaps.append(f"resources.env_runners {spec.resources.env_runners} (SB3 samples its envs in one process)")
    n_envs = spec.env.envs_per_runner * max(1, spec.resources.env_runners)
    if a.train_batch_per_learner % n_envs:
        rollout = a.train_batch_per_learner // n_envs * n_envs
        gaps.append(
            f"algo.train_batch_per_learner {a.train_batch_per_learner} (SB3 rolls out {rollout}: {n_envs} envs)"
        )
    return gaps


def sb3_same_settings(spec: Any, seed: int | None = None) -> Any:
    """An SB3 PPO model with ``spec``'s settings (not yet trained); see the module docstring."""
    try:
        import torch.nn as nn
        from stable_baselines3 import PPO
        from stable_baselines3.common.env_util import make_vec_env
        from stable_baselines3.common.vec_env import VecNormalize
    except ImportError as exc:
        raise SystemExit(f"sb3_same_settings needs stable-baselines3 ({exc}): pip install -e '.[bench]'") from None

    a, m = spec.algo, spec.model
    activations = {"tanh": nn.Tanh, "relu": nn.ReLU, "silu": nn.SiLU, "elu": nn.ELU}
    if m.activation not in activations:
        raise ValueError(f"sb3_same_settings: model.activation {m.activation!r} has no SB3 equivalent here")
    seed = spec.seed if seed is None else seed
    n_envs = spec.env.envs_per_runner * max(1, spec.resources.env_runners)
    env = make_vec_env(spec.env.id, n_envs=n_envs, seed=seed, env_kwargs=dict(spec.env.config))
    if m.normalize_obs or a.normalize_reward:
        env = VecNormalize(env, norm_obs=m.normalize_obs, norm_reward=a.normalize_reward, gamma=a.gamma)

    def schedule(start: float, final: float | None) -> Any:
        return start if final is None else (lambda progress_remaining: progress_remaining * start)

    net = list(m.hidden)
    policy_kwargs: dict[str, Any] = {
        "activation_fn": activations[m.activation],
        "net_arch": net if m.vf_share_layers else {"pi": net, "vf": net},
        "ortho_init": m.init == "orthogonal",
        "optimizer_kwargs": {"eps": a.adam_eps},
    }
    if m.log_std_init is not None:
        policy_kwargs["log_std_init"] = m.log_std_init
    return PPO(
        "MlpPolicy",
        env,
        n_steps=max(1, a.train_batch_per_learner // n_envs),
        batch_size=a.minibatch_size,
        n_epochs=a.epochs,
        learning_rate=schedule(a.lr, a.lr_final),
        gamma=a.gamma,
        gae_lambda=a.gae_lambda,
        clip_range=schedule(a.clip if a.clip is not None else 0.3, a.clip_final),
        ent_coef=a.entropy_coeff,
        vf_coef=a.vf_loss_coeff,
        max_grad_norm=a.grad_clip if a.grad_clip > 0 else float("inf"),
        policy_kwargs=policy_kwargs,
        seed=seed,
        device="cpu",
        verbose=0,
    )


def left_out(env_id: str) -> dict[str, str]:
    """The env-specific contenders that cannot run on ``env_id``, each with why."""
    out = {}
    if env_id not in SB3_ZOO_ENVS:
        out["sb3_zoo"] = (
            f"RL Zoo's tuned hyperparameters are wired in benchmarks/contenders.py for {', '.join(SB3_ZOO_ENVS)} only"
        )
    if env_id not in ZOO_SPEC:
        why = f"RL Zoo's settings as a rayrl spec are wired in benchmarks/contenders.py for {', '.join(ZOO_SPEC)} only"
        out["rayrl_zoo_settings"] = out["rayrl_zoo_sample_ahead"] = why
    if env_id not in TUNED_EXAMPLE_ENVS:
        out["rllib_tuned_example"] = (
            f"RLlib 2.60 ships no tuned PPO example for {env_id} (its wheel has no "
            f"tuned_examples; the one wired here is CartPole-v1's cartpole_ppo.py)"
        )
    return out


def rllib_same_settings(spec: Any, seed: int | None = None) -> Any:
    from ray.rllib.algorithms.ppo import PPOConfig

    from rayrl.rllib.algo import kl_settings
    from rayrl.rllib.models import model_config

    a, r = spec.algo, spec.resources
    config = (
        PPOConfig()
        .environment(spec.env.id, env_config=dict(spec.env.config))
        .env_runners(
            num_env_runners=r.env_runners,
            num_envs_per_env_runner=spec.env.envs_per_runner,
            num_cpus_per_env_runner=r.cpus_per_env_runner,
        )
        .training(
            lr=spec.effective_lr,
            gamma=a.gamma,
            lambda_=a.gae_lambda,
            train_batch_size_per_learner=a.train_batch_per_learner,
            minibatch_size=a.minibatch_size,
            num_epochs=a.epochs,
            entropy_coeff=a.entropy_coeff,
            vf_loss_coeff=a.vf_loss_coeff,
            grad_clip=a.grad_clip or None,
        )
        # The same network rayrl builds: hidden, activation, vf_share_layers, free_log_std, ...
        .rl_module(model_config=model_config(spec.model))
        .debugging(seed=spec.seed if seed is None else seed, log_level="ERROR")
        # algo.report_env_steps is RLlib's own setting: stock RLlib gets it too, or the ratio compares
        # one report per 2,048 steps with one per update (different settings)
        .reporting(metrics_num_episodes_for_smoothing=20, min_sample_timesteps_per_iteration=a.report_env_steps or None)
    )
    config.training(**kl_settings(a.kl_coeff))
    if spec.model.normalize_obs:
        # RLlib's own running mean/std filter, the piece rayrl.rllib.algo.build_config adds for normalize_obs.
        config.env_runners(env_to_module_connector=mean_std_filter)
    if spec.evaluation.interval > 0:
        e = spec.evaluation
        config.evaluation(
            evaluation_interval=e.interval,
            evaluation_duration=e.episodes,
            evaluation_duration_unit="episodes",
            evaluation_num_env_runners=e.env_runners,
            evaluation_config={"explore": not e.deterministic},
        )
    return config


def mean_std_filter(env: Any = None, spaces: Any = None, device: Any = None) -> Any:
    """RLlib's MeanStdFilter connector piece (a running mean/std of observations, merged across runners)."""
    from ray.rllib.connectors.env_to_module.mean_std_filter import MeanStdFilter

    return MeanStdFilter(multi_agent=False)


def rllib_tuned_example(seed: int | None = None, env_id: str = "CartPole-v1") -> Any:
    if env_id not in TUNED_EXAMPLE_ENVS:
        raise ValueError(
            f"rllib_tuned_example: RLlib has a tuned PPO example for {', '.join(TUNED_EXAMPLE_ENVS)} "
            f"only, not {env_id!r}"
        )
    from ray.rllib.algorithms.ppo import PPOConfig

    return (
        PPOConfig()
        .environment(env_id)
        .rl_module(model_config={"fcnet_hiddens": [32], "fcnet_activation": "linear", "vf_share_layers": True})
        .training(gamma=0.99, lr=0.0003, num_epochs=6, vf_loss_coeff=0.01, use_kl_loss=True)
        .debugging(seed=seed, log_level="ERROR")
        .reporting(metrics_num_episodes_for_smoothing=20)
    )


def rayrl(spec: Any, runner: str, seed: int | None = None) -> Any:
    from rayrl import spec as spec_mod
    from rayrl.rllib.algo import build_config

    return build_config(spec_mod.replace(spec, env={"runner": runner}, **({} if seed is None else {"seed": seed})))


def rayrl_sample_ahead(spec: Any, runner: str, seed: int | None = None) -> Any:
    """rayrl's config with ``algo.sample_ahead`` on, on the spec's remote runners (at least one)."""
    from rayrl import spec as spec_mod

    ahead = spec_mod.replace(
        spec, algo={"sample_ahead": True}, resources={"env_runners": max(1, spec.resources.env_runners)}
    )
    return rayrl(ahead, runner, seed)


def sb3_zoo(seed: int, env_id: str = "CartPole-v1") -> Any:
    """An SB3 PPO model with RL Zoo's tuned hyperparameters for ``env_id`` (not yet trained)."""
    if env_id not in SB3_ZOO_ENVS:
        raise ValueError(
            f"sb3_zoo: RL Zoo hyperparameters are wired here for {', '.join(SB3_ZOO_ENVS)} only, not {env_id!r}"
        )
    try:
        from stable_baselines3 import PPO
        from stable_baselines3.common.env_util import make_vec_env
        from stable_baselines3.common.vec_env import VecNormalize
    except ImportError as exc:
        raise SystemExit(f"sb3_zoo needs stable-baselines3 ({exc}): pip install -e '.[bench]'") from None

    def linear(start: float) -> Callable[[float], float]:
        return lambda progress_remaining: progress_remaining * start

    if env_id == "CartPole-v1":
        env = make_vec_env(env_id, n_envs=8, seed=seed)
        return PPO(
            "MlpPolicy",
            env,
            n_steps=32,
            batch_size=256,
            gae_lambda=0.8,
            gamma=0.98,
            n_epochs=20,
            ent_coef=0.0,
            learning_rate=linear(1e-3),
            clip_range=linear(0.2),
            seed=seed,
            device="cpu",
            verbose=0,
        )
    import torch.nn as nn

    # Hopper (RL Zoo hyperparams/ppo.yml, Hopper-v4): make_vec_env puts a Monitor (raw returns) under
    # VecNormalize; Zoo's ExperimentManager passes the algorithm's gamma to VecNormalize.
    gamma = 0.999
    env = VecNormalize(make_vec_env(env_id, n_envs=1, seed=seed), gamma=gamma)
    return PPO(
        "MlpPolicy",
        env,
        n_steps=512,
        batch_size=32,
        gamma=gamma,
        learning_rate=9.80828e-05,
        ent_coef=0.00229519,
        clip_range=0.2,
        n_epochs=5,
        gae_lambda=0.99,
        max_grad_norm=0.7,
        vf_coef=0.835671,
        policy_kwargs=dict(
            log_std_init=-2, ortho_init=False, activation_fn=nn.ReLU, net_arch=dict(pi=[256, 256], vf=[256, 256])
        ),
        seed=seed,
        device="cpu",
        verbose=0,
    )


def zoo_timesteps(env_id: str) -> int:
    """RL Zoo's n_timesteps for ``env_id``: the horizon ``model.learn`` gets when training to a target."""
    return ZOO_N_TIMESTEPS[env_id]


def sb3_learn(
    model: Any,
    env_steps: int,
    target: float | None = None,
    window: int = 20,
    max_wall_s: float = float("inf"),
    horizon: int = ZOO_TIMESTEPS,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Train ``model`` for ``env_steps`` more, or to a ``target`` mean return of the last ``window`` episodes
    (then within ``horizon``, Zoo's n_timesteps for the env: its schedules' horizon, if it has any), or
    until ``max_wall_s``. ``progress`` gets the running figures after every rollout."""
    from stable_baselines3.common.callbacks import BaseCallback

    out: dict[str, Any] = {"reached": False, "return": float("nan")}
    start, first = time.perf_counter(), model.num_timesteps

    class Stop(BaseCallback):
        def _on_step(self) -> bool:
            eps = list(self.model.ep_info_buffer)[-window:]
            if len(eps) >= window:
                out["return"] = sum(e["r"] for e in eps) / len(eps)
                if target is not None and out["return"] >= target:
                    out["reached"] = True
                    return False
            return self.model.num_timesteps - first < env_steps and time.perf_counter() - start < max_wall_s

        def _on_rollout_end(self) -> None:
            if progress is not None:
                progress(
                    {
                        "wall_s": time.perf_counter() - start,
                        "env_steps": float(self.model.num_timesteps - first),
                        "return": out["return"],
                    }
                )

    # To a target: Zoo's own horizon (e.g. CartPole's linear schedules end at 1e5 steps, which also caps the run).
    model.learn(
        total_timesteps=horizon if target is not None else env_steps, callback=Stop(), reset_num_timesteps=False
    )
    out["wall_s"] = time.perf_counter() - start
    out["env_steps"] = float(model.num_timesteps - first)
    return out
