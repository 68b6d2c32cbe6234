"""Wall seconds and env steps until CartPole-v1's mean return reaches 450: RLlib's default vs rayrl.

For each seed, both contenders train in the driver until the mean episode return reaches the
target (or a cap): RLlib's default PPO (``PPOConfig().environment("CartPole-v1")`` with only the
seed set) and rayrl's best config from a sweep (``--best-config``: a sweep's best_config.yaml;
default experiments/configs/cartpole_ppo.yaml). Seeds are interleaved (A B, B A, ...) so drifting
load from other jobs hits both alike; the figures are medians over seeds.

"Reached" is judged on the same number for both: ``env_runners/episode_return_mean`` over the
last 20 episodes (rayrl's reporting window; RLlib's default window of 100 is set to 20, a
reporting setting that does not change training). Wall time counts from the first
``train()`` call (the build, a few seconds of actor start-up, is reported apart). A run that hits
a cap is censored: its figures are lower bounds, and a median over a censored run says ">=".

    python benchmarks/time_to_reward.py                     # full: 3 seeds each, ~6 minutes on 2 cores (caps: <= 13)
    python benchmarks/time_to_reward.py --quick             # smoke test: 1 seed, target 60
    python benchmarks/time_to_reward.py --best-config runs/cartpole-ppo/best_config.yaml --out ttr.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C  # noqa: E402

CONTENDERS = ("rllib_default", "rayrl")


def run_to_target(config: Any, target: float, max_env_steps: float, max_wall_s: float) -> dict[str, Any]:
    """Train until the mean return >= ``target`` or a cap; wall time from the first train() call."""
    from rayrl import keys

    t0 = time.perf_counter()
    algo = config.build_algo()
    build_s = time.perf_counter() - t0
    out: dict[str, Any] = {"reached": False, "build_s": build_s, "iterations": 0, "wall_s": 0.0,
                           "env_steps": 0.0, "return": float("nan"), "best_return": float("nan")}
    try:
        start = time.perf_counter()
        while True:
            result = algo.train()
            out["iterations"] += 1
            out["wall_s"] = time.perf_counter() - start
            out["env_steps"] = float(keys.lookup(result, keys.ENV_STEPS, 0) or 0)
            ret = C._num(keys.lookup(result, keys.EPISODE_RETURN))
            out["return"] = ret
            if ret == ret and not (out["best_return"] >= ret):
                out["best_return"] = ret
            if ret >= target:
                out["reached"] = True
                break
            if out["env_steps"] >= max_env_steps or out["wall_s"] >= max_wall_s:
                break
    finally:
        algo.stop()
    return out


def contender_config(name: str, spec: Any, seed: int) -> Any:
    from rayrl import spec as spec_mod

    if name == "rllib_default":
        return C.rllib_default_config(seed=seed, return_window=C.RETURN_WINDOW)
    return C.rayrl_config(spec_mod.replace(spec, seed=seed))


def summarise(runs: list[dict]) -> dict[str, Any]:
    """Medians over seeds; a run that hit a cap counts at its cap, so the median may be a lower bound."""
    wall = C.median([r["wall_s"] for r in runs])
    steps = C.median([r["env_steps"] for r in runs])
    # A censored run at or below the median could, uncensored, have moved it up.
    lower = any(not r["reached"] and (r["wall_s"] <= wall or r["env_steps"] <= steps) for r in runs)
    return {"wall_s": wall, "env_steps": steps, "reached": sum(r["reached"] for r in runs), "runs": len(runs),
            "median_is_lower_bound": lower, "build_s": C.median([r["build_s"] for r in runs]),
            "env_steps_per_s": C.median([C.ratio(r["env_steps"], r["wall_s"]) for r in runs])}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 seed, target 60, 30 s cap: a smoke test")
    p.add_argument("--out", type=Path, help="also write the figures as JSON here")
    p.add_argument("--best-config", type=Path, default=C.DEFAULT_CONFIG,
                   help="rayrl spec to train, e.g. a sweep's best_config.yaml (default: %(default)s)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V",
                   help="override a field of the rayrl spec")
    p.add_argument("--seeds", type=int, help="seeds per contender (default 3; quick 1)")
    p.add_argument("--target", type=float, help="mean episode return to reach (default 450; quick 60)")
    p.add_argument("--max-env-steps", type=float, help="cap per run (default 500000; quick 60000)")
    p.add_argument("--max-wall-s", type=float, help="cap per run, seconds of training (default 200; quick 30)")
    C.add_torch_threads(p)
    args = p.parse_args(argv)
    q = args.quick
    args.seeds = C.mode_default(args.seeds, 1, 3, q)
    args.target = C.mode_default(args.target, 60.0, C.TARGET_RETURN, q)
    args.max_env_steps = C.mode_default(args.max_env_steps, 60_000, 500_000, q)
    args.max_wall_s = C.mode_default(args.max_wall_s, 30.0, 200.0, q)
    if args.seeds < 1 or args.max_env_steps <= 0 or args.max_wall_s <= 0:
        p.error("--seeds must be >= 1, --max-env-steps and --max-wall-s > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    C.quiet()
    spec = C.load_spec(args.best_config, args.overrides)
    started = time.monotonic()
    runs: dict[str, list[dict]] = {c: [] for c in CONTENDERS}
    with C.local_ray(torch_threads=args.torch_threads):
        for seed in range(args.seeds):
            order = CONTENDERS if seed % 2 == 0 else CONTENDERS[::-1]
            for name in order:
                r = run_to_target(contender_config(name, spec, seed), args.target, args.max_env_steps,
                                  args.max_wall_s)
                r["seed"] = seed
                runs[name].append(r)
                C.say(f"[seed {seed}] {name:<14} {'reached' if r['reached'] else 'NOT reached'} "
                      f"{args.target:g} in {r['wall_s']:.1f} s, {r['env_steps']:,.0f} env steps "
                      f"({r['iterations']} iterations; return {r['return']:.1f})")
    summary = {name: summarise(rs) for name, rs in runs.items()}
    d, r = summary["rllib_default"], summary["rayrl"]
    report: dict[str, Any] = {
        "target_return": args.target,
        "return_window_episodes": C.RETURN_WINDOW,
        "rllib_default_wall_s": d["wall_s"], "rllib_default_env_steps": d["env_steps"],
        "rayrl_wall_s": r["wall_s"], "rayrl_env_steps": r["env_steps"],
        "wall_ratio_default_over_rayrl": C.ratio(d["wall_s"], r["wall_s"]),
        "env_steps_ratio_default_over_rayrl": C.ratio(d["env_steps"], r["env_steps"]),
        "summary": summary,
        "runs": runs,
        "rayrl_spec": {"config": str(args.best_config), "batch": spec.algo.train_batch_per_learner,
                       "minibatch": spec.algo.minibatch_size, "lr": spec.algo.lr, "epochs": spec.algo.epochs},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": C.machine(),
        "wall_total_s": round(time.monotonic() - started, 1),
    }
    print_report(report)
    C.write_json(args.out, report)
    return 0


def print_report(report: dict) -> None:
    s = report["summary"]

    def fig(name: str, key: str) -> str:
        v = s[name][key]
        return ("≥ " if s[name]["median_is_lower_bound"] else "") + (f"{v:,.1f}" if key == "wall_s" else f"{v:,.0f}")

    rows = [[label, fig(name, "wall_s"), fig(name, "env_steps"), f"{s[name]['reached']}/{s[name]['runs']}",
             s[name]["env_steps_per_s"], s[name]["build_s"]]
            for name, label in (("rllib_default", "RLlib default PPO"),
                                ("rayrl", f"rayrl ({Path(report['rayrl_spec']['config']).name})"))]
    C.say(f"\ntime to mean return >= {report['target_return']:g} on CartPole-v1 (median over seeds, "
          f"{report['return_window_episodes']}-episode mean):")
    C.say(C.table(["contender", "wall s", "env steps", "reached", "env steps/s", "build s"], rows))
    C.say(f"\nRLlib default / rayrl: wall x{report['wall_ratio_default_over_rayrl']:.2f}, "
          f"env steps x{report['env_steps_ratio_default_over_rayrl']:.2f}"
          + (" (lower bounds: the default hit a cap in a seed at or below its median)"
             if s["rllib_default"]["median_is_lower_bound"] else ""))
    m = report["machine"]
    C.say(f"machine: {m['nproc']} x {m['cpu_model']}, load {m['load_avg_1m']}; {m['date']}; "
          f"{report['wall_total_s']:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
