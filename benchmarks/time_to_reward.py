"""Wall seconds and env steps until the mean training return reaches a target, per contender, on fresh seeds.

The env of ``--config`` picks the peers and the defaults (``ENV_DEFAULTS``):

* CartPole-v1 (experiments/configs/cartpole_ppo.yaml, the default): target 450, caps 500,000 env steps /
  200 s per run (quick: 150, 60,000 / 60 s); peers ``sb3_zoo``, ``rllib_same_settings``,
  ``rllib_tuned_example``.
* Hopper-v5 / Hopper-v4 (experiments/configs/mujoco_hopper_ppo.yaml): target 1000, caps 1,000,000 env
  steps / 300 s per run (quick: 150, 60,000 / 120 s: the recipe's 2,048-step iterations of 320
  minibatch steps run ~5 s each on 2 busy cores); peers ``sb3_zoo`` (RL Zoo's tuned Hopper
  settings, VecNormalize) and ``rllib_same_settings``. ``rllib_tuned_example`` is left out, and the
  script says so: RLlib 2.60 ships no tuned PPO example for Hopper (see contenders.py).
  Why 1000: random play earns ~17; 1000 is what standing still for the whole 1000-step episode earns,
  so a mean of 1000 over 20 *training* episodes (stochastic policy, raw reward) means the policy
  survives whole episodes, ~60x random. A one-seed probe on 2 busy cores (seed 5000, 150 s each):
  SB3 + Zoo's settings crossed ~1000 at ~62,000 env steps / ~92 s (noisy: 20 episodes of up to
  1000 steps; 940 at 91,000 / 139 s), rayrl's spec was at ~330 after 113,000 env steps / 115 s, so
  within 300 s the spec may well stay below 1000: its figure is then a lower bound, and says so.
  ``--target`` moves it (e.g. 500), ``--progress 15`` shows each run's return vs steps and seconds.
* Any other env: ``rllib_same_settings`` and ``rayrl_default`` (they follow the spec), caps 1,000,000 /
  300 s, and ``--target`` is required; asking for ``sb3_zoo`` or ``rllib_tuned_example`` there is
  refused with a one-paragraph error naming the env and what each supports.

Contenders (``contenders.py``): ``sb3_zoo`` (SB3 + RL Zoo's tuned hyperparameters for the env),
``rayrl_zoo_settings`` (the same hyperparameters as a rayrl spec, annealing included: the platform
comparison with ``sb3_zoo``, at equal settings), ``rayrl_zoo_sample_ahead`` (the same with
``algo.sample_ahead: true`` on one remote runner: equal settings, but each batch trained one update
after the weights that sampled it; run only when named in ``--contenders``),
``rllib_same_settings`` (stock RLlib with exactly the spec's settings, obs filter and evaluation
included), ``rllib_tuned_example`` (RLlib's tuned example), ``rayrl_default`` (``--config``),
``rayrl_sweep_best`` (the ``best_config.yaml`` of the sweep run folder ``--sweep``) and
``rayrl_sweep_total`` (that sweep's own wall time and env steps, from its summary.json, plus
``rayrl_sweep_best``'s per seed: what finding and then training the answer cost). All run in one
process, one after another, the order rotated seed by seed; seeds start at ``--seed-base`` (5000:
no sweep or tuning here saw them).

"Reached" is the mean return of the last 20 training episodes >= the target, for every contender
(SB3's from its Monitor: raw returns, also under VecNormalize). Wall time counts from the first
``train()`` (``learn()`` for SB3); building the algorithm is reported apart. A run that hits a cap
is censored: its figures are lower bounds, and a median over one says so
(``median_is_lower_bound``). SB3's ``learn()`` gets RL Zoo's n_timesteps for the env as its horizon
(CartPole-v1: 1e5, the horizon its linear schedules are tuned for, which also caps the run; Hopper:
1e6, no schedules). A spec with evaluation (Hopper's: 5 greedy episodes every 5 iterations) pays it
in ``rayrl_default``'s and ``rllib_same_settings``' wall time alike; it judges nothing here.

    python -m benchmarks.time_to_reward --out ttr.json                       # CartPole: 3 seeds, ~10 minutes on 2 cores
    python -m benchmarks.time_to_reward --sweep runs/cartpole-ppo --out ttr.json
    python -m benchmarks.time_to_reward --quick                               # 1 seed, target 150: a smoke test
    python -m benchmarks.time_to_reward --config experiments/configs/mujoco_hopper_ppo.yaml --out ttr_hopper.json
        # Hopper: 3 contenders x 3 seeds x <= 300 s (+ build, random play): <= ~50 minutes on 2 cores
    python -m benchmarks.time_to_reward --config experiments/configs/mujoco_hopper_ppo.yaml --quick
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import common as C
from benchmarks import contenders as K

HOPPER_TARGET = 1000.0  #: Hopper's full-run target: see the module docstring
HOPPER_QUICK_TARGET = 150.0  #: --quick on Hopper: ~9x random play

#: Defaults per env id: (target, max env steps, max wall s) of a full run and of --quick. Hopper: see the docstring.
ENV_DEFAULTS: dict[str, dict[str, tuple[float, float, float]]] = {
    "CartPole-v1": {"full": (C.TARGET_RETURN, 500_000, 200.0), "quick": (150.0, 60_000, 60.0)},
    "Hopper-v5": {"full": (HOPPER_TARGET, 1_000_000, 300.0), "quick": (HOPPER_QUICK_TARGET, 60_000, 120.0)},
}
ENV_DEFAULTS["Hopper-v4"] = ENV_DEFAULTS["Hopper-v5"]
#: Any other env: no default target (there is no meaningful one without knowing the env), these caps.
OTHER_CAPS = {"full": (1_000_000, 300.0), "quick": (60_000, 60.0)}

CONTENDERS = (
    "sb3_zoo",
    "rayrl_zoo_settings",
    "rayrl_zoo_sample_ahead",
    "rllib_same_settings",
    "rllib_tuned_example",
    "rayrl_default",
    "rayrl_sweep_best",
    "rayrl_sweep_total",
)
RUN = CONTENDERS[:-1]  #: the total is derived, not run


left_out = K.left_out  #: the env-specific contenders that cannot run on an env, each with why


#: run only when named in --contenders (a variant of another contender, not a peer of its own)
OPT_IN = ("rayrl_zoo_sample_ahead",)


def peers(env_id: str, sweep: bool = False) -> list[str]:
    """The contenders a run on ``env_id`` has by default: every one that can run there, but the opt-in ones."""
    skip = left_out(env_id)
    return [c for c in CONTENDERS if c not in skip and c not in OPT_IN and (sweep or not c.startswith("rayrl_sweep"))]


def refusal(env_id: str, names: list[str]) -> str:
    """The one-paragraph error for env-specific contenders asked for on an env they do not cover."""
    why = left_out(env_id)
    return (
        f"--contenders {' '.join(names)}: cannot run on {env_id} (the env of --config): "
        + "; ".join(f"{n}: {why[n]}" for n in names)
        + f". Supported: sb3_zoo on {', '.join(K.SB3_ZOO_ENVS)}; rayrl_zoo_settings on {', '.join(K.ZOO_SPEC)}; "
        "rllib_tuned_example on "
        f"{', '.join(K.TUNED_EXAMPLE_ENVS)}; rllib_same_settings, rayrl_default (and rayrl_sweep_best/"
        f"rayrl_sweep_total with --sweep) on any env, since they follow the spec. On {env_id} run e.g. "
        f"--contenders {' '.join(peers(env_id))}, or add that env's tuned settings to benchmarks/contenders.py."
    )


def env_defaults(env_id: str, quick: bool) -> tuple[float | None, float, float]:
    """(target, max env steps, max wall s) for ``env_id``; the target is None for an env without one."""
    mode = "quick" if quick else "full"
    if env_id in ENV_DEFAULTS:
        return ENV_DEFAULTS[env_id][mode]
    return (None, *OTHER_CAPS[mode])


def random_play(env_id: str, episodes: int = 100, seed: int = 0) -> float:
    """Mean return of uniformly random actions: the floor a target must be well above."""
    import gymnasium as gym

    env = gym.make(env_id)
    env.action_space.seed(seed)
    total = 0.0
    for k in range(episodes):
        env.reset(seed=seed + k)
        done = False
        while not done:
            _, r, term, trunc, _ = env.step(env.action_space.sample())
            total += float(r)
            done = term or trunc
    return total / episodes


def run_to_target(
    config: Any,
    target: float,
    max_env_steps: float,
    max_wall_s: float,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Train an RLlib config until the mean return >= ``target`` or a cap; wall time from the first train().
    ``progress`` gets the running figures after every iteration."""
    from rayrl.observe import keys

    t0 = time.perf_counter()
    algo = config.build_algo()
    out: dict[str, Any] = {
        "reached": False,
        "build_s": time.perf_counter() - t0,
        "iterations": 0,
        "wall_s": 0.0,
        "env_steps": 0.0,
        "return": float("nan"),
    }
    try:
        start = time.perf_counter()
        while True:
            result = algo.train()
            out["iterations"] += 1
            out["wall_s"] = time.perf_counter() - start
            out["env_steps"] = float(keys.lookup(result, keys.ENV_STEPS, 0) or 0)
            out["return"] = C._num(keys.lookup(result, keys.EPISODE_RETURN))
            if progress is not None:
                progress(out)
            past_cap = out["env_steps"] >= max_env_steps or out["wall_s"] >= max_wall_s
            # An iteration that ends past the wall cap does not count as reaching it inside the cap
            # (SB3's side stops at the cap step by step, so this keeps the two alike).
            if out["return"] >= target and out["wall_s"] <= max_wall_s:
                out["reached"] = True
                break
            if past_cap:
                break
    finally:
        algo.stop()
    return out


def progress_printer(name: str, every_s: float) -> Callable[[dict[str, Any]], None] | None:
    """A callback printing a contender's return vs env steps and wall s about every ``every_s`` seconds."""
    if every_s <= 0:
        return None
    last = [-every_s]

    def show(r: dict[str, Any]) -> None:
        if r["wall_s"] - last[0] >= every_s:
            last[0] = r["wall_s"]
            C.say(f"    {name:<20} {r['wall_s']:6.1f} s {r['env_steps']:>10,.0f} env steps  return {r['return']:.1f}")

    return show


def run_one(name: str, seed: int, args: argparse.Namespace, specs: dict[str, Any]) -> dict[str, Any]:
    env_id = specs["rayrl_default"].env.id
    progress = progress_printer(name, args.progress)
    if name == "sb3_zoo":
        t0 = time.perf_counter()
        model = K.sb3_zoo(seed=seed, env_id=env_id)
        build = time.perf_counter() - t0
        r = K.sb3_learn(
            model,
            int(args.max_env_steps),
            target=args.target,
            window=C.RETURN_WINDOW,
            max_wall_s=args.max_wall_s,
            horizon=K.zoo_timesteps(env_id),
            progress=progress,
        )
        return {**r, "build_s": build}
    config = {
        "rllib_same_settings": lambda: K.rllib_same_settings(specs["rayrl_default"], seed=seed),
        "rllib_tuned_example": lambda: K.rllib_tuned_example(seed=seed, env_id=env_id),
        "rayrl_default": lambda: K.rayrl(specs["rayrl_default"], specs["rayrl_default"].env.runner, seed),
        "rayrl_zoo_settings": lambda: K.rayrl_zoo_settings(specs["rayrl_default"], seed),
        "rayrl_zoo_sample_ahead": lambda: K.rayrl_zoo_settings(specs["rayrl_default"], seed, sample_ahead=True),
        "rayrl_sweep_best": lambda: K.rayrl(specs["rayrl_sweep_best"], specs["rayrl_sweep_best"].env.runner, seed),
    }[name]()
    return run_to_target(config, args.target, args.max_env_steps, args.max_wall_s, progress)


def with_sweep_cost(runs: list[dict], sweep: dict) -> list[dict]:
    """rayrl_sweep_total per seed: the sweep's own wall time and env steps + the best config's run."""
    return [
        {
            **r,
            "wall_s": r["wall_s"] + sweep["wall_s"],
            "env_steps": r["env_steps"] + sweep["env_steps_total"],
            "sweep_wall_s": sweep["wall_s"],
            "sweep_env_steps": sweep["env_steps_total"],
        }
        for r in runs
    ]


def summarise(runs: list[dict]) -> dict[str, Any]:
    """Medians over seeds; a capped run counts at its cap, so the median may be a lower bound."""
    wall = C.median([r["wall_s"] for r in runs])
    steps = C.median([r["env_steps"] for r in runs])
    # A censored run at or below the median could, uncensored, have moved it up.
    lower = any(not r["reached"] and (r["wall_s"] <= wall or r["env_steps"] <= steps) for r in runs)
    return {
        "median_wall_s": wall,
        "median_env_steps": steps,
        "reached": sum(r["reached"] for r in runs),
        "n": len(runs),
        "median_is_lower_bound": lower,
        "runs": runs,
        "build_s": C.median([r.get("build_s", float("nan")) for r in runs]),
        "env_steps_per_s": C.median([C.ratio(r["env_steps"], r["wall_s"]) for r in runs]),
    }


def goals(s: dict[str, dict]) -> dict[str, Any]:
    """The issue's goals for the sweep's answer: met, missed, or not measured (with the figures)."""
    best = s.get("rayrl_sweep_best")
    out = {}
    for other, factor, key in (
        ("rayrl_default", 0.5, "sweep_best_wall_le_half_default"),
        ("sb3_zoo", 1.0, "sweep_best_wall_le_sb3_zoo"),
    ):
        if best is None or other not in s:
            out[key] = {"met": None, "why": "not measured"}
            continue
        value, bound = best["median_wall_s"], factor * s[other]["median_wall_s"]
        out[key] = {"met": bool(best["reached"] == best["n"] and value <= bound), "value": value, "bound": bound}
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help="1 seed, a low target, caps 60,000 steps / 60 s: a smoke "
        f"test (target 150 on CartPole-v1, {HOPPER_QUICK_TARGET:g} on Hopper)",
    )
    p.add_argument("--out", type=Path, help="also write the figures as JSON here")
    p.add_argument(
        "--config",
        type=Path,
        default=C.DEFAULT_CONFIG,
        help="rayrl_default's spec; its env id picks the peers and the defaults (default: %(default)s)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="K=V",
        help="override a field of rayrl_default's spec",
    )
    p.add_argument(
        "--sweep",
        type=Path,
        help="a sweep's run folder (best_config.yaml, summary.json): adds rayrl_sweep_best and rayrl_sweep_total",
    )
    p.add_argument("--contenders", nargs="+", choices=CONTENDERS, help="a subset (default: all that can run)")
    p.add_argument("--seeds", type=int, help="seeds per contender (default 3; quick 1)")
    p.add_argument(
        "--seed-base",
        type=int,
        default=5000,
        help="first seed (default %(default)s: unseen by tuning; "
        "a sweep's confirmation uses its spec seed + 1000, 2000, ...; with --sweep a clash is refused)",
    )
    p.add_argument(
        "--target",
        type=float,
        help="mean return of the last 20 episodes to reach (default: CartPole-v1 "
        f"450, quick 150; Hopper {HOPPER_TARGET:g}, quick {HOPPER_QUICK_TARGET:g}; other envs: required)",
    )
    p.add_argument(
        "--max-env-steps",
        type=float,
        help="cap per run (default: CartPole-v1 500000; Hopper and others 1000000; quick 60000)",
    )
    p.add_argument(
        "--max-wall-s",
        type=float,
        help="cap per run, seconds of training (default: CartPole-v1 200; Hopper and others 300; quick 60)",
    )
    p.add_argument(
        "--progress",
        type=float,
        default=0.0,
        metavar="S",
        help="print each run's return vs env steps and wall s about every S seconds (default: off)",
    )
    C.add_torch_threads(p)
    args = p.parse_args(argv)
    q = args.quick
    try:
        args.env_id = C.load_spec(args.config, args.overrides).env.id
    except Exception as exc:  # noqa: BLE001 - a bad spec is the user's to fix: say which and why
        p.error(f"--config {str(args.config)!r}: {exc}")
    target, max_steps, max_wall = env_defaults(args.env_id, q)
    args.seeds = C.mode_default(args.seeds, 1, 3, q)
    args.target = args.target if args.target is not None else target
    args.max_env_steps = args.max_env_steps if args.max_env_steps is not None else max_steps
    args.max_wall_s = args.max_wall_s if args.max_wall_s is not None else max_wall
    if args.target is None:
        p.error(
            f"--target: there is no default target return for {args.env_id} (defaults exist for "
            f"{', '.join(ENV_DEFAULTS)}); give the mean return of the last 20 episodes to reach, well above "
            "random play, e.g. after a short --progress probe"
        )
    if args.seeds < 1 or args.max_env_steps <= 0 or args.max_wall_s <= 0:
        p.error("--seeds must be >= 1, --max-env-steps and --max-wall-s > 0")
    skip = left_out(args.env_id)
    bad = [c for c in args.contenders or [] if c in skip]
    if bad:
        p.error(refusal(args.env_id, bad))
    args.left_out = {} if args.contenders else skip
    wanted = args.contenders or peers(args.env_id, bool(args.sweep))
    if any(c.startswith("rayrl_sweep") for c in wanted) and not args.sweep:
        p.error(
            "rayrl_sweep_best and rayrl_sweep_total need --sweep RUN_FOLDER (a sweep's best_config.yaml and "
            "summary.json)"
        )
    if args.sweep and not ((args.sweep / "best_config.yaml").is_file() and (args.sweep / "summary.json").is_file()):
        p.error(
            f"--sweep: {str(args.sweep)!r} has no best_config.yaml and summary.json; give a finished sweep's run folder"
        )
    if args.sweep:
        seen = tuning_seeds(args.sweep)
        clash = sorted(seen & set(range(args.seed_base, args.seed_base + args.seeds)))
        if clash:
            p.error(
                f"--seed-base {args.seed_base}: seeds {clash} were used by the sweep in {str(args.sweep)!r} "
                f"(its phases and confirmation used {sorted(seen)}); the answer must be judged on seeds no "
                f"tuning saw: give a --seed-base whose {args.seeds} seeds avoid them, e.g. "
                f"{max(seen) + 1001}"
            )
    if "rayrl_sweep_total" in wanted and "rayrl_sweep_best" not in wanted:
        wanted.append("rayrl_sweep_best")
    args.contenders = [c for c in CONTENDERS if c in wanted]
    return args


def tuning_seeds(run_dir: Path) -> set[int]:
    """Seeds a sweep's phases (spec.yaml's seed) and confirmation (summary.json) trained on."""
    seeds: set[int] = set()
    summary = json.loads((run_dir / "summary.json").read_text())
    seeds.update(int(x) for x in ((summary.get("confirm") or {}).get("seeds") or []))
    spec_file = run_dir / "spec.yaml"
    if spec_file.is_file():
        seeds.add(int(C.load_spec(spec_file).seed))
    return seeds


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    C.quiet()
    specs = {"rayrl_default": C.load_spec(args.config, args.overrides)}
    sweep: dict[str, Any] = {}
    if args.sweep:
        specs["rayrl_sweep_best"] = C.load_spec(args.sweep / "best_config.yaml")
        sweep = json.loads((args.sweep / "summary.json").read_text())
    for name, why in args.left_out.items():
        C.say(f"{name} left out on {args.env_id}: {why}")
    random_return = random_play(specs["rayrl_default"].env.id)
    C.say(
        f"random play: mean return {random_return:.1f}; target {args.target:g} "
        f"({C.ratio(args.target, random_return):.1f}x random)"
    )
    started = time.monotonic()
    to_run = [c for c in args.contenders if c in RUN]
    runs: dict[str, list[dict]] = {c: [] for c in to_run}
    with C.local_ray(torch_threads=args.torch_threads):
        for k in range(args.seeds):
            seed = args.seed_base + k
            shift = k % len(to_run)
            for name in to_run[shift:] + to_run[:shift]:
                r = run_one(name, seed, args, specs)
                r["seed"] = seed
                runs[name].append(r)
                C.say(
                    f"[seed {seed}] {name:<20} {'reached' if r['reached'] else 'NOT reached'} {args.target:g} in "
                    f"{r['wall_s']:.1f} s, {r['env_steps']:,.0f} env steps (return {r['return']:.1f})"
                )
                # Every run is on disk as soon as it ends: a killed benchmark keeps what it measured.
                C.write_json(args.out, {"partial": True, "target_return": args.target, "runs": runs}, quiet=True)
    if "rayrl_sweep_total" in args.contenders:
        runs["rayrl_sweep_total"] = with_sweep_cost(runs["rayrl_sweep_best"], sweep)
    summary = {name: summarise(rs) for name, rs in runs.items()}
    report: dict[str, Any] = {
        "env_id": args.env_id,
        "left_out": args.left_out,
        "target_return": args.target,
        "random_play_return": random_return,
        "return_window_episodes": C.RETURN_WINDOW,
        "contenders": summary,
        "goals": goals(summary),
        "sweep": {
            "run_dir": str(args.sweep),
            "wall_s": sweep.get("wall_s"),
            "env_steps_total": sweep.get("env_steps_total"),
            "best": sweep.get("best"),
        }
        if args.sweep
        else None,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": C.machine(),
        "wall_total_s": round(time.monotonic() - started, 1),
    }
    print_report(report)
    C.write_json(args.out, report)
    return 0


def print_report(report: dict) -> None:
    rows = []
    for name, s in report["contenders"].items():
        lb = "≥ " if s["median_is_lower_bound"] else ""
        rows.append(
            [
                name,
                f"{lb}{s['median_wall_s']:,.1f}",
                f"{lb}{s['median_env_steps']:,.0f}",
                f"{s['reached']}/{s['n']}",
                s["env_steps_per_s"],
                s["build_s"],
            ]
        )
    C.say(
        f"\ntime to a mean return >= {report['target_return']:g} (last {report['return_window_episodes']} "
        f"episodes; random play {report['random_play_return']:.1f}), median over seeds:"
    )
    C.say(C.table(["contender", "wall s", "env steps", "reached", "env steps/s", "build s"], rows))
    for key, g in report["goals"].items():
        state = "not measured" if g["met"] is None else "met" if g["met"] else "MISSED"
        C.say(f"{key}: {state}" + (f" ({g['value']:.1f} s vs {g['bound']:.1f} s)" if "value" in g else ""))
    m = report["machine"]
    C.say(
        f"machine: {m['nproc']} x {m['cpu_model']}, load {m['load_avg_1m']}; {m['date']}; "
        f"{report['wall_total_s']:.0f} s"
    )


if __name__ == "__main__":
    sys.exit(main())
