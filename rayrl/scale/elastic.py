"""The elastic policy: grow, hold or shrink a cluster by its measured utilisation (pure, no Ray).

The guide's thresholds: grow when mean GPU utilisation is above 85%, shrink when below 30%,
never more than 2x (or 1/2x) per step. Against flapping:

* hysteresis in level: the 30%..85% band holds, and a step is sized so the utilisation it
  projects (``util x current / new``, the same work on more or fewer nodes) lands inside the
  band, never across the opposite threshold;
* hysteresis in time: the last ``sustain`` samples must all be beyond the threshold;
* a cool-down after every change (no decision from samples taken before it has settled);
* the guide's gain gate: after a grow, if throughput gained less than 15%, growing again is
  blocked (the extra nodes did not pay; the shrink rule takes them back once utilisation drops).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    """One reading of the running job: time (s), mean GPU utilisation (0..1), env steps/s."""

    t: float
    util: float
    env_steps_per_s: float = math.nan


@dataclass(frozen=True)
class Policy:
    grow_above: float = 0.85
    shrink_below: float = 0.30
    max_factor: float = 2.0
    sustain: int = 3  #: consecutive samples beyond a threshold before acting
    cooldown_s: float = 300.0  #: after a change, ignore samples for this long
    min_gain: float = 0.15  #: a grow must raise throughput this much, or growing stops
    min_nodes: int = 1
    max_nodes: int = 1_000_000

    def __post_init__(self) -> None:
        if not 0.0 <= self.shrink_below < self.grow_above <= 1.0:
            raise ValueError(
                f"elastic policy: shrink_below {self.shrink_below} and grow_above {self.grow_above} "
                "must satisfy 0 <= shrink_below < grow_above <= 1."
            )
        if (
            self.max_factor <= 1.0
            or self.sustain < 1
            or self.cooldown_s < 0
            or not 1 <= self.min_nodes <= self.max_nodes
        ):
            raise ValueError(
                "elastic policy: max_factor > 1, sustain >= 1, cooldown_s >= 0 and "
                "1 <= min_nodes <= max_nodes are required."
            )


@dataclass(frozen=True)
class State:
    """What the policy remembers between decisions."""

    nodes: int
    changed_at: float = -math.inf
    grew_from_throughput: float | None = None  #: throughput before the last grow (None: last change not a grow)
    grow_blocked: bool = False


@dataclass(frozen=True)
class Decision:
    action: str  #: grow, hold or shrink
    nodes: int  #: the size to ask for
    reason: str
    state: State  #: the state to pass to the next call


def decide(samples: Sequence[Sample], state: State, now: float, policy: Policy = Policy()) -> Decision:
    """The next size for a cluster of ``state.nodes`` given the samples so far (oldest first)."""
    n = state.nodes
    if now - state.changed_at < policy.cooldown_s:
        return Decision(
            "hold", n, f"cool-down: {now - state.changed_at:.0f}s since the last change < {policy.cooldown_s:g}s", state
        )
    settled = [s for s in samples if s.t >= state.changed_at + policy.cooldown_s and math.isfinite(s.util)]
    recent = settled[-policy.sustain :]
    state = _check_gain(state, settled, policy)
    if len(recent) < policy.sustain:
        return Decision("hold", n, f"{len(recent)} settled sample(s), {policy.sustain} needed", state)
    mean = sum(s.util for s in recent) / len(recent)
    if all(s.util > policy.grow_above for s in recent):
        if state.grow_blocked:
            return Decision(
                "hold",
                n,
                "utilisation is high, but the last grow gained less than "
                f"{policy.min_gain:.0%} throughput: more nodes do not pay",
                state,
            )
        target = min(_size_for(n, mean, policy, up=True), policy.max_nodes)
        if target > n:
            thr = _mean_throughput(recent)
            return Decision(
                "grow",
                target,
                f"utilisation {mean:.0%} > {policy.grow_above:.0%} for {len(recent)} samples",
                State(target, now, thr, False),
            )
        why = (
            "the cluster is at max_nodes"
            if n >= policy.max_nodes
            else f"no larger size within x{policy.max_factor:g} keeps utilisation above {policy.shrink_below:.0%}"
        )
        return Decision("hold", n, f"utilisation {mean:.0%} is high but {why}", state)
    if all(s.util < policy.shrink_below for s in recent):
        target = max(_size_for(n, mean, policy, up=False), policy.min_nodes)
        if target < n:
            return Decision(
                "shrink",
                target,
                f"utilisation {mean:.0%} < {policy.shrink_below:.0%} for {len(recent)} samples",
                State(target, now, None, state.grow_blocked),
            )
        why = (
            "the cluster is at min_nodes"
            if n <= policy.min_nodes
            else f"no smaller size keeps utilisation below {policy.grow_above:.0%}"
        )
        return Decision("hold", n, f"utilisation {mean:.0%} is low but {why}", state)
    return Decision(
        "hold",
        n,
        f"utilisation {mean:.0%} within {policy.shrink_below:.0%}..{policy.grow_above:.0%} (or not sustained)",
        state,
    )


def _size_for(n: int, util: float, policy: Policy, up: bool) -> int:
    """The size nearest the band's middle, at most max_factor away, whose projected utilisation
    (``util x n / size``) does not cross the opposite threshold."""
    mid = (policy.grow_above + policy.shrink_below) / 2.0
    ideal = max(1, math.ceil(n * util / mid))
    if up:
        upper = min(math.floor(n * policy.max_factor), math.floor(n * util / policy.shrink_below))
        return max(n, min(max(ideal, n + 1), upper))
    lower = max(math.ceil(n / policy.max_factor), math.ceil(n * util / policy.grow_above))
    return min(n, max(ideal, lower))


def _check_gain(state: State, settled: Sequence[Sample], policy: Policy) -> State:
    """After a grow, once settled samples exist: block further growth if throughput gained < min_gain."""
    if state.grew_from_throughput is None:
        return state
    after = _mean_throughput(settled)
    if after is None or not state.grew_from_throughput:
        return state
    blocked = after / state.grew_from_throughput - 1.0 < policy.min_gain
    return State(state.nodes, state.changed_at, None, blocked)


def _mean_throughput(samples: Sequence[Sample]) -> float | None:
    vals = [s.env_steps_per_s for s in samples if math.isfinite(s.env_steps_per_s)]
    return sum(vals) / len(vals) if vals else None
