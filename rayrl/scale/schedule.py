"""The scale-out schedule: grow at most 2x per step, and stop when a step gains less than 15%.

The guide's rule, as for the batch ladder (rayrl.sweep.ladder): each step at most doubles the
GPUs of the last; after each step the *measured* gain is the gate (>= ``min_gain`` to go on).
The plan predicts each step's gain; the first step predicted below the gate is where the
schedule ends. The gain is in time to target when the run reached its target (more env steps
per second is worth less once the global batch is past the critical batch), else in env steps/s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from rayrl.scale.model import Point

MAX_FACTOR = 2.0
MIN_GAIN = 0.15


@dataclass(frozen=True)
class Step:
    step: int
    from_gpus: int
    to_gpus: int
    factor: float
    predicted_gain: float
    gain_of: str  #: "hours_to_target" or "env_steps_per_s"
    decision: str  #: "grow" (predicted to pass the gate) or "stop" (predicted to fail it)
    gate: str

    def as_dict(self) -> dict:
        return asdict(self)


def gain(prev: Point, nxt: Point) -> tuple[float, str]:
    """Relative gain of ``nxt`` over ``prev``: speed-up in time to target, else in throughput."""
    if prev.hours_to_target is not None and nxt.hours_to_target is not None:
        return prev.hours_to_target / nxt.hours_to_target - 1.0, "hours_to_target"
    return nxt.env_steps_per_s / prev.env_steps_per_s - 1.0, "env_steps_per_s"


def schedule(points: Sequence[Point], min_gain: float = MIN_GAIN, max_factor: float = MAX_FACTOR) -> list[Step]:
    """Steps through ``points`` (ascending GPUs, each at most ``max_factor`` x the last), ending at the
    first step predicted to gain less than ``min_gain`` (that step is listed, marked "stop")."""
    steps: list[Step] = []
    for i, (prev, nxt) in enumerate(zip(points, points[1:]), start=1):
        factor = nxt.gpus / prev.gpus
        if factor > max_factor or factor <= 1.0:
            raise ValueError(
                f"schedule: {prev.gpus} -> {nxt.gpus} GPUs is a x{factor:g} step; each step must grow "
                f"by more than x1 and at most x{max_factor:g}."
            )
        g, of = gain(prev, nxt)
        decision = "grow" if g >= min_gain else "stop"
        steps.append(
            Step(
                step=i,
                from_gpus=prev.gpus,
                to_gpus=nxt.gpus,
                factor=factor,
                predicted_gain=g,
                gain_of=of,
                decision=decision,
                gate=f"measure {of} at {nxt.gpus} GPUs; keep the step only if it gains >= "
                f"{min_gain:.0%} over {prev.gpus}, else go back to {prev.gpus} and stop",
            )
        )
        if decision == "stop":
            break
    return steps
