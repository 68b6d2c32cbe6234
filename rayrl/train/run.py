"""`rayrl train`: the long production run, as a single-trial Tune experiment (or a PBT population).

Tune gives the run its checkpoints, retries and resume (rayrl.tune.tuner); this module adds the
summary, the closing lines and the exit status.
"""

from __future__ import annotations

import argparse
import math
import numbers
import sys
import time
from pathlib import Path
from typing import Any

from rayrl import runfolder, runtime
from rayrl import spec as spec_mod
from rayrl.errors import UserError
from rayrl.faults import preemption
from rayrl.observe import keys
from rayrl.spec import Spec
from rayrl.storage.checkpoints import fallbacks
from rayrl.storage.files import explain
from rayrl.train import population
from rayrl.tune import resources
from rayrl.tune.tuner import check_run_states, make_tuner


def run(spec: Spec, paths: runtime.RunPaths) -> dict:
    """Train to the spec's stop criteria (resuming if the run exists); return the summary."""
    paths.write_text(runfolder.SPEC, spec_mod.dumps(spec))
    start = time.monotonic()
    if spec.population.size >= 2:
        tuner = make_tuner(
            spec,
            paths,
            param_space=population.param_space(spec),
            tune_config=population.tune_config(spec, paths.run_dir),
        )
    else:
        tuner = make_tuner(spec, paths)
    preemption.install_driver_handler(spec.checkpoint.preempt_grace_s)
    grid = tuner.fit()
    result = grid[0] if len(grid) == 1 else grid.get_best_result(keys.EPISODE_RETURN, "max", scope="last")
    metrics = result.metrics or {}
    preempted, budget = preemption.driver_preempted(), preemption.budget_exceeded()
    status = "error" if result.error or budget else "preempted" if preempted["requested_at"] else "finished"
    summary = {
        "kind": "train",
        "name": paths.name,
        "algorithm": spec.algo.name,
        "env": spec.env.id,
        "status": status,
        "error": str(result.error).splitlines()[0] if result.error else (budget or None),
        "iterations": metrics.get(keys.ITERATION),
        "env_steps": keys.lookup(metrics, keys.ENV_STEPS),
        "episode_return_mean": _finite(keys.lookup(metrics, keys.return_key(spec.judged_by))),
        "train_return": _finite(keys.lookup(metrics, keys.TRAIN_RETURN)),
        "eval_return": _finite(keys.lookup(metrics, keys.EVAL_RETURN)),
        "return_judged_by": spec.judged_by,
        "wall_s": round(time.monotonic() - start, 2),
        "time_total_s": metrics.get(keys.TIME_TOTAL),
        "backend": keys.lookup(metrics, keys.BACKEND),
        "num_learners": keys.lookup(metrics, keys.NUM_LEARNERS),
        "global_batch": keys.lookup(metrics, keys.GLOBAL_BATCH),
        "checkpoint": result.checkpoint.path if result.checkpoint else None,
        "resources": resources.as_summary(resources.of_spec(spec)),
        "preempted": (
            {"checkpointed": not preempted["timed_out"], "stop_s": round(time.time() - preempted["requested_at"], 2)}
            if preempted["requested_at"]
            else None
        ),
        "checkpoint_fallbacks": fallbacks(paths.run_dir),
        "hung_runner_restarts": keys.lookup(metrics, keys.HUNG_RUNNER_RESTARTS),
        "checkpoints": checkpoint_counts(metrics),
    }
    if len(grid) > 1:  # a population: the best member's figures above, and each member's id
        if (paths.run_dir / runfolder.POPULATION).exists():  # appended locally by the scheduler; the bucket too
            paths.store.upload(runfolder.POPULATION)
        summary["population"] = {
            "size": len(grid),
            "best_trial_id": Path(result.path).name.split("_", 1)[1],
            "exploits": _count_rows(paths.run_dir / runfolder.POPULATION),
            "errored": sum(1 for r in grid if r.error),
        }
    paths.write_json(runfolder.SUMMARY, summary)
    return summary


def checkpoint_counts(metrics: dict) -> dict | None:
    """The last result's checkpoint counts (the trial process that ran last; a restart starts them at 0);
    None where the trainable reported none (untiered Tune persistence)."""
    found = {name: keys.lookup(metrics, key) for name, key in keys.CHECKPOINT_COUNTS.items()}
    if found["uploaded"] is None:
        return None
    return {name: int(v or 0) for name, v in found.items()}


def _count_rows(path: Path) -> int:
    return max(0, len(path.read_text().splitlines()) - 1) if path.exists() else 0


def _finite(value: Any) -> float | None:
    """A return for summary.json: None where no episode (or evaluation) finished."""
    return float(value) if isinstance(value, numbers.Real) and math.isfinite(value) else None


def launch(args: argparse.Namespace, spec: Spec, paths: runtime.RunPaths) -> int:
    """Hold the run's name, start or join Ray, train, print the outcome; the exit status (rayrl.train.cli)."""
    try:
        with runtime.claim(paths):
            check_run_states(paths, (runfolder.PHASE_DIRS[runfolder.TRAIN],))  # before Ray starts or posture.json
            if runtime.init_ray(args.address, args.num_cpus):
                why = resources.trial_misfit(runtime.cluster_resources(), resources.of_spec(spec))
                if why:
                    print(f"rayrl train: error: {why}", file=sys.stderr)
                    return 1
            runtime.record_posture(paths)
            summary = run(spec, paths)
    except Exception as exc:  # a full disk or a failed upload: one paragraph, files intact, resumable
        err = explain(exc, paths.run_dir)
        if err is None or isinstance(exc, UserError):
            raise
        print(f"rayrl train: error: {err.strerror}", file=sys.stderr)
        return 1
    ret = summary["episode_return_mean"]
    print(
        f"rayrl train: {summary['status']} after {summary['iterations']} iterations, "
        f"{summary['env_steps'] or 0:,.0f} env steps, return {ret if ret is not None else float('nan'):.1f}; "
        f"run folder {paths.run_dir}"
    )
    for fb in summary["checkpoint_fallbacks"]:
        print(
            f"rayrl train: {fb['trial']}: checkpoint {fb['registered']} was not intact "
            f"({fb['rejected'][0]['why'] if fb['rejected'] else '?'}); resumed from {fb['restored']} instead "
            f"(recorded in the trial folder)"
        )
    if summary["status"] == "preempted":
        print(
            f"rayrl train: stopped by SIGTERM {summary['preempted']['stop_s']:.1f}s after the signal, "
            + (
                "with a checkpoint of the last iteration"
                if summary["preempted"]["checkpointed"]
                else "before a new checkpoint was written (the grace period ran out)"
            )
            + "; run the same command to resume."
        )
        return preemption.EXIT_PREEMPTED
    if summary["status"] != "finished":
        print(
            f"rayrl train: the trial failed: {summary['error']}; run the same command to retry from the "
            "latest checkpoint."
        )
        return 1
    return 0
