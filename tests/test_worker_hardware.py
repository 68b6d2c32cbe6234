"""Hardware sampled where the work runs: remote Learner actors and EnvRunners report their own
readings (their pids, not the trial's), and the trial's GPU figures come from its learners."""

from __future__ import annotations

import math
import os
import time

import pytest

from rayrl.observe import hardware as wh


def test_aggregate_uses_the_learners_gpus_and_keeps_every_reading():
    learners = [
        {"pid": 11, "gpu_util": 0.9, "gpu_mem_util": 0.5, "cpu_util": 0.2},
        {"pid": 12, "gpu_util": 0.7, "gpu_mem_util": 0.8, "cpu_util": math.nan},
    ]
    runners = [{"pid": 21, "gpu_util": math.nan, "gpu_mem_util": math.nan, "cpu_util": 0.6}]
    section = {"gpu_util": math.nan, "gpu_mem_util": math.nan}  # the trial process: no GPU
    wh.aggregate(section, learners, runners)
    assert section["gpu_util"] == pytest.approx(0.8) and section["gpu_mem_util"] == 0.8  # mean, peak
    assert section["learner_cpu_util"] == pytest.approx(0.2)  # NaN skipped
    assert section["env_runner_cpu_util"] == 0.6 and math.isnan(section["env_runner_gpu_util"])
    assert [r["pid"] for r in section[wh.LEARNERS_KEY].values()] == [11, 12]
    assert list(section[wh.LEARNERS_KEY]) == ["0", "1"]  # a dict, which loggers flatten (not a list)
    # No remote learners: the trial's own reading stands.
    own = wh.aggregate({"gpu_util": 0.95, "gpu_mem_util": 0.4}, [], runners)
    assert own["gpu_util"] == 0.95 and own[wh.LEARNERS_KEY] == {}


def test_sample_here_keeps_one_sampler_per_worker():
    class Worker:
        pass

    w = Worker()
    first = wh.sample_here(w)
    time.sleep(0.3)
    second = wh.sample_here(w)
    assert first["pid"] == os.getpid() and set(first) >= {"host", "cpu_util", "gpu_util"}
    assert w._rayrl_hw_sampler is not None and math.isfinite(second["cpu_util"])  # a rate over an interval


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_remote_cpu_learners_report_from_their_own_processes():
    import ray

    from rayrl import spec as spec_mod
    from rayrl.rllib.algo import build_config

    spec = spec_mod.from_dict(
        {
            "env": {"envs_per_runner": 2},
            "algo": {"train_batch_per_learner": 128, "minibatch_size": 64, "epochs": 1},
            "resources": {"learners": 2, "env_runners": 1},
        }
    )
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    algo = None
    try:
        algo = build_config(spec).build_algo()
        algo.train()
        section = algo.train()["rayrl"]
    finally:
        if algo is not None:
            algo.stop()
        ray.shutdown()
    learners, runners = list(section[wh.LEARNERS_KEY].values()), list(section[wh.RUNNERS_KEY].values())
    assert section["backend"] == "gloo" and len(learners) == 2 and len(runners) == 1
    pids = {r["pid"] for r in learners}
    assert len(pids) == 2 and os.getpid() not in pids  # two learner processes, not the trial's
    assert runners[0]["pid"] not in pids | {os.getpid()}
    # Rates over an iteration: each learner's CPU reading is a real fraction.
    assert all(0.0 <= r["cpu_util"] <= 1.0 for r in learners)
    assert section["learner_cpu_util"] == pytest.approx(sum(r["cpu_util"] for r in learners) / 2)
