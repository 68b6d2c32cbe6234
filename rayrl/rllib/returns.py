"""Reward normalisation's statistics, pure numpy: a running variance of the discounted return.

SB3's ``VecNormalize(norm_reward=True)`` and CleanRL's ``NormalizeReward`` divide each reward by the
running std of ``G_t = gamma * G_{t-1} + r_t`` (reset at an episode's end) and clip the result. PPO
on MuJoCo needs it: raw rewards put value targets in the hundreds and the value loss swamps the
policy's. Here the statistics are updated once per training batch (all of its steps, SB3's parallel
Welford merge) and the batch is then scaled by the updated std, so the result does not depend on
how many env runners produced the batch or in which order their episodes arrive.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

Reduce = Callable[[tuple[float, float, float]], tuple[float, float, float]]


@dataclass
class RunningMoments:
    """Count, mean and variance of a stream, merged a batch at a time (Chan et al.'s formula)."""

    count: float = 1e-4  # SB3's and CleanRL's starting count: the first batch dominates at once
    mean: float = 0.0
    var: float = 1.0

    def merge(self, n: float, mean: float, var: float) -> None:
        """Merge a batch of ``n`` values with this mean and (population) variance."""
        if n <= 0:
            return
        total = self.count + n
        delta = mean - self.mean
        m2 = self.var * self.count + var * n + delta**2 * self.count * n / total
        self.mean, self.var, self.count = self.mean + delta * n / total, m2 / total, total


@dataclass
class ReturnNormalizer:
    """Scales rewards by the running std of the discounted return; one accumulator per episode."""

    gamma: float
    clip: float = 10.0  # 0: no clipping
    eps: float = 1e-8
    moments: RunningMoments = field(default_factory=RunningMoments)
    running: dict[Hashable, float] = field(default_factory=dict)  # G of each ongoing episode

    def discounted(self, chunks: Sequence[tuple[Hashable, np.ndarray, bool]]) -> list[np.ndarray]:
        """Each chunk's discounted returns, continuing its episode's accumulator; ends reset it.

        ``chunks`` are (episode id, rewards, done) in time order per episode. Accumulators of
        episodes absent from the batch are dropped (every ongoing episode continues in the next
        on-policy batch; one that does not never will).
        """
        ongoing: dict[Hashable, float] = {}
        out: list[np.ndarray] = []
        for key, rewards, done in chunks:
            g = ongoing.pop(key, self.running.get(key, 0.0))
            rets: np.ndarray = np.empty(len(rewards), dtype=np.float64)
            for t, r in enumerate(np.asarray(rewards, dtype=np.float64)):
                g = self.gamma * g + r
                rets[t] = g
            out.append(rets)
            if not done:
                ongoing[key] = g
        self.running = ongoing
        return out

    def scale(self, rewards: np.ndarray) -> np.ndarray:
        """``rewards`` / std of the discounted return, clipped to +-clip."""
        out = np.asarray(rewards, dtype=np.float64) / np.sqrt(self.moments.var + self.eps)
        return np.clip(out, -self.clip, self.clip) if self.clip > 0 else out

    def __call__(
        self, chunks: Sequence[tuple[Hashable, np.ndarray, bool]], reduce: Reduce | None = None
    ) -> list[np.ndarray]:
        """Update the statistics with the batch's discounted returns, then scale its rewards.

        ``reduce`` sums (count, sum, sum of squares) over the learners that share the statistics
        (DDP), so every learner merges the same global batch and scales by the same std.
        """
        rets = self.discounted(chunks)
        flat = np.concatenate(rets) if rets else np.zeros(0)
        sums = (float(flat.size), float(flat.sum()), float(np.square(flat).sum()))
        n, total, squares = reduce(sums) if reduce is not None else sums
        if n > 0:
            mean = total / n
            self.moments.merge(n, mean, max(squares / n - mean**2, 0.0))
        return [self.scale(r) for _, r, _ in chunks]

    def get_state(self) -> dict:
        m = self.moments
        return {
            "count": m.count,
            "mean": m.mean,
            "var": m.var,
            "running": {k: float(g) for k, g in self.running.items()},
        }

    def set_state(self, state: dict) -> None:
        self.moments = RunningMoments(float(state["count"]), float(state["mean"]), float(state["var"]))
        self.running = dict(state.get("running", {}))
