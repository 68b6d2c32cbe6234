"""The Tune adapter: one Tuner for every phase and `rayrl train`, resumed when its experiment exists.

Tune gives a run its checkpoints, retries (FailureConfig) and resume (``Tuner.restore``); rayrl adds
the trainable (tiered checkpoints for `rayrl train`), its callbacks (progress, history.csv, the disk
guard, trackers, the failure budget) and the checks that keep a torn experiment from resuming.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from pathlib import Path
from typing import Any

from ray import tune
from ray.tune import ExperimentAnalysis

from rayrl import runfolder, runtime
from rayrl.errors import SpecError
from rayrl.faults.preemption import DriverPreemption, FailureBudget
from rayrl.observe.live import LiveView, live_ok
from rayrl.observe.progress import HistoryWriter, ProgressPrinter
from rayrl.rllib.algo import algorithm_class, build_config
from rayrl.spec import Spec
from rayrl.storage import tunestate
from rayrl.storage.guard import DiskGuard
from rayrl.track.callbacks import logger_callbacks
from rayrl.track.naming import run_name
from rayrl.tune.sealer import StateSealer
from rayrl.tune.stoppers import stop_criteria
from rayrl.tune.trainable import settings_for, signed_trainable, tiered_trainable


def make_tuner(
    spec: Spec,
    paths: runtime.RunPaths,
    *,
    phase: str = runfolder.TRAIN,
    subdir: str | None = None,
    param_space: Any = None,
    tune_config: Any = None,
    stop: Any = None,
    extra_callbacks: list | None = None,
    verbose_label: str = "train",
    checkpoints: bool = True,
) -> Any:
    """A Tuner for ``spec`` (or resumed from ``paths`` when an experiment is already there).

    ``phase`` names the history rows and the trackers' runs; the experiment's folder is the phase's
    (rayrl.runfolder.PHASE_DIRS) unless ``subdir`` says otherwise.
    """
    subdir = subdir or runfolder.PHASE_DIRS.get(phase, phase)

    trackers = logger_callbacks(spec, phase, paths.name)  # before a restore too: it sets Tune's loggers
    trainable = algorithm_class(spec.algo.name, spec.algo.sample_ahead)
    # The long run (and the drills' copies of it): tiered, verified checkpoints, SIGTERM handling and
    # a failure budget by rate. Sweep trials keep Tune's own checkpoints and lifetime retry count, so
    # one broken search trial errors alone instead of ending the sweep.
    production = checkpoints and phase == runfolder.TRAIN
    if production:
        trainable = tiered_trainable(trainable, settings_for(spec))
    elif checkpoints:
        trainable = signed_trainable(trainable, settings_for(spec))
    # Tune's own console output is off (verbose=0; rayrl.observe.progress prints instead), but its
    # new reporter still prints a banner and a TensorBoard hint into Ray's session folder, not the
    # run folder; RAY_AIR_NEW_OUTPUT=0 is Tune's switch for that reporter (silent at verbose=0).
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    exp_path, fs = paths.experiment(subdir)
    run_stop = stop if stop is not None else stop_criteria(spec)
    view = LiveView if live_ok() else ProgressPrinter
    # The callbacks bound to this machine's run folder and terminal, fresh on every start.
    local = [
        view(verbose_label, show_config=phase != runfolder.TRAIN, stop=run_stop, env_budget=spec.stop.env_steps),
        HistoryWriter(paths.run_dir / runfolder.HISTORY, phase, store=paths.store),
        DiskGuard(paths.run_dir, experiment=None if fs else exp_path),
    ]
    sealer = StateSealer(fs, exp_path) if fs is not None else None
    if sealer is not None:
        local.append(sealer)
    if tune.Tuner.can_restore(exp_path, storage_filesystem=fs):
        if fs is None:
            check_experiment_state(exp_path)
        else:
            tunestate.check_remote(fs, exp_path)
        alias_old_modules()  # experiments written before the layout move pickled the old module paths
        restore = dict(trainable=trainable, resume_unfinished=True, resume_errored=True, storage_filesystem=fs)
        try:
            tuner = tune.Tuner.restore(exp_path, param_space=param_space, **restore)
        except ValueError as exc:
            if "param_space" not in str(exc):
                raise
            # The experiment was started by an older rayrl whose param space had other keys (the
            # confirmation's preset-point choices before its planned-runs searcher): go on with its own.
            tuner = tune.Tuner.restore(exp_path, param_space=None, **restore)
        refresh_callbacks(tuner, local)
        return tuner
    run_config = tune.RunConfig(
        name=subdir,
        **paths.tune_storage(),
        stop=run_stop,
        # Measurement-only trials (the ladder) keep no checkpoints and are not retried: a failing rung
        # is a finding (the ladder ends there), not an accident.
        # A PBT member restores another member's checkpoint some iterations after it was chosen; a keep
        # limit can delete it first ("does not exist on storage anymore"), so a population keeps all.
        checkpoint_config=tune.CheckpointConfig(
            num_to_keep=None if spec.population.size >= 2 and phase == runfolder.TRAIN else spec.checkpoint.keep,
            checkpoint_frequency=spec.checkpoint.every if checkpoints else 0,
            checkpoint_at_end=checkpoints,
        ),
        # `rayrl train`: Tune retries forever and FailureBudget ends the run at max_failures within
        # failure_window_s; sweep trials: max_failures over the trial's life.
        failure_config=tune.FailureConfig(
            max_failures=-1 if production else spec.checkpoint.max_failures if checkpoints else 0
        ),
        callbacks=[
            *local,
            *trackers,
            *(extra_callbacks or []),
            *(
                [FailureBudget(spec.checkpoint.max_failures, spec.checkpoint.failure_window_s), DriverPreemption()]
                if production
                else []
            ),
        ],
        verbose=0,
    )
    tune_config = tune_config or tune.TuneConfig()
    tune_config.trial_dirname_creator = trial_dirname
    tune_config.trial_name_creator = functools.partial(run_name, phase=phase)  # phase, batch, lr: trackers' run name
    tuner = tune.Tuner(
        trainable,
        param_space=param_space if param_space is not None else build_config(spec),
        tune_config=tune_config,
        run_config=run_config,
    )
    if sealer is not None:
        sealer.seal_tuner(tuner)
    return tuner


def refresh_callbacks(tuner: Any, local: list) -> None:
    """Swap the restored printer, history writer and disk guard for this start's own.

    Tune restores the callbacks pickled with the experiment, paths included: a run folder moved, or
    resumed on another machine (from the bucket alone, under another HOME), would append history.csv
    to the writer's old path (FileNotFoundError), and an older rayrl's printer lacks today's fields.
    Tune has no public setter for a restored run config; the trackers and the failure budget stay as
    pickled (their state is the run's, not the machine's).
    """
    inner = getattr(tuner, "_local_tuner", None)
    if inner is None:  # Ray Client: the tuner runs remotely with its own pickled callbacks
        return
    run_config = inner.get_run_config()
    kinds = (ProgressPrinter, HistoryWriter, DiskGuard, StateSealer)
    kept = [c for c in (run_config.callbacks or []) if not isinstance(c, kinds)]
    run_config.callbacks = [*local, *kept]


def check_experiment_state(exp_path: str) -> None:
    """Refuse to resume from a torn experiment state: Tune then restarts the run with no trial and hangs.

    Tune copies experiment_state-*.json to storage non-atomically, so a kill during that copy
    leaves a cut-short file; Tune resumes from the newest one (by name). The whole copy DiskGuard
    kept is put back first (rayrl.storage.tunestate); only without one is this an error.
    """
    if "://" in exp_path:
        return
    repaired = tunestate.repair(Path(exp_path))
    if repaired:
        print(f"[rayrl] {repaired}", flush=True)
    states = sorted(Path(exp_path).glob(tunestate.PATTERN))
    if states and not tunestate.whole(states[-1].read_bytes()):
        earlier = (
            f"move that file aside to resume from the {len(states) - 1} earlier state file(s), or start "
            "again with a new --name."
            if len(states) > 1
            else "there is no earlier state file and no whole copy of it, so start again with a new --name."
        )
        raise SpecError(
            f"{states[-1]}: Tune's experiment state is cut short (the run was killed while it was being "
            f"written), so the run cannot resume from it. The checkpoints in {exp_path} are intact: {earlier}"
        )


def check_run_states(paths: runtime.RunPaths, subdirs: tuple[str, ...]) -> None:
    """check_experiment_state for each of a run's local Tune experiments, before any cluster work."""
    for subdir in subdirs:
        exp_path, fs = paths.experiment(subdir)
        if fs is None:
            check_experiment_state(exp_path)


def trial_dirname(trial: Any) -> str:
    """Short trial folder names (Tune's default spells out the whole config)."""
    return f"{trial.trainable_name}_{trial.trial_id}"


def analysis(paths: runtime.RunPaths, phase: str) -> Any:
    """Tune's view of a finished phase; unlike a ResultGrid it keeps errored trials' configs.

    Tune turns Ctrl-C into a normal return from fit(); a phase with unfinished trials is then not
    done, so it raises KeyboardInterrupt (nothing is written; the same command resumes it).
    """
    subdir = runfolder.PHASE_DIRS[phase]
    path, fs = paths.experiment(subdir)
    if fs is not None:
        tunestate.check_remote(fs, path)
    result = ExperimentAnalysis(path, storage_filesystem=fs)
    if any(t.status not in ("TERMINATED", "ERROR") for t in result.trials):
        raise KeyboardInterrupt(f"{subdir} was interrupted")
    return result


def base_params(spec: Spec) -> dict:
    """The spec's RLlib config as Tune's param space; the batch key is left for the searcher to set."""
    params = build_config(spec).to_dict()
    params.pop("_train_batch_size_per_learner", None)
    return params


def alias_old_modules() -> None:
    """Let Tune unpickle an experiment written before the layout move (rayrl.runfolder.OLD_MODULES).

    Old pickles name classes by their old module (``rayrl.search.DoublingSearcher``); each old name
    resolves to the module that holds the class now. Only called before a restore.
    """
    for old, new in runfolder.OLD_MODULES.items():
        targets = [importlib.import_module(n) for n in new]
        module = sys.modules.get(old)
        if module is None:
            try:
                module = importlib.import_module(old)
            except ImportError:
                module = type(sys)(old)
                sys.modules[old] = module
                parent, _, leaf = old.rpartition(".")
                setattr(importlib.import_module(parent), leaf, module)
        for target in targets:
            for name, value in vars(target).items():
                if not name.startswith("__") and not hasattr(module, name):
                    setattr(module, name, value)
