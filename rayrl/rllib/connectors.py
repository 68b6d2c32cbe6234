"""rayrl's learner connector piece: reward normalisation (``algo.normalize_reward``).

RLlib's new API stack clips rewards but cannot normalise them. This piece runs first in the
learner's pipeline, before RLlib's one-step elongation and GAE, so the advantages and value targets
are computed from scaled rewards while every env runner (RLlib's or the fast one) samples and
reports the env's raw rewards: the episodes it changes are the learner's shallow copies, never the
objects an in-process env runner keeps for its episode-return metrics. Its state (the statistics
and each ongoing episode's discounted return) is saved with the learner's (rayrl.rllib.learner).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from rayrl.rllib.returns import ReturnNormalizer


class NormalizeRewards(ConnectorV2):
    """Replaces each training episode by a copy whose rewards are divided by the return's std."""

    def __init__(
        self,
        input_observation_space: Any = None,
        input_action_space: Any = None,
        *,
        gamma: float = 0.99,
        clip: float = 10.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self.normalizer = ReturnNormalizer(gamma=gamma, clip=clip)

    def __call__(self, *, rl_module: Any, batch: Any, episodes: list, **kwargs: Any) -> Any:
        chunks = []
        for e in episodes:
            if not isinstance(e, SingleAgentEpisode):
                raise TypeError(f"algo.normalize_reward supports single-agent episodes, not {type(e).__name__}")
            chunks.append((e.id_, np.asarray(e.get_rewards(), dtype=np.float64), e.is_done))
        scaled = self.normalizer(chunks, reduce=_allreduce if _ddp() else None)
        for i, (e, new) in enumerate(zip(episodes, scaled, strict=True)):
            episodes[i] = _with_rewards(e, new)
        return batch

    def get_state(self, *args: Any, **kwargs: Any) -> dict:
        return self.normalizer.get_state()

    def set_state(self, state: dict) -> None:
        if state:
            self.normalizer.set_state(state)


def _with_rewards(episode: SingleAgentEpisode, rewards: np.ndarray) -> SingleAgentEpisode:
    """A shallow copy of ``episode`` with its own rewards buffer (lookback kept, dtype kept)."""
    out, buf = copy.copy(episode), copy.copy(episode.rewards)
    was_array = isinstance(buf.data, np.ndarray)
    data = np.array(buf.data, dtype=buf.data.dtype if was_array else np.float32)  # a copy either way
    data[buf.lookback : buf.lookback + len(rewards)] = rewards
    buf.data = data if was_array else list(data)
    out.rewards = buf
    return out


def _ddp() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _allreduce(sums: tuple[float, float, float]) -> tuple[float, float, float]:
    t = torch.tensor(sums, dtype=torch.float64)
    dist.all_reduce(t)
    n, s, ss = (float(v) for v in t.tolist())
    return n, s, ss
