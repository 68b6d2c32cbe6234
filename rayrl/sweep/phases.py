"""The ladder and the search, each one Tune experiment whose results become run-folder rows.

``ladder`` measures the doubling rule's rungs (rayrl.sweep.ladder), ``search`` runs ASHA or HyperBand
with Optuna TPE over lr x batch (env steps are the time unit; rayrl.sweep.search). A phase already
finished is read back from its CSV. The confirmation is rayrl.sweep.confirm_run.
"""

from __future__ import annotations

import math
from typing import Any

from ray import tune

from rayrl import runfolder, runtime
from rayrl.observe import keys
from rayrl.spec import Spec, space
from rayrl.sweep import ladder as doubling
from rayrl.sweep.search import DoublingSearcher, phase2_tune_config
from rayrl.tune import resources
from rayrl.tune.tuner import analysis, base_params, make_tuner


def ladder(spec: Spec, paths: runtime.RunPaths) -> tuple[list[runfolder.LadderRow], int]:
    """The ladder: the rungs and their decisions (doubling.csv), and the env steps they cost."""
    done = paths.run_dir / runfolder.DOUBLING
    if done.exists():
        rows = runfolder.read_doubling(done)
        print(f"[sweep] ladder already finished ({len(rows)} rungs in {done}); not repeating it", flush=True)
        return rows, runfolder.phase_env_steps(paths.run_dir / runfolder.HISTORY, runfolder.LADDER)
    d = spec.search.doubling
    tuner = make_tuner(
        spec,
        paths,
        phase=runfolder.LADDER,
        param_space=base_params(spec),
        tune_config=tune.TuneConfig(
            search_alg=DoublingSearcher(spec),
            num_samples=doubling.max_rungs(d.start, d.factor, d.cap),
            max_concurrent_trials=1,
        ),
        stop={keys.ITERATION: d.warmup_iters + d.measure_iters},
        checkpoints=False,
        verbose_label="ladder",
    )
    tuner.fit()
    rungs = []
    steps = 0
    done_ladder = analysis(paths, runfolder.LADDER)
    frames = done_ladder.trial_dataframes
    for trial in sorted(done_ladder.trials, key=lambda t: keys.config_batch_lr(t.config)[0]):
        df = frames.get(trial.trial_id)
        series = [] if df is None or keys.ENV_STEPS_PER_S not in df else list(df[keys.ENV_STEPS_PER_S])
        sps = None if trial.status == "ERROR" else doubling.rung_throughput(series, d.warmup_iters, d.measure_iters)
        rungs.append(doubling.Rung(int(keys.config_batch_lr(trial.config)[0]), sps))
        steps += int(keys.lookup(trial.last_result or {}, keys.ENV_STEPS, 0) or 0)
    rows = doubling.decide(rungs, factor=d.factor, cap=d.cap, min_gain=d.min_gain)
    runfolder.write_doubling(paths, rows)
    return rows, steps


def search(spec: Spec, paths: runtime.RunPaths, batches: list[int]) -> tuple[list[dict], int]:
    """The search: ASHA/HyperBand + Optuna over lr x batch; trials.csv's rows and the env steps they cost."""
    s = spec.search
    concurrent = concurrency(spec)
    print(
        f"[sweep] search: {s.num_samples} trials, {s.scheduler}, up to {concurrent} at once "
        f"(each holds {resources.of_spec(spec)})",
        flush=True,
    )
    stop: dict[str, float] = {keys.ENV_STEPS: s.max_env_steps}
    if spec.stop.episode_return is not None:
        stop[keys.return_key(spec.judged_by)] = spec.stop.episode_return
    tuner = make_tuner(
        spec,
        paths,
        phase=runfolder.SEARCH,
        param_space=base_params(spec),
        tune_config=phase2_tune_config(spec, batches, concurrent),
        stop=stop,
        verbose_label="search",
    )
    tuner.fit()
    trials = [trial_row(t, spec) for t in analysis(paths, runfolder.SEARCH).trials]
    runfolder.write_csv(paths, runfolder.TRIALS, runfolder.TRIALS_COLUMNS + space_columns(spec), trials)
    return trials, sum(int(t["env_steps"] or 0) for t in trials)


def concurrency(spec: Spec) -> int:
    """Trials at once: search.max_concurrent, else as many as fit in the cluster."""
    return resources.max_concurrent_trials(
        runtime.cluster_resources(), resources.of_spec(spec), spec.search.max_concurrent
    )


def trial_row(trial: Any, spec: Spec) -> dict:
    """trials.csv's row for one search trial."""
    m = trial.last_result or {}
    ret = keys.lookup(m, keys.return_key(spec.judged_by))
    steps = keys.lookup(m, keys.ENV_STEPS)
    if trial.status == "ERROR":
        status = "error"
    elif runfolder.reached(ret, spec.stop.episode_return):
        status = "reached_target"
    elif steps is not None and steps >= spec.search.max_env_steps:
        status = "completed"
    else:
        status = "stopped_early"
    batch, lr = keys.config_batch_lr(trial.config)
    return {
        "trial_id": trial.trial_id,
        "batch_size": batch,
        "lr": trial.config.get("rayrl_lr", lr),
        "env_steps": steps,
        "status": status,
        "episode_return_mean": finite(ret),
        **searched_cells(trial.config, spec),
    }


def space_columns(spec: Spec) -> tuple[str, ...]:
    """trials.csv's and confirm.csv's columns for the fields of search.space, in the spec's order."""
    return tuple(space.columns(list(spec.search.space)).values())


def searched_cells(config: dict, spec: Spec) -> dict:
    """A trial's searched values (search.space) as CSV cells under their columns."""
    names = space.columns(list(spec.search.space))
    return {col: space.cell(config.get(space.PARAM_PREFIX + f)) for f, col in names.items()}


def finite(value: Any) -> float | None:
    """A reported number as a float, or None when missing or not finite (NaN before any episode)."""
    return None if value is None or not math.isfinite(value) else float(value)
