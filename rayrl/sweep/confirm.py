"""The confirmation step's rules: which searched configs to re-run, on which seeds, and which wins.

The search runs each config once, on one seed, so its best trial is partly luck. The sweep re-runs
the top ``search.confirm_top_k`` configs on ``search.confirm_seeds`` fresh seeds (never used by
the ladder or the search) and ships the config with the lowest *score*: the cost within which
``ceil(search.confirm_quantile x n)`` of its n seeds reached the target return (the 4th cheapest of 5 at
the default 0.75; 0.5 is the median for an odd count), where the cost is ``search.objective``: wall
seconds, env steps or dollars (rayrl.observe.cost's price model). A run that did not reach the target
costs infinity, so a config that misses on more than a quarter of its seeds cannot win on lucky runs:
measured, a config that reached on 3 of 5 seeds won on the median and then took 2.3x the time of the
runner-up on unseen seeds (docs/benchmarks.md). The spread is reported as rliable does (Agarwal et
al., 2021): the median, the interquartile mean and a percentile-bootstrap interval.

The confirmation is a race (``search.confirm_race``, :class:`Race`): once some config's score is known
to be at most B, a run whose cost passes B is stopped, and a config whose score can no longer get down
to B gets no more runs. Such a run lies above its config's score whenever that score could win, so the
choice is the one the full confirmation would make; the losers cost less.

Pure functions of plain data (no Ray): the sweep's confirm phase (rayrl.sweep.phases) calls them on
Tune's results.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from rayrl.runfolder import rank_trials
from rayrl.spec import OBJECTIVES

SEED_STRIDE = 1000  #: confirmation seeds are phase seed + k x this: far from the env seeds RLlib derives
QUANTILE = 0.75  #: search.confirm_quantile's default


def score_rank(n: int, quantile: float = QUANTILE) -> int:
    """k: a config's score is its k-th cheapest of ``n`` runs, ``ceil(quantile x n)`` (at least 1)."""
    if not 0.0 < quantile <= 1.0:
        raise ValueError(f"quantile: {quantile!r} is not in (0, 1]")
    return max(1, min(n, math.ceil(quantile * n - 1e-9)))


def order_stat(values: Sequence[float], k: int) -> float:
    """The k-th smallest value (1-based); NaN for no values."""
    x = sorted(float(v) for v in values)
    return x[min(k, len(x)) - 1] if x else math.nan


def top_configs(trials: Iterable[dict], k: int, columns: Sequence[str] = ()) -> list[dict]:
    """The ``k`` best distinct configs of the search, best first: distinct in batch size, lr and the
    searched fields' ``columns`` (search.space)."""
    out: list[dict] = []
    seen: set[tuple] = set()
    for t in rank_trials(trials):
        if len(out) >= k:
            break
        key = (int(t["batch_size"]), float(t["lr"]), *(str(t.get(c)) for c in columns))
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


#: phase2_trial_id of the spec's own config when the confirmation adds it (search.confirm_baseline)
BASELINE_ID = "spec"


def with_baseline(candidates: Sequence[dict], batch_size: int, lr: float, own: dict | None = None) -> list[dict]:
    """``candidates`` plus the spec's own config last (its batch size, lr and ``own``: its values of the
    searched fields, by column), unless one of them already is it.

    Why: the top searched configs won single noisy runs; without the starting point on the same
    fresh seeds, the sweep can ship a config slower than the one it started from.
    """
    own = dict(own or {})
    out = list(candidates)
    if not any(
        int(c["batch_size"]) == int(batch_size)
        and math.isclose(float(c["lr"]), float(lr), rel_tol=1e-9)
        and all(str(c.get(col)) == str(value) for col, value in own.items())
        for c in out
    ):
        out.append({"trial_id": BASELINE_ID, "batch_size": int(batch_size), "lr": float(lr), **own})
    return out


def fresh_seeds(phase_seed: int, n: int, stride: int = SEED_STRIDE) -> list[int]:
    """``n`` seeds the ladder and the search never used (they ran with ``phase_seed``), far apart so the env seeds
    RLlib derives from each (seed + runner and env index) do not overlap either."""
    return [phase_seed + stride * (i + 1) for i in range(n)]


def run_cost(run: dict, objective: str) -> float:
    """One confirmation run's cost to the target under ``objective``; infinity if it never got there."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective: {objective!r} is not one of {', '.join(OBJECTIVES)}")
    value = run.get(objective)
    if not run.get("reached") or value is None or not math.isfinite(float(value)):
        return math.inf
    return float(value)


def iqm(values: Sequence[float]) -> float:
    """Interquartile mean: the mean of the middle 50% (trim int(n/4) from each end, as scipy.stats.trim_mean
    with 0.25 and rliable do)."""
    x = np.sort(np.asarray(values, dtype=float))
    if x.size == 0:
        return math.nan
    cut = int(0.25 * x.size)
    return float(np.mean(x[cut : x.size - cut]))


def bootstrap_interval(
    values: Sequence[float], stat: str = "median", confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap interval of ``stat`` (median or iqm) over the runs (seeded, so reproducible).

    Infinite costs (runs that never reached the target) stay infinite, so the upper end says so.
    """
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    samples = x[rng.integers(0, x.size, size=(resamples, x.size))]
    if stat == "median":
        stats = np.median(samples, axis=1)  # costs are >= 0, so inf + inf never meets -inf: no NaN
    elif stat == "iqm":
        cut = int(0.25 * x.size)
        stats = np.mean(np.sort(samples, axis=1)[:, cut : x.size - cut], axis=1)
    else:
        raise ValueError(f"stat: {stat!r} is not median or iqm")
    alpha = (1.0 - confidence) / 2
    return (float(np.quantile(stats, alpha, method="lower")), float(np.quantile(stats, 1.0 - alpha, method="higher")))


def median(values: Sequence[float]) -> float:
    """The median (NaN for no values); a config at the target on half its seeds or fewer has an infinite one."""
    x = np.asarray(values, dtype=float)
    return float(np.median(x)) if x.size else math.nan


def summarise(runs: Sequence[dict], objective: str, seed: int = 0, quantile: float = QUANTILE) -> list[dict]:
    """Per candidate: its runs' costs, score (:func:`score_rank`), median, IQM and bootstrap interval, runs
    at the target, median return.

    ``runs``: rows of confirm.csv (``candidate``, ``batch_size``, ``lr``, ``phase2_trial_id``, the cost
    columns, ``reached``, ``episode_return_mean``). Candidates come back in their search rank order.
    """
    by: dict[int, list[dict]] = {}
    for r in runs:
        by.setdefault(int(r["candidate"]), []).append(r)
    out = []
    for cand, rows in sorted(by.items()):
        costs = [run_cost(r, objective) for r in rows]
        returns = [
            float(r["episode_return_mean"])
            for r in rows
            if r.get("episode_return_mean") is not None and math.isfinite(float(r["episode_return_mean"]))
        ]
        low, high = bootstrap_interval(costs, "median", seed=seed)
        first = rows[0]
        out.append(
            {
                "candidate": cand,
                "phase2_trial_id": first["phase2_trial_id"],
                "batch_size": int(first["batch_size"]),
                "lr": float(first["lr"]),
                "seeds": [int(r["seed"]) for r in rows],
                "costs": costs,
                "score": order_stat(costs, score_rank(len(costs), quantile)),
                "score_k": score_rank(len(costs), quantile),
                "median": median(costs),
                "iqm": iqm(costs),
                "ci_low": low,
                "ci_high": high,
                "reached": sum(bool(r["reached"]) for r in rows),
                "runs": len(rows),
                "cut_by_race": sum(r.get("stopped") == "race" for r in rows),
                "median_return": median(returns) if returns else math.nan,
                "median_env_steps": median([float(r["env_steps"]) for r in rows if r.get("env_steps") is not None]),
            }
        )
    return out


class Race:
    """Which confirmation runs can stop early without changing :func:`choose`'s answer.

    Fed every result of every run (candidate, seed, cost so far, at the target or not). A config's score
    is its k-th cheapest run (:func:`score_rank`). B is the lowest upper bound on any candidate's score:
    its k-th cheapest run with unfinished runs counted as infinite. A run whose cost passes B sits above
    its candidate's score whenever that score is <= B, so censoring it (cost infinite) changes no score
    that could win; a candidate whose lowest possible score (unstarted runs at 0, running ones at their
    cost so far) is above B cannot win, and its runs stop at their next result. Plain data, no Ray.
    """

    def __init__(
        self,
        candidates: Iterable[int],
        seeds: Sequence[int],
        weights: dict[int, float] | None = None,
        quantile: float = QUANTILE,
    ) -> None:
        self.seeds = list(seeds)
        #: candidate -> seed -> [cost so far, finished, cost if finished (inf: missed or censored)], weighted
        self.runs: dict[int, dict[int, list]] = {c: {s: [0.0, False, math.inf] for s in self.seeds} for c in candidates}
        #: candidate -> the factor its costs count with (the spec's own: 1 / (1 + search.confirm_tie), as in choose)
        self.weights = {c: float(w) for c, w in (weights or {}).items()}
        self.k = score_rank(len(self.seeds), quantile)

    def __setstate__(self, state: dict) -> None:
        # a race pickled by an older rayrl (Tune restores the confirmation's stopper) had no weights and
        # ranked by the median
        seeds = state.get("seeds", [])
        self.__dict__.update({"weights": {}, "k": score_rank(len(seeds), 0.5) if seeds else 1, **state})

    def bound(self) -> float:
        """B: some candidate's score is at most this (infinite until one has enough finished runs)."""
        return min(
            (order_stat([r[2] if r[1] else math.inf for r in runs.values()], self.k) for runs in self.runs.values()),
            default=math.inf,
        )

    def lowest_score(self, candidate: int) -> float:
        """The lowest score ``candidate`` can still end with."""
        return order_stat([r[2] if r[1] else r[0] for r in self.runs[candidate].values()], self.k)

    def lost(self, candidate: int) -> bool:
        """Whether ``candidate`` can no longer win (for good: its lowest score only rises, B only falls)."""
        return self.lowest_score(candidate) > self.bound()

    def finish(self, candidate: int, seed: int, cost: float) -> None:
        """A run ended: ``cost`` to the target, or infinity (budget, censored, error)."""
        cost *= self.weights.get(candidate, 1.0)
        run = self.runs[candidate][seed]
        run[0], run[1], run[2] = (cost if math.isfinite(cost) else run[0]), True, cost

    def should_stop(self, candidate: int, seed: int, cost: float) -> bool:
        """Record a running run's cost so far; True when the race stops it (its config cannot win)."""
        return self.why_stop(candidate, seed, cost) is not None

    def why_stop(self, candidate: int, seed: int, cost: float) -> str | None:
        """Record a running run's cost so far; the rule that stops it (a phrase), or None to go on."""
        weight = self.weights.get(candidate, 1.0)
        run = self.runs[candidate][seed]
        run[0] = max(run[0], float(cost) * weight)
        bound = self.bound()
        if not math.isfinite(bound):
            return None
        if run[0] > bound:
            tied = f" (the spec's own config: {bound:.6g} with search.confirm_tie's allowance)" if weight != 1 else ""
            return (
                f"this run passed {bound / weight:.6g}{tied}, so it cannot be among its config's "
                f"{self.k} cheapest of {len(self.seeds)}"
            )
        if self.lost(candidate):
            return f"its config's score can no longer beat the best score so far ({bound:.6g})"
        return None


def stop_reason(reached: bool, errored: bool, env_steps: float | None, budget: float) -> str:
    """confirm.csv's ``stopped`` for a finished run (the race is what is left: neither target, budget nor error).

    A run whose last result reached the target is "target" even if it errored afterwards (while stopping or
    saving): the race counted it as reached, so confirm.csv and the choice must too.
    """
    if reached:
        return "target"
    if errored:
        return "error"
    if env_steps is not None and env_steps >= budget:
        return "budget"
    return "race"


def choose(candidates: Sequence[dict], tie: float = 0.0) -> dict | None:
    """The confirmed config: the lowest score (:func:`summarise`'s ``score``: the cost within which
    ``search.confirm_quantile`` of its seeds reached the target), the spec's own config's counted as
    ``1 / (1 + tie)`` of itself (search.confirm_tie: a searched config must be more than that fraction
    cheaper to ship instead of the starting point; within it they tie and the simpler one ships); a tie
    at a finite score goes to the better search rank. When no score is finite, the lowest median, then
    the higher median return, then the rank.

    Why the rank and not the median or returns breaks a finite tie: the race censors runs above the best
    score, which changes no score at or below it (nor any cheaper run) but can change medians and
    returns, so a tie broken by them could differ between the race and a full confirmation; the rank
    cannot. The race never censors while no score is finite, so the fallback sees whole runs. The race
    weighs the spec's costs the same way (:func:`weights`), so it keeps this choice.
    """
    if not candidates:
        return None
    ret = lambda c: c["median_return"] if math.isfinite(c["median_return"]) else -math.inf  # noqa: E731
    if any(math.isfinite(c["score"]) for c in candidates):
        return min(candidates, key=lambda c: (c["score"] * weight(c, tie), c["candidate"]))
    return min(candidates, key=lambda c: (c["median"] * weight(c, tie), -ret(c), c["candidate"]))


def weight(candidate: dict, tie: float) -> float:
    """The factor a candidate's costs count with: the spec's own config's ``1 / (1 + tie)``, others 1."""
    return 1.0 / (1.0 + tie) if candidate.get("phase2_trial_id") == BASELINE_ID else 1.0


def weights(candidates: Sequence[dict], tie: float) -> dict[int, float]:
    """Race weights by candidate rank (1-based, as confirm.csv numbers them)."""
    return {rank: weight({"phase2_trial_id": c.get("trial_id")}, tie) for rank, c in enumerate(candidates, 1)}


def within_noise(chosen: dict, own: dict | None) -> bool | None:
    """Whether the spec's own config's median lies inside the chosen config's 95% interval (None when
    either is not known or the spec's own is the choice): a winner that close may be luck of the seeds."""
    if own is None or own is chosen or not math.isfinite(own["median"]) or not math.isfinite(chosen["median"]):
        return None
    return bool(chosen["ci_low"] <= own["median"] <= chosen["ci_high"])


def json_safe(value: float) -> float | None:
    """Infinity and NaN as null (JSON has neither)."""
    return float(value) if value is not None and math.isfinite(value) else None


def jsonable(candidate: dict) -> dict:
    """A :func:`summarise` row for summary.json: infinite costs and figures as null."""
    out = dict(candidate)
    out["costs"] = [json_safe(x) for x in candidate["costs"]]
    for k in ("score", "median", "iqm", "ci_low", "ci_high", "median_return", "median_env_steps"):
        out[k] = json_safe(candidate[k])
    return out
