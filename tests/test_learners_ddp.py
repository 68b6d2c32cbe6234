"""Two CPU learners (DDP over gloo on Ray Train's Torch backend) stay identical in every precision."""

from __future__ import annotations

import math

import pytest
import torch

from rayrl.rllib import algo as rayrl_algo
from rayrl.rllib import learner as L
from rayrl.spec import from_dict

MID = "default_policy"
PER_LEARNER, MINIBATCH, EPOCHS, K = 200, 50, 2, 2


def learner_weights(algorithm) -> list[dict[str, torch.Tensor]]:
    def weights(learner) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in learner.module[MID].unwrapped().state_dict().items()}

    return [r.get() for r in algorithm.learner_group.foreach_learner(weights)]


def learner_facts(algorithm) -> list[tuple]:
    def facts(learner) -> tuple:
        import torch.distributed as dist

        return learner._rayrl_ddp, dist.get_rank(), dist.get_world_size(), learner._rayrl_minibatches

    return [r.get() for r in algorithm.learner_group.foreach_learner(facts)]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fp32", "bf16", "fp16"])
def test_two_cpu_learners_keep_equal_weights(ray_local, mode):
    spec = from_dict(
        {
            "seed": 3,
            "env": {"envs_per_runner": 4},
            "algo": {"train_batch_per_learner": PER_LEARNER, "minibatch_size": MINIBATCH, "epochs": EPOCHS, "lr": 1e-3},
            "resources": {"env_runners": 0, "learners": 2},
            "precision": {"mode": mode, "accumulation_steps": K},
        }
    )
    algorithm = rayrl_algo.build_config(spec).build_algo()
    try:
        start = learner_weights(algorithm)
        results = [algorithm.train() for _ in range(2)]
        end = learner_weights(algorithm)
        facts = learner_facts(algorithm)
    finally:
        algorithm.stop()

    assert len(end) == 2
    assert all(torch.equal(end[0][k], end[1][k]) for k in end[0])  # bit-identical after updates
    assert max(float((end[0][k] - start[0][k]).abs().max()) for k in end[0]) > 1e-4  # they did learn
    minibatches = PER_LEARNER // MINIBATCH * EPOCHS  # per learner per iteration
    assert sorted(f[1] for f in facts) == [0, 1]
    assert all(f[0] and f[2] == 2 and f[3] == 2 * minibatches for f in facts), facts

    overflow_before = 0.0
    for result in results:
        rr = result["rayrl"]
        assert rr["backend"] == "gloo"
        assert rr["num_learners"] == 2
        assert rr["global_batch"] == 2 * PER_LEARNER == spec.global_batch
        assert rr["effective_minibatch"] == MINIBATCH * K
        assert rr["precision"] == mode
        assert rr["nonfinite_steps"] == 0
        assert math.isfinite(rr["grad_norm"])
        assert math.isfinite(rr["loss_scale"]) == (mode == "fp16")
        stats = result["learners"][MID]
        # Each learner trained on its own per-learner batch: the steps add up to the global batch.
        assert stats["num_module_steps_trained"] == 2 * PER_LEARNER * EPOCHS
        # Only rank 0 counts (every rank takes the same steps): minibatches / K optimizer steps per
        # iteration, less the fp16 steps the loss scaler skipped (a lifetime count, hence the delta).
        overflow = stats.get(L.OVERFLOW_STEPS, 0.0)
        assert stats[L.OPTIMIZER_STEPS] + (overflow - overflow_before) == minibatches // K
        assert overflow == 0.0 or mode == "fp16"
        overflow_before = overflow
