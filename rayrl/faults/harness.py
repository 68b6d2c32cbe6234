"""What every fault drill shares: the scratch spec and folder, a Tune run watched from the driver,
finding and killing our own processes, and the result row.

It exists so the drills (`rayrl.faults.drills`, `rayrl.faults.driver_drill`) and `rayrl drill` itself
(`rayrl.faults.drill`) take their budgets, timing and kill helpers from one place.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rayrl import runfolder, runtime
from rayrl import spec as spec_mod
from rayrl.observe import keys
from rayrl.spec import Spec
from rayrl.storage.files import write_local

SCRATCH = "drills"  #: RUN_DIR/drills/: the drills' scratch runs, never part of the run itself
BATCH = 512  #: train batch of every drill run (tiny: an iteration takes about a second on 2 cores)
MINIBATCH = 128
KILL_AFTER_ITERS = 3  #: results seen before a fault is injected
AFTER_RECOVERY = 2  #: results required after recovery before a drill run stops


def say(message: str) -> None:
    """One progress line."""
    print(f"[drill] {message}", flush=True)


# ---------------------------------------------------------------------------------------------
# The scratch spec


def drill_runners(spec: Spec) -> int:
    """EnvRunners of the drills that kill one (EnvRunner, node): at least 2, so one survives the kill."""
    return max(spec.resources.env_runners, 2)


def drill_spec(spec: Spec, name: str, *, env_runners: int | None = None, kind: str = "train") -> Spec:
    """A copy of ``spec`` with tiny budgets: same env, algorithm, learners and precision."""
    r = spec.resources
    data = spec_mod.to_dict(spec)
    data["name"] = name
    data["env"]["envs_per_runner"] = min(spec.env.envs_per_runner, 4)
    data["algo"].update(train_batch_per_learner=BATCH, minibatch_size=MINIBATCH, epochs=min(spec.algo.epochs, 2))
    data["resources"]["env_runners"] = r.env_runners if env_runners is None else env_runners
    data["stop"] = {"env_steps": BATCH * 400, "episode_return": None, "wall_s": None}
    # at least 3 retries (a drill kills on purpose); -1 (retry forever) stays -1
    failures = spec.checkpoint.max_failures
    data["checkpoint"] = {"every": 1, "keep": 2, "max_failures": -1 if failures == -1 else max(failures, 3)}
    if kind == "sweep":
        # Two rungs, then four short search trials one at a time (no early stopping), so the kill
        # lands between a finished trial and a running one.
        data["search"].update(
            doubling={
                "start": BATCH,
                "factor": 2,
                "cap": 2 * BATCH,
                "min_gain": spec.search.doubling.min_gain,
                "warmup_iters": 0,
                "measure_iters": 1,
            },
            num_samples=4,
            max_env_steps=BATCH * 6,
            grace_env_steps=BATCH * 6,
            max_concurrent=1,
        )
    elif kind == "driver":
        data["stop"]["env_steps"] = BATCH * 48  # room past the kill point, however fast it trains
    return spec_mod.from_dict(data)


def scratch(storage: Path, name: str) -> runtime.RunPaths:
    """A fresh scratch run folder ``storage/name`` (a previous drill's is removed first)."""
    target = storage / name
    if target.exists():
        shutil.rmtree(target)
    return runtime.resolve(str(storage), name)


# ---------------------------------------------------------------------------------------------
# Watching a Tune run from inside the driver


class Monitor:
    """What the drill sees of a Tune run: timestamped results, checkpoints and retries.

    Times are wall-clock (``time.time``) so a kill timed on another node compares with them. The
    injector thread only reads the list (appends are atomic), so no lock is needed and the
    callback that holds this pickles cleanly into Tune's tuner.pkl.
    """

    def __init__(self, budget_s: float) -> None:
        self.events: list[tuple[float, str, dict]] = []
        self.deadline = time.time() + budget_s
        self.done = False

    def add(self, kind: str, **data: Any) -> None:
        """Record one Tune event now."""
        self.events.append((time.time(), kind, data))

    def results(self, after: float = 0.0) -> list[tuple[float, dict]]:
        """(time, result) of the results seen after ``after``: recovery is timed from these."""
        return [(t, d) for t, kind, d in list(self.events) if kind == "result" and t > after]

    def first(self, kind: str, after: float = 0.0) -> float | None:
        """When the first ``kind`` event after ``after`` came, if one did."""
        return next((t for t, k, _ in list(self.events) if k == kind and t > after), None)

    def first_result_after(self, kind: str, after: float) -> float | None:
        """When the first result came that followed the first ``kind`` event after ``after``.

        Recovery is timed from this: a result the killed actor sent just before the kill can reach
        the driver after it, and would read as a recovery in milliseconds.
        """
        since = self.first(kind, after=after)
        return None if since is None else next((t for t, _ in self.results(after=since)), None)

    def count(self, kind: str, after: float = 0.0) -> int:
        """How many ``kind`` events came after ``after`` (checkpoints, retries, errors)."""
        return sum(1 for t, k, _ in list(self.events) if k == kind and t > after)


def _tune_hooks(monitor: Monitor) -> tuple[Any, Any]:
    """(Tune callback, Tune stopper) feeding and obeying ``monitor``."""
    from ray.tune import Callback, Stopper

    class Recorder(Callback):
        def __init__(self, m: Monitor) -> None:
            self.m = m

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
            ft = result.get("fault_tolerance") or {}
            self.m.add(
                "result",
                iteration=int(result.get(keys.ITERATION, 0)),
                env_steps=keys.lookup(result, keys.ENV_STEPS),
                healthy=ft.get("num_healthy_workers"),
                restarts=ft.get("num_remote_worker_restarts"),
                since_restore=result.get("iterations_since_restore"),
                newer_than_registered=bool(
                    keys.lookup(result, keys.CHECKPOINT_COUNTS["restored_newer_than_registered"], 0)
                ),
            )

        def on_checkpoint(self, iteration: int, trials: list, trial: Any, checkpoint: Any, **info: Any) -> None:
            self.m.add("checkpoint", iteration=int((trial.last_result or {}).get(keys.ITERATION, 0)))

        def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            # Tune's latest registered checkpoint, which it hands the retry (the tiered trainable may
            # restore a newer intact one that a save the kill cut off left behind).
            latest = trial.latest_checkpoint_result
            metrics = (latest.metrics or {}) if latest is not None else {}
            self.m.add("recover", from_iteration=int(metrics.get(keys.ITERATION, 0)) if latest else None)

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.m.add("error")

    class Until(Stopper):
        """Stop once the drill has seen enough after the recovery (or ran out of time)."""

        def __init__(self, m: Monitor) -> None:
            self.m = m

        def __call__(self, trial_id: str, result: dict) -> bool:
            return self.m.done or time.time() > self.m.deadline

        def stop_all(self) -> bool:
            return False

    return Recorder(monitor), Until(monitor)


def wait_for(predicate: Callable[[], Any], deadline: float, step: float = 0.2) -> Any:
    """Poll ``predicate`` until it is truthy (its value) or ``deadline`` (wall time) passes (None)."""
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return None


def our_actors(class_name: str) -> list[dict]:
    """ALIVE actors of this driver's job with that class name (other users' actors never match)."""
    import ray
    from ray._private import state

    job = ray.get_runtime_context().get_job_id()
    table = state.actors(job_id=ray.JobID.from_hex(job), actor_state_name="ALIVE")
    return [a for a in table.values() if a["ActorClassName"] == class_name]


def kill_pid(pid: int, node_id: str) -> float:
    """SIGKILL a process on any node of the cluster; returns the wall time of the kill."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if node_id == ray.get_runtime_context().get_node_id():
        os.kill(pid, signal.SIGKILL)
        return time.time()

    @ray.remote(num_cpus=0)
    def kill(pid: int) -> float:
        os.kill(pid, signal.SIGKILL)
        return time.time()

    return ray.get(
        kill.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(pid), timeout=60
    )


def run_with_fault(
    spec: Spec, paths: runtime.RunPaths, monitor: Monitor, label: str, inject: Callable[[], dict]
) -> tuple[Any, dict]:
    """Train ``spec`` under Tune in this process while ``inject`` runs in a thread; (result, info)."""
    from rayrl.tune.tuner import make_tuner

    info: dict = {}

    def injector() -> None:
        try:
            info.update(inject())
        except Exception as exc:  # a drill that cannot inject is a failed drill, not a crash
            info["problem"] = f"{type(exc).__name__}: {exc}"
        finally:
            monitor.done = True

    write_local(
        paths.run_dir / runfolder.SPEC, spec_mod.dumps(spec).encode()
    )  # the scratch folder reads like any train run's
    callback, stopper = _tune_hooks(monitor)
    tuner = make_tuner(spec, paths, stop=stopper, extra_callbacks=[callback], verbose_label=f"drill {label}")
    thread = threading.Thread(target=injector, daemon=True)
    thread.start()
    grid = tuner.fit()
    monitor.done = True
    thread.join(timeout=30)
    return grid[0], info


def ready_to_kill(monitor: Monitor, need_checkpoint: bool) -> bool:
    """Training is under way (and has a checkpoint to recover from, if the drill needs one)."""
    return len(monitor.results()) >= KILL_AFTER_ITERS and (not need_checkpoint or monitor.count("checkpoint") > 0)


def after_recovery(monitor: Monitor, since: float) -> bool:
    """Enough results since ``since`` to show training goes on after the recovery."""
    return len(monitor.results(after=since)) >= AFTER_RECOVERY


def outcome(name: str, ok: bool, recovery_s: float | None, **detail: Any) -> dict:
    """One drill's row in drill.json (the shape `rayrl report` and `rayrl doctor` read)."""
    return {
        "name": name,
        "outcome": "recovered" if ok else "failed",
        "recovery_s": None if recovery_s is None else round(recovery_s, 2),
        **detail,
    }
