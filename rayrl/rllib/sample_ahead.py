"""PPO that samples the next batch while it learns on this one (``algo.sample_ahead``).

RLlib's PPO samples, then learns: with remote EnvRunners one side always waits for the other, so on a
small machine one core idles through every SGD phase and the learner's core through every sampling
phase. Here each training step takes the batch the runners sampled during the previous step, sends
them the newest weights, asks for the next batch, and only then runs the update, so sampling and SGD
run at once. The price is one update of policy lag: a batch is trained by the weights one update
newer than those that sampled it. PPO's ratio uses the sampling policy's log-probabilities (kept with
the batch), so the clipped objective stays the one it is for every epoch after the first.

What else had to change for the overlap to happen (each found blocking it, docs/learner.md):

* RLlib's ``Algorithm.step`` gathers the runners' connector states after every iteration with a
  blocking call, which waits behind the sample in flight; here the states come back with the sample
  (``sample_get_state_and_metrics``, as RLlib's IMPALA does) and are merged in the step
  (``_dont_auto_sync_env_runner_states``);
* rayrl's per-iteration hardware reading and hung-runner ping would wait the same way; both read
  :attr:`PPO.rayrl_answered` instead (through rayrl.faults.watchdog.answered_ahead);
* a local CPU learner runs torch on the cores its process was given (one, unless Ray assigned more):
  with two intra-op threads on two cores it waits on the core the runner is sampling on.
"""

from __future__ import annotations

from typing import Any

import ray
import torch
from ray.rllib.algorithms.ppo import PPO as RLlibPPO
from ray.rllib.core import ALL_MODULES
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    ENV_RUNNER_SAMPLING_TIMER,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_MODULE_STEPS_TRAINED_LIFETIME,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TIMERS,
)

TAG = "rayrl_sample_ahead"  #: the tag of the sample requests in flight


def learner_threads(assigned_cpus: float | None, fallback: float, current: int) -> int:
    """Torch intra-op threads for a local CPU learner that shares the machine with sampling runners:
    the CPUs Ray assigned to this process (else the main process's configured CPUs), never more than
    torch has now."""
    cpus = assigned_cpus if assigned_cpus else fallback
    return max(1, min(current, int(cpus or 1)))


def _assigned_cpus() -> float | None:
    """The CPUs Ray assigned to this process (a Tune trial's actor); None in a driver."""
    try:
        return ray.get_runtime_context().get_assigned_resources().get("CPU")
    except AssertionError:  # Ray answers only inside a worker process
        return None


class PPO(RLlibPPO):
    """RLlib's PPO with the sample of batch k+1 in flight while batch k trains (module docstring).

    Named ``PPO``, as the class it extends, so Tune's trial folders (``PPO_<id>``) and everything that
    reads them stay the same with ``algo.sample_ahead`` on or off.
    """

    #: the runners whose sample arrived in the latest training step (the hung-runner watchdog's answer)
    rayrl_answered: set[int]
    #: the runners' latest hardware readings that arrived (rayrl.observe.hardware asks without waiting)
    rayrl_runner_readings: list[dict]

    def setup(self, config: Any) -> None:
        super().setup(config)
        self.rayrl_answered = set()
        self.rayrl_runner_readings = []
        self._rayrl_in_flight = 0
        self._rayrl_threads_before: int | None = None
        if self.config.num_learners == 0 and not self.config.num_gpus_per_learner:
            assigned = _assigned_cpus()
            fallback = float(self.config.num_cpus_for_main_process or 1)
            threads = learner_threads(assigned, fallback, torch.get_num_threads())
            if threads != torch.get_num_threads():
                self._rayrl_threads_before = torch.get_num_threads()
                torch.set_num_threads(threads)

    def cleanup(self) -> None:
        try:
            super().cleanup()
        finally:
            if self._rayrl_threads_before is not None:  # a benchmark's next contender runs in this process
                torch.set_num_threads(self._rayrl_threads_before)
                self._rayrl_threads_before = None

    def _rayrl_launch(self) -> None:
        self._rayrl_in_flight = self.env_runner_group.foreach_env_runner_async("sample_get_state_and_metrics", tag=TAG)

    def training_step(self) -> None:
        group = self.env_runner_group
        if group is None or group.num_healthy_remote_workers() == 0:
            self.rayrl_answered = set()
            return super().training_step()  # no remote runner to sample ahead on: sample, then learn
        with self.metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
            if not self._rayrl_in_flight:
                self._rayrl_launch()
            ready = group.fetch_ready_async_reqs(tags=TAG, timeout_seconds=self.config.sample_timeout_s)
            self._rayrl_in_flight = 0
            self.rayrl_answered = {rid for rid, _ in ready}
            if not ready:  # every runner lost or late: RLlib restores lost ones before the next step
                return
            refs, states, stats = zip(*(r for _, r in ready))
            episodes = [e for batch in ray.get(list(refs)) for e in batch]
            self.metrics.aggregate(list(stats), key=ENV_RUNNER_RESULTS)
        env_steps = self.metrics.peek((ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0)
        with self.metrics.log_time((TIMERS, SYNCH_WORKER_WEIGHTS_TIMER)):
            # Queued on each runner before the next sample: it samples with the newest weights.
            group.sync_weights(from_worker_or_learner_group=self.learner_group, inference_only=True)
            group.sync_env_runner_states(
                config=self.config,
                connector_states=list(states),
                env_steps_sampled=env_steps,
                env_to_module=self.env_to_module_connector,
                module_to_env=self.module_to_env_connector,
            )
        self._rayrl_launch()
        # The update as RLlib's PPO.training_step runs it (RLlib 2.60): re-check it on an RLlib upgrade.
        with self.metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)):
            learner_results = self.learner_group.update(
                episodes=episodes,
                timesteps={
                    NUM_ENV_STEPS_SAMPLED_LIFETIME: env_steps,
                    NUM_MODULE_STEPS_TRAINED_LIFETIME: self.metrics.peek(
                        (LEARNER_RESULTS, ALL_MODULES, NUM_MODULE_STEPS_TRAINED_LIFETIME), default=0
                    ),
                },
                num_epochs=self.config.num_epochs,
                minibatch_size=self.config.minibatch_size,
                shuffle_batch_per_epoch=self.config.shuffle_batch_per_epoch,
            )
            self.metrics.aggregate(learner_results, key=LEARNER_RESULTS)
