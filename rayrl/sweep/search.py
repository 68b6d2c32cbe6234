"""Tune-side search: the doubling rule as a Searcher (the ladder); ASHA/HyperBand + Optuna (the search);
the confirmation's planned runs as a Searcher."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import Any

from ray.tune.search import Searcher

from rayrl import spec as spec_mod
from rayrl.observe import keys
from rayrl.runfolder import LadderRow
from rayrl.spec import Spec, scaled_lr, schedule, space
from rayrl.sweep import design, ladder


class PickledSearcher(Searcher):
    """A searcher whose whole state is one pickle, saved with the experiment so a resumed phase goes on.

    ``UNSAVED``: attributes tied to this start (a callback into the driver's other objects): saved as
    None, and a restore keeps this start's values.
    """

    UNSAVED: tuple[str, ...] = ()

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump({**self.__dict__, **dict.fromkeys(self.UNSAVED)}, f)

    def restore(self, checkpoint_path: str) -> None:
        keep = {k: getattr(self, k, None) for k in self.UNSAVED}
        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(pickle.load(f))
        self.__dict__.update(keep)


class DoublingSearcher(PickledSearcher):
    """Proposes one rung at a time and reads its throughput, so the ladder is an ordinary Tune run.

    A rung's figure is the median env steps/s of its measured iterations after warm-up
    (:func:`rayrl.sweep.ladder.rung_throughput`). State is saved with the experiment, so an
    interrupted ladder resumes where it stopped.
    """

    def __init__(self, spec: Spec) -> None:
        super().__init__(metric=keys.ENV_STEPS_PER_S, mode="max")
        d = spec.search.doubling
        self.start, self.factor, self.cap, self.min_gain = d.start, d.factor, d.cap, d.min_gain
        self.warmup, self.measure = d.warmup_iters, d.measure_iters
        self.base_batch, self.base_minibatch = spec.algo.train_batch_per_learner, spec.algo.minibatch_size
        self.rungs: list[ladder.Rung] = []
        self.pending: dict[str, int] = {}  # trial_id -> batch size
        self.samples: dict[str, dict[int, float]] = {}  # trial_id -> {iteration: env steps/s}

    def rows(self) -> list[LadderRow]:
        return ladder.decide(self.rungs, factor=self.factor, cap=self.cap, min_gain=self.min_gain)

    def suggest(self, trial_id: str) -> dict | str | None:
        if self.pending:
            return None  # one rung at a time: the next depends on this one's figure
        batch = ladder.next_batch(
            self.rungs, start=self.start, factor=self.factor, cap=self.cap, min_gain=self.min_gain
        )
        if batch is None:
            return Searcher.FINISHED
        self.pending[trial_id] = batch
        self.samples[trial_id] = {}
        return {
            "train_batch_size_per_learner": batch,
            "minibatch_size": ladder.minibatch_for(batch, self.base_batch, self.base_minibatch),
        }

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        value = keys.lookup(result, keys.ENV_STEPS_PER_S)
        if trial_id in self.samples and value is not None:
            self.samples[trial_id][int(keys.lookup(result, keys.ITERATION, 0))] = float(value)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if result and not error:  # Tune hands the last result here, not to on_trial_result
            self.on_trial_result(trial_id, result)
        batch = self.pending.pop(trial_id, None)
        if batch is None:
            return
        series = [v for _, v in sorted(self.samples.get(trial_id, {}).items())]
        sps = None if error else ladder.rung_throughput(series, self.warmup, self.measure)
        self.rungs.append(ladder.Rung(batch, sps))

    def restore(self, checkpoint_path: str) -> None:
        super().restore(checkpoint_path)
        # A rung that was running when the driver died is measured again from scratch.
        self.pending.clear()


class PlannedRuns(PickledSearcher):
    """The confirmation's planned runs, handed to Tune one by one in order, then FINISHED.

    ``skip(point)``: True for a run not worth starting (the race has ruled its config out); it is passed
    over. Why: each trial costs seconds of process start and build before its
    first result, where the race could stop it. State (the next run) is saved with the experiment, so a
    resumed confirmation plans no run twice; ``skip`` is not saved (after a resume the race starts over).
    """

    UNSAVED = ("skip",)

    def __init__(self, points: Sequence[dict], skip: Callable[[dict], bool] | None = None) -> None:
        super().__init__()
        self.points, self.next = [dict(p) for p in points], 0
        self.skip = skip

    def suggest(self, trial_id: str) -> dict | str | None:
        while self.next < len(self.points):
            point = dict(self.points[self.next])
            self.next += 1
            if self.skip is None or not self.skip(point):
                return point
        return Searcher.FINISHED

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        pass


class Phase2Space:
    """Optuna define-by-run space: lr log-uniform, batch from the admissible ladder and the sizes below its
    start (rayrl.sweep.ladder.search_batches), and the fields of ``search.space``.

    Returns the RLlib config keys as constants so the minibatch follows the batch, the lr follows the
    declared scaling rule, and a searched spec field reaches RLlib through the one adapter that maps
    the spec (:func:`config_delta`). A class (not a closure) so Tune can pickle the searcher.
    """

    def __init__(self, spec: Spec, ladder: list[int]) -> None:
        s, a, r = spec.search, spec.algo, spec.resources
        self.lr_min, self.lr_max, self.ladder = s.lr_min, s.lr_max, list(ladder)
        self.base_batch, self.base_minibatch = a.train_batch_per_learner, a.minibatch_size
        self.learners, self.lr_scaling = r.learners, r.lr_scaling
        self.lr0, self.lr_final, self.horizon = a.lr, a.lr_final, spec.stop.env_steps
        self.spec, self.dims = spec, space.dims(spec)

    def __call__(self, trial: Any) -> dict:
        lr = trial.suggest_float(design.LR_PARAM, self.lr_min, self.lr_max, log=True)
        batch = trial.suggest_categorical(design.BATCH_PARAM, self.ladder)
        out = {
            "lr": schedule.lr(self.lr0, self.lr_final, scaled_lr(lr, self.learners, self.lr_scaling), self.horizon),
            "train_batch_size_per_learner": batch,
            "minibatch_size": ladder.minibatch_for(batch, self.base_batch, self.base_minibatch),
        }
        values = {d.field: d.suggest(trial) for d in self.dims}
        if "algo.minibatch_size" in values:  # at most the batch: the value the trial trains with is recorded
            values["algo.minibatch_size"] = min(int(values["algo.minibatch_size"]), batch)
        if values:
            out.update(config_delta(self.spec, values, batch))
            out.update({space.PARAM_PREFIX + f: v for f, v in values.items()})  # lists decoded, not Optuna's JSON
        return out


def with_values(spec: Spec, values: dict[str, Any], batch: int) -> Spec:
    """The spec a trial of ``values`` (search.space fields) at ``batch`` trains: the minibatch follows the
    batch as the ladder's rule says, or is the searched one, at most the batch."""
    changes = space.sections(values)
    algo = changes.setdefault("algo", {})
    algo["minibatch_size"] = min(
        int(
            algo.get("minibatch_size")
            or ladder.minibatch_for(batch, spec.algo.train_batch_per_learner, spec.algo.minibatch_size)
        ),
        batch,
    )
    algo["train_batch_per_learner"] = batch
    return spec_mod.replace(spec, **changes)


def config_delta(spec: Spec, values: dict[str, Any], batch: int) -> dict:
    """The RLlib config keys that ``values`` change at ``batch``: build_config of the spec with and
    without them, compared key by key (so each field maps to RLlib in one place, rayrl.rllib.algo)."""
    from rayrl.rllib.algo import build_config

    base = build_config(with_values(spec, {}, batch)).to_dict()
    new = build_config(with_values(spec, values, batch)).to_dict()
    # repr as well as ==: a connector factory is a new functools.partial per build, equal in all but identity
    return {
        k: v for k, v in new.items() if k != "lr" and (k not in base or (base[k] != v and repr(base[k]) != repr(v)))
    }


def phase2_tune_config(spec: Spec, ladder: list[int], max_concurrent: int) -> Any:
    """TuneConfig with ASHA (or HyperBand) over env steps and a seeded Optuna TPE searcher whose first
    trials are a Latin hypercube over lr x batch (rayrl.sweep.design), TPE's model the rest."""
    import optuna
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, HyperBandScheduler
    from ray.tune.search.optuna import OptunaSearch

    s = spec.search
    if s.scheduler == "asha":
        scheduler = ASHAScheduler(
            time_attr=keys.ENV_STEPS,
            max_t=s.max_env_steps,
            grace_period=s.grace_env_steps,
            reduction_factor=s.reduction_factor,
        )
    else:
        scheduler = HyperBandScheduler(
            time_attr=keys.ENV_STEPS, max_t=s.max_env_steps, reduction_factor=s.reduction_factor
        )
    # The return key is in every result (NaN until the first episode/evaluation): ASHA neither stops a
    # trial on a NaN nor counts it in a rung's cutoff; Optuna records a trial that ends on NaN as failed.
    metric = keys.return_key(spec.judged_by)
    startup = design.startup_count(s.num_samples)
    searcher = OptunaSearch(
        space=Phase2Space(spec, ladder),
        metric=metric,
        mode="max",
        sampler=optuna.samplers.TPESampler(seed=spec.seed, n_startup_trials=startup),
        points_to_evaluate=design.latin_hypercube(startup, s.lr_min, s.lr_max, ladder, spec.seed),
    )
    return tune.TuneConfig(
        metric=metric,
        mode="max",
        scheduler=scheduler,
        search_alg=searcher,
        num_samples=s.num_samples,
        max_concurrent_trials=max_concurrent,
    )
