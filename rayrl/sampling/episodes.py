"""A rollout's preallocated arrays -> RLlib SingleAgentEpisodes, in bulk (pure numpy, no Ray).

The fast runner steps N envs for T steps and writes every step into arrays; only at the end are
they cut into episodes, so the learner side (GAE, losses) sees exactly what RLlib's own runner
would hand it. Vector envs autoreset on the *next* step (gymnasium's NEXT_STEP mode, and
EnvPool's): the step after an episode ends only resets that env; its action is ignored, its
reward is 0 and its observation is the new episode's first. Such steps are marked ``reset`` and
belong to no episode.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer


@dataclass
class Carry:
    """Where env ``i``'s episode stands between two rollouts."""

    id_: str = field(default_factory=lambda: uuid.uuid4().hex)
    t: int = 0  #: env steps of this episode already returned in earlier chunks
    pending_reset: bool = False  #: the last step ended it: the next step is an autoreset step
    start_time: float = field(default_factory=time.perf_counter)


class Rollout:
    """Preallocated arrays for up to ``capacity`` vector steps of ``num_envs`` envs; grown if needed.

    ``obs[t]`` is what the policy saw at step ``t``; ``obs[T]`` the observation after the last
    step. ``extra`` holds the model outputs an episode keeps (action log-probs, dist inputs).
    """

    def __init__(
        self,
        num_envs: int,
        obs_shape: tuple,
        obs_dtype: Any,
        act_shape: tuple,
        act_dtype: Any,
        extra: dict[str, tuple[tuple, Any]],
        capacity: int,
    ) -> None:
        self.num_envs, self.t = num_envs, 0
        self._specs = {
            "obs": (obs_shape, obs_dtype),
            "actions": (act_shape, act_dtype),
            "rewards": ((), np.float32),
            "terminated": ((), bool),
            "truncated": ((), bool),
            "reset": ((), bool),
            **{f"extra:{k}": v for k, v in extra.items()},
        }
        self.arrays: dict[str, np.ndarray] = {}
        self.times = np.zeros(0)
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        old, self.capacity = self.arrays, capacity
        self.arrays = {
            k: np.zeros((capacity + (k == "obs"), self.num_envs, *shape), dtype)
            for k, (shape, dtype) in self._specs.items()
        }
        times, self.times = self.times, np.zeros(capacity + 1)
        for k, a in old.items():
            self.arrays[k][: len(a)] = a
        self.times[: len(times)] = times

    def ensure(self, steps: int) -> None:
        """Room for ``steps`` vector steps (doubling: amortised O(1) a step)."""
        if steps > self.capacity:
            self._allocate(max(steps, 2 * self.capacity))

    def __getitem__(self, key: str) -> np.ndarray:
        return self.arrays[key]


def build(
    r: Rollout,
    carry: list[Carry],
    obs_space: Any,
    act_space: Any,
    now: float | None = None,
) -> tuple[list[SingleAgentEpisode], list[SingleAgentEpisode]]:
    """Cut ``r``'s first ``r.t`` steps into done episodes and ongoing chunks; ``carry`` is updated.

    An ongoing chunk keeps its episode's id and ``t_started`` so the next chunk continues it (as
    RLlib's ``SingleAgentEpisode.cut`` does); its last observation is the one GAE bootstraps from.
    """
    T = r.t
    now = time.perf_counter() if now is None else now
    done_mask = r["terminated"][:T] | r["truncated"][:T]
    extra_keys = [k for k in r.arrays if k.startswith("extra:")]
    done: list[tuple[int, int, SingleAgentEpisode]] = []
    ongoing: list[SingleAgentEpisode] = []
    for i in range(r.num_envs):
        c = carry[i]
        s = 0
        if c.pending_reset:  # the carried episode ended on the last rollout's last step: step 0 resets
            carry[i] = c = Carry(start_time=float(r.times[0]))
            s = 1
        for d in (int(x) for x in np.flatnonzero(done_mask[:, i])):  # episode steps s..d (a reset step never ends one)
            ep = _episode(
                r,
                i,
                s,
                d + 1,
                c,
                extra_keys,
                obs_space,
                act_space,
                terminated=bool(r["terminated"][d, i]),
                truncated=bool(r["truncated"][d, i]),
            )
            ep._start_time, ep._last_step_time = c.start_time, r.times[d + 1]
            done.append((d, i, ep))
            s = d + 2  # step d + 1 resets this env
            carry[i] = c = Carry(start_time=float(r.times[min(s, T)]), pending_reset=s > T)
        if s < T:  # steps s..T-1 of an episode the next rollout continues
            ep = _episode(r, i, s, T, c, extra_keys, obs_space, act_space, terminated=False, truncated=False)
            ep._start_time, ep._last_step_time = c.start_time, now
            ongoing.append(ep)
            c.t += T - s
            c.start_time = now
    # In the order the episodes ended, as RLlib's runner returns (and logs) them.
    return [ep for _, _, ep in sorted(done, key=lambda x: x[:2])], ongoing


def _episode(
    r: Rollout,
    i: int,
    s: int,
    e: int,
    c: Carry,
    extra_keys: list[str],
    obs_space: Any,
    act_space: Any,
    terminated: bool,
    truncated: bool,
) -> SingleAgentEpisode:
    n = e - s
    ep = SingleAgentEpisode(
        id_=c.id_,
        observations=r["obs"][s : e + 1, i].copy(),
        infos=InfiniteLookbackBuffer([{} for _ in range(n + 1)]),
        actions=r["actions"][s:e, i].copy(),
        rewards=r["rewards"][s:e, i].copy(),
        extra_model_outputs={k[6:]: r[k][s:e, i].copy() for k in extra_keys},
        terminated=terminated,
        truncated=truncated,
        t_started=c.t,
        len_lookback_buffer=0,
        observation_space=obs_space,
        action_space=act_space,
    )
    return ep
