"""The in-process drills: kill an EnvRunner, the trial's actor or a worker node under a Tune run that
this process drives, and time how long training takes to come back.

They share one shape (train a scratch copy, inject the fault from a thread, read the monitor) that
`rayrl.faults.harness` provides; the driver drill, which kills this kind of process itself, is
`rayrl.faults.driver_drill`.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from rayrl.faults.harness import (
    Monitor,
    after_recovery,
    drill_runners,
    drill_spec,
    kill_pid,
    our_actors,
    outcome,
    ready_to_kill,
    run_with_fault,
    say,
    scratch,
    wait_for,
)
from rayrl.observe import keys
from rayrl.spec import Spec


def env_runner_class_name(spec: Spec) -> str:
    """The actor class name of the spec's env runners (the fast runner's, or RLlib's own)."""
    from rayrl.sampling import runner_class

    cls = runner_class(spec.env_runner, spec.env.backend)
    return cls.__name__ if cls is not None else "SingleAgentEnvRunner"


def env_runner_drill(spec: Spec, storage: Path, timeout_s: float = 600.0) -> dict:
    """Kill one EnvRunner actor mid-training; recovered when every runner is healthy again and the
    restart is counted, with the trial itself never failing."""
    runners = drill_runners(spec)
    dspec = drill_spec(spec, "env_runner", env_runners=runners)
    monitor = Monitor(timeout_s)

    runner_cls = env_runner_class_name(dspec)

    def inject() -> dict:
        if not wait_for(lambda: ready_to_kill(monitor, False), monitor.deadline):
            return {"problem": "training produced no results to interrupt"}
        actor = wait_for(lambda: our_actors(runner_cls), monitor.deadline)
        if not actor:
            return {"problem": "no EnvRunner actor found to kill"}
        before = monitor.results()[-1][1]
        t_kill = kill_pid(actor[0]["Pid"], actor[0]["Address"]["NodeID"])
        say(f"env_runner: killed EnvRunner pid {actor[0]['Pid']} at iteration {before['iteration']}")

        def back() -> float | None:
            for t, r in monitor.results(after=t_kill):
                if (r["restarts"] or 0) > (before["restarts"] or 0) and r["healthy"] == runners:
                    return t
            return None

        t_back = wait_for(back, monitor.deadline)
        if t_back:
            wait_for(lambda: after_recovery(monitor, t_back), monitor.deadline)
        return {"t_kill": t_kill, "t_back": t_back, "killed_at_iteration": before["iteration"]}

    result, info = run_with_fault(dspec, scratch(storage, "env_runner"), monitor, "env_runner", inject)
    after = monitor.results(after=info.get("t_kill", float("inf")))
    last = after[-1][1] if after else {}
    ok = (
        info.get("t_back") is not None
        and result.error is None
        and monitor.count("recover") == 0
        and monitor.count("error") == 0
    )
    recovery = info["t_back"] - info["t_kill"] if info.get("t_back") else None
    return outcome(
        "env_runner",
        ok,
        recovery,
        env_runners=runners,
        restarts=last.get("restarts"),
        killed_at_iteration=info.get("killed_at_iteration"),
        final_iteration=last.get("iteration"),
        trial_failures=monitor.count("error") + monitor.count("recover"),
        **({"problem": info["problem"]} if "problem" in info else {}),
    )


def trial_drill(spec: Spec, storage: Path, timeout_s: float = 600.0) -> dict:
    """Kill the trial's actor; recovered when Tune has retried it from its latest checkpoint, the
    first result after the retry continues that checkpoint's counters, and the trial finishes."""
    from rayrl.rllib.algo import algorithm_class

    dspec = drill_spec(spec, "trial")
    monitor = Monitor(timeout_s)
    cls = algorithm_class(dspec.algo.name, dspec.algo.sample_ahead).__name__

    def inject() -> dict:
        if not wait_for(lambda: ready_to_kill(monitor, True), monitor.deadline):
            return {"problem": "training produced no checkpoint to recover from"}
        actor = wait_for(lambda: our_actors(cls), monitor.deadline)
        if not actor:
            return {"problem": f"no {cls} trial actor found to kill"}
        before = monitor.results()[-1][1]
        t_kill = kill_pid(actor[0]["Pid"], actor[0]["Address"]["NodeID"])
        say(f"trial: killed the {cls} trial actor pid {actor[0]['Pid']} at iteration {before['iteration']}")

        t_back = wait_for(lambda: monitor.first_result_after("recover", t_kill), monitor.deadline)
        if t_back:
            wait_for(lambda: after_recovery(monitor, t_back), monitor.deadline)
        return {
            "t_kill": t_kill,
            "t_back": t_back,
            "killed_at_iteration": before["iteration"],
            "env_steps_at_kill": before["env_steps"],
        }

    result, info = run_with_fault(dspec, scratch(storage, "trial"), monitor, "trial", inject)
    if "t_kill" not in info:
        return outcome("trial", False, None, problem=info.get("problem", "no kill"))
    t_kill, t_back = info["t_kill"], info.get("t_back")
    first = next((d for t, d in monitor.results(after=(t_back or t_kill) - 1e-6)), {})
    registered = next((d for t, k, d in monitor.events if k == "recover" and t > t_kill), {}).get("from_iteration")
    resumed_from = first["iteration"] - 1 if first.get("since_restore") == 1 else None
    continued = resumed_from_latest(monitor, t_kill, registered, resumed_from, first)
    ok = (
        t_back is not None
        and monitor.count("recover") >= 1
        and continued
        and result.error is None
        and result.metrics is not None
    )
    return outcome(
        "trial",
        ok,
        t_back - t_kill if t_back else None,
        retries=monitor.count("recover"),
        killed_at_iteration=info["killed_at_iteration"],
        resumed_from_checkpoint_iteration=resumed_from,
        tune_registered_iteration=registered,
        restored_newer_than_registered=first.get("newer_than_registered"),
        first_iteration_after=first.get("iteration"),
        first_env_steps_after=first.get("env_steps"),
        env_steps_at_kill=info.get("env_steps_at_kill"),
        final_iteration=(result.metrics or {}).get(keys.ITERATION),
        **({"problem": info["problem"]} if "problem" in info else {}),
    )


def resumed_from_latest(
    monitor: Monitor, t_kill: float, registered: int | None, resumed_from: int | None, first: dict
) -> bool:
    """The retry went on from the latest checkpoint: at least Tune's latest registered one and every
    one registered before the kill, a newer one only where the trainable says it restored one that
    Tune never registered (a save the kill cut off), and counters that continue rather than restart."""
    if not first or registered is None or resumed_from is None or resumed_from < 1:
        return False
    seen = [d["iteration"] for t, k, d in monitor.events if k == "checkpoint" and t < t_kill]
    if resumed_from < max(registered, *seen):
        return False
    if resumed_from > registered and not first.get("newer_than_registered"):
        return False
    return (first["env_steps"] or 0) > 0


def node_drill(spec: Spec, storage: Path, timeout_s: float = 600.0) -> dict:
    """Kill the raylet of a worker node hosting the drill's actors (never the driver's node);
    recovered when training goes on with every EnvRunner healthy and the trial finishes."""
    import ray

    from rayrl.rllib.algo import algorithm_class

    runners = drill_runners(spec)
    dspec = drill_spec(spec, "node", env_runners=runners)
    monitor = Monitor(timeout_s)
    cls = algorithm_class(dspec.algo.name, dspec.algo.sample_ahead).__name__
    runner_cls = env_runner_class_name(dspec)
    driver_node = ray.get_runtime_context().get_node_id()

    def inject() -> dict:
        if not wait_for(lambda: ready_to_kill(monitor, True), monitor.deadline):
            return {"problem": "training produced no checkpoint before the node kill"}
        actors = our_actors(runner_cls) + our_actors(cls)
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
        say(
            f"node: killed the raylet of node {node[:8]} (hosting {', '.join(sorted(hosts[node]))}) at "
            f"iteration {before['iteration']}"
        )

        t_back = wait_for(lambda: back_after_node_loss(monitor, t_kill, before, runners), monitor.deadline)
        if t_back:
            wait_for(lambda: after_recovery(monitor, t_back), monitor.deadline)
        return {
            "t_kill": t_kill,
            "t_back": t_back,
            "node": node,
            "hosted": sorted(hosts[node]),
            "killed_at_iteration": before["iteration"],
        }

    result, info = run_with_fault(dspec, scratch(storage, "node"), monitor, "node", inject)
    t_back = info.get("t_back")
    ok = t_back is not None and result.error is None
    return outcome(
        "node",
        ok,
        t_back - info["t_kill"] if t_back else None,
        node=info.get("node"),
        hosted=info.get("hosted"),
        retries=monitor.count("recover"),
        killed_at_iteration=info.get("killed_at_iteration"),
        final_iteration=(result.metrics or {}).get(keys.ITERATION),
        **({"problem": info["problem"]} if "problem" in info else {}),
    )


def back_after_node_loss(monitor: Monitor, t_kill: float, before: dict, runners: int) -> float | None:
    """When training was back after a node loss: the first result with every EnvRunner healthy that
    follows a restart of the lost runners in place, or the trial's retry. After a retry only results
    that came after it count: one the lost trial actor sent before the kill can arrive after it."""
    retry = monitor.first("recover", after=t_kill)
    for t, r in monitor.results(after=t_kill):
        restarted = (r["restarts"] or 0) > (before["restarts"] or 0)
        if r["healthy"] == runners and (restarted or (retry is not None and t > retry)):
            return t
    return None


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
