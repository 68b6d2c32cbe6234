"""The confirmation's Tune stopper: target, budget and the race (rayrl.confirm.Race) in one place.

One object sees every result of every confirmation run, so a run can be stopped once its config can
no longer win. It is plain Python state (Tune pickles it with the experiment); after a resume the race
starts again from nothing, which only makes it stop fewer runs, never a wrong one.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ray.tune import Stopper

from rayrl import confirm, keys
from rayrl.cost import TrialResources, trial_cost
from rayrl.progress import config_batch_lr
from rayrl.spec import CostSpec


class ConfirmStopper(Stopper):
    """Stops a confirmation run at the judged return's target, at the env-step budget, or when the race
    (``race=True``) says its config cannot win; ``points`` are the runs' (candidate, batch, lr, seed)."""

    def __init__(self, points: Sequence[tuple[int, int, float, int]], seeds: Sequence[int], *, objective: str,
                 return_key: str, target: float | None, budget: float, held: TrialResources, prices: CostSpec,
                 race: bool = True) -> None:
        self.points = [(int(c), int(b), float(lr), int(s)) for c, b, lr, s in points]
        self.race = confirm.Race(sorted({p[0] for p in self.points}), seeds) if race else None
        self.objective, self.return_key, self.target, self.budget = objective, return_key, target, float(budget)
        self.held, self.prices = held, prices

    def which(self, config: dict) -> tuple[int, int]:
        """(candidate rank, seed) of the planned run a trial's config is."""
        batch, lr = config_batch_lr(config)
        seed = int(config.get("seed"))
        for c, b, plr, s in self.points:
            if b == int(batch) and s == seed and math.isclose(plr, float(lr), rel_tol=1e-9):
                return c, s
        raise KeyError(f"confirmation: no planned run has batch {batch}, lr {lr}, seed {seed}")

    def cost(self, result: dict) -> float:
        """The run's cost so far under the objective (env steps, wall seconds or dollars)."""
        wall = float(result.get(keys.TIME_TOTAL) or 0.0)
        if self.objective == "env_steps":
            return float(keys.lookup(result, keys.ENV_STEPS, 0) or 0)
        if self.objective == "wall_s":
            return wall
        return trial_cost(self.held, wall, self.prices)

    def __call__(self, trial_id: str, result: dict) -> bool:
        steps = float(keys.lookup(result, keys.ENV_STEPS, 0) or 0)
        ret = keys.lookup(result, self.return_key)
        reached = (self.target is not None and ret is not None and math.isfinite(float(ret))
                   and float(ret) >= self.target)
        if self.race is None:
            return reached or steps >= self.budget
        cand, seed = self.which(result.get("config") or {})
        cost = self.cost(result)
        if reached:
            self.race.finish(cand, seed, cost)
            return True
        if steps >= self.budget:
            self.race.finish(cand, seed, math.inf)
            return True
        if self.race.should_stop(cand, seed, cost):
            bound = self.race.bound()
            print(f"[sweep] confirmation: race: candidate {cand} seed {seed} stopped after {steps:,.0f} env steps "
                  f"({self.objective} {cost:.6g}): past the best median so far ({bound:.6g}), it cannot change "
                  f"the choice", flush=True)
            self.race.finish(cand, seed, math.inf)
            return True
        return False

    def stop_all(self) -> bool:
        return False
