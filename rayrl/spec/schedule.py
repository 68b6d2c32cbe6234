"""Linear schedules over a run's env steps, pure: lr, entropy (RLlib's schedulers) and PPO's clip.

One definition serves both users: RLlib takes the points (``[[0, start], [horizon, final]]``, linear
in between, the last value after), and rayrl's PPO learner evaluates the clip's with
:func:`value_at`, so the three quantities anneal on one clock, lifetime env steps sampled.
"""

from __future__ import annotations

Points = list[list[float]]


def points(start: float, final: float | None, horizon: int | None) -> float | Points:
    """``start`` when ``final`` is None (constant), else the two points of a linear anneal."""
    if final is None:
        return start
    if not horizon or horizon <= 0:
        raise ValueError(f"a linear schedule needs a positive horizon (stop.env_steps), not {horizon!r}")
    return [[0, float(start)], [int(horizon), float(final)]]


def value_at(schedule: float | Points, t: float) -> float:
    """The schedule's value after ``t`` env steps (piecewise linear; flat outside its points)."""
    if not isinstance(schedule, list):
        return float(schedule)
    (t0, v0), *rest = schedule
    if t <= t0:
        return float(v0)
    for t1, v1 in rest:
        if t <= t1:
            return float(v0 + (v1 - v0) * (t - t0) / (t1 - t0))
        t0, v0 = t1, v1
    return float(v0)


def first(schedule: float | Points | None) -> float | None:
    """The schedule's starting value (what a run's lr is called in tables and names)."""
    if isinstance(schedule, list):
        return float(schedule[0][1])
    return schedule


def lr(spec_lr: float, lr_final: float | None, lr: float, horizon: int | None) -> float | Points:
    """``lr`` (a searched or scaled lr) annealed as the spec anneals ``spec_lr``: to the same fraction."""
    return points(lr, None if lr_final is None else lr_final * lr / spec_lr, horizon)
