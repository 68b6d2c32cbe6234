"""`rayrl drill RUN_DIR`: fault drills on a scratch copy of a run's spec, and a restore of every checkpoint.

A long run is only as good as its recovery, and recovery that is never exercised rots. The drills
kill real processes the way a cluster loses them and time how long training takes to come back:

- ``env_runner``: SIGKILL one EnvRunner actor; RLlib restarts it, resyncs its weights and counts
  the restart (``fault_tolerance/num_remote_worker_restarts``), and training never stops.
- ``trial``: SIGKILL the trial's own actor; Tune retries it from its latest checkpoint and the
  counters (iteration, env steps) go on from that checkpoint, not from zero.
- ``driver``: ``kill -9`` the driver (the sweep during phase 2, or ``rayrl train``) and run the same
  command again: it resumes, phase 1 and finished trials are kept, no file already written changes.
- ``node`` (only on a cluster with more than one node): kill the raylet of a worker node that hosts
  the drill's actors; training survives on the remaining nodes.

Drills never touch the user's run: they train a copy of its spec with tiny budgets under
``RUN_DIR/drills/`` (wiped before each drill). The restore check then loads every kept checkpoint
of the run itself with ``Algorithm.from_checkpoint`` (read only) and plays one greedy episode with
each. Results go to ``RUN_DIR/drill.json``, which `rayrl report` and `rayrl doctor` read.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from rayrl import keys, runtime, spec as spec_mod
from rayrl.runfolder import RunFolderError, load as load_run
from rayrl.spec import Spec, SpecError

DRILLS = ("env_runner", "trial", "driver", "node")
SCRATCH = "drills"
EXIT_USAGE = 2
BATCH = 512          #: train batch of every drill run (tiny: an iteration takes about a second on 2 cores)
MINIBATCH = 128
KILL_AFTER_ITERS = 3  #: results seen before a fault is injected
AFTER_RECOVERY = 2    #: results required after recovery before a drill run stops
_SWEEP_MAIN = "import sys; from rayrl.sweep import main; sys.exit(main(sys.argv[1:]))"


class DrillError(Exception):
    """A drill cannot be set up here (bad run folder, unreachable cluster); the message says why."""


def say(message: str) -> None:
    """One progress line."""
    print(f"[drill] {message}", flush=True)


# ---------------------------------------------------------------------------------------------
# The scratch spec


def drill_spec(spec: Spec, name: str, *, env_runners: int | None = None, kind: str = "train") -> Spec:
    """A copy of ``spec`` with tiny budgets: same env, algorithm, learners and precision."""
    r = spec.resources
    data = spec_mod.to_dict(spec)
    data["name"] = name
    data["env"]["envs_per_runner"] = min(spec.env.envs_per_runner, 4)
    data["algo"].update(train_batch_per_learner=BATCH, minibatch_size=MINIBATCH, epochs=min(spec.algo.epochs, 2))
    data["resources"]["env_runners"] = r.env_runners if env_runners is None else env_runners
    data["stop"] = {"env_steps": BATCH * 400, "episode_return": None, "wall_s": None}
    data["checkpoint"] = {"every": 1, "keep": 2, "max_failures": max(spec.checkpoint.max_failures, 3)}
    if kind == "sweep":
        # Two rungs, then four short phase-2 trials one at a time (no early stopping), so the kill
        # lands between a finished trial and a running one.
        data["search"].update(
            doubling={"start": BATCH, "factor": 2, "cap": 2 * BATCH, "min_gain": spec.search.doubling.min_gain,
                      "warmup_iters": 0, "measure_iters": 1},
            num_samples=4, max_env_steps=BATCH * 6, grace_env_steps=BATCH * 6, max_concurrent=1)
    elif kind == "driver":
        data["stop"]["env_steps"] = BATCH * 16
    return spec_mod.from_dict(data)


def _scratch(storage: Path, name: str) -> runtime.RunPaths:
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
        self.events.append((time.time(), kind, data))

    def results(self, after: float = 0.0) -> list[tuple[float, dict]]:
        return [(t, d) for t, kind, d in list(self.events) if kind == "result" and t > after]

    def count(self, kind: str, after: float = 0.0) -> int:
        return sum(1 for t, k, _ in list(self.events) if k == kind and t > after)


def _tune_hooks(monitor: Monitor) -> tuple[Any, Any]:
    """(Tune callback, Tune stopper) feeding and obeying ``monitor``."""
    from ray.tune import Callback, Stopper

    class Recorder(Callback):
        def __init__(self, m: Monitor) -> None:
            self.m = m

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
            ft = result.get("fault_tolerance") or {}
            self.m.add("result", iteration=int(result.get(keys.ITERATION, 0)),
                       env_steps=keys.lookup(result, keys.ENV_STEPS), healthy=ft.get("num_healthy_workers"),
                       restarts=ft.get("num_remote_worker_restarts"))

        def on_checkpoint(self, iteration: int, trials: list, trial: Any, checkpoint: Any, **info: Any) -> None:
            self.m.add("checkpoint", iteration=int((trial.last_result or {}).get(keys.ITERATION, 0)))

        def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.m.add("recover")

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


def _wait(predicate: Callable[[], Any], deadline: float, step: float = 0.2) -> Any:
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return None


def _our_actors(class_name: str) -> list[dict]:
    """ALIVE actors of this driver's job with that class name (other users' actors never match)."""
    import ray
    from ray._private import state

    job = ray.get_runtime_context().get_job_id()
    table = state.actors(job_id=ray.JobID.from_hex(job), actor_state_name="ALIVE")
    return [a for a in table.values() if a["ActorClassName"] == class_name]


def _kill_pid(pid: int, node_id: str) -> float:
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

    return ray.get(kill.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
                   .remote(pid), timeout=60)


def _run_with_fault(spec: Spec, paths: runtime.RunPaths, monitor: Monitor, label: str,
                    inject: Callable[[], dict]) -> tuple[Any, dict]:
    """Train ``spec`` under Tune in this process while ``inject`` runs in a thread; (result, info)."""
    from rayrl.train import make_tuner

    info: dict = {}

    def injector() -> None:
        try:
            info.update(inject())
        except Exception as exc:  # a drill that cannot inject is a failed drill, not a crash
            info["problem"] = f"{type(exc).__name__}: {exc}"
        finally:
            monitor.done = True

    spec_mod.dump(spec, paths.run_dir / "spec.yaml")  # the scratch folder reads like any train run's
    callback, stopper = _tune_hooks(monitor)
    tuner = make_tuner(spec, paths, stop=stopper, extra_callbacks=[callback], verbose_label=f"drill {label}")
    thread = threading.Thread(target=injector, daemon=True)
    thread.start()
    grid = tuner.fit()
    monitor.done = True
    thread.join(timeout=30)
    return grid[0], info


def _ready_to_kill(monitor: Monitor, need_checkpoint: bool) -> bool:
    return len(monitor.results()) >= KILL_AFTER_ITERS and (not need_checkpoint or monitor.count("checkpoint") > 0)


def _after_recovery(monitor: Monitor, since: float) -> bool:
    return len(monitor.results(after=since)) >= AFTER_RECOVERY


def _outcome(name: str, ok: bool, recovery_s: float | None, **detail: Any) -> dict:
    return {"name": name, "outcome": "recovered" if ok else "failed",
            "recovery_s": None if recovery_s is None else round(recovery_s, 2), **detail}


# ---------------------------------------------------------------------------------------------
# In-process drills: env runner, trial, node


def env_runner_drill(spec: Spec, storage: Path, timeout_s: float = 600.0) -> dict:
    """Kill one EnvRunner actor mid-training; recovered when every runner is healthy again and the
    restart is counted, with the trial itself never failing."""
    runners = max(spec.resources.env_runners, 2)
    dspec = drill_spec(spec, "env_runner", env_runners=runners)
    monitor = Monitor(timeout_s)

    def inject() -> dict:
        if not _wait(lambda: _ready_to_kill(monitor, False), monitor.deadline):
            return {"problem": "training produced no results to interrupt"}
        actor = _wait(lambda: _our_actors("SingleAgentEnvRunner"), monitor.deadline)
        if not actor:
            return {"problem": "no EnvRunner actor found to kill"}
        before = monitor.results()[-1][1]
        t_kill = _kill_pid(actor[0]["Pid"], actor[0]["Address"]["NodeID"])
        say(f"env_runner: killed EnvRunner pid {actor[0]['Pid']} at iteration {before['iteration']}")

        def back() -> float | None:
            for t, r in monitor.results(after=t_kill):
                if (r["restarts"] or 0) > (before["restarts"] or 0) and r["healthy"] == runners:
                    return t
            return None

        t_back = _wait(back, monitor.deadline)
        if t_back:
            _wait(lambda: _after_recovery(monitor, t_back), monitor.deadline)
        return {"t_kill": t_kill, "t_back": t_back, "killed_at_iteration": before["iteration"]}

    result, info = _run_with_fault(dspec, _scratch(storage, "env_runner"), monitor, "env_runner", inject)
    after = monitor.results(after=info.get("t_kill", float("inf")))
    last = after[-1][1] if after else {}
    ok = (info.get("t_back") is not None and result.error is None and monitor.count("recover") == 0
          and monitor.count("error") == 0)
    recovery = info["t_back"] - info["t_kill"] if info.get("t_back") else None
    return _outcome("env_runner", ok, recovery, env_runners=runners, restarts=last.get("restarts"),
                    killed_at_iteration=info.get("killed_at_iteration"), final_iteration=last.get("iteration"),
                    trial_failures=monitor.count("error") + monitor.count("recover"),
                    **({"problem": info["problem"]} if "problem" in info else {}))


def trial_drill(spec: Spec, storage: Path, timeout_s: float = 600.0) -> dict:
    """Kill the trial's actor; recovered when Tune has retried it from its latest checkpoint, the
    first result after the retry continues that checkpoint's counters, and the trial finishes."""
    from rayrl.algo import algorithm_class

    dspec = drill_spec(spec, "trial")
    monitor = Monitor(timeout_s)
    cls = algorithm_class(dspec.algo.name).__name__

    def inject() -> dict:
        if not _wait(lambda: _ready_to_kill(monitor, True), monitor.deadline):
            return {"problem": "training produced no checkpoint to recover from"}
        actor = _wait(lambda: _our_actors(cls), monitor.deadline)
        if not actor:
            return {"problem": f"no {cls} trial actor found to kill"}
        before = monitor.results()[-1][1]
        t_kill = _kill_pid(actor[0]["Pid"], actor[0]["Address"]["NodeID"])
        say(f"trial: killed the {cls} trial actor pid {actor[0]['Pid']} at iteration {before['iteration']}")
        t_back = _wait(lambda: next((t for t, _ in monitor.results(after=t_kill)), None), monitor.deadline)
        if t_back:
            _wait(lambda: _after_recovery(monitor, t_back), monitor.deadline)
        return {"t_kill": t_kill, "t_back": t_back, "killed_at_iteration": before["iteration"],
                "env_steps_at_kill": before["env_steps"]}

    result, info = _run_with_fault(dspec, _scratch(storage, "trial"), monitor, "trial", inject)
    if "t_kill" not in info:
        return _outcome("trial", False, None, problem=info.get("problem", "no kill"))
    t_kill, t_back = info["t_kill"], info.get("t_back")
    checkpoints = [d["iteration"] for t, k, d in monitor.events if k == "checkpoint" and t < (t_back or 0)]
    first = next((d for t, d in monitor.results(after=t_kill)), {})
    resumed_from = max(checkpoints) if checkpoints else None
    continued = bool(first) and resumed_from is not None and first["iteration"] == resumed_from + 1 \
        and first["iteration"] > 1 and (first["env_steps"] or 0) > 0
    ok = t_back is not None and monitor.count("recover") >= 1 and continued and result.error is None \
        and result.metrics is not None
    return _outcome("trial", ok, t_back - t_kill if t_back else None, retries=monitor.count("recover"),
                    killed_at_iteration=info["killed_at_iteration"], resumed_from_checkpoint_iteration=resumed_from,
                    first_iteration_after=first.get("iteration"), first_env_steps_after=first.get("env_steps"),
                    env_steps_at_kill=info.get("env_steps_at_kill"),
                    final_iteration=(result.metrics or {}).get(keys.ITERATION),
                    **({"problem": info["problem"]} if "problem" in info else {}))


def node_drill(spec: Spec, storage: Path, timeout_s: float = 600.0) -> dict:
    """Kill the raylet of a worker node hosting the drill's actors (never the driver's node);
    recovered when training goes on with every EnvRunner healthy and the trial finishes."""
    import ray

    from rayrl.algo import algorithm_class

    runners = max(spec.resources.env_runners, 2)
    dspec = drill_spec(spec, "node", env_runners=runners)
    monitor = Monitor(timeout_s)
    cls = algorithm_class(dspec.algo.name).__name__
    driver_node = ray.get_runtime_context().get_node_id()

    def inject() -> dict:
        if not _wait(lambda: _ready_to_kill(monitor, True), monitor.deadline):
            return {"problem": "training produced no checkpoint before the node kill"}
        actors = _our_actors("SingleAgentEnvRunner") + _our_actors(cls)
        hosts: dict[str, list[str]] = {}
        for a in actors:
            hosts.setdefault(a["Address"]["NodeID"], []).append(a["ActorClassName"])
        # Prefer a node with env runners but not the trial actor: the pure "lost capacity" case.
        candidates = sorted((n for n in hosts if n != driver_node), key=lambda n: cls in hosts[n])
        if not candidates:
            return {"problem": "every drill actor runs on the driver's node; no worker node to kill"}
        node = candidates[0]
        before = monitor.results()[-1][1]
        t_kill = _kill_raylet(node)
        say(f"node: killed the raylet of node {node[:8]} (hosting {', '.join(sorted(hosts[node]))}) at "
            f"iteration {before['iteration']}")

        def back() -> float | None:
            for t, r in monitor.results(after=t_kill):
                retried = monitor.count("recover", after=t_kill) > 0
                if r["healthy"] == runners and ((r["restarts"] or 0) > (before["restarts"] or 0) or retried):
                    return t
            return None

        t_back = _wait(back, monitor.deadline)
        if t_back:
            _wait(lambda: _after_recovery(monitor, t_back), monitor.deadline)
        return {"t_kill": t_kill, "t_back": t_back, "node": node, "hosted": sorted(hosts[node]),
                "killed_at_iteration": before["iteration"]}

    result, info = _run_with_fault(dspec, _scratch(storage, "node"), monitor, "node", inject)
    t_back = info.get("t_back")
    ok = t_back is not None and result.error is None
    return _outcome("node", ok, t_back - info["t_kill"] if t_back else None, node=info.get("node"),
                    hosted=info.get("hosted"), retries=monitor.count("recover"),
                    killed_at_iteration=info.get("killed_at_iteration"),
                    final_iteration=(result.metrics or {}).get(keys.ITERATION),
                    **({"problem": info["problem"]} if "problem" in info else {}))


def _kill_raylet(node_id: str) -> float:
    """SIGKILL the raylet of ``node_id`` half a second after a task there reports its pid."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0, max_retries=0)
    def kill_parent_raylet() -> float:
        import psutil

        raylet = psutil.Process(os.getppid())
        if "raylet" not in raylet.name():
            raise RuntimeError(f"the worker's parent is {raylet.name()!r}, not the raylet")
        threading.Timer(0.5, raylet.kill).start()  # after this task has returned its answer
        return time.time() + 0.5

    strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
    return ray.get(kill_parent_raylet.options(scheduling_strategy=strategy).remote(), timeout=60)


# ---------------------------------------------------------------------------------------------
# The driver drill: a subprocess killed with SIGKILL and started again


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _newest_state(exp: Path) -> list[dict]:
    """Trial states in Tune's newest experiment_state file ([] while missing or mid-write)."""
    files = sorted(exp.glob("experiment_state-*.json"))
    if not files:
        return []
    try:
        return [json.loads(t[0]) for t in json.loads(files[-1].read_text())["trial_data"]]
    except (ValueError, KeyError, IndexError, TypeError, OSError):
        return []


def _history_rows(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _parse_rows(lines: list[str]) -> list[dict]:
    """history.csv lines (header first) as dicts."""
    import csv

    return list(csv.DictReader(lines)) if len(lines) > 1 else []


def driver_drill(spec: Spec, kind: str, storage: Path, *, address: str | None, num_cpus: int | None,
                 timeout_s: float = 900.0) -> dict:
    """SIGKILL the driver's process group mid-run (a sweep in phase 2, or `rayrl train` after a
    checkpoint), run the same command again, and check what was kept."""
    sweep = kind == "sweep"
    dspec = drill_spec(spec, "driver", kind="sweep" if sweep else "driver")
    paths = _scratch(storage, "driver")
    config = storage / "driver.yaml"
    spec_mod.dump(dspec, config)
    args = ["--config", str(config), "--storage", str(storage), "--name", "driver"]
    if address is None:
        args += ["--num-cpus", str(num_cpus or os.cpu_count() or 2)]
    cmd = [sys.executable, "-c", _SWEEP_MAIN, *args] if sweep else \
        [sys.executable, "-m", "rayrl.cli", "train", *args]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    env.pop("RAY_ADDRESS", None)
    if address is not None:
        env["RAY_ADDRESS"] = address
    run_dir, history = paths.run_dir, paths.run_dir / "history.csv"
    deadline = time.time() + timeout_s

    def ready() -> dict | None:
        if sweep:
            states = [s.get("status") for s in _newest_state(run_dir / "phase2")]
            done = states.count("TERMINATED")
            if done >= 1 and "RUNNING" in states and done < dspec.search.num_samples:
                return {"killed_at": f"phase 2, {done} of {dspec.search.num_samples} trials finished"}
            return None
        ckpts = list((run_dir / "tune").glob("*/checkpoint_*"))
        rows = len(_history_rows(history)) - 1
        return {"killed_at": f"iteration {rows}"} if ckpts and rows >= KILL_AFTER_ITERS else None

    say(f"driver: started {'the sweep' if sweep else 'rayrl train'} on a scratch spec; waiting for "
        f"{'a finished phase-2 trial' if sweep else 'a checkpoint'}")
    with (storage / "driver.log").open("w") as log:
        first = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            where = _wait(lambda: ready() or (first.poll() is not None and {"exited": first.returncode}),
                          deadline, step=0.1)
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    if not where or "exited" in where:
        return _outcome("driver", False, None, problem=f"the {kind} ended (exit {where and where.get('exited')}) "
                        f"or timed out before the kill point; see {storage / 'driver.log'}")
    say(f"driver: kill -9 of the driver at {where['killed_at']}; running the same command again")
    before = _digest(run_dir)
    rows_before = _history_rows(history)
    finished = {s["trial_id"] for s in _newest_state(run_dir / "phase2") if s.get("status") == "TERMINATED"} \
        if sweep else set()

    t_restart = time.time()
    with (storage / "driver.resume.log").open("w") as log:
        second = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            t_back = _wait(lambda: len(_history_rows(history)) > len(rows_before) and time.time(),
                           deadline, step=0.1)
            rc = second.wait(timeout=max(deadline - time.time(), 1))
        except subprocess.TimeoutExpired:
            os.killpg(second.pid, signal.SIGKILL)
            second.wait()
            rc = None
    rerun_s = time.time() - t_restart
    out = (storage / "driver.resume.log").read_text(errors="replace")
    after = _digest(run_dir)
    rows_after = _history_rows(history)
    new_rows = rows_after[len(rows_before):]
    problems = _kept_problems(before, after, rows_before, rows_after, finished, sweep)
    new = _parse_rows(rows_after[:1] + new_rows)
    detail: dict[str, Any] = {"kind": kind, "killed_at": where["killed_at"], "exit_status": rc,
                              "rerun_s": round(rerun_s, 1), "files_checked": len(before)}
    if sweep:
        rerun = sorted({r["trial_id"] for r in new} & finished)
        phase1_rerun = sum(r["phase"] == "doubling" for r in new)
        detail.update(finished_before_kill=len(finished), finished_trials_rerun=len(rerun),
                      phase1_kept="phase 1 already finished" in out and phase1_rerun == 0)
        if rerun:
            problems.append(f"finished trials ran again: {', '.join(rerun)}")
        if not detail["phase1_kept"]:
            problems.append("phase 1 ran again")
    else:
        killed_iter = max((int(float(r[keys.ITERATION])) for r in _parse_rows(rows_before)), default=0)
        first_iter = int(float(new[0][keys.ITERATION])) if new else None
        detail.update(killed_at_iteration=killed_iter, first_iteration_after=first_iter)
        if first_iter is None or not 1 < first_iter <= killed_iter + 1:
            problems.append(f"the resumed run started at iteration {first_iter}, not from a checkpoint "
                            f"(killed at {killed_iter})")
    try:
        load_run(run_dir)
    except RunFolderError as exc:
        problems.append(f"the run folder no longer loads: {exc}")
    if rc != 0:
        problems.append(f"the second run exited {rc}; see {storage / 'driver.resume.log'}")
    if problems:
        detail["problems"] = problems
    return _outcome("driver", not problems and t_back is not None, t_back - t_restart if t_back else None,
                    **detail)


def _kept_problems(before: dict[str, str], after: dict[str, str], rows_before: list[str],
                   rows_after: list[str], finished: set[str], sweep: bool) -> list[str]:
    """Files the resume must leave exactly as they were (rayrl's, phase 1, finished trials)."""
    def frozen(rel: str) -> bool:
        parts = rel.split("/")
        if rel in ("spec.yaml", "doubling.csv") or parts[0] == "phase1":
            return True
        return sweep and parts[0] == "phase2" and len(parts) > 2 and parts[1].rsplit("_", 1)[-1] in finished

    changed = sorted(rel for rel, digest in before.items() if frozen(rel) and after.get(rel) != digest)
    problems = [f"changed or lost: {', '.join(changed[:8])}"] if changed else []
    if rows_after[:len(rows_before)] != rows_before:
        problems.append("history.csv: rows written before the kill changed")
    return problems


# ---------------------------------------------------------------------------------------------
# Restoring every kept checkpoint


def kept_checkpoints(run_dir: Path) -> list[Path]:
    """The checkpoint_* folders of the run's Tune trials (the drills' scratch runs excluded)."""
    return sorted(p for p in run_dir.glob("*/*/checkpoint_*") if p.is_dir() and p.parts[-3] != SCRATCH)


def restore_checkpoints(run_dir: Path, spec: Spec) -> tuple[list[dict], float | None]:
    """Algorithm.from_checkpoint on each kept checkpoint, then one greedy episode; (rows, rate)."""
    from ray.rllib.algorithms.algorithm import Algorithm

    from rayrl.algo import env_name

    env_name(spec)  # registers a factory env with Tune's registry, as training did
    rows = []
    paths = kept_checkpoints(run_dir)
    for i, path in enumerate(paths, 1):
        start = time.monotonic()
        row: dict[str, Any] = {"checkpoint": str(path.relative_to(run_dir))}
        algorithm = None
        try:
            algorithm = Algorithm.from_checkpoint(str(path))
            row["restore_s"] = round(time.monotonic() - start, 2)
            row["episode_return"], row["episode_len"] = _play_episode(algorithm)
            row["ok"] = True
        except Exception as exc:  # any failure to restore is a finding for drill.json
            row.update(ok=False, error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
        finally:
            if algorithm is not None:
                algorithm.stop()
        rows.append(row)
        say(f"restore {i}/{len(paths)}: {row['checkpoint']}: " + (
            f"restored in {row['restore_s']:.1f}s, episode return {row['episode_return']:.1f}" if row["ok"]
            else f"FAILED ({row['error']})"))
    rate = sum(r["ok"] for r in rows) / len(rows) if rows else None
    return rows, rate


def _play_episode(algorithm: Any) -> tuple[float, int]:
    """One greedy episode with the restored policy, on the local EnvRunner or a remote one."""
    runner = algorithm.env_runner
    if runner is not None and getattr(runner, "env", None) is not None:
        episodes = runner.sample(num_episodes=1, explore=False)
    else:
        episodes = algorithm.env_runner_group.foreach_env_runner(
            lambda r: r.sample(num_episodes=1, explore=False), local_env_runner=False)[0]
    done = [e for e in episodes if e.is_done] or episodes
    return float(done[0].get_return()), len(done[0])


# ---------------------------------------------------------------------------------------------
# `rayrl drill`


def check_run_dir(path: str | Path) -> tuple[Path, Spec, str]:
    """The run folder, its spec and its kind; DrillError naming the problem when it is not usable."""
    try:
        run = load_run(path)
    except RunFolderError as exc:
        raise DrillError(str(exc)) from None
    try:
        spec = spec_mod.load(run.path / "spec.yaml")
    except SpecError as exc:
        raise DrillError(f"{run.path / 'spec.yaml'}: not a valid rayrl spec ({exc}); the run folder is damaged "
                         "or from another version of rayrl.") from None
    return run.path, spec, run.kind


def run_drills(run_dir: Path, spec: Spec, kind: str, names: Sequence[str], *, address: str | None = None,
               num_cpus: int | None = None, restore: bool = True, timeout_s: float = 600.0) -> dict:
    """Run the named drills and the restore check; write and return drill.json's content."""
    import ray

    storage = run_dir / SCRATCH
    storage.mkdir(exist_ok=True)
    local_cpus = None if address else max(num_cpus or os.cpu_count() or 2, _cpus_needed(spec))
    results: dict[str, dict] = {}
    skipped: list[dict] = []
    if "driver" in names and address is None:  # its own local Ray: run it before this process starts one
        results["driver"] = _logged(driver_drill(spec, kind, storage, address=None, num_cpus=local_cpus,
                                                 timeout_s=timeout_s * 1.5))
    runtime.init_ray(address, local_cpus)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    say(f"cluster: {len(nodes)} node(s), {ray.cluster_resources().get('CPU', 0):g} CPUs")
    needed = _gpus_needed(spec)
    if needed > ray.cluster_resources().get("GPU", 0):
        raise DrillError(f"the run's spec needs {needed:g} GPU(s) per trial and this cluster has "
                         f"{ray.cluster_resources().get('GPU', 0):g}; run the drills on the cluster that ran it "
                         "(--address).")
    for name in DRILLS:
        if name not in names or name in results:
            continue
        if name == "driver":
            results[name] = _logged(driver_drill(spec, kind, storage, address=address, num_cpus=None,
                                                 timeout_s=timeout_s * 1.5))
        elif name == "node" and len(nodes) < 2:
            skipped.append({"name": "node", "reason": f"the cluster has {len(nodes)} node"})
            say("node: skipped (a one-node cluster; give --address of a multi-node cluster)")
        else:
            say(f"{name}: training a scratch copy of the spec under {storage / name}")
            fn = {"env_runner": env_runner_drill, "trial": trial_drill, "node": node_drill}[name]
            results[name] = _logged(fn(spec, storage, timeout_s))
    data = _merge(run_dir / "drill.json", kind, results, skipped)
    if restore:
        rows, rate = restore_checkpoints(run_dir, spec)
        data["restores"], data["restore_rate"] = rows, rate
        if not rows:
            say("restore: the run keeps no checkpoint (phase 1 and measurement trials keep none)")
    _write_json(run_dir / "drill.json", data)
    return data


def _cpus_needed(spec: Spec) -> int:
    from rayrl.train import trial_resources

    wider = spec_mod.replace(spec, resources={"env_runners": max(spec.resources.env_runners, 2)})
    return int(trial_resources(wider)["cpus_per_trial"] + 0.999)


def _gpus_needed(spec: Spec) -> float:
    from rayrl.train import trial_resources

    return float(trial_resources(spec)["gpus_per_trial"])


def _logged(result: dict) -> dict:
    if result["outcome"] == "recovered":
        say(f"{result['name']}: recovered in {result['recovery_s']:.1f}s")
    else:
        why = result.get("problem") or "; ".join(result.get("problems", [])) or "no recovery seen"
        say(f"{result['name']}: FAILED: {why}")
    return result


def _merge(path: Path, kind: str, results: dict[str, dict], skipped: list[dict]) -> dict:
    """drill.json with this run's drills replacing same-named earlier ones (others are kept)."""
    old: dict = {}
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except ValueError:
            old = {}
    kept = {d["name"]: d for d in old.get("drills") or [] if isinstance(d, dict) and d.get("name") in DRILLS}
    kept.update(results)
    import ray

    data = {"kind": kind, "ray_version": ray.__version__, "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "drills": [kept[n] for n in DRILLS if n in kept], "skipped": skipped,
            "restores": old.get("restores", []), "restore_rate": old.get("restore_rate")}
    return data


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


def build_parser() -> argparse.ArgumentParser:
    from rayrl.cli import _Parser

    p = _Parser(prog="rayrl drill", formatter_class=argparse.RawDescriptionHelpFormatter, description=textwrap.dedent(
        """\
        Fault drills for a run folder: kill an EnvRunner, the trial, the driver (and a worker node on a
        multi-node cluster), time each recovery, then restore every kept checkpoint and play one
        episode from each. Writes RUN_DIR/drill.json (read by `rayrl report`).

        The drills train a copy of the run's spec with tiny budgets under RUN_DIR/drills/; the run
        itself is only read. About 3-5 minutes on 2 cores.

          env_runner  SIGKILL an EnvRunner; RLlib restarts and resyncs it, training goes on
          trial       SIGKILL the trial actor; Tune retries from the latest checkpoint
          driver      kill -9 the sweep (in phase 2) or `rayrl train`, then the same command again
          node        kill a worker node's raylet (only when the cluster has more than one node)"""),
        epilog="exit status: 0 all drills recovered and every checkpoint restored, 1 otherwise, 2 bad input.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder of `rayrl train` or the sweep ({storage}/{name})")
    p.add_argument("--only", nargs="+", choices=DRILLS, metavar="DRILL", default=None,
                   help=f"run only these drills ({', '.join(DRILLS)}); drill.json keeps earlier results of the others")
    p.add_argument("--address", default=None, help="Ray cluster to run on (default: RAY_ADDRESS, else a new local "
                   "Ray); the node drill needs a cluster with several nodes")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs for a local Ray (default: all, at least "
                   "what a drill trial needs)")
    p.add_argument("--no-restore", action="store_true", help="skip restoring the run's checkpoints")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="give up on a drill after this many seconds (default: 600)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `rayrl drill`; exit 2 with one paragraph on a missing or damaged RUN_DIR."""
    args = build_parser().parse_args(argv)
    try:
        if args.num_cpus is not None and args.num_cpus < 1:
            raise DrillError(f"--num-cpus: {args.num_cpus} is not a positive number of CPUs.")
        if args.timeout <= 0:
            raise DrillError(f"--timeout: {args.timeout:g} is not a positive number of seconds.")
        run_dir, spec, kind = check_run_dir(args.run_dir)
        if not os.access(run_dir, os.W_OK):
            raise DrillError(f"{run_dir}: not writable; the drills need RUN_DIR/drills/ and RUN_DIR/drill.json.")
    except DrillError as exc:
        _fail(str(exc))
        return EXIT_USAGE
    address = args.address or os.environ.get("RAY_ADDRESS") or None
    say(f"{kind} run {run_dir}: drills {', '.join(args.only or DRILLS)}"
        f"{'' if args.no_restore else ', then a restore of every kept checkpoint'}")
    start = time.monotonic()
    try:
        data = run_drills(run_dir, spec, kind, args.only or DRILLS, address=address, num_cpus=args.num_cpus,
                          restore=not args.no_restore, timeout_s=args.timeout)
    except DrillError as exc:
        _fail(str(exc))
        return EXIT_USAGE
    except ConnectionError as exc:
        _fail(f"--address: cannot reach the Ray cluster at {address} ({exc}).")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("\nrayrl drill: interrupted; drill.json was not updated.\n")
        return 130
    drills, rate = data["drills"], data.get("restore_rate")
    ok = all(d["outcome"] == "recovered" for d in drills) and rate in (None, 1.0)
    summary = ", ".join(f"{d['name']} {d['outcome']}"
                        + (f" in {d['recovery_s']:.1f}s" if d.get("recovery_s") is not None else "") for d in drills)
    restored = "no checkpoint to restore" if rate is None else f"restore rate {rate:.0%} of {len(data['restores'])}"
    print(f"rayrl drill: {summary}; {restored}; {time.monotonic() - start:.0f}s; wrote {run_dir / 'drill.json'}",
          flush=True)
    return 0 if ok else 1


def _fail(message: str) -> None:
    sys.stderr.write(textwrap.fill(f"rayrl drill: error: {message}", width=100) + "\n")
