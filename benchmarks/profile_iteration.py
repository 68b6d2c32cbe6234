"""Where one rayrl training iteration at the knee spends its time: sampling, learning, rayrl, RLlib, Tune.

Three looks at the same config (rayrl's spec at ``--batch``, the knee):

1. driver, no Tune: ``Algorithm.train()`` under cProfile. Each phase is the cumulative time of
   the function that does it, per iteration: sampling (``synchronous_parallel_sample``: waiting
   for the env runner and unpickling its episodes), the learner update (``LearnerGroup.update``:
   GAE connector + SGD; rayrl's learner code inside it is shown apart), weight sync, rayrl's
   result callback, and the rest of ``train()`` (RLlib's metrics and result assembly). RLlib's
   own ``result["timers"]`` are printed beside them. One checkpoint save is timed too.
2. env runner: one ``sample()`` of a batch under cProfile inside the remote runner: the env
   step, the policy forward pass, the connector pipelines and the episode bookkeeping.
3. Tune: the same config as a one-trial Tune experiment (rayrl's ``make_tuner``). Tune's
   per-iteration overhead in the trial is the wall time between results minus RLlib's
   ``time_this_iter_s``; the driver-side figure is the time between results arriving.

    python -m benchmarks.profile_iteration                   # full: batch 16384, about 1 minute
    python -m benchmarks.profile_iteration --quick           # smoke test
    python -m benchmarks.profile_iteration --doubling runs/cartpole-ppo/doubling.csv --out profile.json
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import common as C

#: phase -> (path fragment, function name) whose cumulative time is the phase's (the outermost
#: match when several classes' methods match, e.g. a MultiRLModule calling its modules)
DRIVER_PHASES = {
    "train_total": ("ray/tune/trainable/trainable.py", "train"),
    "training_step": ("rllib/algorithms/ppo/ppo.py", "training_step"),
    "sampling": ("rllib/execution/rollout_ops.py", "synchronous_parallel_sample"),
    "learner_update": ("rllib/core/learner/learner_group.py", "update"),
    "learner_connector": ("rllib/connectors/learner/learner_connector_pipeline.py", "__call__"),
    "rayrl_learner_minibatches": ("rayrl/rllib/learner.py", "_uncompiled_update"),
    "rayrl_learner_step": ("rayrl/rllib/learner.py", "_rayrl_step"),
    "weight_sync": ("rllib/env/env_runner_group.py", "sync_weights"),
    "rayrl_callback": ("rayrl/rllib/callback.py", "on_train_result"),
}
RUNNER_PHASES = {
    "sample_total": ("rllib/env/single_agent_env_runner.py", "sample"),
    "env_step": ("gymnasium/", "step"),  # the outermost vector env's step (SyncVectorEnv, a wrapper, numpy)
    "module_forward": ("rllib/core/rl_module/", "_forward"),  # what both runners call, under its wrappers
    "env_to_module_connectors": ("rllib/connectors/env_to_module/env_to_module_pipeline.py", "__call__"),
}
#: module-to-env has no __call__ of its own: the generic pipeline's, called from the runner itself
MODULE_TO_ENV = (("rllib/connectors/connector_pipeline_v2.py", "__call__"), "rllib/env/single_agent_env_runner.py")


def cumulative(stats: pstats.Stats, where: tuple[str, str]) -> float:
    """Cumulative seconds of a function (the largest match: the outermost of nested ones)."""
    fragment, name = where
    return max(
        (
            ct
            for (filename, _, func), (_, _, _, ct, _) in stats.stats.items()  # type: ignore[attr-defined]
            if func == name and fragment in filename.replace("\\", "/")
        ),
        default=0.0,
    )


def top_functions(stats: pstats.Stats, n: int) -> list[dict]:
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:n]  # type: ignore[attr-defined]
    out = []
    for (filename, line, func), (_, nc, tt, ct, _) in rows:
        short = filename.split("site-packages/")[-1].replace(str(C.ROOT) + "/", "")
        out.append({"function": f"{short}:{line}({func})", "calls": nc, "tottime_s": tt, "cumtime_s": ct})
    return out


def profile_driver(config: Any, warmup: int, iters: int, top: int) -> dict[str, Any]:
    """cProfile over ``iters`` driver-side ``train()`` calls (after ``warmup``); one checkpoint timed."""
    algo = config.build_algo()
    try:
        for _ in range(warmup):
            algo.train()
        prof = cProfile.Profile()
        walls, timers, steps = [], [], []
        last = None
        for _ in range(iters):
            t0 = time.perf_counter()
            prof.enable()
            result = algo.train()
            prof.disable()
            walls.append(time.perf_counter() - t0)
            timers.append(dict(result.get("timers", {}) or {}))
            lifetime = float(result.get("num_env_steps_sampled_lifetime", 0) or 0)
            steps.append(
                lifetime - last
                if last is not None
                else float(result.get("env_runners", {}).get("num_env_steps_sampled", 0) or 0)
            )
            last = lifetime
        with tempfile.TemporaryDirectory(prefix="rayrl-bench-ckpt-") as tmp:
            t0 = time.perf_counter()
            algo.save_to_path(tmp)
            checkpoint_s = time.perf_counter() - t0
        runner = profile_runner(algo, int(config.train_batch_size_per_learner))
    finally:
        algo.stop()
    stats = pstats.Stats(prof)
    phases = {k: cumulative(stats, v) / iters for k, v in DRIVER_PHASES.items()}
    phases["rllib_result_assembly"] = max(
        0.0, phases["train_total"] - phases["training_step"] - phases["rayrl_callback"]
    )
    phases["training_step_other"] = max(
        0.0, phases["training_step"] - phases["sampling"] - phases["learner_update"] - phases["weight_sync"]
    )
    return {
        "phases_s": phases,
        "wall_s": walls,
        "env_steps": steps,
        "checkpoint_s": checkpoint_s,
        "timers_s": {
            k: C.median([t.get(k, float("nan")) for t in timers])
            for k in (
                "env_runner_sampling_timer",
                "learner_update_timer",
                "synch_weights",
                "training_step",
                "training_iteration",
            )
        },
        "top": top_functions(stats, top),
        "runner": runner,
    }


def profile_runner(algo: Any, batch: int) -> dict[str, Any]:
    """cProfile of one ``sample(num_timesteps=batch)`` inside the (first) remote env runner."""
    phases, module_to_env = dict(RUNNER_PHASES), MODULE_TO_ENV

    def run(runner: Any) -> dict:
        import cProfile as cp
        import pstats as ps
        import time as t

        prof = cp.Profile()
        t0 = t.perf_counter()
        prof.enable()
        episodes = runner.sample(num_timesteps=batch)
        prof.disable()
        wall = t.perf_counter() - t0
        stats = ps.Stats(prof)
        out = {"wall_s": wall, "env_steps": float(sum(len(e) for e in episodes))}
        for key, (suffix, name) in phases.items():
            out[key] = max(
                (
                    ct
                    for (f, _, fn), (_, _, _, ct, _) in stats.stats.items()
                    if fn == name and suffix in f.replace("\\", "/")
                ),
                default=0.0,
            )
        (suffix, name), caller = module_to_env
        out["module_to_env_connectors"] = sum(
            c[3]
            for (f, _, fn), (_, _, _, _, callers) in stats.stats.items()
            if fn == name and suffix in f.replace("\\", "/")
            for (cf, _, _), c in callers.items()
            if caller in cf.replace("\\", "/")
        )
        return out

    group = algo.env_runner_group
    if group.num_remote_env_runners() == 0:
        found = [run(group.local_env_runner)]
    else:
        found = group.foreach_env_runner(run, local_env_runner=False, remote_worker_ids=[1])
    r = found[0]
    r["bookkeeping_s"] = max(
        0.0,
        r["sample_total"]
        - r["env_step"]
        - r["module_forward"]
        - r["env_to_module_connectors"]
        - r["module_to_env_connectors"],
    )
    r["env_steps_per_s"] = C.ratio(r["env_steps"], r["wall_s"])
    return r


def profile_tune(spec: Any, iters: int) -> dict[str, Any]:
    """The same config as a one-trial Tune run: per-iteration wall in the trial and at the driver."""
    from ray.tune import Callback

    from rayrl import runtime
    from rayrl.observe import keys
    from rayrl.tune.tuner import make_tuner

    arrivals: list[float] = []
    results: list[dict] = []

    class Clock(Callback):
        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
            arrivals.append(time.perf_counter())
            results.append(
                {
                    "time_this_iter_s": float(result.get("time_this_iter_s", 0) or 0),
                    "sps": C._num(keys.lookup(result, keys.ENV_STEPS_PER_S)),
                    "steps": C._num(keys.lookup(result, keys.ENV_STEPS_THIS_ITER)),
                }
            )

    with tempfile.TemporaryDirectory(prefix="rayrl-bench-tune-") as tmp:
        paths = runtime.resolve(tmp, "profile")
        tuner = make_tuner(
            spec,
            paths,
            phase="profile",
            subdir="tune",
            stop={keys.ITERATION: iters},
            extra_callbacks=[Clock()],
            checkpoints=False,
            verbose_label="tune",
        )
        t0 = time.perf_counter()
        tuner.fit()
        total = time.perf_counter() - t0
    # From the 2nd result on: the first includes actor start-up.
    in_trial = [r["steps"] / r["sps"] for r in results[1:] if r["sps"] and r["sps"] > 0]
    this_iter = [r["time_this_iter_s"] for r in results[1:]]
    at_driver = [b - a for a, b in zip(arrivals[:-1], arrivals[1:])]
    return {
        "iterations": len(results),
        "fit_s": total,
        "trial_wall_per_iter_s": C.median(in_trial),
        "time_this_iter_s": C.median(this_iter),
        "driver_interval_s": C.median(at_driver),
        "tune_overhead_in_trial_s": C.median(in_trial) - C.median(this_iter),
        "sps_in_trial": C.median([r["sps"] for r in results[1:]]),
        "startup_s": (arrivals[0] - t0) if arrivals else float("nan"),
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="batch 1024, 2 iterations: a smoke test")
    p.add_argument("--out", type=Path, help="also write the figures as JSON here")
    p.add_argument("--config", type=Path, default=C.DEFAULT_CONFIG, help="rayrl spec (default: %(default)s)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V")
    p.add_argument(
        "--batch",
        type=int,
        help="the knee (default 16384, the knee of this machine's ladder, see docs/benchmarks.md; quick 1024)",
    )
    p.add_argument("--doubling", type=Path, help="take the knee from a sweep's doubling.csv/summary.json")
    p.add_argument("--iters", type=int, help="profiled iterations (default 5; quick 2)")
    p.add_argument("--warmup", type=int, default=1, help="unprofiled iterations first")
    p.add_argument("--tune-iters", type=int, help="iterations of the Tune run (default 6; quick 3)")
    p.add_argument("--top", type=int, default=15, help="functions listed by own time")
    C.add_torch_threads(p)
    args = p.parse_args(argv)
    args.iters = C.mode_default(args.iters, 2, 5, args.quick)
    args.tune_iters = C.mode_default(args.tune_iters, 3, 6, args.quick)
    if args.iters < 1 or args.tune_iters < 2 or args.warmup < 0 or (args.batch is not None and args.batch < 1):
        p.error("--iters must be >= 1, --tune-iters >= 2, --warmup >= 0, --batch >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    C.quiet()
    spec = C.load_spec(args.config, args.overrides)
    if args.doubling and args.batch is None:  # as in throughput.py: an explicit --batch wins
        knee, _ = C.read_knee(args.doubling)
    else:
        knee = C.mode_default(args.batch, 1024, 16384, args.quick)
    spec = C.spec_at_batch(spec, knee)
    started = time.monotonic()
    with C.local_ray(torch_threads=args.torch_threads):
        driver = profile_driver(C.rayrl_config(spec), args.warmup, args.iters, args.top)
        tune = profile_tune(spec, args.tune_iters)
    wall = C.median(driver["wall_s"])
    report: dict[str, Any] = {
        "batch_size": knee,
        "minibatch_size": spec.algo.minibatch_size,
        "epochs": spec.algo.epochs,
        "iteration_wall_s": wall,
        "env_steps_per_s": C.ratio(C.median(driver["env_steps"]), wall),
        "driver": driver,
        "tune": tune,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": C.machine(),
        "wall_s": round(time.monotonic() - started, 1),
    }
    ph = driver["phases_s"]
    report["shares"] = {
        k: C.ratio(ph[k], ph["train_total"])
        for k in (
            "sampling",
            "learner_update",
            "weight_sync",
            "rayrl_callback",
            "rllib_result_assembly",
            "training_step_other",
        )
    }
    print_report(report)
    C.write_json(args.out, report)
    return 0


def print_report(report: dict) -> None:
    d, t, ph = report["driver"], report["tune"], report["driver"]["phases_s"]
    total = ph["train_total"]
    tm = d["timers_s"]
    rows = [
        ["train() total (driver, cProfile on)", total, 1.0, tm["training_iteration"]],
        [
            "  sampling: wait for env runner + unpickle episodes",
            ph["sampling"],
            ph["sampling"] / total,
            tm["env_runner_sampling_timer"],
        ],
        [
            "  learner update (GAE connector + SGD)",
            ph["learner_update"],
            ph["learner_update"] / total,
            tm["learner_update_timer"],
        ],
        ["    learner connector (GAE, batch build)", ph["learner_connector"], ph["learner_connector"] / total, ""],
        [
            "    rayrl learner: minibatches (fwd, loss, bwd, step)",
            ph["rayrl_learner_minibatches"],
            ph["rayrl_learner_minibatches"] / total,
            "",
        ],
        [
            "      of which rayrl step (norm, guard, clip, Adam)",
            ph["rayrl_learner_step"],
            ph["rayrl_learner_step"] / total,
            "",
        ],
        ["  weight sync to env runner", ph["weight_sync"], ph["weight_sync"] / total, tm["synch_weights"]],
        ["  training_step, other", ph["training_step_other"], ph["training_step_other"] / total, ""],
        ["  rayrl callback (rayrl section, hardware, gauges)", ph["rayrl_callback"], ph["rayrl_callback"] / total, ""],
        ["  RLlib result/metrics assembly", ph["rllib_result_assembly"], ph["rllib_result_assembly"] / total, ""],
        ["checkpoint save (one; rayrl saves every 5 iterations)", d["checkpoint_s"], d["checkpoint_s"] / total, ""],
    ]
    C.say(
        f"\none rayrl iteration at batch {report['batch_size']} (minibatch {report['minibatch_size']}, "
        f"{report['epochs']} epochs): {report['iteration_wall_s']:.3f} s wall, "
        f"{report['env_steps_per_s']:,.0f} env steps/s (driver, no Tune)"
    )
    C.say(C.table(["phase (per iteration)", "s", "share", "RLlib timer s"], rows))
    r = d["runner"]
    C.say(
        f"\nenv runner, one sample() of {r['env_steps']:,.0f} steps: {r['wall_s']:.3f} s "
        f"({r['env_steps_per_s']:,.0f} env steps/s, cProfile on)"
    )
    C.say(
        C.table(
            ["part", "s", "share"],
            [
                [k, r[k], C.ratio(r[k], r["sample_total"])]
                for k in (
                    "env_step",
                    "module_forward",
                    "env_to_module_connectors",
                    "module_to_env_connectors",
                    "bookkeeping_s",
                )
            ],
        )
    )
    C.say(
        f"\nTune (one trial, {t['iterations']} iterations): trial wall/iter {t['trial_wall_per_iter_s']:.3f} s, "
        f"RLlib time_this_iter_s {t['time_this_iter_s']:.3f} s -> Tune overhead in the trial "
        f"{t['tune_overhead_in_trial_s']:.3f} s/iter; results reach the driver every "
        f"{t['driver_interval_s']:.3f} s; start-up to first result {t['startup_s']:.1f} s; "
        f"{t['sps_in_trial']:,.0f} env steps/s in the trial"
    )
    C.say("\ndriver functions by own time (all profiled iterations):")
    C.say(
        C.table(
            ["function", "calls", "own s", "cum s"],
            [[x["function"][-90:], x["calls"], x["tottime_s"], x["cumtime_s"]] for x in d["top"]],
        )
    )
    m = report["machine"]
    C.say(f"machine: {m['nproc']} x {m['cpu_model']}, load {m['load_avg_1m']}; {m['date']}; {report['wall_s']:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
