"""The confirmation as a Tune run: the top configs on fresh seeds, raced, into confirm.csv's rows.

The stopper is one object that sees every result of every confirmation run, so a run can be stopped
once its config can no longer win (the rules: rayrl.sweep.confirm). It is plain Python state (Tune
pickles it with the experiment); after a resume the race starts again from nothing, which only makes
it stop fewer runs, never a wrong one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ray import tune
from ray.tune import Stopper
from ray.tune.search import ConcurrencyLimiter

from rayrl import runfolder, runtime
from rayrl.observe import keys
from rayrl.observe.cost import TrialResources, trial_cost
from rayrl.spec import CostSpec, SearchSpec, Spec, scaled_lr, schedule, space
from rayrl.sweep import confirm as rules
from rayrl.sweep.phases import concurrency, finite, space_columns
from rayrl.sweep.search import PlannedRuns, config_delta, with_values
from rayrl.tune import resources
from rayrl.tune.tuner import analysis, base_params, make_tuner

#: a confirmation run's candidate rank, carried in its config so the stopper and confirm.csv find it
CANDIDATE_KEY = "rayrl_candidate"


def costs(result: dict, held: TrialResources, prices: CostSpec) -> dict[str, float]:
    """What a run has spent so far in each objective's unit (search.objective picks one): env steps,
    wall seconds, and dollars for the resources it holds. The stopper and confirm.csv both use this."""
    wall = float(result.get(keys.TIME_TOTAL) or 0.0)
    return {
        "env_steps": float(keys.lookup(result, keys.ENV_STEPS, 0) or 0),
        "wall_s": wall,
        "usd": trial_cost(held, wall, prices),
    }


def confirm_budget(search: SearchSpec) -> int:
    """Env steps per confirmation run: search.confirm_env_steps, else the search's per-trial budget."""
    return search.max_env_steps if search.confirm_env_steps is None else search.confirm_env_steps


def confirm(spec: Spec, paths: runtime.RunPaths, trials: list[dict]) -> tuple[list[dict], int]:
    """The confirmation: the search's top configs (and the spec's own) on fresh seeds; confirm.csv's rows, env steps.

    Returns no rows when search.confirm_top_k is 0 or no trial is usable. A finished confirmation is
    read back from confirm.csv; an interrupted one resumes through Tune.
    """
    s = spec.search
    done = paths.run_dir / runfolder.CONFIRM
    if done.exists():
        runs = runfolder.read_confirm(done)
        print(f"[sweep] confirm already finished ({len(runs)} runs in {done}); not repeating it", flush=True)
    else:
        candidates = rules.top_configs(trials, s.confirm_top_k, space_columns(spec))
        if not candidates:
            return [], 0
        if s.confirm_baseline:
            own = {col: space.cell(value) for col, value in zip(space_columns(spec), space.own_values(spec).values())}
            candidates = rules.with_baseline(candidates, spec.algo.train_batch_per_learner, spec.algo.lr, own)
        runs = run_confirm(spec, paths, candidates, rules.fresh_seeds(spec.seed, s.confirm_seeds))
        runfolder.write_csv(paths, runfolder.CONFIRM, runfolder.CONFIRM_COLUMNS + space_columns(spec), runs)
    return runs, int(sum(float(r["env_steps"] or 0) for r in runs))


def run_confirm(spec: Spec, paths: runtime.RunPaths, candidates: list[dict], seeds: list[int]) -> list[dict]:
    """Every candidate on every seed, one Tune experiment whose trials stop at the target, the budget or
    (search.confirm_race) once their config cannot win; returns confirm.csv's rows."""
    s, a = spec.search, spec.algo
    points: list[dict[str, Any]] = []
    plan = []
    for rank, c in enumerate(candidates, 1):
        batch = int(c["batch_size"])
        values = candidate_values(c, spec)
        # the same config the search ran: the lr annealed as the spec anneals it, the searched fields
        # mapped by the one adapter (rayrl.sweep.search.config_delta)
        fixed = {
            "lr": schedule.lr(
                a.lr,
                a.lr_final,
                scaled_lr(c["lr"], spec.resources.learners, spec.resources.lr_scaling),
                spec.stop.env_steps,
            ),
            "train_batch_size_per_learner": batch,
            "minibatch_size": with_values(spec, values, batch).algo.minibatch_size,
            **(config_delta(spec, values, batch) if values else {}),
            CANDIDATE_KEY: rank,
        }
        for seed in seeds:
            points.append({**fixed, "seed": seed})
            plan.append((rank, c))
    print(
        f"[sweep] confirm: {len(candidates)} configs x seeds {seeds}, up to {confirm_budget(s):,} env "
        f"steps each, by the {s.objective} within which {rules.score_rank(len(seeds), s.confirm_quantile)} of "
        f"{len(seeds)} seeds reach return {spec.stop.episode_return}"
        f"{'; a run stops once its config cannot win' if s.confirm_race else ''}",
        flush=True,
    )
    held = resources.of_spec(spec)
    stop = ConfirmStopper(
        [
            (rank, int(c["batch_size"]), float(schedule.first(p["lr"]) or 0.0), int(p["seed"]))
            for (rank, c), p in zip(plan, points)
        ],
        seeds,
        objective=s.objective,
        return_key=keys.return_key(spec.judged_by),
        target=spec.stop.episode_return,
        budget=confirm_budget(s),
        held=held,
        prices=spec.cost,
        race=s.confirm_race,
        weights=rules.weights(candidates, s.confirm_tie),
        quantile=s.confirm_quantile,
    )
    tuner = make_tuner(
        spec,
        paths,
        phase=runfolder.CONFIRM_PHASE,
        param_space=base_params(spec),
        tune_config=tune.TuneConfig(
            # A searcher's suggestion is merged key by key into the spec's config, so a list value (an
            # annealed lr, hidden sizes) stays whole; preset points of a variant generator cannot take one.
            search_alg=ConcurrencyLimiter(PlannedRuns(points, stop.skip), max_concurrent=concurrency(spec)),
            num_samples=len(points),
        ),
        stop=stop,
        verbose_label="confirm",
    )
    tuner.fit()
    trials = analysis(paths, runfolder.CONFIRM_PHASE).trials
    planned, started = {stop.which(p) for p in points}, {stop.which(t.config) for t in trials}
    columns = space_columns(spec)
    rows = never_started(planned - started, candidates, columns)
    for trial in trials:
        rank, seed = stop.which(trial.config)
        m = trial.last_result or {}
        # the judged return (evaluation when the spec judges by it), last known, as the search and the stop use
        ret, steps = keys.lookup(m, keys.return_key(spec.judged_by)), keys.lookup(m, keys.ENV_STEPS)
        spent = costs(m, held, spec.cost)
        reached = runfolder.reached(ret, spec.stop.episode_return)  # an error after reaching keeps the reach
        stopped = rules.stop_reason(reached, trial.status == "ERROR", steps, confirm_budget(s))
        row = run_row(candidates, rank, seed, columns, trial.trial_id, steps, spent, finite(ret), reached, stopped)
        rows.append({**row, "batch_size": keys.config_batch_lr(trial.config)[0]})
    return sorted(rows, key=lambda r: (r["candidate"], r["seed"]))


def run_row(
    candidates: list[dict],
    rank: int,
    seed: int,
    columns: Sequence[str],
    trial_id: str,
    env_steps: Any,
    spent: dict[str, float],
    ret: float | None,
    reached: bool,
    stopped: str,
) -> dict:
    """One confirm.csv row: candidate ``rank``'s run on ``seed``."""
    c = candidates[rank - 1]
    return {
        **{col: c.get(col) for col in columns},
        "candidate": rank,
        "phase2_trial_id": c["trial_id"],
        "batch_size": int(c["batch_size"]),
        "lr": c["lr"],
        "seed": seed,
        "trial_id": trial_id,
        "env_steps": env_steps,
        "wall_s": round(spent["wall_s"], 3),
        "usd": spent["usd"],
        "episode_return_mean": ret,
        "reached": reached,
        "stopped": stopped,
    }


def never_started(runs: set[tuple[int, int]], candidates: list[dict], columns: Sequence[str]) -> list[dict]:
    """confirm.csv's rows for planned (candidate rank, seed) runs that never started: the race had ruled
    their config out (ConfirmStopper.skip). Each is a miss at no cost, stopped by the race."""
    nothing = {"env_steps": 0.0, "wall_s": 0.0, "usd": 0.0}
    return [
        run_row(candidates, rank, seed, columns, "", 0, nothing, None, False, "race") for rank, seed in sorted(runs)
    ]


def candidate_values(candidate: dict, spec: Spec) -> dict[str, Any]:
    """A candidate's search.space values (field -> value), read from its trials.csv cells."""
    return {f: space.parse_cell(candidate.get(col)) for f, col in space.columns(list(spec.search.space)).items()}


class ConfirmStopper(Stopper):
    """Stops a confirmation run at the judged return's target, at the env-step budget, or when the race
    (``race=True``) says its config cannot win; ``points`` are the runs' (candidate, batch, lr, seed)."""

    def __init__(
        self,
        points: Sequence[tuple[int, int, float, int]],
        seeds: Sequence[int],
        *,
        objective: str,
        return_key: str,
        target: float | None,
        budget: float,
        held: TrialResources,
        prices: CostSpec,
        race: bool = True,
        weights: dict[int, float] | None = None,
        quantile: float = rules.QUANTILE,
    ) -> None:
        self.points = [(int(c), int(b), float(lr), int(s)) for c, b, lr, s in points]
        cands = sorted({p[0] for p in self.points})
        self.race = rules.Race(cands, seeds, weights, quantile) if race else None
        self.objective, self.return_key, self.target, self.budget = objective, return_key, target, float(budget)
        self.held, self.prices = held, prices

    #: what a finished run's line says when neither its target nor its budget ended it
    early_stop_reason = "stopped by the confirmation race (its line above says why)"

    def criteria(self) -> dict[str, float]:
        """The plain stop criteria, as Tune's stop dict would hold them (for the driver's lines)."""
        out = {keys.ENV_STEPS: self.budget}
        if self.target is not None:
            out[self.return_key] = float(self.target)
        return out

    def which(self, config: dict) -> tuple[int, int]:
        """(candidate rank, seed) of the planned run a trial's config is."""
        seed = int(config["seed"])
        if CANDIDATE_KEY in config:
            return int(config[CANDIDATE_KEY]), seed
        batch, lr = keys.config_batch_lr(config)  # a confirmation started before runs carried their rank
        for c, b, plr, s in self.points:
            if b == int(batch) and s == seed and math.isclose(plr, float(lr), rel_tol=1e-9):
                return c, s
        raise KeyError(f"confirmation: no planned run has batch {batch}, lr {lr}, seed {seed}")

    def cost(self, result: dict) -> float:
        """The run's cost so far under the objective (env steps, wall seconds or dollars)."""
        return costs(result, self.held, self.prices)[self.objective]

    def __call__(self, trial_id: str, result: dict) -> bool:
        steps = float(keys.lookup(result, keys.ENV_STEPS, 0) or 0)
        ret = keys.lookup(result, self.return_key)
        reached = runfolder.reached(ret, self.target)
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
        why = self.race.why_stop(cand, seed, cost)
        if why is not None:
            print(
                f"[sweep] confirmation: race: candidate {cand} seed {seed} stopped after {steps:,.0f} env steps "
                f"({self.objective} {cost:.6g}): {why}; it cannot change the choice",
                flush=True,
            )
            self.race.finish(cand, seed, math.inf)
            return True
        return False

    def stop_all(self) -> bool:
        return False

    def skip(self, point: dict) -> bool:
        """PlannedRuns' question before it starts a planned run: True when the race has ruled its config
        out, so the run is never started (it would be stopped at its first result, after the seconds a
        trial takes to start and build)."""
        if self.race is None:
            return False
        cand, seed = self.which(point)
        if not self.race.lost(cand):
            return False
        print(
            f"[sweep] confirmation: race: candidate {cand} seed {seed} not started: its config's score can no "
            f"longer beat the best score so far ({self.race.bound():.6g}); it cannot change the choice",
            flush=True,
        )
        self.race.finish(cand, seed, math.inf)
        return True
