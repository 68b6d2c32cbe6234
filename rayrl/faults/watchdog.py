"""The hung EnvRunner watchdog: restart a runner whose env step never returns.

RLlib 2.60 restarts EnvRunners that die or raise (``restart_failed_env_runners``, probed by
``env_runner_health_probe_timeout_s``), but one that hangs (an env ``step()`` that blocks) stays
"healthy": ``sample_timeout_s`` only drops its late sample call, so every iteration waits that long
and gets its samples from the others (with one runner, none at all), for as long as the run lasts.

After each iteration the watchdog pings every healthy runner (``ping``, the call RLlib's own
health probe makes). A runner hung in ``step()`` cannot answer: its single thread is busy. When a
runner has stayed silent for ``hung_s`` it is killed with ``ray.kill(no_restart=False)``, so Ray
restarts its process (RLlib creates runners with ``max_restarts``), and marked unhealthy, so RLlib's
next probe resyncs its weights and brings it back, as after a crash. Restarts are counted in
``result["rayrl"]["hung_runner_restarts"]`` (and in history.csv).
"""

from __future__ import annotations

import time
from typing import Any


def answered_ahead(algorithm: Any) -> set[int] | None:
    """The runners whose sample arrived this step when ``algorithm`` samples ahead
    (rayrl.rllib.sample_ahead.PPO), else None: such runners are always busy with the next sample,
    so a call that waits for them (a ping, a hardware reading) would wait behind it."""
    answered = getattr(algorithm, "rayrl_answered", None)
    return None if answered is None else set(answered)


def silent_too_long(
    silent_since: dict[int, float], answered: set[int], asked: set[int], now: float, hung_s: float
) -> list[int]:
    """Update ``silent_since`` (runner id -> first unanswered ping) and return the runners to restart."""
    for rid in list(silent_since):
        if rid in answered or rid not in asked:
            del silent_since[rid]
    for rid in asked - answered:
        silent_since.setdefault(rid, now)
    return sorted(rid for rid, since in silent_since.items() if now - since >= hung_s)


class Watchdog:
    """Per-algorithm watchdog state; :meth:`check` runs once per training iteration."""

    def __init__(self, hung_s: float, ping_s: float = 1.0) -> None:
        self.hung_s = hung_s
        self.ping_s = ping_s
        self.silent_since: dict[int, float] = {}
        self.restarts = 0

    def check(self, algorithm: Any) -> int:
        """Ping the healthy runners, restart the ones silent for ``hung_s``; return restarts so far."""
        import ray

        group = getattr(algorithm, "env_runner_group", None)
        if self.hung_s <= 0 or group is None or group.num_remote_env_runners() == 0:
            return self.restarts
        manager = group._worker_manager  # RLlib's FaultTolerantActorManager: ids, handles, health
        actors = {rid: manager._actors[rid] for rid in manager.healthy_actor_ids()}
        sampled = answered_ahead(algorithm)
        if sampled is not None:  # the sample that arrived this step is the runner's answer
            answered = sampled
        else:
            refs = {actor.ping.remote(): rid for rid, actor in actors.items()}
            ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=self.ping_s)
            answered = {refs[r] for r in ready}
        for rid in silent_too_long(self.silent_since, answered, set(actors), time.monotonic(), self.hung_s):
            print(
                f"[rayrl] EnvRunner {rid} has not answered for {self.hung_s:g}s (a hung env step?): restarting it",
                flush=True,
            )
            ray.kill(actors[rid], no_restart=False)
            manager.set_actor_state(rid, healthy=False)
            del self.silent_since[rid]
            self.restarts += 1
        return self.restarts
