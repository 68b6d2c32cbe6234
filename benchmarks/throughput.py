"""Env steps per second on CartPole-v1 with PPO: the rollout limit, RLlib's default, rayrl at the knee.

Three contenders, measured side by side in one run, their order rotated round by round so load
from other jobs on a shared machine hits all of them alike:

* ``limit``: the rollout limit on one core. gymnasium's numpy-vectorised CartPole
  (``CartPoleVectorEnv``, as many envs as rayrl's runner) stepped with the forward pass of the
  same policy network rayrl trains (RLlib's PPO RLModule) and sampled actions; no learning, no
  Ray, one torch thread.
* ``rllib_default``: ``PPOConfig().environment("CartPole-v1")``, defaults untouched.
* ``rayrl``: rayrl's spec (``--config``) at the knee of the doubling rule. Full mode runs the
  ladder as a sweep's phase 1 does (``rayrl.sweep.phase1``, Tune trials); ``--doubling FILE``
  reads a sweep's doubling.csv / summary.json instead; ``--quick`` measures a small fixed ladder.

RLlib's default and rayrl are built in the driver and timed the same way: wall time around
``Algorithm.train()``, env steps from ``num_env_steps_sampled_lifetime``; the figure is the median
over every measured iteration of every round.

    python benchmarks/throughput.py                   # full: ladder + 3 rounds, about 5 minutes on 2 cores
    python benchmarks/throughput.py --quick           # smoke test, about a minute
    python benchmarks/throughput.py --doubling runs/cartpole-ppo/doubling.csv --out throughput.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C  # noqa: E402

GOAL_RATIO = 2.5  #: rayrl / RLlib default, the issue's target
CONTENDERS = ("limit", "rllib_default", "rayrl")
QUICK_LADDER = (1024, 2048)


def rollout_limit(spec: Any, num_envs: int, seconds: float, seed: int = 0, chunk_s: float = 0.5) -> list[float]:
    """Env steps/s of a numpy-vectorised CartPole stepped by the policy's forward pass, one core.

    Returns one figure per ``chunk_s`` of stepping (their median is the limit).
    """
    import gymnasium as gym
    import torch

    env = gym.make_vec(spec.env.id, num_envs=num_envs, vectorization_mode="vector_entry_point")
    config = C.rayrl_config(spec)
    module = config.get_rl_module_spec(
        spaces={"default_policy": (env.single_observation_space, env.single_action_space)}).build()
    module.eval()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    out: list[float] = []
    try:
        obs, _ = env.reset(seed=seed)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            steps, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < chunk_s:
                with torch.no_grad():
                    logits = module.forward_exploration({"obs": torch.from_numpy(obs)})["action_dist_inputs"]
                    actions = torch.distributions.Categorical(logits=logits).sample().numpy()
                obs, _, _, _, _ = env.step(actions)
                steps += num_envs
            out.append(steps / (time.perf_counter() - t0))
    finally:
        torch.set_num_threads(threads)
        env.close()
    return out


# ---- the knee ----------------------------------------------------------------------------------

def run_ladder(spec: Any, storage: Path) -> tuple[int, list[dict]]:
    """The doubling ladder exactly as a sweep's phase 1 runs it (Tune trials, rayrl's searcher)."""
    from rayrl import runtime, sweep, throughput

    paths = runtime.resolve(str(storage), "throughput-ladder")
    rows, _ = sweep.phase1(spec, paths)
    knee = throughput.knee(rows)
    if knee is None:
        raise SystemExit(f"the ladder's first rung failed; see {paths.run_dir / 'phase1'}")
    return knee, C.ladder_dicts(rows)


def quick_ladder(spec: Any, min_gain: float) -> tuple[int, list[dict]]:
    """A small fixed ladder measured in the driver (1 warm-up + 1 timed iteration a rung)."""
    from rayrl import throughput

    rungs = []
    for batch in QUICK_LADDER:
        timed = C.run_iterations(C.rayrl_config(C.spec_at_batch(spec, batch)), warmup=1, iters=1)
        rungs.append(throughput.Rung(batch, C.median(timed.sps)))
    rows = throughput.decide(rungs, factor=2, cap=QUICK_LADDER[-1], min_gain=min_gain)
    return throughput.knee(rows) or QUICK_LADDER[0], C.ladder_dicts(rows)


# ---- the side-by-side rounds -------------------------------------------------------------------

def measure(args: argparse.Namespace, spec_knee: Any) -> dict[str, dict]:
    """Rounds of all three contenders, order rotated each round; per-contender samples."""
    res: dict[str, dict] = {c: {"sps": [], "round_median": [], "timers": [], "build_s": []} for c in CONTENDERS}
    for rnd in range(args.rounds):
        order = CONTENDERS[rnd % 3:] + CONTENDERS[:rnd % 3]
        for name in order:
            if name == "limit":
                sps = rollout_limit(spec_knee, args.limit_envs, args.limit_seconds, seed=rnd)
                timers: list[dict] = []
                build = 0.0
            else:
                config = (C.rllib_default_config() if name == "rllib_default" else C.rayrl_config(spec_knee))
                iters = args.default_iters if name == "rllib_default" else args.rayrl_iters
                timed = C.run_iterations(config, warmup=args.warmup, iters=iters)
                sps, timers, build = timed.sps, timed.timers, timed.build_s
            r = res[name]
            r["sps"] += sps
            r["round_median"].append(C.median(sps))
            r["timers"] += timers
            r["build_s"].append(build)
            C.say(f"[round {rnd + 1}/{args.rounds}] {name:<14} {C.median(sps):>10,.0f} env steps/s "
                  f"({len(sps)} samples)")
    return res


def timer_medians(timers: list[dict]) -> dict[str, float]:
    """Median seconds per iteration of RLlib's per-phase timers (sampling, learner update, ...)."""
    names = ("env_runner_sampling_timer", "learner_update_timer", "synch_weights", "training_step",
             "training_iteration")
    return {n: C.median([t.get(n, float("nan")) for t in timers]) for n in names if timers}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a fixed 2-rung ladder, 1 round: a smoke test")
    p.add_argument("--out", type=Path, help="also write the figures as JSON here")
    p.add_argument("--config", type=Path, default=C.DEFAULT_CONFIG, help="rayrl spec (default: %(default)s)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V",
                   help="override a spec field, e.g. --set env.envs_per_runner=16")
    p.add_argument("--doubling", type=Path, help="a sweep's doubling.csv, summary.json or run folder: take its "
                   "knee instead of running the ladder")
    p.add_argument("--batch", type=int, help="take this batch as the knee (no ladder)")
    p.add_argument("--ladder-storage", type=Path, help="where the ladder's run folder goes (default: a temp dir)")
    p.add_argument("--rounds", type=int, help="side-by-side rounds (default 3; quick 1)")
    p.add_argument("--warmup", type=int, help="untimed iterations after each build (default 1; quick 0)")
    p.add_argument("--default-iters", type=int, help="timed RLlib-default iterations a round (default 3; quick 1)")
    p.add_argument("--rayrl-iters", type=int, help="timed rayrl iterations a round (default 5; quick 2)")
    p.add_argument("--limit-seconds", type=float, help="seconds of rollout-limit stepping a round "
                   "(default 3; quick 1)")
    p.add_argument("--limit-envs", type=int, help="vectorised envs of the limit (default: the spec's "
                   "env.envs_per_runner)")
    C.add_torch_threads(p)
    args = p.parse_args(argv)
    q = args.quick
    args.rounds = C.mode_default(args.rounds, 1, 3, q)
    args.warmup = C.mode_default(args.warmup, 0, 1, q)
    args.default_iters = C.mode_default(args.default_iters, 1, 3, q)
    args.rayrl_iters = C.mode_default(args.rayrl_iters, 2, 5, q)
    args.limit_seconds = C.mode_default(args.limit_seconds, 1.0, 3.0, q)
    for name in ("rounds", "default_iters", "rayrl_iters", "batch", "limit_envs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.warmup < 0 or args.limit_seconds <= 0:
        p.error("--warmup must be >= 0 and --limit-seconds > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    C.quiet()
    spec = C.load_spec(args.config, args.overrides)
    args.limit_envs = args.limit_envs or spec.env.envs_per_runner
    started = time.monotonic()
    with C.local_ray(torch_threads=args.torch_threads):
        if args.batch:
            knee, ladder, source = args.batch, [], "--batch"
        elif args.doubling:
            (knee, ladder), source = C.read_knee(args.doubling), f"--doubling {args.doubling}"
        elif args.quick:
            (knee, ladder), source = quick_ladder(spec, spec.search.doubling.min_gain), \
                f"quick ladder {list(QUICK_LADDER)} (driver-timed)"
        else:
            storage = args.ladder_storage or Path(tempfile.mkdtemp(prefix="rayrl-bench-ladder-"))
            (knee, ladder), source = run_ladder(spec, storage), f"doubling ladder (sweep phase 1) in {storage}"
        C.say(f"knee: batch {knee} ({source})")
        spec_knee = C.spec_at_batch(spec, knee)
        res = measure(args, spec_knee)
    figures = {name: C.median(r["sps"]) for name, r in res.items()}
    report: dict[str, Any] = {
        "limit_sps": figures["limit"],
        "rllib_default_sps": figures["rllib_default"],
        "rayrl_sps": figures["rayrl"],
        "rayrl_over_rllib_default": C.ratio(figures["rayrl"], figures["rllib_default"]),
        "rayrl_over_limit": C.ratio(figures["rayrl"], figures["limit"]),
        "rllib_default_over_limit": C.ratio(figures["rllib_default"], figures["limit"]),
        "goal_ratio": GOAL_RATIO,
        "knee_batch_size": knee,
        "knee_source": source,
        "ladder": ladder,
        "contenders": {name: {"sps_median": figures[name], "sps_min": min(r["sps"]), "sps_max": max(r["sps"]),
                              "samples": len(r["sps"]), "round_medians": r["round_median"],
                              "build_s_median": C.median(r["build_s"]), "timers_median_s": timer_medians(r["timers"])}
                       for name, r in res.items()},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "rayrl_spec": {"batch": knee, "minibatch": spec_knee.algo.minibatch_size, "epochs": spec.algo.epochs,
                       "env_runners": spec.resources.env_runners, "envs_per_runner": spec.env.envs_per_runner,
                       "hidden": spec.model.hidden},
        "machine": C.machine(),
        "wall_s": round(time.monotonic() - started, 1),
    }
    # Load from other jobs drifts: a ratio within one round compares neighbours in time.
    rounds = [C.ratio(r, d) for r, d in zip(res["rayrl"]["round_median"], res["rllib_default"]["round_median"])]
    report["round_ratios_rayrl_over_rllib_default"] = rounds
    report["best_round_sps"] = {name: max(r["round_median"]) for name, r in res.items()}
    report["best_round_rayrl_over_rllib_default"] = C.ratio(report["best_round_sps"]["rayrl"],
                                                            report["best_round_sps"]["rllib_default"])
    report["goal_met"] = bool(report["rayrl_over_rllib_default"] >= GOAL_RATIO)
    print_report(report)
    C.write_json(args.out, report)
    return 0


def print_report(report: dict) -> None:
    if report["ladder"]:
        C.say("\ndoubling ladder (env steps/s as the sweep measured it):")
        C.say(C.table(["batch", "env steps/s", "gain", "decision"],
                      [[r["batch_size"], r["env_steps_per_s"] if r["env_steps_per_s"] is not None else float("nan"),
                        "" if r["gain"] is None else f"{r['gain']:+.0%}", r["decision"]] for r in report["ladder"]]))
    labels = {"limit": f"rollout limit ({report['settings']['limit_envs']} numpy envs, 1 core, no learning)",
              "rllib_default": "RLlib default PPO", "rayrl": f"rayrl at the knee (batch {report['knee_batch_size']})"}
    rows = []
    for name in CONTENDERS:
        c = report["contenders"][name]
        t = c["timers_median_s"]
        rows.append([labels[name], c["sps_median"], c["sps_min"], c["sps_max"], c["samples"],
                     C.ratio(c["sps_median"], report["rllib_default_sps"]),
                     C.ratio(c["sps_median"], report["limit_sps"]),
                     t.get("env_runner_sampling_timer", float("nan")), t.get("learner_update_timer", float("nan"))])
    C.say("\nenv steps/s on CartPole-v1, PPO (median over iterations of all rounds):")
    C.say(C.table(["contender", "median", "min", "max", "n", "x RLlib default", "x limit", "sample s/iter",
                   "learn s/iter"], rows))
    m = report["machine"]
    C.say(f"\nrayrl / RLlib default = {report['rayrl_over_rllib_default']:.2f} (goal >= {GOAL_RATIO}: "
          f"{'met' if report['goal_met'] else 'missed'}); rayrl / limit = {report['rayrl_over_limit']:.2f}")
    best = report["best_round_sps"]
    C.say("rayrl / RLlib default within each round: "
          + ", ".join(f"{x:.2f}" for x in report["round_ratios_rayrl_over_rllib_default"])
          + f"; best rounds: {report['best_round_rayrl_over_rllib_default']:.2f} "
          f"(rayrl {best['rayrl']:,.0f}, RLlib default {best['rllib_default']:,.0f}, "
          f"limit {best['limit']:,.0f} env steps/s)")
    C.say(f"machine: {m['nproc']} x {m['cpu_model']}, load {m['load_avg_1m']}; {m['date']}; "
          f"ray {m['ray']}, torch {m['torch']}; {report['wall_s']:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
