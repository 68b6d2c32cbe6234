"""`rayrl train`: the long production run, as a single-trial Tune experiment.

Tune gives the run its checkpoints, retries from the latest checkpoint (FailureConfig) and
resume (``Tuner.restore``); rayrl adds the spec, the progress line and the run folder files.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path
from typing import Any

from rayrl import keys, runtime, spec as spec_mod
from rayrl.spec import Spec
from rayrl.track.naming import run_name


def stop_criteria(spec: Spec) -> dict[str, float]:
    """Tune's stop dict: the run ends when any metric reaches its value."""
    stop: dict[str, float] = {}
    if spec.stop.env_steps is not None:
        stop[keys.ENV_STEPS] = spec.stop.env_steps
    if spec.stop.episode_return is not None:
        stop[keys.EPISODE_RETURN] = spec.stop.episode_return
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
    from rayrl.progress import HistoryWriter, ProgressPrinter
    from rayrl.track.callbacks import logger_callbacks

    trackers = logger_callbacks(spec, phase, paths.name)  # before a restore too: it sets Tune's loggers
    trainable = algorithm_class(spec.algo.name)
    exp_path = _join(paths.storage, paths.name, subdir)
    if tune.Tuner.can_restore(exp_path):
        check_experiment_state(exp_path)
        return tune.Tuner.restore(exp_path, trainable=trainable, resume_unfinished=True, resume_errored=True,
                                  param_space=param_space)
    run_config = tune.RunConfig(
        name=subdir,
        storage_path=_join(paths.storage, paths.name),
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
        failure_config=tune.FailureConfig(max_failures=spec.checkpoint.max_failures if checkpoints else 0),
        callbacks=[ProgressPrinter(verbose_label, show_config=phase != "train"),
                   HistoryWriter(paths.run_dir / "history.csv", phase), *trackers, *(extra_callbacks or [])],
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
    leaves a cut-short file; Tune resumes from the newest one (by name).
    """
    if "://" in exp_path:
        return
    states = sorted(Path(exp_path).glob("experiment_state-*.json"))
    if not states:
        return
    try:
        json.loads(states[-1].read_text())
    except (ValueError, UnicodeDecodeError):
        earlier = (f"move that file aside to resume from the {len(states) - 1} earlier state file(s)" if len(states) > 1
                   else "there is no earlier state file, so")
        raise spec_mod.SpecError(
            f"{states[-1]}: Tune's experiment state is cut short (the run was killed while it was being "
            f"written), so the run cannot resume from it. The checkpoints in {exp_path} are intact: {earlier} "
            "or start again with a new --name.") from None


def trial_dirname(trial: Any) -> str:
    """Short trial folder names (Tune's default spells out the whole config)."""
    return f"{trial.trainable_name}_{trial.trial_id}"


def _join(storage: str, *parts: str) -> str:
    return "/".join([storage.rstrip("/"), *parts])


def run(spec: Spec, paths: runtime.RunPaths) -> dict:
    """Train to the spec's stop criteria (resuming if the run exists); return the summary."""
    spec_mod.dump(spec, paths.run_dir / "spec.yaml")
    start = time.monotonic()
    if spec.population.size >= 2:
        from rayrl import population

        tuner = make_tuner(spec, paths, param_space=population.param_space(spec),
                           tune_config=population.tune_config(spec, paths.run_dir))
    else:
        tuner = make_tuner(spec, paths)
    grid = tuner.fit()
    result = grid[0] if len(grid) == 1 else grid.get_best_result(keys.EPISODE_RETURN, "max", scope="last")
    metrics = result.metrics or {}
    summary = {
        "kind": "train",
        "name": paths.name,
        "algorithm": spec.algo.name,
        "env": spec.env.id,
        "status": "error" if result.error else "finished",
        "error": str(result.error).splitlines()[0] if result.error else None,
        "iterations": metrics.get(keys.ITERATION),
        "env_steps": keys.lookup(metrics, keys.ENV_STEPS),
        "episode_return_mean": keys.lookup(metrics, keys.EPISODE_RETURN),
        "wall_s": round(time.monotonic() - start, 2),
        "time_total_s": metrics.get(keys.TIME_TOTAL),
        "backend": keys.lookup(metrics, keys.BACKEND),
        "num_learners": keys.lookup(metrics, keys.NUM_LEARNERS),
        "global_batch": keys.lookup(metrics, keys.GLOBAL_BATCH),
        "checkpoint": result.checkpoint.path if result.checkpoint else None,
        "resources": trial_resources(spec),
    }
    if len(grid) > 1:  # a population: the best member's figures above, and each member's id
        summary["population"] = {"size": len(grid), "best_trial_id": Path(result.path).name.split("_", 1)[1],
                                 "exploits": _count_rows(paths.run_dir / "population.csv"),
                                 "errored": sum(1 for r in grid if r.error)}
    runtime.write_json(paths.run_dir / "summary.json", summary)
    return summary


def _count_rows(path: Path) -> int:
    return max(0, len(path.read_text().splitlines()) - 1) if path.exists() else 0


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
    paths = runtime.resolve(args.storage, args.name or spec.name)
    runtime.init_ray(args.address, args.num_cpus)
    summary = run(spec, paths)
    ret = summary["episode_return_mean"]
    print(f"rayrl train: {summary['status']} after {summary['iterations']} iterations, "
          f"{summary['env_steps'] or 0:,.0f} env steps, return {ret if ret is not None else float('nan'):.1f}; "
          f"run folder {paths.run_dir}")
    if summary["status"] != "finished":
        print(f"rayrl train: the trial failed: {summary['error']}; run the same command to retry from the "
              "latest checkpoint.")
        return 1
    return 0

