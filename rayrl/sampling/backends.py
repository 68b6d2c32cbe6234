"""The vectorised env a fast runner steps: gymnasium's own, or EnvPool's (C++ threads, no GIL).

Both autoreset on the next step (see :mod:`rayrl.sampling.episodes`). ``gymnasium`` takes the
env's numpy-vectorised implementation when gymnasium registers one (``vector_entry_point``:
CartPole, ...) and otherwise leaves the env to RLlib (SyncVectorEnv over gymnasium.make, factories,
ALE); ``envpool`` runs EnvPool's implementation of the same id. For an ALE id (``ALE/Breakout-v5``)
EnvPool's Atari env is set up to give what RLlib's Atari preprocessing gives
(:mod:`rayrl.envs.registry`): 84x84 grayscale, 4 stacked frames channels-last scaled to [-1, 1],
frameskip 4, up to 30 no-ops and FIRE at reset, each life one episode, rewards clipped to their sign,
so one spec runs on either backend with the same module.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rayrl.envs import registry
from rayrl.spec.preflight import envpool_id

#: env.config keys of an ALE spec that EnvPool names otherwise (the rest pass as they are).
ALE_TO_ENVPOOL = {"frameskip": "frame_skip"}


def envpool_options(env_id: str, env_config: dict) -> dict:
    """EnvPool's keyword arguments for a spec's env.config; for ALE ids, RLlib's preprocessing as
    EnvPool's options (a key EnvPool does not know is refused by ``envpool.make``, naming it)."""
    if not registry.is_ale(env_id):
        return dict(env_config)
    options = {
        "frame_skip": registry.ATARI_FRAMESKIP,
        "stack_num": registry.ATARI_FRAMESTACK,
        "img_height": registry.ATARI_DIM,
        "img_width": registry.ATARI_DIM,
        "noop_max": 30,
        "use_fire_reset": True,
        "episodic_life": True,
        "reward_clip": True,
        "repeat_action_probability": 0.25,  # ALE v5's default, as gymnasium.make gives it
    }
    options.update({ALE_TO_ENVPOOL.get(k, k): v for k, v in env_config.items()})
    return options


def gymnasium_vector(env_id: str, num_envs: int, env_config: dict) -> gym.vector.VectorEnv | None:
    """gymnasium's numpy-vectorised env for ``env_id``, or None when it registers none."""
    if env_id not in gym.registry or gym.spec(env_id).vector_entry_point is None:
        return None
    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **env_config)


class EnvPoolVectorEnv(gym.vector.VectorEnv):
    """An EnvPool pool behind gymnasium's VectorEnv interface (spaces, reset, step), NEXT_STEP autoreset."""

    def __init__(self, env_id: str, num_envs: int, env_config: dict, seed: int | None = None) -> None:
        import envpool

        self._pool = envpool.make_gymnasium(
            envpool_id(env_id), num_envs=num_envs, seed=seed or 0, **envpool_options(env_id, env_config)
        )
        self.num_envs = num_envs
        self._image = registry.is_ale(env_id)
        self.single_observation_space = self._pool.observation_space
        if self._image:  # (stack, H, W) uint8 -> (H, W, stack) float32 in [-1, 1], as RLlib's wrapper
            c, h, w = self._pool.observation_space.shape
            self.single_observation_space = gym.spaces.Box(-1.0, 1.0, (h, w, c), np.float32)
        self.single_action_space = self._pool.action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """EnvPool seeds its envs when the pool is made (``seed``); a reset's seed is not used."""
        obs, _ = self._pool.reset()
        return self._obs(obs), {}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        obs, rew, term, trunc, _ = self._pool.step(np.asarray(actions))
        return self._obs(obs), rew.astype(np.float32, copy=False), term, trunc, {}

    def _obs(self, obs: np.ndarray) -> np.ndarray:
        if not self._image:
            return obs
        out = np.transpose(obs, (0, 2, 3, 1)).astype(np.float32)  # the one copy a step
        out *= 1.0 / 128.0
        out -= 1.0
        return out

    def close(self, **kwargs: Any) -> None:
        self._pool.close() if hasattr(self._pool, "close") else None
