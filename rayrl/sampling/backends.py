"""The vectorised env a fast runner steps: gymnasium's own, or EnvPool's (C++ threads, no GIL).

Both autoreset on the next step (see :mod:`rayrl.sampling.episodes`). ``gymnasium`` takes the
env's numpy-vectorised implementation when gymnasium registers one (``vector_entry_point``:
CartPole, ...) and otherwise leaves the env to RLlib (SyncVectorEnv over gymnasium.make, factories,
ALE); ``envpool`` runs EnvPool's implementation of the same id.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


def gymnasium_vector(env_id: str, num_envs: int, env_config: dict) -> gym.vector.VectorEnv | None:
    """gymnasium's numpy-vectorised env for ``env_id``, or None when it registers none."""
    if env_id not in gym.registry or gym.spec(env_id).vector_entry_point is None:
        return None
    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **env_config)


class EnvPoolVectorEnv(gym.vector.VectorEnv):
    """An EnvPool pool behind gymnasium's VectorEnv interface (spaces, reset, step), NEXT_STEP autoreset."""

    def __init__(self, env_id: str, num_envs: int, env_config: dict, seed: int | None = None) -> None:
        import envpool

        self._pool = envpool.make_gymnasium(env_id, num_envs=num_envs, seed=seed or 0, **env_config)
        self.num_envs = num_envs
        self.single_observation_space = self._pool.observation_space
        self.single_action_space = self._pool.action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """EnvPool seeds its envs when the pool is made (``seed``); a reset's seed is not used."""
        obs, _ = self._pool.reset()
        return obs, {}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        obs, rew, term, trunc, _ = self._pool.step(np.asarray(actions))
        return obs, rew.astype(np.float32, copy=False), term, trunc, {}

    def close(self, **kwargs: Any) -> None:
        self._pool.close() if hasattr(self._pool, "close") else None
