"""A tiny env whose episodes outlast a training iteration: `tests.long_env:make` (env.id factory).

Each step the agent guesses the sign of a noisy observation: +1 for a right guess, 0 otherwise.
Episodes last ``length`` steps (500 by default), so with smoke budgets (batch 128-512 per
iteration) several iterations pass before the first episode finishes. Random play scores about
length/2; a learned policy about 0.9 x length.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class SignGuess(gym.Env):
    def __init__(self, length: int = 500) -> None:
        self.length = int(length)
        self.observation_space = gym.spaces.Box(-3.0, 3.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._rng = np.random.default_rng(0)
        self._t = 0
        self._x = 0.0

    def _obs(self) -> np.ndarray:
        self._x = float(self._rng.normal())
        return np.array([np.clip(self._x + 0.3 * self._rng.normal(), -3, 3)], np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action: int):
        reward = 1.0 if (action == 1) == (self._x > 0) else 0.0
        self._t += 1
        return self._obs(), reward, False, self._t >= self.length, {}


def make(env_config: dict) -> gym.Env:
    return SignGuess(**env_config)
