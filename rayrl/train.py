"""`rayrl train`: the long production run, as a single-trial Tune experiment.

Tune gives the run its checkpoints, retries from the latest checkpoint (FailureConfig) and
resume (``Tuner.restore``); rayrl adds the spec, the progress line and the run folder files.
"""

from __future__ import annotations

import argparse
import functools
import math
import numbers
import sys
import time
from pathlib import Path
from typing import Any

from rayrl import keys, runtime, spec as spec_mod
from rayrl.spec import Spec
from rayrl.storage.files import explain
from rayrl.track.naming import run_name


def stop_criteria(spec: Spec) -> dict[str, float]:
    """Tune's stop dict: the run ends when any metric reaches its value."""
    stop: dict[str, float] = {}
    if spec.stop.env_steps is not None:
        stop[keys.ENV_STEPS] = spec.stop.env_steps
    if spec.stop.episode_return is not None:  # NaN (no episode or evaluation yet) never stops a run
        stop[keys.return_key(spec.judged_by)] = spec.stop.episode_return
    if spec.stop.wall_s is not None:
        stop[keys.TIME_TOTAL] = spec.stop.wall_s
    return stop


def make_tuner(spec: Spec, paths: runtime.RunPaths, *, phase: str = "train", subdir: str = "tune",
               param_space: Any = None, tune_config: Any = None, stop: Any = None,
               extra_callbacks: list | None = None, verbose_label: str = "train",
               checkpoints: bool = True) -> Any:
    """A Tuner for ``spec`` (or resumed from ``paths`` when an experiment is already there)."""
    from ray import tune

    from rayrl.algo import algorithm_class, build_config
    from rayrl.faults.preemption import DriverPreemption, FailureBudget
    from rayrl.progress import HistoryWriter, ProgressPrinter
    from rayrl.storage.trainable import settings_for, tiered_trainable
    from rayrl.track.callbacks import logger_callbacks
    from rayrl.storage.guard import DiskGuard

    trackers = logger_callbacks(spec, phase, paths.name)  # before a restore too: it sets Tune's loggers
    trainable = algorithm_class(spec.algo.name)
    # The long run (and the drills' copies of it): tiered, verified checkpoints, SIGTERM handling and
    # a failure budget by rate. Sweep trials keep Tune's own checkpoints and lifetime retry count, so
    # one broken phase-2 trial errors alone instead of ending the sweep.
    production = checkpoints and phase == "train"
    if production:
        trainable = tiered_trainable(trainable, settings_for(spec))
    exp_path, fs = paths.experiment(subdir)
    if tune.Tuner.can_restore(exp_path, storage_filesystem=fs):
        if fs is None:
            check_experiment_state(exp_path)
        return tune.Tuner.restore(exp_path, trainable=trainable, resume_unfinished=True, resume_errored=True,
                                  param_space=param_space, storage_filesystem=fs)
    run_config = tune.RunConfig(
        name=subdir,
        **paths.tune_storage(),
        stop=stop if stop is not None else stop_criteria(spec),
        # Measurement-only trials (phase 1) keep no checkpoints and are not retried: a failing rung
        # is a finding (the ladder ends there), not an accident.
        # A PBT member restores another member's checkpoint some iterations after it was chosen; a keep
        # limit can delete it first ("does not exist on storage anymore"), so a population keeps all.
        checkpoint_config=tune.CheckpointConfig(
            num_to_keep=None if spec.population.size >= 2 and phase == "train" else spec.checkpoint.keep,
            checkpoint_frequency=spec.checkpoint.every if checkpoints else 0,
            checkpoint_at_end=checkpoints,
        ),
        # `rayrl train`: Tune retries forever and FailureBudget ends the run at max_failures within
        # failure_window_s; sweep trials: max_failures over the trial's life.
        failure_config=tune.FailureConfig(max_failures=-1 if production else spec.checkpoint.max_failures
                                          if checkpoints else 0),
        callbacks=[ProgressPrinter(verbose_label, show_config=phase != "train"),
                   HistoryWriter(paths.run_dir / "history.csv", phase, store=paths.store),
                   DiskGuard(paths.run_dir, experiment=None if fs else exp_path),
                   *trackers, *(extra_callbacks or []),
                   *([FailureBudget(spec.checkpoint.max_failures, spec.checkpoint.failure_window_s),
                      DriverPreemption()] if production else [])],
        verbose=0,
    )
    tune_config = tune_config or tune.TuneConfig()
    tune_config.trial_dirname_creator = trial_dirname
    tune_config.trial_name_creator = functools.partial(run_name, phase=phase)  # phase, batch, lr: trackers' run name
    return tune.Tuner(trainable, param_space=param_space if param_space is not None else build_config(spec),
                      tune_config=tune_config, run_config=run_config)


def check_experiment_state(exp_path: str) -> None:
    """Refuse to resume from a torn experiment state: Tune then restarts the run with no trial and hangs.

    Tune copies experiment_state-*.json to storage non-atomically, so a kill during that copy
    leaves a cut-short file; Tune resumes from the newest one (by name). The whole copy DiskGuard
    kept is put back first (rayrl.storage.tunestate); only without one is this an error.
    """
    if "://" in exp_path:
        return
    from rayrl.storage import tunestate

    repaired = tunestate.repair(Path(exp_path))
    if repaired:
        print(f"[rayrl] {repaired}", flush=True)
    states = sorted(Path(exp_path).glob(tunestate.PATTERN))
    if states and not tunestate.whole(states[-1].read_bytes()):
        earlier = (f"move that file aside to resume from the {len(states) - 1} earlier state file(s), or start "
                   "again with a new --name." if len(states) > 1 else "there is no earlier state file and no whole "
                   "copy of it, so start again with a new --name.")
        raise spec_mod.SpecError(
            f"{states[-1]}: Tune's experiment state is cut short (the run was killed while it was being "
            f"written), so the run cannot resume from it. The checkpoints in {exp_path} are intact: {earlier}")


def check_run_states(paths: runtime.RunPaths, subdirs: tuple[str, ...]) -> None:
    """check_experiment_state for each of a run's local Tune experiments, before any cluster work."""
    for subdir in subdirs:
        exp_path, fs = paths.experiment(subdir)
        if fs is None:
            check_experiment_state(exp_path)


def trial_dirname(trial: Any) -> str:
    """Short trial folder names (Tune's default spells out the whole config)."""
    return f"{trial.trainable_name}_{trial.trial_id}"


def run(spec: Spec, paths: runtime.RunPaths) -> dict:
    """Train to the spec's stop criteria (resuming if the run exists); return the summary."""
    from rayrl.faults import preemption
    from rayrl.storage.checkpoints import fallbacks

    paths.write_text("spec.yaml", spec_mod.dumps(spec))
    start = time.monotonic()
    if spec.population.size >= 2:
        from rayrl import population

        tuner = make_tuner(spec, paths, param_space=population.param_space(spec),
                           tune_config=population.tune_config(spec, paths.run_dir))
    else:
        tuner = make_tuner(spec, paths)
    preemption.install_driver_handler(spec.checkpoint.preempt_grace_s)
    grid = tuner.fit()
    result = grid[0] if len(grid) == 1 else grid.get_best_result(keys.EPISODE_RETURN, "max", scope="last")
    metrics = result.metrics or {}
    preempted, budget = preemption.driver_preempted(), preemption.budget_exceeded()
    status = ("error" if result.error or budget else "preempted" if preempted["requested_at"] else "finished")
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
        "resources": trial_resources(spec),
        "preempted": ({"checkpointed": not preempted["timed_out"],
                       "stop_s": round(time.time() - preempted["requested_at"], 2)}
                      if preempted["requested_at"] else None),
        "checkpoint_fallbacks": fallbacks(paths.run_dir),
        "hung_runner_restarts": keys.lookup(metrics, keys.HUNG_RUNNER_RESTARTS),
    }
    if len(grid) > 1:  # a population: the best member's figures above, and each member's id
        if (paths.run_dir / "population.csv").exists():  # appended locally by the scheduler; the bucket gets it too
            paths.store.upload("population.csv")
        summary["population"] = {"size": len(grid), "best_trial_id": Path(result.path).name.split("_", 1)[1],
                                 "exploits": _count_rows(paths.run_dir / "population.csv"),
                                 "errored": sum(1 for r in grid if r.error)}
    paths.write_json("summary.json", summary)
    return summary


def _count_rows(path: Path) -> int:
    return max(0, len(path.read_text().splitlines()) - 1) if path.exists() else 0


def _finite(value: Any) -> float | None:
    """A return for summary.json: None where no episode (or evaluation) finished."""
    return float(value) if isinstance(value, numbers.Real) and math.isfinite(value) else None


def trial_resources(spec: Spec) -> dict:
    """CPUs and GPUs one trial holds, for cost accounting (rayrl.cost's model)."""
    from rayrl.cost import trial_resources as reserved

    held = reserved(spec.resources)
    return {"cpus_per_trial": held.cpus, "gpus_per_trial": held.gpus}


def main(args: argparse.Namespace) -> int:
    overrides = list(args.overrides)
    if getattr(args, "population", None) is not None:
        overrides.append(f"population.size={args.population}")
    spec = spec_mod.load(args.config, overrides)
    paths = runtime.resolve(args.storage, args.name or spec.name, args.allow_shared_run_dir)
    try:
        with runtime.claim(paths):
            check_run_states(paths, ("tune",))  # before Ray starts or posture.json is rewritten
            if runtime.init_ray(args.address, args.num_cpus):
                from rayrl.algo import check_fits

                why = check_fits(spec)
                if why:
                    print(f"rayrl train: error: {why}", file=sys.stderr)
                    return 1
            runtime.record_posture(paths)
            summary = run(spec, paths)
    except Exception as exc:  # a full disk or a failed upload: one paragraph, files intact, resumable
        err = explain(exc, paths.run_dir)
        if err is None or isinstance(exc, spec_mod.SpecError):
            raise
        print(f"rayrl train: error: {err.strerror}", file=sys.stderr)
        return 1
    from rayrl.faults import preemption

    ret = summary["episode_return_mean"]
    print(f"rayrl train: {summary['status']} after {summary['iterations']} iterations, "
          f"{summary['env_steps'] or 0:,.0f} env steps, return {ret if ret is not None else float('nan'):.1f}; "
          f"run folder {paths.run_dir}")
    for fb in summary["checkpoint_fallbacks"]:
        print(f"rayrl train: {fb['trial']}: checkpoint {fb['registered']} was not intact "
              f"({fb['rejected'][0]['why'] if fb['rejected'] else '?'}); resumed from {fb['restored']} instead "
              f"(recorded in the trial folder)")
    if summary["status"] == "preempted":
        print(f"rayrl train: stopped by SIGTERM {summary['preempted']['stop_s']:.1f}s after the signal, "
              + ("with a checkpoint of the last iteration" if summary["preempted"]["checkpointed"]
                 else "before a new checkpoint was written (the grace period ran out)")
              + "; run the same command to resume.")
        return preemption.EXIT_PREEMPTED
    if summary["status"] != "finished":
        print(f"rayrl train: the trial failed: {summary['error']}; run the same command to retry from the "
              "latest checkpoint.")
        return 1
    return 0

