"""The sweep: phase 1 measures the doubling ladder, phase 2 searches lr x batch by reward.

After phase 2 a confirmation step re-runs the top configs on fresh seeds and ships the one with
the lowest median cost to the target (rayrl.confirm). Writes the run folder contract:
doubling.csv, trials.csv, confirm.csv, best_config.yaml, summary.json, history.csv and spec.yaml,
with Tune's experiments in phase1/, phase2/ and confirm/ beside them. Running the same name again
resumes: a finished phase 1 is read back from doubling.csv, a finished confirmation from
confirm.csv, and Tune's restore keeps finished trials.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import time
from pathlib import Path
from typing import Any

from rayrl import confirm, keys, runtime, spec as spec_mod, throughput
from rayrl.spec import Spec, SpecError, scaled_lr
from rayrl.storage.files import explain

log = logging.getLogger("rayrl.sweep")

TRIAL_COLUMNS = ("trial_id", "batch_size", "lr", "env_steps", "episode_return_mean", "status")
SAFE_CAP = 16384


class SweepError(RuntimeError):
    """The sweep cannot go on (e.g. the first rung failed); the message says what to change."""


def smoke(spec: Spec) -> Spec:
    """Tiny budgets: the whole sweep, confirmation included, in about 4 minutes on 2 cores (tests, a first try).

    Sampling and evaluation run in the trial's own process (no EnvRunner actors), so a cluster preset
    (e.g. the Pong GPU config with its learners set to 0) fits a 2-core machine.
    """
    return spec_mod.replace(
        spec,
        env={"envs_per_runner": 4},
        algo={"train_batch_per_learner": 512, "minibatch_size": 128, "epochs": 4},
        resources={"env_runners": 0},
        evaluation={"env_runners": 0},
        checkpoint={"every": 5},
        search={"doubling": {"start": 512, "factor": 2, "cap": 2048, "min_gain": spec.search.doubling.min_gain,
                             "warmup_iters": 1, "measure_iters": 2},
                "num_samples": 4, "max_env_steps": 16000, "grace_env_steps": 4000, "reduction_factor": 2.0,
                "max_concurrent": 0, "min_batch": 256, "confirm_top_k": min(spec.search.confirm_top_k, 2),
                "confirm_seeds": 2, "confirm_env_steps": 4000},
    )


def load_spec(config: str, overrides: list[str] | tuple[str, ...] = (), *, tiny: bool = False) -> Spec:
    """The spec a sweep runs: the file, then --smoke's budgets, then the --set overrides (they win)."""
    if not tiny:
        return spec_mod.load(config, overrides)
    # --set is validated on top of the smoke budgets, not the file's (e.g. a cap below the file's start)
    spec = spec_mod.load(config, [])
    return spec_mod.from_dict(spec_mod.apply_overrides(spec_mod.to_dict(smoke(spec)), overrides))


def run(spec: Spec, paths: runtime.RunPaths) -> dict:
    """Both phases, resumable; returns summary.json's content."""
    start = time.monotonic()
    if spec.search.doubling.cap > SAFE_CAP:
        log.warning("search.doubling.cap=%d is above %d: sample efficiency falls above that batch size; "
                    "the ladder may pick a knee that learns slower per env step.", spec.search.doubling.cap,
                    SAFE_CAP)
    from rayrl.train import trial_resources

    paths.write_text("spec.yaml", spec_mod.dumps(spec))
    rows, phase1_steps = phase1(spec, paths)
    ladder = throughput.admissible(rows)
    knee = throughput.knee(rows)
    if knee is None:
        raise SweepError(f"phase 1: the first rung (batch {rows[0].batch_size if rows else '?'}) failed, so "
                         f"there is no batch size to search; see the trial's error in {paths.run_dir / 'phase1'}, lower "
                         "search.doubling.start or give the trial more resources, then use a new --name (or "
                         "delete doubling.csv and phase1/ to measure the ladder again).")
    d = spec.search.doubling
    batches = throughput.search_batches(ladder, start=d.start, factor=d.factor, min_batch=spec.search.min_batch)
    print(f"[sweep] phase 1 done: knee at batch {knee}; phase 2 searches batch in {batches}", flush=True)
    trials, best, phase2_steps = phase2(spec, paths, batches)
    confirmed, confirm_steps = confirmation(spec, paths, trials)
    if confirmed is not None:
        best = confirmed["best"]
    summary = {
        "kind": "sweep",
        "name": paths.name,
        "algorithm": spec.algo.name,
        "env": spec.env.id,
        "knee_batch_size": knee,
        "ladder": ladder,
        "search_batches": batches,
        "best": best,
        "confirm": None if confirmed is None else confirmed["summary"],
        "env_steps_total": phase1_steps + phase2_steps + confirm_steps,
        "env_steps_phase1": phase1_steps,
        "env_steps_phase2": phase2_steps,
        "env_steps_confirm": confirm_steps,
        "wall_s": round(time.monotonic() - start, 1),
        "trials": len(trials),
        "stopped_early": sum(1 for t in trials if t["status"] == "stopped_early"),
        "scheduler": spec.search.scheduler,
        "return_judged_by": spec.judged_by,
        "resources": trial_resources(spec),
    }
    paths.write_json("summary.json", summary)
    if best is not None:
        best_spec = spec_mod.replace(
            spec, name=f"{paths.name}-best",
            algo={"lr": best["lr"], "train_batch_per_learner": best["batch_size"],
                  "minibatch_size": throughput.minibatch_for(best["batch_size"], spec.algo.train_batch_per_learner,
                                                             spec.algo.minibatch_size)})
        paths.write_text("best_config.yaml", spec_mod.dumps(best_spec))
    return summary


def phase1(spec: Spec, paths: runtime.RunPaths) -> tuple[list[throughput.Row], int]:
    """The ladder: read back from doubling.csv when phase 1 already finished, else run it."""
    done = paths.run_dir / "doubling.csv"
    if done.exists():
        rows = read_doubling(done)
        print(f"[sweep] phase 1 already finished ({len(rows)} rungs in {done}); not repeating it", flush=True)
        return rows, _phase_env_steps(paths.run_dir / "history.csv", "doubling")
    from ray import tune

    from rayrl.progress import config_batch_lr
    from rayrl.search import DoublingSearcher
    from rayrl.train import make_tuner

    d = spec.search.doubling
    max_rungs = int(math.log(d.cap / d.start, d.factor) + 1e-9) + 1
    tuner = make_tuner(
        spec, paths, phase="doubling", subdir="phase1", param_space=_base_params(spec),
        tune_config=tune.TuneConfig(search_alg=DoublingSearcher(spec), num_samples=max_rungs,
                                    max_concurrent_trials=1),
        stop={keys.ITERATION: d.warmup_iters + d.measure_iters}, checkpoints=False, verbose_label="phase 1")
    tuner.fit()
    analysis = _analysis(paths, "phase1")
    rungs = []
    steps = 0
    for trial in sorted(analysis.trials, key=lambda t: config_batch_lr(t.config)[0]):
        df = analysis.trial_dataframes.get(trial.trial_id)
        series = [] if df is None or keys.ENV_STEPS_PER_S not in df else list(df[keys.ENV_STEPS_PER_S])
        failed = trial.status == "ERROR"
        sps = None if failed else throughput.rung_throughput(series, d.warmup_iters, d.measure_iters)
        rungs.append(throughput.Rung(int(config_batch_lr(trial.config)[0]), sps))
        steps += int(keys.lookup(trial.last_result or {}, keys.ENV_STEPS, 0) or 0)
    rows = throughput.decide(rungs, factor=d.factor, cap=d.cap, min_gain=d.min_gain)
    write_doubling(paths, rows)
    return rows, steps


def phase2(spec: Spec, paths: runtime.RunPaths, batches: list[int]) -> tuple[list[dict], dict | None, int]:
    """ASHA/HyperBand + Optuna over lr x batch; env steps are the time unit."""
    from rayrl.search import phase2_tune_config
    from rayrl.train import make_tuner

    s = spec.search
    concurrent, request = _concurrent(spec)
    print(f"[sweep] phase 2: {s.num_samples} trials, {s.scheduler}, up to {concurrent} at once "
          f"(each holds {request})", flush=True)
    stop = {keys.ENV_STEPS: s.max_env_steps}
    if spec.stop.episode_return is not None:
        stop[keys.return_key(spec.judged_by)] = spec.stop.episode_return
    tuner = make_tuner(spec, paths, phase="search", subdir="phase2", param_space=_base_params(spec),
                       tune_config=phase2_tune_config(spec, batches, concurrent), stop=stop,
                       verbose_label="phase 2")
    tuner.fit()
    trials = [_trial_row(t, spec) for t in _analysis(paths, "phase2").trials]
    write_csv(paths, "trials.csv", TRIAL_COLUMNS, trials)
    top = pick_best(trials)
    best = None if top is None else {k: top[k] for k in ("trial_id", "batch_size", "lr", "episode_return_mean",
                                                         "env_steps")}
    return trials, best, sum(int(t["env_steps"] or 0) for t in trials)


def pick_best(trials: list[dict]) -> dict | None:
    """Phase 2's best trial (the confirmation's first candidate): of those that reached the target, the
    one that needed the fewest env steps (ties: the higher return); if none did, the highest return.

    A trial stops at its first result at or above the target, so among those the final return is
    noise (451 vs 478); the env steps it took are what a production run of that config will pay.
    """
    ranked = confirm.rank(trials)
    return ranked[0] if ranked else None


def confirm_budget(search: spec_mod.SearchSpec) -> int:
    """Env steps per confirmation run: search.confirm_env_steps, else phase 2's per-trial budget."""
    return search.max_env_steps if search.confirm_env_steps is None else search.confirm_env_steps


def confirmation(spec: Spec, paths: runtime.RunPaths, trials: list[dict]) -> tuple[dict | None, int]:
    """Re-run phase 2's top configs on fresh seeds; the lowest median cost to the target wins.

    Returns ({"best": summary's best, "summary": summary's confirm section} or None when
    search.confirm_top_k is 0 or no trial is usable, env steps spent). A finished confirmation is
    read back from confirm.csv, not rerun; an interrupted one resumes through Tune.
    """
    s = spec.search
    done = paths.run_dir / "confirm.csv"
    if done.exists():
        runs = read_confirm(done)
        print(f"[sweep] confirmation already finished ({len(runs)} runs in {done}); not repeating it", flush=True)
    else:
        candidates = confirm.top_configs(trials, s.confirm_top_k)
        if not candidates:
            return None, 0
        if s.confirm_baseline:
            candidates = confirm.with_baseline(candidates, spec.algo.train_batch_per_learner, spec.algo.lr)
        runs = run_confirm(spec, paths, candidates, confirm.fresh_seeds(spec.seed, s.confirm_seeds))
        write_csv(paths, "confirm.csv", confirm.CONFIRM_COLUMNS, runs)
    if not runs:
        return None, 0
    table = confirm.summarise(runs, s.objective, seed=spec.seed)
    chosen = confirm.choose(table)
    best = {"trial_id": chosen["phase2_trial_id"], "batch_size": chosen["batch_size"], "lr": chosen["lr"],
            "episode_return_mean": confirm.json_safe(chosen["median_return"]),
            "env_steps": confirm.json_safe(chosen["median_env_steps"]), "confirmed": True,
            "objective": s.objective, "median_cost": confirm.json_safe(chosen["median"]),
            "iqm_cost": confirm.json_safe(chosen["iqm"]),
            "ci95_cost": [confirm.json_safe(chosen["ci_low"]), confirm.json_safe(chosen["ci_high"])],
            "seeds_at_target": f"{chosen['reached']}/{chosen['runs']}"}
    summary = {"objective": s.objective, "seeds": sorted({int(r["seed"]) for r in runs}),
               "env_steps_budget": confirm_budget(s), "target_return": spec.stop.episode_return,
               "chosen": chosen["candidate"], "race": s.confirm_race,
               "runs_cut_by_race": sum(r.get("stopped") == "race" for r in runs),
               "candidates": [confirm.jsonable(c) for c in table]}
    why = (f"has the lowest median {s.objective} to the target, {chosen['median']:.4g} (IQM {chosen['iqm']:.4g}, "
           f"95% interval {chosen['ci_low']:.4g}..{chosen['ci_high']:.4g})" if math.isfinite(chosen["median"]) else
           f"wins on median return ({chosen['median_return']:.1f}): no candidate reached the target on most seeds")
    print(f"[sweep] confirmation: candidate {chosen['candidate']} (batch {chosen['batch_size']}, lr "
          f"{chosen['lr']:.2e}) {why}; {chosen['reached']}/{chosen['runs']} seeds reached it"
          + (f" ({chosen['cut_by_race']} stopped by the race above that median)" if chosen["cut_by_race"] else ""),
          flush=True)
    if chosen["phase2_trial_id"] == confirm.BASELINE_ID:
        print("[sweep] confirmation: the spec's own batch and lr won; no searched config beat the starting point "
              "on fresh seeds, so best_config.yaml keeps them", flush=True)
    return {"best": best, "summary": summary}, int(sum(float(r["env_steps"] or 0) for r in runs))


def run_confirm(spec: Spec, paths: runtime.RunPaths, candidates: list[dict], seeds: list[int]) -> list[dict]:
    """Every candidate on every seed, one Tune experiment (confirm/) whose trials stop at the target, the
    budget or (search.confirm_race) once their config cannot win; returns confirm.csv's rows."""
    from ray import tune
    from ray.tune.search.basic_variant import BasicVariantGenerator

    from rayrl.confirm_stop import ConfirmStopper
    from rayrl.cost import trial_cost, trial_resources
    from rayrl.progress import config_batch_lr
    from rayrl.train import make_tuner

    s, a = spec.search, spec.algo
    points, plan = [], []
    for rank, c in enumerate(candidates, 1):
        for seed in seeds:
            points.append({"lr": scaled_lr(c["lr"], spec.resources.learners, spec.resources.lr_scaling),
                           "train_batch_size_per_learner": int(c["batch_size"]), "seed": seed,
                           "minibatch_size": throughput.minibatch_for(int(c["batch_size"]), a.train_batch_per_learner,
                                                                      a.minibatch_size)})
            plan.append((rank, c))
    print(f"[sweep] confirmation: {len(candidates)} configs x seeds {seeds}, up to {confirm_budget(s):,} env "
          f"steps each, by median {s.objective} to return {spec.stop.episode_return}"
          f"{'; a run stops once its config cannot win' if s.confirm_race else ''}", flush=True)
    held = trial_resources(spec.resources)
    stop = ConfirmStopper([(rank, int(c["batch_size"]), p["lr"], p["seed"]) for (rank, c), p in zip(plan, points)],
                          seeds, objective=s.objective, return_key=keys.return_key(spec.judged_by),
                          target=spec.stop.episode_return, budget=confirm_budget(s), held=held, prices=spec.cost,
                          race=s.confirm_race)
    concurrent, _ = _concurrent(spec)
    params = _base_params(spec)  # the varied keys as choices, so Tune sees each point as a valid pick
    params.update({k: tune.choice(sorted({p[k] for p in points})) for k in points[0]})
    tuner = make_tuner(spec, paths, phase="confirm", subdir="confirm", param_space=params,
                       tune_config=tune.TuneConfig(search_alg=BasicVariantGenerator(points_to_evaluate=points),
                                                   num_samples=len(points), max_concurrent_trials=concurrent),
                       stop=stop, verbose_label="confirm")
    tuner.fit()
    rows = []
    for trial in _analysis(paths, "confirm").trials:
        batch, _ = config_batch_lr(trial.config)
        rank, seed = stop.which(trial.config)
        c = candidates[rank - 1]
        m = trial.last_result or {}
        # the judged return (evaluation when the spec judges by it), last known, as phase 2 and the stop use
        ret, steps = keys.lookup(m, keys.return_key(spec.judged_by)), keys.lookup(m, keys.ENV_STEPS)
        wall = float(m.get(keys.TIME_TOTAL) or 0.0)
        ret = None if ret is None or not math.isfinite(ret) else float(ret)
        reached = (trial.status != "ERROR" and ret is not None and spec.stop.episode_return is not None
                   and ret >= spec.stop.episode_return)
        rows.append({"candidate": rank, "phase2_trial_id": c["trial_id"], "batch_size": batch, "lr": c["lr"],
                     "seed": seed, "trial_id": trial.trial_id, "env_steps": steps, "wall_s": round(wall, 3),
                     "usd": trial_cost(held, wall, spec.cost), "episode_return_mean": ret, "reached": reached,
                     "stopped": confirm.stop_reason(reached, trial.status == "ERROR", steps, confirm_budget(s))})
    return sorted(rows, key=lambda r: (r["candidate"], r["seed"]))


def read_confirm(path: Path) -> list[dict]:
    """confirm.csv's rows with numbers and booleans parsed."""
    num = lambda v: float(v) if v not in ("", None) else None  # noqa: E731
    with path.open() as f:
        return [{**r, "candidate": int(r["candidate"]), "batch_size": int(r["batch_size"]), "lr": float(r["lr"]),
                 "seed": int(r["seed"]), "env_steps": num(r["env_steps"]), "wall_s": num(r["wall_s"]),
                 "usd": num(r["usd"]), "episode_return_mean": num(r["episode_return_mean"]),
                 "reached": r["reached"] == "True", "stopped": r.get("stopped") or ""} for r in csv.DictReader(f)]


def _concurrent(spec: Spec) -> tuple[int, dict]:
    """Trials at once (search.max_concurrent, else what fits in the cluster) and what one trial holds."""
    import ray

    from rayrl.algo import resource_request
    from rayrl.search import max_concurrent_trials

    request = resource_request(spec)
    return max_concurrent_trials(ray.cluster_resources(), request.get("CPU", 1), request.get("GPU", 0),
                                 spec.search.max_concurrent), request


def _analysis(paths: runtime.RunPaths, subdir: str) -> Any:
    """Tune's view of a finished phase; unlike a ResultGrid it keeps errored trials' configs.

    Tune turns Ctrl-C into a normal return from fit(); a phase with unfinished trials is then not
    done, so it raises KeyboardInterrupt (nothing is written; the same command resumes it).
    """
    from ray.tune import ExperimentAnalysis

    path, fs = paths.experiment(subdir)
    analysis = ExperimentAnalysis(path, storage_filesystem=fs)
    if any(t.status not in ("TERMINATED", "ERROR") for t in analysis.trials):
        raise KeyboardInterrupt(f"{subdir} was interrupted")
    return analysis


def _base_params(spec: Spec) -> dict:
    from rayrl.algo import build_config

    params = build_config(spec).to_dict()
    params.pop("_train_batch_size_per_learner", None)
    return params


def _trial_row(trial: Any, spec: Spec) -> dict:
    from rayrl.progress import config_batch_lr

    m = trial.last_result or {}
    ret = keys.lookup(m, keys.return_key(spec.judged_by))
    steps = keys.lookup(m, keys.ENV_STEPS)
    target = spec.stop.episode_return
    if trial.status == "ERROR":
        status = "error"
    elif ret is not None and target is not None and ret >= target:
        status = "reached_target"
    elif steps is not None and steps >= spec.search.max_env_steps:
        status = "completed"
    else:
        status = "stopped_early"
    batch, lr = config_batch_lr(trial.config)
    return {"trial_id": trial.trial_id, "batch_size": batch, "lr": trial.config.get("rayrl_lr", lr),
            "env_steps": steps, "status": status,
            "episode_return_mean": None if ret is None or not math.isfinite(ret) else float(ret)}


def write_doubling(paths: runtime.RunPaths, rows: list[throughput.Row]) -> None:
    write_csv(paths, "doubling.csv", throughput.DOUBLING_COLUMNS, [
        {"batch_size": r.batch_size, "env_steps_per_s": "" if r.env_steps_per_s is None else round(r.env_steps_per_s, 2),
         "gain": "" if r.gain is None else round(r.gain, 4), "decision": r.decision} for r in rows])


def read_doubling(path: Path) -> list[throughput.Row]:
    with path.open() as f:
        return [throughput.Row(int(r["batch_size"]), float(r["env_steps_per_s"]) if r["env_steps_per_s"] else None,
                               float(r["gain"]) if r["gain"] else None, r["decision"]) for r in csv.DictReader(f)]


def write_csv(paths: runtime.RunPaths, rel: str, columns: tuple[str, ...], rows: list[dict]) -> None:
    """One run-folder CSV, written atomically (and uploaded on object storage)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns))
    writer.writeheader()
    writer.writerows(rows)
    paths.write_text(rel, buf.getvalue())


def _phase_env_steps(history: Path, phase: str) -> int:
    """Env steps a finished phase consumed, from history.csv (last row per trial)."""
    if not history.exists():
        return 0
    last: dict[str, float] = {}
    with history.open() as f:
        for row in csv.DictReader(f):
            if row["phase"] == phase and row["env_steps"]:
                last[row["trial_id"]] = float(row["env_steps"])
    return int(sum(last.values()))


def main(argv: list[str] | None = None) -> int:
    """`python experiments/sweep.py ...` (see --help)."""
    import sys
    import textwrap

    from rayrl.cli import _Parser, add_run_args

    parser = _Parser(prog="experiments/sweep.py", description=(
        "The rayrl sweep. Phase 1 measures env steps/s at batch 2048, 4096, ... (the doubling rule: stop when "
        "a doubling gains < 15% or at the cap) to find the knee; phase 2 runs ASHA (or HyperBand) with Optuna "
        "TPE over lr and the batch sizes up to the knee (and below the start, down to search.min_batch), by "
        "episode return; then the top search.confirm_top_k configs and the spec's own batch and lr "
        "(search.confirm_baseline) run again on fresh seeds and the lowest median cost to the target "
        "(search.objective) wins; a run stops once its config can no longer win (search.confirm_race). Results: STORAGE/NAME/ (doubling.csv, trials.csv, "
        "confirm.csv, best_config.yaml, summary.json). The same command again resumes."))
    add_run_args(parser, default_config="experiments/configs/cartpole_ppo.yaml")
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: the whole sweep, confirmation "
                        "included, in about 4 minutes on 2 cores; sampling and evaluation in the trial's own process "
                        "(--set overrides still apply on top)")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs for a local Ray (default: all)")
    args = parser.parse_args(argv)
    try:
        spec = load_spec(args.config, args.overrides, tiny=args.smoke)
        paths = runtime.resolve(args.storage, args.name or spec.name, args.allow_shared_run_dir)
    except SpecError as exc:
        sys.stderr.write(textwrap.fill(f"sweep: error: {exc}", width=100) + "\n")
        return 2
    try:
        with runtime.claim(paths):
            from rayrl.train import check_run_states

            check_run_states(paths, ("phase1", "phase2", "confirm"))  # before Ray starts
            if runtime.init_ray(None, args.num_cpus):
                from rayrl.algo import check_fits

                why = check_fits(spec)
                if why:
                    raise SweepError(why)
            runtime.record_posture(paths)
            summary = run(spec, paths)
    except SweepError as exc:
        sys.stderr.write(textwrap.fill(f"sweep: error: {exc}", width=100) + "\n")
        return 1
    except SpecError as exc:  # a damaged run folder found on resume
        sys.stderr.write(textwrap.fill(f"sweep: error: {exc}", width=100) + "\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("\nsweep: interrupted; run the same command again to resume.\n")
        return 130
    except Exception as exc:  # a full disk or a failed upload: one paragraph, files intact, resumable
        err = explain(exc, paths.run_dir)
        if err is None:
            raise
        sys.stderr.write(f"sweep: error: {err.strerror}\n")
        return 1
    best = summary["best"]
    if best is None:
        what = "evaluation" if spec.judged_by == "evaluation" else "episode"
        print(f"[sweep] no phase-2 trial finished an {what} within search.max_env_steps "
              f"({spec.search.max_env_steps:,}), so there is no return to pick the best by; raise "
              f"search.max_env_steps (episodes of this env may be long) and see {paths.run_dir}/phase2", flush=True)
        return 1
    print(f"[sweep] done in {summary['wall_s']:.0f}s: knee {summary['knee_batch_size']}, best batch "
          f"{best['batch_size']} lr {best['lr']:.2e} return {best['episode_return_mean']:.1f}; "
          f"{summary['env_steps_total']:,} env steps; run folder {paths.run_dir}", flush=True)
    print(f"[sweep] train the best config: rayrl train --config {paths.run_dir / 'best_config.yaml'}")
    return 0
