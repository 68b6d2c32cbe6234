"""What a sweep costs: the deployment guide's grid, in both readings, vs rayrl's sweep.

All searches run PPO on CartPole-v1 from the same rayrl spec (``--config``), as Tune
experiments on the same local Ray, with the same per-trial stop criteria (``--budget`` env steps,
or the spec's ``stop.episode_return``, 450) and the same trial concurrency rule:

* grid16: batch in {1024, 2048, 4096, 8192} x 4 learning rates drawn log-uniform from 1e-5..1e-3
  (one from each quarter of the log range, seeded: a plain draw of 4 can land all below 5e-5);
  every trial runs to the full budget (no early stopping). The minibatch follows the batch by
  rayrl's own rule (``ladder.minibatch_for``, as in phase 2), so only the search differs.
* grid4: the guide's snippet read literally: one lr draw per batch (the same 4 lrs, shuffled).
* rayrl: ``rayrl.sweep.run`` with ``search.max_env_steps`` = ``search.confirm_env_steps`` = the
  grid's budget: the doubling ladder, ASHA + Optuna TPE, then the confirmation runs (all count).

Counted from each side's history.csv (rows in the order results reached the driver): env steps
consumed by all trials until the first result with return >= the target, and in total; wall
seconds likewise (from Tune's result timestamps, 1 s resolution); the best return (last result of
each search trial). Each repetition uses its own seed (training, lr draw, TPE) and the order of
the three searches rotates between repetitions; the headline figures are medians over them.
Goals: rayrl's env steps to the target <= grid4's; rayrl's total <= 1/3 of grid16's total.

    python -m benchmarks.sweep_cost                 # full: 3 x (grid16 + grid4 + rayrl), about 1.5 h on 2 cores
    python -m benchmarks.sweep_cost --quick         # smoke test: 2x2 / 2x1 grids, tiny budget, target 40
    python -m benchmarks.sweep_cost --budget 60000 --reps 1 --out sweep_cost.json
    python -m benchmarks.sweep_cost --storage DIR --report-only   # figures again from a run's folders
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

from benchmarks import common as C
from rayrl import runfolder

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
            if row["phase"] != runfolder.LADDER:
                ret[trial] = r
            if r >= target:
                reached.add(trial)
                if first is None:
                    first = {
                        "trial_id": trial,
                        "iteration": int(float(row["training_iteration"])),
                        "env_steps": sum(last.values()),
                    }
    finite = [v for v in ret.values() if math.isfinite(v)]
    trials = [(last[t], t in reached) for t in ret]
    return {
        "env_steps_total": sum(last.values()),
        "first_at_target": first,
        "env_steps_to_target": first["env_steps"] if first else None,
        "env_steps_to_target_random_order": expected_to_target(trials),
        "best_return": max(finite) if finite else math.nan,
        "trials": len(ret),
        "trials_at_target": sum(ok for _, ok in trials),
    }


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


def one_lr_per_batch(batches: tuple[int, ...], lrs: list[float], seed: int) -> dict[int, float]:
    """The 4-trial reading of the guide's grid: each batch gets one of the lrs (a seeded shuffle)."""
    import numpy as np

    order = np.random.default_rng(seed).permutation(len(lrs))
    return {b: lrs[int(order[i % len(lrs)])] for i, b in enumerate(batches)}


def rotation(names: tuple[str, ...], rep: int) -> list[str]:
    """The order of the searches in repetition ``rep``: rotated, so none always runs first."""
    k = rep % len(names)
    return list(names[k:] + names[:k])


def run_grid(spec: Any, paths: Any, batches: tuple[int, ...], lrs: list[float] | dict[int, float], budget: int) -> None:
    """The guide's grid as one Tune experiment (FIFO: every trial to the budget or the target).

    ``lrs``: a list (every batch x every lr) or a dict batch -> lr (one lr per batch)."""
    import ray
    from ray import tune

    from rayrl.observe import keys
    from rayrl.rllib.algo import build_config
    from rayrl.sweep import ladder
    from rayrl.tune import resources
    from rayrl.tune.tuner import make_tuner

    config = build_config(spec)
    params = config.to_dict()
    params.pop("_train_batch_size_per_learner", None)
    base_b, base_mb = spec.algo.train_batch_per_learner, spec.algo.minibatch_size
    params["train_batch_size_per_learner"] = tune.grid_search(list(batches))
    if isinstance(lrs, dict):
        per_batch = dict(lrs)
        params["lr"] = tune.sample_from(lambda s: per_batch[s.config["train_batch_size_per_learner"]])
        n_lrs = 1
    else:
        params["lr"] = tune.grid_search(list(lrs))
        n_lrs = len(lrs)
    params["minibatch_size"] = tune.sample_from(
        lambda s: ladder.minibatch_for(s.config["train_batch_size_per_learner"], base_b, base_mb)
    )
    concurrent = resources.max_concurrent_trials(
        ray.cluster_resources(), resources.of_spec(spec), spec.search.max_concurrent
    )
    stop = {keys.ENV_STEPS: budget}
    if spec.stop.episode_return is not None:
        stop[keys.EPISODE_RETURN] = spec.stop.episode_return
    shown = {b: f"{x:.2e}" for b, x in lrs.items()} if isinstance(lrs, dict) else [f"{x:.2e}" for x in lrs]
    C.say(
        f"[{paths.name}] {len(batches) * n_lrs} trials: batch {list(batches)} x lr {shown}, up to {concurrent} "
        f"at once, budget {budget:,} env steps"
    )
    tuner = make_tuner(
        spec,
        paths,
        phase="grid",
        subdir="grid",
        param_space=params,
        tune_config=tune.TuneConfig(num_samples=1, max_concurrent_trials=concurrent),
        stop=stop,
        verbose_label="grid",
    )
    tuner.fit()


def side(
    run_dir: Path, experiments: dict[str, Path], phases: tuple[str, ...], target: float, start: float, end: float
) -> dict[str, Any]:
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
    """Tiny budgets for the smoke test: 2 ladder rungs, 2 search trials, 2 x 2 confirmation runs."""
    from rayrl import spec as spec_mod

    return spec_mod.replace(
        spec,
        algo={"train_batch_per_learner": 512, "minibatch_size": 128, "epochs": 4},
        stop={"episode_return": 40.0},
        search={
            "doubling": {
                "start": 512,
                "factor": 2,
                "cap": 1024,
                "min_gain": spec.search.doubling.min_gain,
                "warmup_iters": 1,
                "measure_iters": 1,
            },
            "num_samples": 2,
            "grace_env_steps": 2048,
            "reduction_factor": 2.0,
            "min_batch": 256,
            "confirm_top_k": 2,
            "confirm_seeds": 2,
        },
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help="2x2 and 2x1 grids, 2-rung ladder, 2 trials, 2x2 confirmation runs, target 40: a smoke test",
    )
    p.add_argument("--out", type=Path, help="also write the figures as JSON here")
    p.add_argument("--config", type=Path, default=C.DEFAULT_CONFIG, help="rayrl spec (default: %(default)s)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="K=V",
        help="override a spec field (all searches), e.g. --set search.num_samples=6",
    )
    p.add_argument("--budget", type=int, help="env steps per trial, all searches (default 100000; quick 4096)")
    p.add_argument(
        "--reps",
        type=int,
        default=3,
        help="repetitions, each with its own seed and a rotated "
        "order (default %(default)s); the headline figures are medians",
    )
    p.add_argument(
        "--lr-seed",
        type=int,
        help="seed of the grids' lr draw in the first repetition (default: the spec's seed; repetition i adds i)",
    )
    p.add_argument("--storage", type=Path, help="where the run folders go (default: a temp dir)")
    p.add_argument("--only", choices=SIDES, help="run one search only (the others' figures are null)")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: recompute the figures from the run folders a previous run left under --storage",
    )
    args = p.parse_args(argv)
    args.budget = C.mode_default(args.budget, 4096, 100_000, args.quick)
    if args.budget < 1:
        p.error(f"--budget must be >= 1, got {args.budget}")
    if args.reps < 1:
        p.error(f"--reps must be >= 1, got {args.reps}")
    if args.report_only and not args.storage:
        p.error("--report-only needs the --storage of a previous run")
    return args


SIDES = ("grid16", "grid4", "rayrl")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    C.quiet()
    from rayrl import spec as spec_mod

    spec = C.load_spec(args.config, args.overrides)
    if args.quick:
        spec = quick_spec(spec)
    grace = min(spec.search.grace_env_steps, args.budget)
    spec = spec_mod.replace(
        spec, search={"max_env_steps": args.budget, "grace_env_steps": grace, "confirm_env_steps": args.budget}
    )
    target = spec.stop.episode_return if spec.stop.episode_return is not None else C.TARGET_RETURN
    batches = QUICK_BATCHES if args.quick else GRID_BATCHES
    storage = args.storage or Path(tempfile.mkdtemp(prefix="rayrl-bench-sweep-"))
    started = time.monotonic()
    reps = []
    with contextlib.nullcontext() if args.report_only else C.local_ray():
        for rep in range(args.reps):
            seed = spec.seed + rep
            lrs = draw_lrs(
                2 if args.quick else 4,
                spec.search.lr_min,
                spec.search.lr_max,
                seed if args.lr_seed is None else args.lr_seed + rep,
            )
            rep_spec = spec_mod.replace(spec, seed=seed)
            sides = run_rep(rep_spec, storage / f"rep{rep}", rotation(SIDES, rep), batches, lrs, args, target)
            report = figures(
                {"grid": sides["grid16"], "grid4": sides["grid4"], "rayrl": sides["rayrl"]}, target, args.budget
            )
            report.update(
                rep=rep,
                seed=seed,
                order=rotation(SIDES, rep),
                grid_lrs=lrs,
                grid4_lrs={str(b): x for b, x in one_lr_per_batch(batches, lrs, seed).items()},
            )
            reps.append(report)
    report = combine(reps)
    report.update(
        target_return=target,
        budget_env_steps=args.budget,
        grid_batches=list(batches),
        storage=str(storage),
        rayrl_search={
            "num_samples": spec.search.num_samples,
            "scheduler": spec.search.scheduler,
            "grace_env_steps": grace,
            "reduction_factor": spec.search.reduction_factor,
            "min_batch": spec.search.min_batch,
            "confirm_top_k": spec.search.confirm_top_k,
            "confirm_seeds": spec.search.confirm_seeds,
            "objective": spec.search.objective,
            "doubling": spec_mod.to_dict(spec.search.doubling),
        },
        settings={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        machine=C.machine(),
        wall_s=round(time.monotonic() - started, 1),
    )
    print_report(report)
    C.write_json(args.out, report)
    return 0


def run_rep(
    spec: Any,
    storage: Path,
    order: list[str],
    batches: tuple[int, ...],
    lrs: list[float],
    args: argparse.Namespace,
    target: float,
) -> dict[str, Any]:
    """One repetition: the three searches in ``order``, each in its own run folder; their figures."""
    from rayrl import runtime
    from rayrl.sweep import run as sweep

    sides: dict[str, Any] = {name: None for name in SIDES}
    for name in order:
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
            if name == "rayrl":
                sweep.run(spec, paths)
            else:
                run_grid(
                    spec,
                    paths,
                    batches,
                    lrs if name == "grid16" else one_lr_per_batch(batches, lrs, spec.seed),
                    args.budget,
                )
            t1 = time.time()
            clock.write_text(json.dumps({"start": t0, "end": t1}))
        if name != "rayrl":
            sides[name] = side(paths.run_dir, {"grid": paths.run_dir / "grid"}, ("grid",), target, t0, t1)
            continue
        summary = json.loads((paths.run_dir / "summary.json").read_text())
        sides["rayrl"] = side(
            paths.run_dir,
            {d: paths.run_dir / d for d in runfolder.SWEEP_DIRS},
            (runfolder.LADDER, runfolder.SEARCH, runfolder.CONFIRM_PHASE),
            target,
            t0,
            t1,
        )
        sides["rayrl"].update(
            knee_batch_size=summary["knee_batch_size"],
            ladder=summary["ladder"],
            best=summary["best"],
            env_steps_phase1=summary["env_steps_phase1"],
            env_steps_confirm=summary.get("env_steps_confirm"),
        )
    return sides


HEADLINE = {  # key in the combined report -> key in one repetition's figures
    "grid4_env_steps_to_target": "grid4_env_steps",
    "grid16_env_steps_to_target": "grid_env_steps",
    "grid16_env_steps_total": "grid_env_steps_total",
    "grid4_env_steps_total": "grid4_env_steps_total",
    "rayrl_env_steps_to_target": "rayrl_env_steps",
    "rayrl_env_steps_total": "rayrl_env_steps_total",
    "grid_best_return": "grid_best_return",
    "grid4_best_return": "grid4_best_return",
    "rayrl_best_return": "rayrl_best_return",
    "rayrl_wall_s_total": "rayrl_wall_s_total",
    "grid16_wall_s_total": "grid_wall_s_total",
    "grid4_wall_s_total": "grid4_wall_s_total",
}


def combine(reps: list[dict]) -> dict[str, Any]:
    """Medians over the repetitions of every headline figure, and the two goals judged on the medians.

    A search that never reached the target counts all it spent as its env steps to the target
    (:func:`headline`), so a miss is never cheaper than a hit."""
    out: dict[str, Any] = {k: C.median([r[v] for r in reps]) for k, v in HEADLINE.items()}
    out["reps"] = reps
    out["to_target_ratio_vs_grid4"] = C.ratio(out["rayrl_env_steps_to_target"], out["grid4_env_steps_to_target"])
    out["total_ratio_vs_grid16"] = C.ratio(out["rayrl_env_steps_total"], out["grid16_env_steps_total"])
    out["goal_to_target_met"] = bool(out["to_target_ratio_vs_grid4"] <= 1.0)
    out["goal_total_fraction"] = GOAL_FRACTION
    out["goal_total_met"] = bool(out["total_ratio_vs_grid16"] <= GOAL_FRACTION)
    return out


def headline(s: dict | None) -> float:
    """A side's env-step figure: to the first trial at the target, else everything it spent."""
    if s is None:
        return math.nan
    return float(s["env_steps_to_target"] if s["env_steps_to_target"] is not None else s["env_steps_total"])


def figures(sides: dict[str, Any], target: float, budget: int) -> dict[str, Any]:
    g, r = sides["grid"], sides["rayrl"]
    get = lambda s, k: math.nan if s is None or s.get(k) is None else float(s[k])  # noqa: E731
    report = {
        "target_return": target,
        "budget_env_steps": budget,
        "grid_env_steps": headline(g),
        "rayrl_env_steps": headline(r),
        "grid_env_steps_total": get(g, "env_steps_total"),
        "rayrl_env_steps_total": get(r, "env_steps_total"),
        "grid_env_steps_to_target_random_order": get(g, "env_steps_to_target_random_order"),
        "grid_wall_s_to_target": get(g, "wall_s_to_target"),
        "rayrl_wall_s_to_target": get(r, "wall_s_to_target"),
        "grid_wall_s_total": get(g, "wall_s_total"),
        "rayrl_wall_s_total": get(r, "wall_s_total"),
        "grid_best_return": get(g, "best_return"),
        "rayrl_best_return": get(r, "best_return"),
        "grid_reached_target": bool(g and g["first_at_target"]),
        "rayrl_reached_target": bool(r and r["first_at_target"]),
        "grid": g,
        "rayrl": r,
    }
    report["env_steps_ratio_to_target"] = C.ratio(report["rayrl_env_steps"], report["grid_env_steps"])
    report["env_steps_ratio_total"] = C.ratio(report["rayrl_env_steps_total"], report["grid_env_steps_total"])
    report["env_steps_ratio_to_target_vs_random_grid_order"] = C.ratio(
        report["rayrl_env_steps"], report["grid_env_steps_to_target_random_order"]
    )
    report["wall_ratio_total"] = C.ratio(report["rayrl_wall_s_total"], report["grid_wall_s_total"])
    if "grid4" in sides:  # the 4-trial reading of the guide's grid (one lr per batch)
        g4 = sides["grid4"]
        report.update(
            grid4_env_steps=headline(g4),
            grid4_env_steps_total=get(g4, "env_steps_total"),
            grid4_best_return=get(g4, "best_return"),
            grid4_wall_s_total=get(g4, "wall_s_total"),
            grid4_reached_target=bool(g4 and g4["first_at_target"]),
            grid4=g4,
        )
    equal = report["rayrl_best_return"] >= min(report["grid_best_return"], target)
    report["goal_fraction"] = GOAL_FRACTION
    report["goal_met"] = bool(equal and report["env_steps_ratio_to_target"] <= GOAL_FRACTION)
    return report


def print_report(report: dict) -> None:
    """The medians, each repetition's figures, and the two goals as met or missed."""
    C.say(
        f"\nsweep cost on CartPole-v1 PPO, {report['budget_env_steps']:,} env steps per trial, target return "
        f"{report['target_return']:g}, {len(report['reps'])} repetition(s), order rotated:"
    )
    rows = []
    for r in report["reps"]:
        for side, key in (("grid16", "grid"), ("grid4", "grid4"), ("rayrl", "rayrl")):
            info = r.get(key) or {}
            rows.append(
                [
                    r["rep"],
                    side,
                    info.get("trials", "-"),
                    r.get(f"{key}_env_steps", math.nan),
                    "yes" if r.get(f"{key}_reached_target") else "no",
                    r.get(f"{key}_env_steps_total", math.nan),
                    r.get(f"{key}_wall_s_total", math.nan),
                    r.get(f"{key}_best_return", math.nan),
                ]
            )
    C.say(
        C.table(
            [
                "rep",
                "search",
                "trials",
                "env steps to target (all spent if never)",
                "reached",
                "env steps total",
                "wall s total",
                "best return",
            ],
            rows,
        )
    )
    C.say(C.table(["median over repetitions", "value"], [[k, report[k]] for k in HEADLINE]))
    C.say(
        f"\ngoal 1: rayrl env steps to target <= grid4's: ratio {report['to_target_ratio_vs_grid4']:.2f}: "
        f"{'met' if report['goal_to_target_met'] else 'missed'}"
    )
    C.say(
        f"goal 2: rayrl env steps total <= {GOAL_FRACTION:.2f} of grid16's: ratio "
        f"{report['total_ratio_vs_grid16']:.2f}: {'met' if report['goal_total_met'] else 'missed'}"
    )
    m = report["machine"]
    C.say(
        f"machine: {m['nproc']} x {m['cpu_model']}, load {m['load_avg_1m']}; {m['date']}; "
        f"{report['wall_s']:.0f} s; run folders under {report['storage']}"
    )


if __name__ == "__main__":
    sys.exit(main())
