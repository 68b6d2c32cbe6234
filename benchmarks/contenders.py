"""The contenders of the side-by-side benchmarks (throughput, time to reward), built one way each.

* ``rllib_same_settings``: stock RLlib ``PPOConfig`` with exactly rayrl's spec settings (runners, envs,
  batch, minibatch, epochs, lr, gamma, lambda, coefficients, clipping, network, seed) and nothing
  of rayrl's: RLlib's learner, RLlib's SingleAgentEnvRunner, no callback.
* ``rllib_tuned_example``: RLlib's ``rllib/tuned_examples/ppo/cartpole_ppo.py`` (a 32-unit linear
  network sharing value layers, lr 3e-4, 6 epochs, vf coeff 0.01, KL loss; RLlib's defaults
  otherwise: 2 runners x 1 env, batch 4000, minibatch 128), without its parallel evaluation runner
  (every contender is judged on its training return).
* ``sb3_zoo``: Stable-Baselines3 PPO with RL Zoo's tuned CartPole-v1 hyperparameters (8 envs,
  n_steps 32, batch 256, 20 epochs, gamma 0.98, gae_lambda 0.8, lr and clip range linear from 1e-3
  and 0.2 over Zoo's 1e5 steps); needs the ``bench`` extra.
* ``rayrl`` / ``rayrl_fast``: rayrl's spec through ``rayrl.algo.build_config`` with
  ``env.runner`` rllib / fast.
"""

from __future__ import annotations

import time
from typing import Any, Callable

ZOO_TIMESTEPS = 100_000  #: RL Zoo's n_timesteps for CartPole-v1: the horizon of its linear schedules


def rllib_same_settings(spec: Any, seed: int | None = None) -> Any:
    from ray.rllib.algorithms.ppo import PPOConfig

    from rayrl.models import model_config

    a, r = spec.algo, spec.resources
    return (PPOConfig().environment(spec.env.id, env_config=dict(spec.env.config))
            .env_runners(num_env_runners=r.env_runners, num_envs_per_env_runner=spec.env.envs_per_runner)
            .training(lr=a.lr, gamma=a.gamma, lambda_=a.gae_lambda,
                      train_batch_size_per_learner=a.train_batch_per_learner,
                      minibatch_size=a.minibatch_size, num_epochs=a.epochs, entropy_coeff=a.entropy_coeff,
                      vf_loss_coeff=a.vf_loss_coeff, grad_clip=a.grad_clip or None)
            .rl_module(model_config=model_config(spec.model))   # the same network rayrl builds
            .debugging(seed=spec.seed if seed is None else seed, log_level="ERROR")
            .reporting(metrics_num_episodes_for_smoothing=20))


def rllib_tuned_example(seed: int | None = None, env_id: str = "CartPole-v1") -> Any:
    from ray.rllib.algorithms.ppo import PPOConfig

    return (PPOConfig().environment(env_id)
            .rl_module(model_config={"fcnet_hiddens": [32], "fcnet_activation": "linear", "vf_share_layers": True})
            .training(gamma=0.99, lr=0.0003, num_epochs=6, vf_loss_coeff=0.01, use_kl_loss=True)
            .debugging(seed=seed, log_level="ERROR")
            .reporting(metrics_num_episodes_for_smoothing=20))


def rayrl(spec: Any, runner: str, seed: int | None = None) -> Any:
    from rayrl import spec as spec_mod
    from rayrl.algo import build_config

    return build_config(spec_mod.replace(spec, env={"runner": runner}, **({} if seed is None else {"seed": seed})))


def sb3_zoo(seed: int, env_id: str = "CartPole-v1") -> Any:
    """An SB3 PPO model with RL Zoo's CartPole-v1 hyperparameters (not yet trained)."""
    try:
        from stable_baselines3 import PPO
        from stable_baselines3.common.env_util import make_vec_env
    except ImportError as exc:
        raise SystemExit(f"sb3_zoo needs stable-baselines3 ({exc}): pip install -e '.[bench]'") from None

    def linear(start: float) -> Callable[[float], float]:
        return lambda progress_remaining: progress_remaining * start

    env = make_vec_env(env_id, n_envs=8, seed=seed)
    return PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
               learning_rate=linear(1e-3), clip_range=linear(0.2), seed=seed, device="cpu", verbose=0)


def sb3_learn(model: Any, env_steps: int, target: float | None = None, window: int = 20,
              max_wall_s: float = float("inf")) -> dict[str, Any]:
    """Train ``model`` for ``env_steps`` more, or to a ``target`` mean return of the last ``window`` episodes
    (then within Zoo's 1e5 steps, its schedules' horizon), or until ``max_wall_s``."""
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

    # To a target: Zoo's own horizon (its linear schedules end at 1e5 steps, which also caps the run).
    model.learn(total_timesteps=ZOO_TIMESTEPS if target is not None else env_steps,
                callback=Stop(), reset_num_timesteps=False)
    out["wall_s"] = time.perf_counter() - start
    out["env_steps"] = float(model.num_timesteps - first)
    return out
