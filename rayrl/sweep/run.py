"""One sweep, start to finish: ladder -> search -> confirm -> summary.json and best_config.yaml.

Resumable: a phase already finished is read back from its CSV, an interrupted one resumes through
Tune (rayrl.tune.tuner). The phases are in rayrl.sweep.phases, their rules in ladder and confirm.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from rayrl import runfolder, runtime
from rayrl import spec as spec_mod
from rayrl.spec import Spec
from rayrl.sweep import confirm as rules
from rayrl.sweep import confirm_run, phases
from rayrl.sweep import ladder as doubling
from rayrl.sweep.config import SAFE_CAP, SweepError
from rayrl.sweep.search import with_values
from rayrl.tune import resources

log = logging.getLogger("rayrl.sweep")


def run(spec: Spec, paths: runtime.RunPaths) -> dict:
    """The three phases, resumable; returns summary.json's content."""
    start = time.monotonic()
    if spec.search.doubling.cap > SAFE_CAP:
        log.warning(
            "search.doubling.cap=%d is above %d: sample efficiency falls above that batch size; "
            "the ladder may pick a knee that learns slower per env step.",
            spec.search.doubling.cap,
            SAFE_CAP,
        )
    paths.write_text(runfolder.SPEC, spec_mod.dumps(spec))
    rows, ladder_steps = phases.ladder(spec, paths)
    rungs = doubling.admissible(rows)
    knee = runfolder.knee(rows)
    if knee is None:
        raise SweepError(
            f"ladder: the first rung (batch {rows[0].batch_size if rows else '?'}) failed, so there "
            f"is no batch size to search; see the trial's error in "
            f"{paths.run_dir / runfolder.PHASE_DIRS[runfolder.LADDER]}, lower search.doubling.start "
            f"or give the trial more resources, then use a new --name (or delete "
            f"{runfolder.DOUBLING} and {runfolder.PHASE_DIRS[runfolder.LADDER]}/ to measure the "
            "ladder again)."
        )
    d = spec.search.doubling
    batches = doubling.search_batches(rungs, start=d.start, factor=d.factor, min_batch=spec.search.min_batch)
    print(f"[sweep] ladder done: knee at batch {knee}; search tries batch in {batches}", flush=True)
    trials, search_steps = phases.search(spec, paths, batches)
    runs, confirm_steps = confirm_run.confirm(spec, paths, trials)
    best, confirmed = choose(spec, trials, runs)
    summary = {
        "kind": "sweep",
        "name": paths.name,
        "algorithm": spec.algo.name,
        "env": spec.env.id,
        "knee_batch_size": knee,
        "ladder": rungs,
        "search_batches": batches,
        "best": best,
        "confirm": confirmed,
        "env_steps_total": ladder_steps + search_steps + confirm_steps,
        "env_steps_phase1": ladder_steps,
        "env_steps_phase2": search_steps,
        "env_steps_confirm": confirm_steps,
        "wall_s": round(time.monotonic() - start, 1),
        "trials": len(trials),
        "stopped_early": sum(1 for t in trials if t["status"] == "stopped_early"),
        "scheduler": spec.search.scheduler,
        "return_judged_by": spec.judged_by,
        "resources": resources.as_summary(resources.of_spec(spec)),
    }
    paths.write_json(runfolder.SUMMARY, summary)
    if best is not None:
        trained = with_values(spec, confirm_run.candidate_values(best, spec), int(best["batch_size"]))
        best_spec = spec_mod.replace(trained, name=f"{paths.name}-best", algo={"lr": best["lr"]})
        paths.write_text(runfolder.BEST_CONFIG, spec_mod.dumps(best_spec))
    return summary


def choose(spec: Spec, trials: list[dict], runs: list[dict]) -> tuple[dict | None, dict | None]:
    """summary.json's ``best`` and ``confirm``: the confirmation's choice, else the search's top trial."""
    if not runs:
        ranked = runfolder.rank_trials(trials)
        if not ranked:
            return None, None
        top = ranked[0]
        keep = ("trial_id", "batch_size", "lr", "episode_return_mean", "env_steps", *phases.space_columns(spec))
        return {k: top[k] for k in keep}, None
    s = spec.search
    table = rules.summarise(runs, s.objective, seed=spec.seed, quantile=s.confirm_quantile)
    chosen = rules.choose(table, s.confirm_tie)
    if chosen is None:
        return None, None
    own = next((c for c in table if c["phase2_trial_id"] == rules.BASELINE_ID), None)
    lowest = rules.choose(table)  # without the tie allowance: did it change the choice?
    row = next(r for r in runs if int(r["candidate"]) == int(chosen["candidate"]))
    best = {
        "trial_id": chosen["phase2_trial_id"],
        "batch_size": chosen["batch_size"],
        "lr": chosen["lr"],
        **{col: row.get(col) for col in phases.space_columns(spec)},
        "episode_return_mean": rules.json_safe(chosen["median_return"]),
        "env_steps": rules.json_safe(chosen["median_env_steps"]),
        "confirmed": True,
        "objective": s.objective,
        "score_cost": rules.json_safe(chosen["score"]),
        "score_seeds": f"{chosen['score_k']}/{chosen['runs']}",
        "median_cost": rules.json_safe(chosen["median"]),
        "iqm_cost": rules.json_safe(chosen["iqm"]),
        "ci95_cost": [rules.json_safe(chosen["ci_low"]), rules.json_safe(chosen["ci_high"])],
        "seeds_at_target": f"{chosen['reached']}/{chosen['runs']}",
    }
    summary = {
        "objective": s.objective,
        "seeds": sorted({int(r["seed"]) for r in runs}),
        "env_steps_budget": confirm_run.confirm_budget(s),
        "target_return": spec.stop.episode_return,
        "chosen": chosen["candidate"],
        "race": s.confirm_race,
        "runs_cut_by_race": sum(r.get("stopped") == "race" for r in runs),
        "candidates": [rules.jsonable(c) for c in table],
        "tie": s.confirm_tie,
        "quantile": s.confirm_quantile,
        "spec_won_by_tie": lowest is not chosen,
        "spec_within_noise": rules.within_noise(chosen, own),
    }
    _explain(chosen, s.objective)
    if lowest is not chosen and lowest is not None:
        print(
            f"[sweep] confirm: the best searched config (candidate {lowest['candidate']}, score "
            f"{lowest['score']:.4g}) is not more than search.confirm_tie={s.confirm_tie:g} cheaper than the spec's "
            f"own ({chosen['score']:.4g}): they tie, and the starting point ships",
            flush=True,
        )
    elif own is not None and summary["spec_within_noise"]:
        print(
            f"[sweep] confirm: the spec's own config's median ({own['median']:.4g}) lies inside the chosen "
            f"config's 95% interval: the difference may be the seeds' luck (more search.confirm_seeds would tell)",
            flush=True,
        )
    return best, summary


def _explain(chosen: dict[str, Any], objective: str) -> None:
    if math.isfinite(chosen["score"]):
        why = (
            f"has the lowest {objective} within which {chosen['score_k']} of its {chosen['runs']} seeds reached "
            f"the target, {chosen['score']:.4g} (median {chosen['median']:.4g}, IQM {chosen['iqm']:.4g}, 95% "
            f"interval of the median {chosen['ci_low']:.4g}..{chosen['ci_high']:.4g})"
        )
    elif math.isfinite(chosen["median"]):
        why = (
            f"has the lowest median {objective} to the target, {chosen['median']:.4g}: no candidate reached it "
            f"on {chosen['score_k']} of {chosen['runs']} seeds (search.confirm_quantile)"
        )
    else:
        why = f"wins on median return ({chosen['median_return']:.1f}): no candidate reached the target on most seeds"
    print(
        f"[sweep] confirm: candidate {chosen['candidate']} (batch {chosen['batch_size']}, lr "
        f"{chosen['lr']:.2e}) {why}; {chosen['reached']}/{chosen['runs']} seeds reached it"
        + (f" ({chosen['cut_by_race']} stopped by the race above that score)" if chosen["cut_by_race"] else ""),
        flush=True,
    )
    if chosen["phase2_trial_id"] == rules.BASELINE_ID:
        print(
            "[sweep] confirm: the spec's own batch and lr won; no searched config beat the starting point "
            "on fresh seeds, so best_config.yaml keeps them",
            flush=True,
        )
