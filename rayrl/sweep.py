"""The sweep: phase 1 measures the doubling ladder, phase 2 searches lr x batch by reward.

Writes the run folder contract: doubling.csv, trials.csv, best_config.yaml, summary.json,
history.csv and spec.yaml, with Tune's experiments in phase1/ and phase2/ beside them.
Running the same name again resumes: a finished phase 1 is read back from doubling.csv, and
Tune's restore keeps finished phase-2 trials.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import time
from pathlib import Path
from typing import Any

from rayrl import keys, runtime, spec as spec_mod, throughput
from rayrl.spec import Spec, SpecError
from rayrl.storage.files import explain

log = logging.getLogger("rayrl.sweep")

TRIAL_COLUMNS = ("trial_id", "batch_size", "lr", "env_steps", "episode_return_mean", "status")
SAFE_CAP = 16384


class SweepError(RuntimeError):
    """The sweep cannot go on (e.g. the first rung failed); the message says what to change."""


def smoke(spec: Spec) -> Spec:
    """Tiny budgets: the whole sweep in about 3 minutes on 2 cores (tests, first contact)."""
    return spec_mod.replace(
        spec,
        env={"envs_per_runner": 4},
        algo={"train_batch_per_learner": 512, "minibatch_size": 128, "epochs": 4},
        resources={"env_runners": 0},
        checkpoint={"every": 5},
        search={"doubling": {"start": 512, "factor": 2, "cap": 2048, "min_gain": spec.search.doubling.min_gain,
                             "warmup_iters": 1, "measure_iters": 2},
                "num_samples": 4, "max_env_steps": 16000, "grace_env_steps": 4000, "reduction_factor": 2.0,
                "max_concurrent": 0},
    )


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
    print(f"[sweep] phase 1 done: knee at batch {knee}; phase 2 searches batch in {ladder}", flush=True)
    trials, best, phase2_steps = phase2(spec, paths, ladder)
    summary = {
        "kind": "sweep",
        "name": paths.name,
        "algorithm": spec.algo.name,
        "env": spec.env.id,
        "knee_batch_size": knee,
        "ladder": ladder,
        "best": best,
        "env_steps_total": phase1_steps + phase2_steps,
        "env_steps_phase1": phase1_steps,
        "env_steps_phase2": phase2_steps,
        "wall_s": round(time.monotonic() - start, 1),
        "trials": len(trials),
        "stopped_early": sum(1 for t in trials if t["status"] == "stopped_early"),
        "scheduler": spec.search.scheduler,
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


def phase2(spec: Spec, paths: runtime.RunPaths, ladder: list[int]) -> tuple[list[dict], dict | None, int]:
    """ASHA/HyperBand + Optuna over lr x batch; env steps are the time unit."""
    import ray

    from rayrl.algo import algorithm_class, build_config
    from rayrl.search import max_concurrent_trials, phase2_tune_config
    from rayrl.train import make_tuner

    s = spec.search
    request = algorithm_class(spec.algo.name).default_resource_request(build_config(spec)).required_resources
    concurrent = max_concurrent_trials(ray.cluster_resources(), request.get("CPU", 1), request.get("GPU", 0),
                                       s.max_concurrent)
    print(f"[sweep] phase 2: {s.num_samples} trials, {s.scheduler}, up to {concurrent} at once "
          f"(each holds {request})", flush=True)
    stop = {keys.ENV_STEPS: s.max_env_steps}
    if spec.stop.episode_return is not None:
        stop[keys.EPISODE_RETURN] = spec.stop.episode_return
    tuner = make_tuner(spec, paths, phase="search", subdir="phase2", param_space=_base_params(spec),
                       tune_config=phase2_tune_config(spec, ladder, concurrent), stop=stop,
                       verbose_label="phase 2")
    tuner.fit()
    trials = [_trial_row(t, spec) for t in _analysis(paths, "phase2").trials]
    write_csv(paths, "trials.csv", TRIAL_COLUMNS, trials)
    top = pick_best(trials)
    best = None if top is None else {k: top[k] for k in ("trial_id", "batch_size", "lr", "episode_return_mean",
                                                         "env_steps")}
    return trials, best, sum(int(t["env_steps"] or 0) for t in trials)


def pick_best(trials: list[dict]) -> dict | None:
    """The trial whose config the sweep ships: of those that reached the target, the one that needed
    the fewest env steps (ties: the higher return); if none did, the highest return.

    A trial stops at its first result at or above the target, so among those the final return is
    noise (451 vs 478); the env steps it took are what a production run of that config will pay.
    """
    finished = [t for t in trials if t["episode_return_mean"] is not None and t["status"] != "error"]
    reached = [t for t in finished if t["status"] == "reached_target" and t["env_steps"] is not None]
    if reached:
        return min(reached, key=lambda t: (t["env_steps"], -t["episode_return_mean"]))
    return max(finished, key=lambda t: t["episode_return_mean"], default=None)


def _analysis(paths: runtime.RunPaths, subdir: str) -> Any:
    """Tune's view of a finished phase; unlike a ResultGrid it keeps errored trials' configs."""
    from ray.tune import ExperimentAnalysis

    path, fs = paths.experiment(subdir)
    return ExperimentAnalysis(path, storage_filesystem=fs)


def _base_params(spec: Spec) -> dict:
    from rayrl.algo import build_config

    params = build_config(spec).to_dict()
    params.pop("_train_batch_size_per_learner", None)
    return params


def _trial_row(trial: Any, spec: Spec) -> dict:
    from rayrl.progress import config_batch_lr

    m = trial.last_result or {}
    ret = keys.lookup(m, keys.EPISODE_RETURN)
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
        "a doubling gains < 15%% or at the cap) to find the knee; phase 2 runs ASHA (or HyperBand) with Optuna "
        "TPE over lr and the batch sizes up to the knee, by episode return. Results: STORAGE/NAME/ "
        "(doubling.csv, trials.csv, best_config.yaml, summary.json). The same command again resumes."))
    add_run_args(parser, default_config="experiments/configs/cartpole_ppo.yaml")
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: the whole sweep in about 3 minutes "
                        "on 2 cores")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs for a local Ray (default: all)")
    args = parser.parse_args(argv)
    try:
        spec = spec_mod.load(args.config, args.overrides)
        if args.smoke:
            spec = smoke(spec)
        paths = runtime.resolve(args.storage, args.name or spec.name)
    except SpecError as exc:
        sys.stderr.write(textwrap.fill(f"sweep: error: {exc}", width=100) + "\n")
        return 2
    try:
        with runtime.claim(paths):
            runtime.init_ray(None, args.num_cpus)
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
        print(f"[sweep] no phase-2 trial reported a return; see {paths.run_dir}/phase2", flush=True)
        return 1
    print(f"[sweep] done in {summary['wall_s']:.0f}s: knee {summary['knee_batch_size']}, best batch "
          f"{best['batch_size']} lr {best['lr']:.2e} return {best['episode_return_mean']:.1f}; "
          f"{summary['env_steps_total']:,} env steps; run folder {paths.run_dir}", flush=True)
    print(f"[sweep] train the best config: rayrl train --config {paths.run_dir / 'best_config.yaml'}")
    return 0
