"""What a sweep costs: the deployment guide's full grid vs rayrl's doubling rule + ASHA.

Both searches run PPO on CartPole-v1 from the same rayrl spec (``--config``), as Tune
experiments on the same local Ray, with the same per-trial stop criteria (``--budget`` env steps,
or the spec's ``stop.episode_return``, 450) and the same trial concurrency rule:

* grid: batch in {1024, 2048, 4096, 8192} x 4 learning rates drawn log-uniform from 1e-5..1e-3
  (one from each quarter of the log range, seeded: a plain draw of 4 can land all below 5e-5);
  every trial runs to the full budget (no early stopping). The minibatch follows the batch as in
  rayrl's phase 2 (same number of minibatches per epoch), so only the search differs.
* rayrl: ``rayrl.sweep.run`` with ``search.max_env_steps`` = the grid's budget: the doubling ladder
  (its env steps count too), then ASHA + Optuna TPE.

Counted from each side's history.csv (rows in the order results reached the driver): env steps
consumed by all trials until the first result with return >= the target, and in total; wall
seconds likewise (from Tune's result timestamps, 1 s resolution); the best return (last result of
each search trial). Goal: rayrl uses <= 1/3 of the grid's env steps for an equal best return.

    python benchmarks/sweep_cost.py                 # full: 16-trial grid + rayrl sweep, ~10 minutes on 2 cores
    python benchmarks/sweep_cost.py --quick         # smoke test: 2x2 grid, tiny budget
    python benchmarks/sweep_cost.py --budget 60000 --out sweep_cost.json
    python benchmarks/sweep_cost.py --storage DIR --report-only   # figures again from a run's folders
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C  # noqa: E402

GRID_BATCHES = (1024, 2048, 4096, 8192)
QUICK_BATCHES = (512, 1024)
GOAL_FRACTION = 1 / 3
TIMING_FILE = "bench_timing.json"  #: start/end (Unix s) of one side's run, for --report-only


def draw_lrs(n: int, low: float, high: float, seed: int) -> list[float]:
    """``n`` log-uniform learning rates, one from each 1/n of the log range (sorted, seeded)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    edges = np.linspace(math.log(low), math.log(high), n + 1)
    return sorted(float(math.exp(rng.uniform(a, b))) for a, b in zip(edges[:-1], edges[1:]))


def consumption(history: Path, phases: tuple[str, ...], target: float) -> dict[str, Any]:
    """Env steps until the first result >= ``target`` and in total, from history.csv's row order."""
    last: dict[str, float] = {}
    ret: dict[str, float] = {}
    reached: set[str] = set()
    first: dict[str, Any] | None = None
    with history.open() as f:
        for row in csv.DictReader(f):
            if row["phase"] not in phases or not row["env_steps"]:
                continue
            trial = row["trial_id"]
            last[trial] = float(row["env_steps"])
            r = C._num(row["episode_return_mean"])
            if row["phase"] != "doubling":
                ret[trial] = r
            if r >= target:
                reached.add(trial)
                if first is None:
                    first = {"trial_id": trial, "iteration": int(float(row["training_iteration"])),
                             "env_steps": sum(last.values())}
    finite = [v for v in ret.values() if math.isfinite(v)]
    trials = [(last[t], t in reached) for t in ret]
    return {"env_steps_total": sum(last.values()), "first_at_target": first,
            "env_steps_to_target": first["env_steps"] if first else None,
            "env_steps_to_target_random_order": expected_to_target(trials),
            "best_return": max(finite) if finite else math.nan, "trials": len(ret),
            "trials_at_target": sum(ok for _, ok in trials)}


def expected_to_target(trials: list[tuple[float, bool]]) -> float | None:
    """Expected env steps until the first trial at the target if the trials ran one at a time in random order.

    ``trials``: (env steps the trial used, reached the target); a trial at the target stopped there.
    Each failed trial comes before all k successes with probability 1/(k+1); the first success is
    any of the k alike. Tune runs a grid in its own fixed order, so this says what that order was
    worth. None when no trial reached the target.
    """
    wins = [s for s, ok in trials if ok]
    losses = [s for s, ok in trials if not ok]
    if not wins:
        return None
    return sum(losses) / (len(wins) + 1) + sum(wins) / len(wins)


def result_timestamp(experiment: Path, trial_id: str, iteration: int) -> float | None:
    """Tune's timestamp (Unix s) of one trial's result, from the experiment's result files."""
    from ray.tune import ExperimentAnalysis

    analysis = ExperimentAnalysis(str(experiment))
    df = analysis.trial_dataframes.get(trial_id)
    if df is None or "timestamp" not in df:
        return None
    rows = df[df["training_iteration"] == iteration]
    return float(rows["timestamp"].iloc[-1]) if len(rows) else None


def run_grid(spec: Any, paths: Any, batches: tuple[int, ...], lrs: list[float], budget: int) -> None:
    """The guide's grid as one Tune experiment (FIFO: every trial to the budget or the target)."""
    import ray
    from ray import tune

    from rayrl import keys, throughput
    from rayrl.algo import algorithm_class, build_config
    from rayrl.search import max_concurrent_trials
    from rayrl.train import make_tuner

    config = build_config(spec)
    params = config.to_dict()
    params.pop("_train_batch_size_per_learner", None)
    base_b, base_mb = spec.algo.train_batch_per_learner, spec.algo.minibatch_size
    params["train_batch_size_per_learner"] = tune.grid_search(list(batches))
    params["lr"] = tune.grid_search(list(lrs))
    params["minibatch_size"] = tune.sample_from(
        lambda s: throughput.minibatch_for(s.config["train_batch_size_per_learner"], base_b, base_mb))
    request = algorithm_class(spec.algo.name).default_resource_request(config).required_resources
    concurrent = max_concurrent_trials(ray.cluster_resources(), request.get("CPU", 1), request.get("GPU", 0),
                                       spec.search.max_concurrent)
    stop = {keys.ENV_STEPS: budget}
    if spec.stop.episode_return is not None:
        stop[keys.EPISODE_RETURN] = spec.stop.episode_return
    C.say(f"[grid] {len(batches) * len(lrs)} trials: batch {list(batches)} x lr "
          f"{[f'{x:.2e}' for x in lrs]}, up to {concurrent} at once, budget {budget:,} env steps")
    tuner = make_tuner(spec, paths, phase="grid", subdir="grid", param_space=params,
                       tune_config=tune.TuneConfig(num_samples=1, max_concurrent_trials=concurrent),
                       stop=stop, verbose_label="grid")
    tuner.fit()


def side(run_dir: Path, experiments: dict[str, Path], phases: tuple[str, ...], target: float,
         start: float, end: float) -> dict[str, Any]:
    """One search's figures: env steps and wall to the target and in total, best return."""
    c = consumption(run_dir / "history.csv", phases, target)
    c["wall_s_total"] = end - start
    c["wall_s_to_target"] = None
    first = c["first_at_target"]
    if first:
        for exp in experiments.values():
            ts = result_timestamp(exp, first["trial_id"], first["iteration"])
            if ts is not None:
                c["wall_s_to_target"] = max(0.0, ts - start)
                break
    c["run_dir"] = str(run_dir)
    return c


def quick_spec(spec: Any) -> Any:
    """Tiny budgets for the smoke test: 2 ladder rungs, 2 search trials."""
    from rayrl import spec as spec_mod

    return spec_mod.replace(
        spec, algo={"train_batch_per_learner": 512, "minibatch_size": 128, "epochs": 4},
        stop={"episode_return": 40.0},
        search={"doubling": {"start": 512, "factor": 2, "cap": 1024, "min_gain": spec.search.doubling.min_gain,
                             "warmup_iters": 1, "measure_iters": 1},
                "num_samples": 2, "grace_env_steps": 2048, "reduction_factor": 2.0})


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2x2 grid, 2-rung ladder, 2 trials, target 40: a smoke test")
    p.add_argument("--out", type=Path, help="also write the figures as JSON here")
    p.add_argument("--config", type=Path, default=C.DEFAULT_CONFIG, help="rayrl spec (default: %(default)s)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V",
                   help="override a spec field (both searches), e.g. --set search.num_samples=6")
    p.add_argument("--budget", type=int, help="env steps per trial, both searches (default 100000; quick 4096)")
    p.add_argument("--lr-seed", type=int, help="seed of the grid's lr draw (default: the spec's seed)")
    p.add_argument("--storage", type=Path, help="where both run folders go (default: a temp dir)")
    p.add_argument("--only", choices=("grid", "rayrl"), help="run one side only (the other's figures are null)")
    p.add_argument("--report-only", action="store_true", help="run nothing: recompute the figures from the run "
                   "folders a previous run left under --storage")
    args = p.parse_args(argv)
    args.budget = C.mode_default(args.budget, 4096, 100_000, args.quick)
    if args.budget < 1:
        p.error(f"--budget must be >= 1, got {args.budget}")
    if args.report_only and not args.storage:
        p.error("--report-only needs the --storage of a previous run")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    C.quiet()
    from rayrl import runtime, spec as spec_mod, sweep

    spec = C.load_spec(args.config, args.overrides)
    if args.quick:
        spec = quick_spec(spec)
    grace = min(spec.search.grace_env_steps, args.budget)
    spec = spec_mod.replace(spec, search={"max_env_steps": args.budget, "grace_env_steps": grace})
    target = spec.stop.episode_return if spec.stop.episode_return is not None else C.TARGET_RETURN
    batches = QUICK_BATCHES if args.quick else GRID_BATCHES
    lrs = draw_lrs(2 if args.quick else 4, spec.search.lr_min, spec.search.lr_max,
                   spec.seed if args.lr_seed is None else args.lr_seed)
    storage = args.storage or Path(tempfile.mkdtemp(prefix="rayrl-bench-sweep-"))
    started = time.monotonic()
    sides: dict[str, Any] = {"grid": None, "rayrl": None}
    with contextlib.nullcontext() if args.report_only else C.local_ray():
        for name in ("grid", "rayrl"):
            if args.only not in (None, name):
                continue
            paths = runtime.resolve(str(storage), name)
            clock = paths.run_dir / TIMING_FILE
            if args.report_only:
                if not clock.exists():
                    raise SystemExit(f"--report-only: {clock} is missing; run the benchmark with this --storage first.")
                t0, t1 = (json.loads(clock.read_text())[k] for k in ("start", "end"))
            else:
                t0 = time.time()
                if name == "grid":
                    run_grid(spec, paths, batches, lrs, args.budget)
                else:
                    sweep.run(spec, paths)
                t1 = time.time()
                clock.write_text(json.dumps({"start": t0, "end": t1}))
            if name == "grid":
                sides["grid"] = side(paths.run_dir, {"grid": paths.run_dir / "grid"}, ("grid",), target, t0, t1)
            else:
                summary = json.loads((paths.run_dir / "summary.json").read_text())
                sides["rayrl"] = side(paths.run_dir, {"phase2": paths.run_dir / "phase2",
                                                      "phase1": paths.run_dir / "phase1"},
                                      ("doubling", "search"), target, t0, t1)
                sides["rayrl"].update(knee_batch_size=summary["knee_batch_size"], ladder=summary["ladder"],
                                      best=summary["best"], env_steps_phase1=summary["env_steps_phase1"])
    report = figures(sides, target, args.budget)
    report.update(grid_batches=list(batches), grid_lrs=lrs, storage=str(storage),
                  rayrl_search={"num_samples": spec.search.num_samples, "scheduler": spec.search.scheduler,
                                "grace_env_steps": grace, "reduction_factor": spec.search.reduction_factor,
                                "doubling": spec_mod.to_dict(spec.search.doubling)},
                  settings={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                  machine=C.machine(), wall_s=round(time.monotonic() - started, 1))
    print_report(report)
    C.write_json(args.out, report)
    return 0


def headline(s: dict | None) -> float:
    """A side's env-step figure: to the first trial at the target, else everything it spent."""
    if s is None:
        return math.nan
    return float(s["env_steps_to_target"] if s["env_steps_to_target"] is not None else s["env_steps_total"])


def figures(sides: dict[str, Any], target: float, budget: int) -> dict[str, Any]:
    g, r = sides["grid"], sides["rayrl"]
    get = lambda s, k: math.nan if s is None or s.get(k) is None else float(s[k])  # noqa: E731
    report = {
        "target_return": target, "budget_env_steps": budget,
        "grid_env_steps": headline(g), "rayrl_env_steps": headline(r),
        "grid_env_steps_total": get(g, "env_steps_total"), "rayrl_env_steps_total": get(r, "env_steps_total"),
        "grid_env_steps_to_target_random_order": get(g, "env_steps_to_target_random_order"),
        "grid_wall_s_to_target": get(g, "wall_s_to_target"), "rayrl_wall_s_to_target": get(r, "wall_s_to_target"),
        "grid_wall_s_total": get(g, "wall_s_total"), "rayrl_wall_s_total": get(r, "wall_s_total"),
        "grid_best_return": get(g, "best_return"), "rayrl_best_return": get(r, "best_return"),
        "grid_reached_target": bool(g and g["first_at_target"]),
        "rayrl_reached_target": bool(r and r["first_at_target"]),
        "grid": g, "rayrl": r,
    }
    report["env_steps_ratio_to_target"] = C.ratio(report["rayrl_env_steps"], report["grid_env_steps"])
    report["env_steps_ratio_total"] = C.ratio(report["rayrl_env_steps_total"], report["grid_env_steps_total"])
    report["env_steps_ratio_to_target_vs_random_grid_order"] = C.ratio(
        report["rayrl_env_steps"], report["grid_env_steps_to_target_random_order"])
    report["wall_ratio_total"] = C.ratio(report["rayrl_wall_s_total"], report["grid_wall_s_total"])
    equal = report["rayrl_best_return"] >= min(report["grid_best_return"], target)
    report["goal_fraction"] = GOAL_FRACTION
    report["goal_met"] = bool(equal and report["env_steps_ratio_to_target"] <= GOAL_FRACTION)
    return report


def print_report(report: dict) -> None:
    def val(side: str, key: str) -> float:
        return report[f"{side}_{key}"]

    rows = []
    for side, label in (("grid", f"grid {len(report['grid_batches'])}x{len(report['grid_lrs'])}, FIFO"),
                        ("rayrl", "rayrl: doubling + ASHA/TPE")):
        info = report[side] or {}
        rows.append([label, info.get("trials", "-"), val(side, "env_steps") if report[f"{side}_reached_target"]
                     else float("nan"), val(side, "env_steps_total"), val(side, "wall_s_to_target"),
                     val(side, "wall_s_total"), val(side, "best_return")])
    C.say(f"\nsweep cost on CartPole-v1 PPO, {report['budget_env_steps']:,} env steps per trial, "
          f"target return {report['target_return']:g}:")
    C.say(C.table(["search", "trials", "env steps to target", "env steps total", "wall s to target",
                   "wall s total", "best return"], rows))
    C.say(f"grid in a random trial order (expected): {report['grid_env_steps_to_target_random_order']:,.0f} env steps "
          f"to target; {report['grid']['trials_at_target'] if report['grid'] else 0} of its trials reached it"
          if report["grid"] and report["grid"]["first_at_target"] else "grid: no trial reached the target")
    C.say(f"\nrayrl / grid env steps: to target {report['env_steps_ratio_to_target']:.2f} (vs a random grid order "
          f"{report['env_steps_ratio_to_target_vs_random_grid_order']:.2f}), total "
          f"{report['env_steps_ratio_total']:.2f}; wall total {report['wall_ratio_total']:.2f}; goal <= "
          f"{GOAL_FRACTION:.2f} for an equal best return: {'met' if report['goal_met'] else 'missed'}")
    if report["rayrl"]:
        C.say(f"rayrl knee {report['rayrl']['knee_batch_size']}, ladder env steps "
              f"{report['rayrl']['env_steps_phase1']:,}")
    m = report["machine"]
    C.say(f"machine: {m['nproc']} x {m['cpu_model']}, load {m['load_avg_1m']}; {m['date']}; "
          f"{report['wall_s']:.0f} s; run folders under {report['storage']}")


if __name__ == "__main__":
    sys.exit(main())
