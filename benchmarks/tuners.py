"""The sweep against the tuners people use: equal env-step budgets, each answer judged on unseen seeds.

Per env, every tuner gets the same budget of env steps (``--budget-runs`` x the spec's ``stop.env_steps``,
default 8 full runs) and the same search space: lr log-uniform over the spec's ``search.lr_min`` ..
``search.lr_max`` x the batch sizes the sweep can search (``search.min_batch`` .. the ladder's
``search.doubling.cap``; the sweep itself searches only up to the knee its ladder finds). Tuners
(benchmarks/tuner_runs.py):

* ``rayrl``: the sweep as shipped. It has no budget knob: its cost is what its three phases spent.
* ``zoo_optimize``: ``rl_zoo3.train --optimize`` (TPE + median pruner, RL Zoo's own PPO space, its
  defaults for the env below that), n_trials x n_timesteps = the budget, n_timesteps RL Zoo's own for
  the env (at most the spec's ``stop.env_steps``); its env steps counted (benchmarks/zoo_optimize.py).
* ``zoo_optimize_batch_lr``: the same with RL Zoo's sampler restricted to batch x lr.
* ``tune_by_hand``: Tune ASHA + OptunaSearch over batch x lr on rayrl's trainable; no ladder, no confirmation.
* ``random``: Tune's random search over batch x lr, FIFO.

Each answer is trained by its own library (RL Zoo's by SB3; ``zoo_*_as_rayrl``: the same answer as a
rayrl spec, where its fields map) on ``--judge-seeds`` seeds no tuner saw, until the mean return of
the last 20 training episodes reaches the env's target: median and IQM wall time and env steps,
reached of N. Each tuner runs ``--reps`` times with its own seed; tuners alternate (the order
rotates by repetition, the judging order by seed). Every finished tuner run and judging run is a
JSON file under ``--work``; the same command again skips them (a killed benchmark continues).

    python -m benchmarks.tuners --out tuners.json --work /work/bench/tuners           # both envs
    python -m benchmarks.tuners --envs cartpole --reps 1 --out t.json --work DIR     # one env
    python -m benchmarks.tuners --config my.yaml --target 300 --out t.json           # any spec
    python -m benchmarks.tuners --quick --out q.json    # ~12 min on 2 cores (~2 with --tuners tune_by_hand,random)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import common as C

TUNERS = ("rayrl", "zoo_optimize", "zoo_optimize_batch_lr", "tune_by_hand", "random")
ZOO_TUNERS = ("zoo_optimize", "zoo_optimize_batch_lr")
#: each tuner's answer is judged as: (the name in the table, the library that trains it)
JUDGED: dict[str, tuple[tuple[str, str], ...]] = {
    "rayrl": (("rayrl", "rayrl"),),
    "zoo_optimize": (("zoo_optimize", "sb3"), ("zoo_optimize_as_rayrl", "rayrl")),
    "zoo_optimize_batch_lr": (("zoo_optimize_batch_lr", "sb3"), ("zoo_optimize_batch_lr_as_rayrl", "rayrl")),
    "tune_by_hand": (("tune_by_hand", "rayrl"),),
    "random": (("random", "rayrl"),),
}


@dataclass(frozen=True)
class Env:
    """A named env of the benchmark: its spec, target, and the caps of one judging run (env steps, s)."""

    config: Path
    target: float
    caps: tuple[float, float]


ENVS = {
    "cartpole": Env(C.ROOT / "experiments/configs/cartpole_ppo.yaml", 450.0, (500_000, 200.0)),
    "pendulum": Env(C.ROOT / "experiments/configs/pendulum_ppo.yaml", -200.0, (400_000, 400.0)),
}
QUICK = Env(ENVS["cartpole"].config, 150.0, (40_000, 45.0))  #: --quick: CartPole, a low target, short caps
QUICK_RUN_ENV_STEPS = 20_000  #: --quick: the spec's stop.env_steps (a "full run"); the budget is 2 of them
QUICK_BUDGET_RUNS = 2
OTHER_CAPS = (1_000_000, 300.0)  #: judging caps of a --config env
JUDGE_SEED_BASE = 100_000  #: first judging seed: far from every seed a tuner uses (spec seed + rep, + 1000 k)
SEED_STRIDE = 1000  #: between judging seeds, so the env seeds RLlib derives from each do not overlap
ZOO_EVALUATIONS = 4  #: RL Zoo's evaluations per trial (its median pruner acts on them; quick: 2)
GOAL_SPREAD = 0.25  #: rayrl's two answers' median times to target may differ by this fraction


# ---- the plan: budgets, seeds, order, files (pure) --------------------------------------------


@dataclass(frozen=True)
class Budget:
    """One env's budget per tuner and how each tuner spends it."""

    env_steps: int  #: per tuner, all its trials together
    per_trial: int  #: tune_by_hand / random: a trial's cap (the spec's search.max_env_steps)
    grace: int  #: tune_by_hand: ASHA's grace period
    reduction_factor: float
    num_samples: int  #: tune_by_hand / random: a cap on trials that the budget reaches first
    zoo_trials: int
    zoo_timesteps: int  #: RL Zoo's n_timesteps per trial
    zoo_evaluations: int


def split(budget: int, run_env_steps: int, search: Any, zoo_horizon: int | None, quick: bool) -> Budget:
    """How ``budget`` env steps are spent by each tuner (the sweep's ``search`` section sizes the Tune tuners)."""
    if budget < 1 or run_env_steps < 1:
        raise ValueError(f"budget and a run's env steps must be >= 1, got {budget} and {run_env_steps}")
    per_trial = max(1, min(int(search.max_env_steps), budget))
    grace = max(1, min(int(search.grace_env_steps), per_trial))
    timesteps = max(1, min(zoo_horizon or run_env_steps, run_env_steps, budget))
    return Budget(
        env_steps=budget,
        per_trial=per_trial,
        grace=grace,
        reduction_factor=float(search.reduction_factor),
        num_samples=max(2, math.ceil(2 * budget / grace)),
        zoo_trials=max(1, budget // timesteps),
        zoo_timesteps=timesteps,
        zoo_evaluations=2 if quick else ZOO_EVALUATIONS,
    )


def search_space(spec: Any) -> dict[str, Any]:
    """The space every tuner searches: the spec's lr range and every batch the sweep could search."""
    d, s = spec.search.doubling, spec.search
    below, batch = [], d.start // d.factor
    while batch >= max(s.min_batch, 1):
        below.append(batch)
        batch //= d.factor
    ladder, batch = [], d.start
    while batch <= d.cap:
        ladder.append(batch)
        batch *= d.factor
    return {"lr": [s.lr_min, s.lr_max], "batches": sorted(below) + ladder}


def rotation(names: Sequence[Any], k: int) -> list[Any]:
    """``names`` rotated by ``k``: none always runs first."""
    if not names:
        return []
    k %= len(names)
    return list(names[k:]) + list(names[:k])


def judge_seeds(base: int, n: int) -> list[int]:
    return [base + SEED_STRIDE * i for i in range(n)]


def tuning_seeds(spec_seed: int, reps: int, confirm_seeds: int) -> set[int]:
    """Every seed a tuner trains on: spec seed + rep, and the sweep's confirmation seeds (+1000 k)."""
    from rayrl.sweep.confirm import fresh_seeds

    out = set()
    for rep in range(reps):
        out.add(spec_seed + rep)
        out.update(fresh_seeds(spec_seed + rep, confirm_seeds))
    return out


@dataclass(frozen=True)
class Step:
    """One unit of work with its own result file: a tuner run (``judged_as`` None) or one judging run."""

    env: str
    tuner: str
    rep: int
    judged_as: str | None = None
    library: str | None = None
    seed: int | None = None

    def path(self, work: Path) -> Path:
        base = work / self.env / self.tuner / f"rep{self.rep}"
        return (
            base / "tuned.json" if self.judged_as is None else base / "judge" / self.judged_as / f"seed{self.seed}.json"
        )

    def run_dir(self, work: Path) -> Path:
        return work / self.env / self.tuner / f"rep{self.rep}" / "run"


def plan(envs: Sequence[str], tuners: Sequence[str], reps: int, seeds: Sequence[int]) -> list[Step]:
    """Every step in order: per env and repetition, the tuners (rotated by repetition), then their answers
    judged seed by seed (rotated by seed)."""
    steps = []
    for env in envs:
        for rep in range(reps):
            order = rotation(tuners, rep)
            steps += [Step(env, t, rep) for t in order]
            answers = [(t, name, lib) for t in order for name, lib in JUDGED[t]]
            for k, seed in enumerate(seeds):
                steps += [Step(env, t, rep, name, lib, seed) for t, name, lib in rotation(answers, k)]
    return steps


def pending(steps: Sequence[Step], work: Path) -> list[Step]:
    """The steps whose result file is not there yet (what a resumed benchmark still runs)."""
    return [s for s in steps if not s.path(work).exists()]


def read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def write(path: Path, data: dict[str, Any]) -> None:
    """Atomically: a killed benchmark leaves the file whole or absent."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(C.jsonable(data), indent=2, allow_nan=False))
    os.replace(tmp, path)


def check_settings(work: Path, settings: dict[str, Any]) -> str | None:
    """Record the settings that make results comparable; say why not if --work holds others' results."""
    path = work / "settings.json"
    if path.exists():
        old = read(path)
        diff = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
        if diff:
            return (
                f"--work {str(work)!r} holds results of other settings ({', '.join(diff)} differ: "
                f"{ {k: old.get(k) for k in diff} } there, { {k: settings.get(k) for k in diff} } now); give "
                "another --work, or the same settings to resume"
            )
        return None
    write(path, settings)
    return None


# ---- figures (pure) ----------------------------------------------------------------------------


def judged_figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and IQM wall and env steps to the target over the judging runs; a run that missed counts at
    its cap, so a figure with a miss at or below it is a lower bound (``median_is_lower_bound``)."""
    from benchmarks import time_to_reward as T
    from rayrl.sweep.confirm import iqm

    if not runs:
        return {"answer_median_wall_s": None, "reached": 0, "n": 0}
    s = T.summarise(runs)
    return {
        "answer_median_wall_s": s["median_wall_s"],
        "answer_median_env_steps": s["median_env_steps"],
        "answer_iqm_wall_s": iqm([r["wall_s"] for r in runs]),
        "answer_iqm_env_steps": iqm([r["env_steps"] for r in runs]),
        "reached": s["reached"],
        "n": s["n"],
        "median_is_lower_bound": s["median_is_lower_bound"],
        "runs": [{k: r.get(k) for k in ("seed", "reached", "wall_s", "env_steps", "return", "build_s")} for r in runs],
    }


def rows(env: str, tuners: Sequence[str], reps: int, seeds: Sequence[int], work: Path, budget: int) -> list[dict]:
    """The output's rows for one env: per tuner, judged-as and repetition, from the files under ``work``."""
    out = []
    for tuner in tuners:
        for rep in range(reps):
            tuned_path = Step(env, tuner, rep).path(work)
            tuned = read(tuned_path) if tuned_path.exists() else None
            for name, lib in JUDGED[tuner]:
                files = [Step(env, tuner, rep, name, lib, s).path(work) for s in seeds]
                runs = [read(f) for f in files if f.exists()]
                row = {
                    "env": env,
                    "tuner": tuner,
                    "judged_as": name,
                    "library": lib,
                    "rep": rep,
                    "budget_env_steps": budget,
                    "tuner_env_steps": None if tuned is None else tuned["tuner_env_steps"],
                    "tuner_wall_s": None if tuned is None else tuned["tuner_wall_s"],
                    "answer": None if tuned is None else (tuned.get("answers") or {}).get(name, tuned.get("answer")),
                    **judged_figures(runs),
                }
                if tuned is not None:
                    row.update({k: tuned[k] for k in ("seed", "accounting", "tuner_eval_env_steps") if k in tuned})
                    row["unmapped"] = (tuned.get("unmapped") or {}).get(name)
                out.append(row)
    return out


def per_name(table: list[dict], key: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in table:
        if r.get(key) is not None:
            out.setdefault(r["judged_as"], []).append(float(r[key]))
    return out


def goals(table: list[dict]) -> dict[str, Any]:
    """The issue's goals on one env: met, missed, or not measured, with the figures."""
    wall = {k: C.median(v) for k, v in per_name(table, "answer_median_wall_s").items()}
    cost = {k: C.median(v) for k, v in per_name(table, "tuner_env_steps").items()}
    out: dict[str, Any] = {}
    others = {k: v for k, v in wall.items() if k != "rayrl"}
    if "rayrl" in wall and others:
        out["answer_le_every_other"] = {
            "met": all(wall["rayrl"] <= v for v in others.values()),
            "rayrl": wall["rayrl"],
            "others": others,
        }
    else:
        out["answer_le_every_other"] = {"met": None, "why": "not measured"}
    if "rayrl" in cost and "zoo_optimize" in cost:
        out["cost_le_zoo_optimize"] = {
            "met": cost["rayrl"] <= cost["zoo_optimize"],
            "rayrl": cost["rayrl"],
            "zoo_optimize": cost["zoo_optimize"],
        }
    else:
        out["cost_le_zoo_optimize"] = {"met": None, "why": "not measured"}
    answers = per_name(table, "answer_median_wall_s").get("rayrl", [])
    if len(answers) >= 2 and min(answers) > 0:
        spread = max(answers) / min(answers) - 1
        out["rayrl_reproducible"] = {"met": spread <= GOAL_SPREAD, "spread": spread, "bound": GOAL_SPREAD}
    else:
        out["rayrl_reproducible"] = {"met": None, "why": "needs 2 repetitions of rayrl, judged"}
    return out


def short(answer: dict[str, Any] | None) -> str:
    """An answer in a table cell."""
    if not answer:
        return "-"
    if "n_steps" in answer:  # SB3 settings
        batch = int(answer["n_steps"]) * int(answer.get("n_envs", 1))
        lr = answer["learning_rate"]
        lr_text = lr if isinstance(lr, str) else f"{float(lr):.2e}"
        extra = f" ep {answer['n_epochs']} g {float(answer['gamma']):.3f}" if "n_epochs" in answer else ""
        return f"b {batch} mb {answer.get('batch_size', 64)} lr {lr_text}{extra}"
    if "overrides" in answer:
        return f"{len(answer['overrides'])} fields (as rayrl)"
    return f"b {answer['batch_size']} lr {float(answer['lr']):.2e}"


def number(value: Any) -> float:
    """A table cell's number (floats get thousands separators); NaN, shown as -, when missing."""
    return math.nan if value is None else float(value)


def rounded(value: Any) -> Any:
    """Figures to 3 significant digits, for the goals' lines."""
    if isinstance(value, float):
        return float(f"{value:.3g}")
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return value


def print_table(report: dict[str, Any]) -> None:
    for env, e in report["envs"].items():
        C.say(
            f"\n{env} ({e['env_id']}): budget {e['budget_env_steps']:,} env steps per tuner "
            f"({e['budget_runs']} x stop.env_steps {e['run_env_steps']:,}); target {e['target']:g}; "
            f"judged on seeds {e['judge_seeds']}"
        )
        body = []
        for r in e["rows"]:
            lb = "≥ " if r.get("median_is_lower_bound") else ""
            med = r.get("answer_median_wall_s")
            body.append(
                [
                    r["judged_as"],
                    r["rep"],
                    number(r["tuner_env_steps"]),
                    number(r["tuner_wall_s"]),
                    short(r["answer"]),
                    "-" if med is None else f"{lb}{med:,.1f}",
                    number(r.get("answer_median_env_steps")),
                    number(r.get("answer_iqm_wall_s")),
                    f"{r['reached']}/{r['n']}",
                ]
            )
        headers = ["tuner (judged as)", "rep", "tuner env steps", "tuner wall s", "answer", "median wall s"]
        C.say(C.table([*headers, "median env steps", "IQM wall s", "reached"], body))
        for key, g in e["goals"].items():
            state = "not measured" if g["met"] is None else "met" if g["met"] else "MISSED"
            C.say(f"{key}: {state} {json.dumps(rounded({k: v for k, v in g.items() if k != 'met'}))}")
    m = report["machine"]
    C.say(f"machine: {m['nproc']} x {m['cpu_model']}, load {m['load_avg_1m']}; {m['date']}; {report['wall_s']:.0f} s")


# ---- arguments ----------------------------------------------------------------------------------


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the figures as JSON")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"CartPole only, budget {QUICK_BUDGET_RUNS} x {QUICK_RUN_ENV_STEPS:,} env steps per tuner, the sweep "
        f"at smoke sizes, 1 repetition, 1 judging seed to return {QUICK.target:g}: about 12 minutes with "
        "all five tuners on 2 cores, 2 with --tuners tune_by_hand,random",
    )
    p.add_argument(
        "--envs", default=None, help=f"comma-separated, of {', '.join(ENVS)} (default: all; quick: cartpole)"
    )
    p.add_argument("--config", type=Path, help="run on this spec instead of the named envs (needs --target)")
    p.add_argument("--target", type=float, help="the mean return to reach (with --config; else the env's)")
    p.add_argument("--work", type=Path, help="where results and run folders go, resumable (default: OUT.work)")
    p.add_argument("--reps", type=int, help="repetitions of each tuner, each its own seed (default 2; quick 1)")
    p.add_argument("--judge-seeds", type=int, help="seeds each answer is judged on (default 5; quick 1)")
    p.add_argument(
        "--seed-base",
        type=int,
        default=JUDGE_SEED_BASE,
        help="first judging seed (default %(default)s; the next are +1000 each); must avoid every tuner's seeds",
    )
    p.add_argument("--tuners", default=",".join(TUNERS), help="comma-separated subset (default: %(default)s)")
    p.add_argument(
        "--budget-runs", type=float, help="env-step budget per tuner, in stop.env_steps (default 8; quick 2)"
    )
    C.add_torch_threads(p)
    args = p.parse_args(argv)
    q = args.quick
    args.reps = C.mode_default(args.reps, 1, 2, q)
    args.judge_seeds = C.mode_default(args.judge_seeds, 1, 5, q)
    args.budget_runs = C.mode_default(args.budget_runs, QUICK_BUDGET_RUNS, 8, q)
    if args.reps < 1 or args.judge_seeds < 1:
        p.error(f"--reps and --judge-seeds must be >= 1, got {args.reps} and {args.judge_seeds}")
    if not args.budget_runs > 0:
        p.error(f"--budget-runs must be > 0, got {args.budget_runs}")
    args.tuners = [t.strip() for t in args.tuners.split(",") if t.strip()]
    bad = [t for t in args.tuners if t not in TUNERS]
    if bad or not args.tuners:
        p.error(f"--tuners: {', '.join(bad) or 'none given'}: choose from {', '.join(TUNERS)}")
    if args.config is not None:
        if args.envs or q:
            p.error("--config replaces --envs and --quick's env: give one of them")
        if args.target is None:
            p.error(f"--config {str(args.config)!r} needs --target: the mean return of the last 20 episodes to reach")
        args.envs = ["config"]
    else:
        args.envs = ["cartpole"] if q and args.envs is None else (args.envs or ",".join(ENVS)).split(",")
        bad = [e for e in args.envs if e not in ENVS]
        if bad:
            p.error(f"--envs: {', '.join(bad)}: choose from {', '.join(ENVS)} (or give --config FILE --target R)")
        if args.target is not None and len(args.envs) > 1:
            p.error("--target applies to one env: give --envs NAME or --config FILE with it")
    args.specs = {}
    for env in args.envs:
        try:
            args.specs[env] = base_spec(env, args)
        except Exception as exc:  # noqa: BLE001 - a bad spec is the user's to fix: say which and why
            p.error(f"{env}: {exc}")
    if any(t in ZOO_TUNERS for t in args.tuners):
        from benchmarks import zoo_answers as Z

        for env, spec in args.specs.items():
            why = Z.unsupported(spec.env.id)
            if why:
                p.error(f"--tuners {','.join(ZOO_TUNERS)} on {env}: {why}; leave them out with --tuners")
    seeds = judge_seeds(args.seed_base, args.judge_seeds)
    for env, spec in args.specs.items():
        seen = tuning_seeds(spec.seed, args.reps, spec.search.confirm_seeds)
        clash = sorted(seen & set(seeds))
        if clash:
            p.error(
                f"--seed-base {args.seed_base}: judging seeds {clash} are seeds the tuners train on ({env}: "
                f"{sorted(seen)}); an answer must be judged on seeds no tuner saw, e.g. --seed-base "
                f"{max(seen) + SEED_STRIDE}"
            )
    args.seeds = seeds
    args.work = args.work or (args.out.with_name(args.out.name + ".work"))
    return args


def env_of(name: str, args: argparse.Namespace) -> Env:
    if name == "config":
        return Env(args.config, args.target, OTHER_CAPS)
    env = QUICK if args.quick else ENVS[name]
    return env if args.target is None else Env(env.config, args.target, env.caps)


def base_spec(name: str, args: argparse.Namespace) -> Any:
    """The spec every tuner starts from (--quick: the sweep at smoke sizes, the low target)."""
    env = env_of(name, args)
    spec = C.load_spec(env.config)
    from rayrl import spec as spec_mod

    spec = spec_mod.replace(spec, stop={"episode_return": env.target})
    return quick_spec(spec) if args.quick else spec


def quick_spec(spec: Any) -> Any:
    """Smoke sizes: 2 ladder rungs, 3 search trials of <= 8,000 env steps, 1 candidate + the spec's own on
    2 seeds of <= 4,000: the sweep spends about the quick budget (2 x 20,000)."""
    from rayrl import spec as spec_mod
    from rayrl.sweep.config import smoke

    return spec_mod.replace(
        smoke(spec),
        stop={"env_steps": QUICK_RUN_ENV_STEPS},
        search={
            "doubling": {
                "start": 512,
                "factor": 2,
                "cap": 1024,
                "min_gain": spec.search.doubling.min_gain,
                "warmup_iters": 1,
                "measure_iters": 1,
            },
            "num_samples": 3,
            "max_env_steps": 8000,
            "grace_env_steps": 2048,
            "reduction_factor": 2.0,
            "confirm_top_k": 1,
            "confirm_seeds": 2,
            "confirm_env_steps": 4000,
        },
    )


# ---- running ------------------------------------------------------------------------------------


def run_step(step: Step, args: argparse.Namespace, budgets: dict[str, Budget], space: dict[str, Any]) -> dict:
    """Run one step and return its result file's content."""
    from benchmarks import tuner_runs as R
    from benchmarks import zoo_answers as Z
    from rayrl import spec as spec_mod

    spec = args.specs[step.env]
    seed = spec.seed + step.rep
    folder = step.run_dir(args.work)
    lr_range, batches = (float(space["lr"][0]), float(space["lr"][1])), list(space["batches"])
    if step.judged_as is None:
        budget = budgets[step.env]
        tuner_spec = spec_mod.replace(spec, seed=seed)
        if step.tuner == "rayrl":
            out = R.run_rayrl(tuner_spec, folder)
        elif step.tuner in ZOO_TUNERS:
            out = R.run_zoo(step.tuner, spec.env.id, folder, budget, seed, lr_range, batches)
            sets, unmapped = Z.rayrl_overrides(
                out["answer"], R.continuous(spec.env.id), int((Z.defaults(spec.env.id) or {}).get("n_timesteps", 0))
            )
            out["answers"] = {f"{step.tuner}_as_rayrl": {"overrides": sets}}
            out["unmapped"] = {f"{step.tuner}_as_rayrl": unmapped}
        else:
            out = R.run_tune(step.tuner, tuner_spec, folder, budget, lr_range, batches)
        if out["answer"] is None:
            raise RuntimeError(f"{step.tuner} (rep {step.rep}) has no answer: no trial finished with a return")
        return {**out, "seed": seed, "budget_env_steps": budget.env_steps}
    tuned = read(Step(step.env, step.tuner, step.rep).path(args.work))
    env = env_of(step.env, args)
    if step.library == "sb3":
        r = R.judge_sb3(tuned["answer"], spec.env.id, int(step.seed or 0), env.target, env.caps)
    else:
        answer = tuned["answers"][step.judged_as] if step.judged_as != step.tuner else tuned["answer"]
        if "best_config" in answer:
            judged = C.load_spec(answer["best_config"])
        elif "overrides" in answer:
            judged = spec_mod.from_dict(spec_mod.apply_overrides(spec_mod.to_dict(spec), answer["overrides"]))
        else:
            judged = spec_mod.replace(
                spec,
                algo={
                    "lr": answer["lr"],
                    "train_batch_per_learner": answer["batch_size"],
                    "minibatch_size": answer["minibatch_size"],
                },
            )
        r = R.judge_rayrl(judged, int(step.seed or 0), env.target, env.caps)
    return {**r, "seed": step.seed}


def settings(args: argparse.Namespace, budgets: dict[str, Budget], spaces: dict[str, Any]) -> dict[str, Any]:
    """What makes two runs' results comparable (a resumed run must match them)."""
    return {
        "quick": args.quick,
        "budgets": {e: asdict(b) for e, b in budgets.items()},
        "spaces": spaces,
        "targets": {e: env_of(e, args).target for e in args.envs},
        "configs": {e: str(env_of(e, args).config) for e in args.envs},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    C.quiet()
    from benchmarks import zoo_answers as Z

    budgets, spaces = {}, {}
    for env, spec in args.specs.items():
        horizon = (Z.defaults(spec.env.id) or {}).get("n_timesteps")
        budget = int(args.budget_runs * spec.stop.env_steps)
        budgets[env] = split(budget, spec.stop.env_steps, spec.search, int(horizon) if horizon else None, args.quick)
        spaces[env] = search_space(spec)
    why = check_settings(args.work, settings(args, budgets, spaces))
    if why:
        sys.stderr.write(f"tuners: error: {why}\n")
        return 2
    steps = plan(args.envs, args.tuners, args.reps, args.seeds)
    todo = pending(steps, args.work)
    C.say(f"{len(steps) - len(todo)} of {len(steps)} steps already done in {args.work}; {len(todo)} to run")
    started = time.monotonic()
    if todo:
        with C.local_ray(torch_threads=args.torch_threads):
            for step in todo:
                C.say(
                    f"\n== {step.env} {step.tuner} rep {step.rep}"
                    + (f": {step.judged_as} seed {step.seed}" if step.judged_as else "")
                )
                result = run_step(step, args, budgets, spaces[step.env])
                write(step.path(args.work), result)
                if step.judged_as:
                    C.say(
                        f"   {'reached' if result['reached'] else 'NOT reached'} {env_of(step.env, args).target:g} in "
                        f"{result['wall_s']:.1f} s, {result['env_steps']:,.0f} env steps"
                    )
                else:
                    C.say(f"   spent {result['tuner_env_steps']:,} env steps, {result['tuner_wall_s']:.0f} s")
    report = build_report(args, budgets, spaces, time.monotonic() - started)
    print_table(report)
    C.write_json(args.out, report)
    return 0


def build_report(args: argparse.Namespace, budgets: dict[str, Budget], spaces: dict, wall: float) -> dict[str, Any]:
    envs = {}
    for env in args.envs:
        spec, b = args.specs[env], budgets[env]
        table = rows(env, args.tuners, args.reps, args.seeds, args.work, b.env_steps)
        envs[env] = {
            "env_id": spec.env.id,
            "config": str(env_of(env, args).config),
            "target": env_of(env, args).target,
            "judge_caps": {"env_steps": env_of(env, args).caps[0], "wall_s": env_of(env, args).caps[1]},
            "budget_env_steps": b.env_steps,
            "budget_runs": args.budget_runs,
            "run_env_steps": spec.stop.env_steps,
            "budget": asdict(b),
            "search_space": spaces[env],
            "judge_seeds": args.seeds,
            "rows": table,
            "goals": goals(table),
        }
    return {
        "envs": envs,
        "tuners": args.tuners,
        "reps": args.reps,
        "work": str(args.work),
        "settings": {k: v for k, v in vars(args).items() if k != "specs"},
        "machine": C.machine(),
        "wall_s": round(wall, 1),
    }


if __name__ == "__main__":
    sys.exit(main())
